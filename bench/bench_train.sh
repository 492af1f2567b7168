#!/usr/bin/env bash
# Training throughput, tandem vs PyTorch eager, on the same Llama shapes in one run: a ~124M
# (GPT-2-small-sized: dim 768, 12 layers, 12 heads, SwiGLU ffn 2048, vocab 32000, tied) and a ~30M
# (dim 384, 8 layers, 6 heads, ffn 1024, vocab 32000, tied) model, batch 8 x 256, 2 threads, AdamW,
# random tokens; FP32 and BF16 (tandem --bf16; torch.autocast('cpu', bfloat16)), and tandem with
# --gemm dnnl (OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive). The sides run interleaved (tandem, torch,
# tandem, torch, ...), a warm-up step then timed steps each. Per timed step it records wall time and
# the process's CPU time (tandem: /proc/PID/stat sampled as each metrics line appears; torch:
# time.process_time()), and reports tokens/s by wall clock and "CPU-normalized" tokens/s = tokens /
# (CPU seconds / 2), what two cores of its own would give; MFU = tokens/s * (6 N + 12 L D T) / peak,
# N the parameters (tied: the head counted once, the embedding lookup is free), peak from
# `tandem bench ceilings` (AVX-512 FMA and BF16 dot-product peaks on THREADS threads, wall clock).
# Usage: bench/bench_train.sh [build-dir=build]   (env: SIZES="30m 124m", ROUNDS_30M=2,
#        ROUNDS_124M=1, STEPS_30M=2, STEPS_124M=1, WARMUP=1, DNNL=1, TORCH_FP32=1, OUT=.cache/bench_train)
# Not a test: figures depend on the machine and its load.
set -euo pipefail
BUILD=${1:-build}
OUT=${OUT:-.cache/bench_train}
mkdir -p "$OUT"
for b in tandem bench_train_data; do
    [ -x "$BUILD/$b" ] || { echo "bench_train.sh: $BUILD/$b missing (build first)" >&2; exit 1; }
done
[ -f "$OUT/rand32k.tdsh" ] || "$BUILD/bench_train_data" "$OUT/rand32k.tdsh" 32000 200000
export BUILD OUT
exec /usr/bin/python3 - <<'PY'
import datetime, json, os, subprocess, sys, time

B, T, THREADS = 8, 256, 2
BUILD, OUT = os.environ["BUILD"], os.environ["OUT"]
SHARD = f"{OUT}/rand32k.tdsh"
WARMUP = int(os.environ.get("WARMUP", 1))
SIZES = {  # name: (dim, layers, heads, ffn)
    "tiny": (128, 2, 2, 384),  # smoke test of the script
    "30m": (384, 8, 6, 1024),
    "124m": (768, 12, 12, 2048),
}
DNNL = os.environ.get("DNNL", "1") == "1"
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / TICK  # utime + stime, every thread


def run_tandem(shape, steps, prec, gemm):
    dim, layers, heads, ffn = shape
    metrics = f"{OUT}/metrics-{os.getpid()}.jsonl"
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [f"{BUILD}/tandem", "train", "--dim", str(dim), "--layers", str(layers), "--heads",
           str(heads), "--ffn", str(ffn), "--vocab", "32000", "--batch", str(B), "--seq-len", str(T),
           "--steps", str(WARMUP + steps), "--threads", str(THREADS), "--metrics", metrics, SHARD]
    env = dict(os.environ)
    if prec == "bf16":
        cmd.insert(2, "--bf16")
    if gemm == "dnnl":
        cmd[2:2] = ["--gemm", "dnnl"]
        env.update(OMP_NUM_THREADS=str(THREADS), OMP_WAIT_POLICY="passive")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    marks = []  # (lines seen, cpu seconds) when each metrics line appeared
    while p.poll() is None:
        try:
            n = sum(1 for _ in open(metrics))
        except FileNotFoundError:
            n = 0
        if n > len(marks):
            try:
                c = proc_cpu(p.pid)
            except (FileNotFoundError, ProcessLookupError):
                break
            marks += [c] * (n - len(marks))
        time.sleep(0.05)
    out = p.communicate()[0]
    if p.returncode != 0:
        raise SystemExit(f"tandem failed: {' '.join(cmd)}\n{out}")
    lines = [json.loads(l) for l in open(metrics)]
    os.remove(metrics)
    params = int(out.split("train: ")[1].split(" parameters")[0])
    el = [l["elapsed_s"] for l in lines]
    wall = el[-1] - el[WARMUP - 1] if WARMUP else el[-1]
    cpu = marks[WARMUP + steps - 1] - marks[WARMUP - 1] if WARMUP and len(marks) >= WARMUP + steps \
        else float("nan")
    return dict(params=params, wall_s=wall, cpu_s=cpu, steps=steps,
                loss=[l["loss"] for l in lines], cmd=" ".join(cmd))


def run_torch(shape, steps, prec):
    dim, layers, heads, ffn = shape
    cmd = ["/usr/bin/python3", "bench/train_torch.py", "--dim", str(dim), "--layers", str(layers),
           "--heads", str(heads), "--ffn", str(ffn), "--vocab", "32000", "--batch", str(B), "--seq",
           str(T), "--threads", str(THREADS), "--warmup", str(WARMUP), "--steps", str(steps)]
    if prec == "bf16":
        cmd.append("--bf16")
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return dict(params=r["params"], wall_s=sum(r["step_s"]), cpu_s=sum(r["cpu_s"]), steps=steps,
                loss=r["loss"], cmd=" ".join(cmd), torch=r["torch"])


peak = json.loads(subprocess.run([f"{BUILD}/tandem", "bench", "ceilings", "-t", str(THREADS), "--json"],
                                 check=True, capture_output=True, text=True).stdout)["ceilings"]
print("peak:", json.dumps(peak), flush=True)
stamp = datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%MZ")
res_path = f"{OUT}/results-{stamp}.jsonl"
TORCH_FP32 = os.environ.get("TORCH_FP32", "1") == "1"  # 0: skip torch FP32 (one core here: minutes a step)
configs = [("tandem", "fp32", "kernels")] + ([("torch", "fp32", None)] if TORCH_FP32 else []) + \
    [("tandem", "bf16", "kernels"), ("torch", "bf16", None)] + ([("tandem", "fp32", "dnnl")] if DNNL else [])
rows = []
for size in os.environ.get("SIZES", "30m 124m").split():
    shape = SIZES[size]
    rounds = int(os.environ.get(f"ROUNDS_{size.upper()}", 2 if size == "30m" else 1))
    steps = int(os.environ.get(f"STEPS_{size.upper()}", 2 if size == "30m" else 1))
    for rnd in range(rounds):
        for side, prec, gemm in configs:
            load = os.getloadavg()[0]
            r = run_tandem(shape, steps, prec, gemm) if side == "tandem" else \
                run_torch(shape, steps, prec)
            dim, layers = shape[0], shape[1]
            fpt = 6 * r["params"] + 12 * layers * dim * T  # training flops per token
            tok = B * T * steps
            r.update(size=size, round=rnd, side=side, precision=prec, gemm=gemm, load=load,
                     tok_s_wall=tok / r["wall_s"], tok_s_cpu=tok / (r["cpu_s"] / THREADS),
                     flops_per_token=fpt)
            r["mfu_wall"] = r["tok_s_wall"] * fpt / (peak["fma_gflops"] * 1e9)
            r["mfu_cpu"] = r["tok_s_cpu"] * fpt / (peak["fma_gflops"] * 1e9)
            r["mfu_bf16_wall"] = r["tok_s_wall"] * fpt / (peak["bf16_gflops"] * 1e9)
            r["mfu_bf16_cpu"] = r["tok_s_cpu"] * fpt / (peak["bf16_gflops"] * 1e9)
            rows.append(r)
            with open(res_path, "a") as f:
                f.write(json.dumps(r) + "\n")
            print(f"{size} r{rnd} {side:6} {prec} {gemm or '':7} params {r['params']/1e6:.1f}M "
                  f"wall {r['tok_s_wall']:.0f} tok/s  cpu-normalized {r['tok_s_cpu']:.0f} tok/s  "
                  f"MFU {100*r['mfu_wall']:.1f}% / {100*r['mfu_cpu']:.1f}% (of BF16 peak "
                  f"{100*r['mfu_bf16_wall']:.1f}% / {100*r['mfu_bf16_cpu']:.1f}%)  load {load:.1f}",
                  flush=True)

print(f"\nresults: {res_path}\n")
print("| model | side | precision | tok/s wall (per round) | tok/s CPU-normalized | MFU wall | "
      "MFU CPU-normalized | MFU of BF16 peak, wall / CPU |")
print("|---|---|---|---|---|---|---|---|")
for size in dict.fromkeys(r["size"] for r in rows):
    for side, prec, gemm in configs:
        rs = [r for r in rows if r["size"] == size and r["side"] == side and r["precision"] == prec
              and r["gemm"] == gemm]
        if not rs:
            continue
        name = side + (" --gemm dnnl" if gemm == "dnnl" else "")
        pr = "BF16 autocast" if side == "torch" and prec == "bf16" else prec.upper()
        w = ", ".join(f"{r['tok_s_wall']:.0f}" for r in rs)
        c = ", ".join(f"{r['tok_s_cpu']:.0f}" for r in rs)
        mw = ", ".join(f"{100*r['mfu_wall']:.1f}%" for r in rs)
        mc = ", ".join(f"{100*r['mfu_cpu']:.1f}%" for r in rs)
        mb = ", ".join(f"{100*r['mfu_bf16_wall']:.1f}% / {100*r['mfu_bf16_cpu']:.1f}%" for r in rs)
        print(f"| {size} ({rs[0]['params']/1e6:.1f}M) | {name} | {pr} | {w} | {c} | {mw} | {mc} | {mb} |")
PY
