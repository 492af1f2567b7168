"""Turns compare_llama.sh's raw.jsonl into a markdown table: per model and test, the median tokens/s
of every repetition of every round on each side, the spread (min-max), tandem / llama.cpp, and the
fraction of the ceiling (pp: GFLOP/s over the peak of the arithmetic the type's matmuls use, int8
VNNI for Q8_0/Q4_0/Q5_0/Q4_K/Q6_K and BF16 dot products for BF16 as both programs use them, else FP32 FMA; tg: GB/s
over the read bandwidth),
both sides counted with tandem's FLOP and byte model of the same run. Reads only; judges nothing.

usage: /usr/bin/python3 bench/compare_table.py raw.jsonl
"""
import json
import os
import statistics
import sys


def main():
    recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    ceil = [r["data"]["ceilings"] for r in recs if r["side"] == "ceilings"]
    # A ceiling is the most the machine was seen to do: the best of the measurements (on a loaded
    # machine one of them can be far too low).
    gbs = max(c["read_gbs"] for c in ceil)
    gfl = max(c["fma_gflops"] for c in ceil)
    i8 = max(c.get("int8_giops", 0) for c in ceil)
    bf = max(c.get("bf16_gflops", 0) for c in ceil)

    def pp_peak(dtype):
        if dtype in ("Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K") and i8 > 0:
            return i8
        if dtype == "BF16" and bf > 0:
            return bf
        return gfl
    models = []
    llama, tandem, info = {}, {}, {}
    for r in recs:
        m = r["model"]
        if r["side"] == "ceilings":
            continue
        if m not in models:
            models.append(m)
        if r["side"] == "llama.cpp":
            for e in r["data"]:
                test = "pp" if e["n_prompt"] > 0 and e["n_gen"] == 0 else "tg"
                llama.setdefault((m, test), []).extend(e["samples_ts"])
        else:
            d = r["data"]
            tandem.setdefault((m, d["test"]), []).extend(d["samples_ts"])
            info[(m, d["test"])] = d

    def cell(v):
        if not v:
            return "-", None
        med = statistics.median(v)
        return f"{med:.2f} ({min(v):.2f}-{max(v):.2f})", med

    def frac(m, test, ts):
        d = info.get((m, test))
        if not d or ts is None:
            return None
        work = d["flops"] if test == "pp" else d["bytes"]  # per run of n tokens
        rate = work * ts / d["n"] / 1e9
        return rate / (pp_peak(d.get("type")) if test == "pp" else gbs)

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    pp_n = next((d["n"] for (m, t), d in info.items() if t == "pp"), "?")
    tg_n = next((d["n"] for (m, t), d in info.items() if t == "tg"), "?")
    print(f"| model | type | llama.cpp pp{pp_n} t/s | tandem pp{pp_n} t/s | tandem/llama.cpp | "
          f"llama.cpp tg{tg_n} t/s | tandem tg{tg_n} t/s | tandem/llama.cpp | "
          f"of ceiling pp (tandem / llama.cpp) | of ceiling tg (tandem / llama.cpp) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in models:
        d = info.get((m, "pp")) or info.get((m, "tg")) or {}
        row = [os.path.basename(m).replace(".gguf", ""), d.get("type", "?")]
        fr = []
        for test in ("pp", "tg"):
            lc, lm = cell(llama.get((m, test), []))
            tc, tm = cell(tandem.get((m, test), []))
            ratio = f"{tm / lm:.2f}x" if lm and tm else "-"
            row += [lc, tc, ratio]
            fr.append(f"{pct(frac(m, test, tm))} / {pct(frac(m, test, lm))}")
        print("| " + " | ".join(row + fr) + " |")
    print()
    print("t/s: median of all repetitions of all rounds (min-max in brackets). Ceilings measured by "
          "`tandem bench ceilings` before / after the runs: "
          + ", ".join(f"{c['read_gbs']:.1f} GB/s read, {c['fma_gflops']:.1f} GFLOP/s FP32 FMA ({c['fma_isa']}), "
                      f"{c.get('int8_giops', 0):.0f} GOP/s int8, {c.get('bf16_gflops', 0):.0f} GFLOP/s BF16"
                      for c in ceil)
          + f"; the fractions use the best of them (pp: int8 for Q8_0/Q4_0/Q5_0/Q4_K/Q6_K, BF16 for BF16, else FP32). pp work = 2 x matmul parameters x tokens + attention + "
          "one output row; tg bytes = every weight once per token + the f32 KV cache read.")


if __name__ == "__main__":
    main()
