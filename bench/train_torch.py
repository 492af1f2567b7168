#!/usr/bin/python3
# PyTorch eager side of bench/bench_train.sh: the same Llama as `tandem train` builds (RMSNorm,
# RoPE (rotate-half), causal MHA, SwiGLU, tied embeddings, no biases), AdamW, random tokens; a few
# warm-up steps, then timed steps. FP32, or BF16 autocast on the CPU. Prints one JSON line: wall
# seconds and process CPU seconds of each timed step, tokens/s.
# Not a correctness oracle (tests/reference/ holds those); run with /usr/bin/python3 (Debian torch).
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.w


def rope_tables(T, hd, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
    f = torch.outer(torch.arange(T).float(), inv)  # [T, hd/2]
    emb = torch.cat([f, f], -1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


class Block(nn.Module):
    def __init__(self, d, h, f):
        super().__init__()
        self.h, self.hd = h, d // h
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate = nn.Linear(d, f, bias=False)
        self.up = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, D = x.shape
        xn = self.n1(x)
        q = self.q(xn).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k(xn).view(B, T, self.h, self.hd).transpose(1, 2)
        v = self.v(xn).view(B, T, self.h, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # torch 1.13 has no scaled_dot_product_attention: the eager formulation.
        s = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd) + mask
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.o(a)
        xn = self.n2(x)
        return x + self.down(F.silu(self.gate(xn)) * self.up(xn))


class Llama(nn.Module):
    def __init__(self, vocab, d, layers, heads, ffn, T):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, heads, ffn) for _ in range(layers)])
        self.norm = RMSNorm(d)
        cos, sin = rope_tables(T, d // heads)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.register_buffer("mask", torch.full((T, T), float("-inf")).triu(1))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, tgt):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin, self.mask)
        logits = F.linear(self.norm(x), self.emb.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="torch.autocast('cpu', bfloat16)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    m = Llama(a.vocab, a.dim, a.layers, a.heads, a.ffn, a.seq)
    n_params = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(2)
    data = torch.randint(0, a.vocab, (a.warmup + a.steps, a.batch, a.seq + 1), generator=g)
    times, cpus, losses = [], [], []
    for i in range(a.warmup + a.steps):
        x, y = data[i, :, :-1], data[i, :, 1:]
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = m(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)  # every thread of the process
    tok = a.batch * a.seq
    print(json.dumps({
        "side": "torch", "precision": "bf16-autocast" if a.bf16 else "fp32",
        "torch": torch.__version__, "threads": torch.get_num_threads(), "params": n_params,
        "tokens_per_step": tok, "step_s": times, "cpu_s": cpus,
        "tokens_per_s": tok * len(times) / sum(times), "best_tokens_per_s": tok / min(times),
        "loss": losses}))


if __name__ == "__main__":
    main()
