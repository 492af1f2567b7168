"""PyTorch oracle for tandem's trainer (test_train_oracle): float64 forward, autograd gradients and
torch.optim.AdamW steps on small random Llama-family models.

For each config it writes, under OUT/<name>/ (OUT = $TANDEM_TEST_DATA/train_oracle or
.cache/train_oracle):
  model/                 an HF directory (config.json + model.safetensors, f32) both sides start from
  oracle.safetensors     f32 tensors:
    tokens, targets      [STEPS, ACCUM, B*T] (ids as floats; -1 targets are ignored)
    logits               [B*T, V]  initial weights, micro-batch (0, 0)
    loss                 [1]       mean cross-entropy of that micro-batch
    grad.<hf name>       d loss / d param for that micro-batch
    step_loss, step_norm [STEPS]   mean loss over the step's ACCUM micro-batches, grad norm pre-clip
    final.<hf name>      the weights after STEPS AdamW steps (accumulation, clipping, warm-up+cosine)
The hyper-parameters below are repeated in tests/unit/test_train_oracle.c: change both together.
Written from the papers and torch's documented semantics; the forward mirrors model_ref.py.
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_writer as S  # noqa: E402
from model_ref import RefConfig, apply_rope, rms_norm, rope_inv_freq  # noqa: E402

torch.set_default_dtype(torch.float64)
DT = torch.float64

B, T, STEPS, ACCUM = 2, 8, 4, 2
MAX_LR, MIN_LR, WARMUP, TOTAL = 3e-3, 3e-4, 2, 6
BETAS, EPS, WD, CLIP = (0.9, 0.95), 1e-8, 0.1, 0.5

# name, model_type, vocab, hidden, layers, heads, kv heads, head_dim (None: hidden/heads), ffn, tied,
# rope_scaling
CONFIGS = [
    ("mha_untied", "llama", 64, 32, 2, 4, 4, None, 48, False, None),
    ("gqa_tied", "llama", 64, 32, 2, 4, 2, None, 40, True,
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0,
      "original_max_position_embeddings": 32}),
    ("qwen3_hd12", "qwen3", 48, 32, 2, 4, 2, 12, 40, False, None),
    ("qwen2_bias", "qwen2", 48, 24, 1, 4, 2, None, 32, True, None),
]


def param_names(c: RefConfig):
    """HF names in tandem's buffer order."""
    names = ["model.embed_tokens.weight"]
    for l in range(c.n_layers):
        p = f"model.layers.{l}."
        names.append(p + "input_layernorm.weight")
        for x in ("q", "k", "v"):
            names.append(p + f"self_attn.{x}_proj.weight")
            if c.qkv_bias:
                names.append(p + f"self_attn.{x}_proj.bias")
        if c.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names += [p + "self_attn.o_proj.weight", p + "post_attention_layernorm.weight",
                  p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
    names.append("model.norm.weight")
    if not c.tie_embeddings:
        names.append("lm_head.weight")
    return names


def shapes(c: RefConfig):
    d, qd, kvd = c.hidden_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    sh = {}
    for n in param_names(c):
        if n.endswith("norm.weight") or n.endswith("layernorm.weight"):
            sh[n] = (c.head_dim,) if ("q_norm" in n or "k_norm" in n) else (d,)
        elif n.endswith(".bias"):
            sh[n] = (qd,) if "q_proj" in n else (kvd,)
        elif "q_proj" in n:
            sh[n] = (qd, d)
        elif "k_proj" in n or "v_proj" in n:
            sh[n] = (kvd, d)
        elif "o_proj" in n:
            sh[n] = (d, qd)
        elif "gate_proj" in n or "up_proj" in n:
            sh[n] = (c.ffn_dim, d)
        elif "down_proj" in n:
            sh[n] = (d, c.ffn_dim)
        else:  # embeddings, lm_head
            sh[n] = (c.vocab_size, d)
    return sh


def init_weights(c: RefConfig, rng):
    """HF-like init (normal 0.02) scaled up so the gradients are not tiny; norms near 1 and biases
    non-zero so that their gradients are exercised."""
    w = {}
    for n, s in shapes(c).items():
        if n.endswith("norm.weight") or n.endswith("layernorm.weight"):
            w[n] = (1.0 + 0.2 * rng.standard_normal(s)).astype(np.float32)
        elif n.endswith(".bias"):
            w[n] = (0.1 * rng.standard_normal(s)).astype(np.float32)
        else:
            w[n] = (0.2 * rng.standard_normal(s)).astype(np.float32)
    return w


def forward(c: RefConfig, w, tokens, inv_freq):
    """tokens (B, T) long -> logits (B, T, V)."""
    Bn, Tn = tokens.shape
    pos = torch.arange(Tn)
    x = w["model.embed_tokens.weight"][tokens]  # (B, T, D)
    causal = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    g = c.n_heads // c.n_kv_heads
    for l in range(c.n_layers):
        p = f"model.layers.{l}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], c.rms_eps)

        def lin(v, name):
            y = v @ w[p + name + ".weight"].T
            return y + w[p + name + ".bias"] if c.qkv_bias and name[-6:] in ("q_proj", "k_proj", "v_proj") else y
        q = lin(h, "self_attn.q_proj").view(Bn, Tn, c.n_heads, c.head_dim).transpose(1, 2)
        k = lin(h, "self_attn.k_proj").view(Bn, Tn, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = lin(h, "self_attn.v_proj").view(Bn, Tn, c.n_kv_heads, c.head_dim).transpose(1, 2)
        if c.qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], c.rms_eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], c.rms_eps)
        q = apply_rope(q, pos, inv_freq)
        k = apply_rope(k, pos, inv_freq)
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
        s = s.masked_fill(~causal, float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(Bn, Tn, c.n_heads * c.head_dim)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_eps)
        gt = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gt) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], c.rms_eps)
    head = w["model.embed_tokens.weight"] if c.tie_embeddings else w["lm_head.weight"]
    return x @ head.T


def loss_sum(c, w, tokens, targets, inv_freq):
    logits = forward(c, w, tokens, inv_freq)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, c.vocab_size), targets.reshape(-1),
                                             ignore_index=-1, reduction="sum"), logits


def lr_at(step):
    if step < WARMUP:
        return MAX_LR * (step + 1) / WARMUP
    prog = (step - WARMUP) / (TOTAL - WARMUP)
    return MIN_LR + 0.5 * (MAX_LR - MIN_LR) * (1 + math.cos(math.pi * prog))


def hf_config(spec, c):
    name, mt, V, D, L, H, KV, hd, F, tied, rs = spec
    cfg = {"architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                              "qwen3": "Qwen3ForCausalLM"}[mt]],
           "model_type": mt, "vocab_size": V, "hidden_size": D, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": KV, "intermediate_size": F,
           "max_position_embeddings": 64, "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta,
           "tie_word_embeddings": tied, "hidden_act": "silu", "torch_dtype": "float32",
           "bos_token_id": 1, "eos_token_id": 2}
    if hd is not None:
        cfg["head_dim"] = hd
    if rs:
        cfg["rope_scaling"] = rs
    return cfg


def run(spec, out):
    name, mt, V, D, L, H, KV, hd, F, tied, rs = spec
    c = RefConfig(vocab_size=V, hidden_size=D, n_layers=L, n_heads=H, n_kv_heads=KV,
                  head_dim=hd if hd else D // H, ffn_dim=F, rms_eps=1e-5, rope_theta=10000.0,
                  rope_scaling=rs, qkv_bias=mt == "qwen2", qk_norm=mt == "qwen3", tie_embeddings=tied)
    seed = sum(ord(ch) for ch in name)
    rng = np.random.default_rng(seed)
    w0 = init_weights(c, rng)
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "model"), exist_ok=True)
    with open(os.path.join(d, "model", "config.json"), "w") as f:
        json.dump(hf_config(spec, c), f, indent=1)
    stored = S.write(os.path.join(d, "model", "model.safetensors"), w0, "F32", {"format": "pt"})

    tokens = rng.integers(0, V, size=(STEPS, ACCUM, B, T))
    targets = np.concatenate([tokens[..., 1:], rng.integers(0, V, size=(STEPS, ACCUM, B, 1))], axis=-1)
    targets[..., 0, 3] = -1  # ignored targets
    targets[..., 1, 5] = -1
    inv_freq = rope_inv_freq(c)

    w = {n: torch.tensor(stored[n], dtype=DT, requires_grad=True) for n in param_names(c)}
    res = {"tokens": tokens.reshape(STEPS, ACCUM, B * T).astype(np.float32),
           "targets": targets.reshape(STEPS, ACCUM, B * T).astype(np.float32)}
    tk = torch.as_tensor(tokens[0, 0])
    tg = torch.as_tensor(targets[0, 0])
    s, logits = loss_sum(c, w, tk, tg, inv_freq)
    n = int((tg >= 0).sum())
    (s / n).backward()
    res["logits"] = logits.detach().reshape(B * T, V).numpy().astype(np.float32)
    res["loss"] = np.array([float(s) / n], dtype=np.float32)
    for nm in param_names(c):
        res["grad." + nm] = w[nm].grad.numpy().astype(np.float32)
        w[nm].grad = None

    decay = [w[nm] for nm in param_names(c) if not (nm.endswith("norm.weight") or nm.endswith(".bias"))]
    no_decay = [w[nm] for nm in param_names(c) if nm.endswith("norm.weight") or nm.endswith(".bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=MAX_LR, betas=BETAS, eps=EPS, foreach=False)
    step_loss, step_norm = [], []
    for st in range(STEPS):
        opt.zero_grad()
        cnt = int((torch.as_tensor(targets[st]) >= 0).sum())
        tot = 0.0
        for a in range(ACCUM):
            s, _ = loss_sum(c, w, torch.as_tensor(tokens[st, a]), torch.as_tensor(targets[st, a]), inv_freq)
            (s / cnt).backward()
            tot += float(s)
        norm = torch.nn.utils.clip_grad_norm_(list(w.values()), CLIP)
        for gr in opt.param_groups:
            gr["lr"] = lr_at(st)
        opt.step()
        step_loss.append(tot / cnt)
        step_norm.append(float(norm))
    res["step_loss"] = np.array(step_loss, dtype=np.float32)
    res["step_norm"] = np.array(step_norm, dtype=np.float32)
    for nm in param_names(c):
        res["final." + nm] = w[nm].detach().numpy().astype(np.float32)
    S.write(os.path.join(d, "oracle.safetensors"), res, "F32")


def main():
    out = os.path.join(os.environ.get("TANDEM_TEST_DATA") or ".cache", "train_oracle")
    os.makedirs(out, exist_ok=True)
    for spec in CONFIGS:
        run(spec, out)
    print(f"train_ref: wrote {len(CONFIGS)} configs under {out}")


if __name__ == "__main__":
    main()
