#!/usr/bin/python3
"""Oracle for tests/unit/test_loadgen_stats.c: numpy summary statistics (mean, std, median,
np.percentile with the default linear method) on awkward arrays, and the serving metrics of
`vllm bench serve` (calculate_metrics: TTFT, TPOT, ITL, E2EL, throughputs, goodput, peak output
rate and peak concurrency) computed with numpy from synthetic per-request records.

    /usr/bin/python3 tests/reference/loadgen_oracle.py --out .cache/loadgen_oracle.json
"""
import argparse
import json
import math
import os

import numpy as np

PCTS = [0, 1, 25, 50, 90, 99, 99.9, 100]


def stats_case(x):
    xs = list(map(float, x))
    return {
        "x": xs,
        "pcts": PCTS,
        "mean": float(np.mean(xs or 0)),
        "std": float(np.std(xs or 0)),
        "median": float(np.median(xs or 0)),
        "percentiles": [float(np.percentile(xs or 0, p)) for p in PCTS],
    }


def synth_requests(rng, n, fail_rate, one_token_rate, no_usage_rate):
    reqs = []
    for i in range(n):
        success = bool(rng.random() >= fail_rate)
        out = 1 if rng.random() < one_token_rate else int(rng.integers(2, 40))
        start = float(rng.uniform(0, 5))
        ttft = float(rng.uniform(0.01, 1.5))
        # chunks may bundle tokens: fewer chunks than tokens sometimes
        chunks = out if rng.random() < 0.7 else max(1, out - int(rng.integers(0, out)))
        itl = [float(v) for v in rng.exponential(0.03, size=chunks - 1)]
        latency = ttft + float(sum(itl))
        usage = 0 if rng.random() < no_usage_rate else out
        reqs.append({"success": success, "prompt_len": int(rng.integers(1, 2000)), "usage_tokens": usage,
                     "chunks": chunks, "start": start, "ttft": ttft, "latency": latency, "itl": itl})
    return reqs


def vllm_metrics(reqs, dur, slo, pcts):
    """The definitions of vllm/benchmarks/serve.py calculate_metrics, with the output length taken
    from usage when reported, else from the number of token-carrying chunks."""
    out_lens, total_input, completed, good = [], 0, 0, 0
    itls, tpots, all_tpots, ttfts, e2els = [], [], [], [], []
    for r in reqs:
        if r["success"]:
            out = r["usage_tokens"] or r["chunks"]
            out_lens.append(out)
            total_input += r["prompt_len"]
            tpot = 0.0
            if out > 1:
                tpot = (r["latency"] - r["ttft"]) / (out - 1)
                tpots.append(tpot)
            all_tpots.append(tpot)
            itls += r["itl"]
            ttfts.append(r["ttft"])
            e2els.append(r["latency"])
            completed += 1
        else:
            out_lens.append(0)
    if slo:
        valid, vals = [], []
        if slo.get("ttft") is not None:
            valid.append(ttfts)
            vals.append(slo["ttft"] / 1000)
        if slo.get("tpot") is not None:
            valid.append(all_tpots)
            vals.append(slo["tpot"] / 1000)
        if slo.get("e2el") is not None:
            valid.append(e2els)
            vals.append(slo["e2el"] / 1000)
        for m in zip(*valid):
            if all(s >= v for s, v in zip(vals, m)):
                good += 1
    ok = [r for r in reqs if r["success"]]
    max_tok, peak = 0.0, 0
    if ok:
        t0 = min(r["start"] for r in ok)
        t1 = max(r["start"] + r["latency"] for r in ok)
        nb = int(np.ceil(t1 - t0)) + 1
        buckets = np.zeros(nb)
        for r in ok:
            t = r["start"] + r["ttft"]
            times = [t]
            for g in r["itl"]:
                t += g
                times.append(t)
            for tt in times:
                b = int(tt - t0)
                if 0 <= b < nb:
                    buckets[b] += 1
        max_tok = float(np.max(buckets))
        ev = sorted([(r["start"], 1) for r in ok] + [(r["start"] + r["latency"], -1) for r in ok])
        cur = 0
        for _, d in ev:
            cur += d
            peak = max(peak, cur)

    def summ(x):
        return {"mean": float(np.mean(x or 0) * 1000), "std": float(np.std(x or 0) * 1000),
                "median": float(np.median(x or 0) * 1000),
                "pct": [float(np.percentile(x or 0, p) * 1000) for p in pcts]}

    return {
        "completed": completed, "failed": len(reqs) - completed, "total_input": total_input,
        "total_output": int(sum(out_lens)), "output_lens": out_lens,
        "request_throughput": completed / dur, "request_goodput": good / dur,
        "output_throughput": sum(out_lens) / dur, "total_token_throughput": (total_input + sum(out_lens)) / dur,
        "max_output_tokens_per_s": max_tok, "max_concurrent_requests": peak,
        "ttft": summ(ttfts), "tpot": summ(tpots), "itl": summ(itls), "e2el": summ(e2els),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(1234)
    stats = [
        stats_case([]),
        stats_case([3.5]),
        stats_case([2.0, 1.0]),
        stats_case([5, 5, 5, 1, 1, 9]),
        stats_case(rng.exponential(0.05, size=7)),
        stats_case(rng.normal(100, 30, size=100)),
        stats_case(rng.uniform(0, 1, size=1001)),
        stats_case(np.concatenate([np.full(50, 0.02), rng.exponential(1.0, size=3)])),
    ]
    metrics = []
    for k, (n, fail, one, nousage, slo, pcts) in enumerate([
        (40, 0.0, 0.0, 0.0, None, [99]),
        (60, 0.2, 0.1, 0.3, {"ttft": 800.0, "tpot": 35.0}, [50, 90, 99]),
        (25, 0.1, 0.2, 0.0, {"e2el": 1500.0}, [99, 99.9]),
        (30, 0.0, 0.0, 0.5, {"ttft": 1000.0, "tpot": 40.0, "e2el": 2000.0}, [25, 75]),
        (10, 1.0, 0.0, 0.0, {"ttft": 100.0}, [99]),  # everything failed
    ]):
        reqs = synth_requests(rng, n, fail, one, nousage)
        dur = max([r["start"] + r["latency"] for r in reqs]) + 0.1
        metrics.append({"requests": reqs, "duration": dur, "slo": slo, "pcts": pcts,
                        "expected": vllm_metrics(reqs, dur, slo, pcts)})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"stats": stats, "metrics": metrics}, f)


if __name__ == "__main__":
    main()
