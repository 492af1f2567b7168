"""The Llama-family forward pass in plain PyTorch: tandem's numerical oracle.

Written from the papers and the Hugging Face model definitions' documented behaviour (Llama, Mistral,
Qwen2, Qwen3), not copied from them, and kept deliberately simple: one sequence, no KV cache, float64
throughout so that it is an accurate reference for tandem's float32 arithmetic. Weights use Hugging
Face names and layouts (rotate_half RoPE, [out, in] linear weights). It is not fast and not a trainer.

Optionally (RefModel's `act`) it emulates llama.cpp-style low-precision activations in front of chosen
matmuls, the semantics of tandem's avx512-int8 kernel set (docs/kernels.md): "q8" quantizes each
32-element block of an activation row to int8 with an f32 scale, "bf16" rounds activations to bfloat16.
"""
import math
from dataclasses import dataclass, field
from typing import Optional

import torch

DTYPE = torch.float64


@dataclass
class RefConfig:
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # HF config.json's rope_scaling (llama3 or linear)
    qkv_bias: bool = False               # Qwen2
    qk_norm: bool = False                # Qwen3
    tie_embeddings: bool = False
    max_pos: int = 512
    extra: dict = field(default_factory=dict)


def rope_inv_freq(cfg: RefConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] after rope scaling.

    llama3 follows transformers' _compute_llama3_parameters: wavelengths shorter than
    orig/high_freq_factor keep their frequency, longer than orig/low_freq_factor are divided by
    `factor`, and the band between is interpolated smoothly. linear divides every frequency by factor
    (equivalently, positions are divided by factor).
    """
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=DTYPE) / d))
    rs = cfg.rope_scaling
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    factor = float(rs["factor"])
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        low = float(rs.get("low_freq_factor", 1.0))
        high = float(rs.get("high_freq_factor", 4.0))
        old_ctx = float(rs.get("original_max_position_embeddings", 8192))
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, inv_l)
    raise ValueError(f"unsupported rope scaling {kind}")


def llama3_rope_factors(cfg: RefConfig) -> torch.Tensor:
    """The divisors llama.cpp stores as `rope_freqs.weight`: inv_freq / factors == rope_inv_freq."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=DTYPE) / d))
    return inv / rope_inv_freq(cfg)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # x: (..., n); normalised over the last dimension, then scaled elementwise by w: (n,)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    # x: (heads, T, head_dim); pos: (T,). HF pairs dimension i with i + head_dim/2.
    ang = pos.to(DTYPE)[:, None] * inv_freq[None, :]  # (T, head_dim/2), radians
    emb = torch.cat((ang, ang), dim=-1)                # (T, head_dim)
    return x * emb.cos() + rotate_half(x) * emb.sin()


def act_q8(x: torch.Tensor) -> torch.Tensor:
    """x: (..., n), n a multiple of 32 -> the values an int8-quantized activation row stands for.

    The kernel sees x in float32 and, per 32-element block, computes in float32: amax = max|x|,
    dx = amax / 127, q = round_half_even(x * (127 / amax)) (0 when amax == 0); the block then means
    q * dx exactly (the integer dot and the scales are exact up to the f32 summation that every
    kernel has). The same float32 operations here (IEEE, correctly rounded) give the same q."""
    shape = x.shape
    b = x.to(torch.float32).reshape(*shape[:-1], shape[-1] // 32, 32)
    amax = b.abs().amax(dim=-1, keepdim=True)               # float32
    dx = amax / torch.tensor(127.0, dtype=torch.float32)    # float32 division
    pos = amax > 0
    inv = torch.where(pos, torch.tensor(127.0, dtype=torch.float32) / torch.where(pos, amax, 1.0),
                      torch.zeros_like(amax))               # 127 / amax in float32
    q = torch.round(b * inv)                                # float32 product, half to even
    return (q.to(DTYPE) * dx.to(DTYPE)).reshape(shape)


def act_q8k(x: torch.Tensor) -> torch.Tensor:
    """x: (..., n), n a multiple of 256 -> the values a Q8_K-quantized activation row stands for
    (in front of Q4_K / Q6_K matmuls). Per 256-element block, in float32: amax = max|x|, iscale =
    127 / amax, q = min(127, round_half_even(x * iscale)), d = 1 / iscale; the block means d * q.
    (ggml takes iscale = -127 / the largest-magnitude element: q and d both change sign, d * q not.)"""
    shape = x.shape
    b = x.to(torch.float32).reshape(*shape[:-1], shape[-1] // 256, 256)
    amax = b.abs().amax(dim=-1, keepdim=True)
    pos = amax > 0
    one = torch.tensor(1.0, dtype=torch.float32)
    iscale = torch.where(pos, torch.tensor(127.0, dtype=torch.float32) / torch.where(pos, amax, one),
                         torch.zeros_like(amax))
    q = torch.clamp(torch.round(b * iscale), max=127.0)
    d = torch.where(pos, one / torch.where(pos, iscale, one), torch.zeros_like(amax))
    return (q.to(DTYPE) * d.to(DTYPE)).reshape(shape)


def act_bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to float32, then to bfloat16 (round to nearest even), as vcvtne2ps2bf16 does."""
    return x.to(torch.float32).to(torch.bfloat16).to(DTYPE)


ACT_ROUND = {"q8": act_q8, "q8k": act_q8k, "bf16": act_bf16}


class RefModel:
    """weights: dict of HF tensor names -> float arrays (numpy or torch), exactly as stored.
    act: optional dict of HF weight names (".weight" included; the tied head is
    "model.embed_tokens.weight") -> "q8" or "bf16": the activation rounding applied to the input
    of that matmul (ACT_ROUND). Absent names, or act None, multiply the float64 activations."""

    def __init__(self, cfg: RefConfig, weights: dict, act: Optional[dict] = None):
        self.cfg = cfg
        self.w = {k: torch.as_tensor(v).to(DTYPE) for k, v in weights.items()}
        self.inv_freq = rope_inv_freq(cfg)
        self.act = act or {}

    def _round(self, x, wname):
        mode = self.act.get(wname)
        return ACT_ROUND[mode](x) if mode else x

    def _lin(self, x, name, bias=False):
        y = self._round(x, name + ".weight") @ self.w[name + ".weight"].T
        if bias:
            y = y + self.w[name + ".bias"]
        return y

    def forward(self, tokens) -> torch.Tensor:
        """tokens: list of ids at positions 0..T-1 -> logits (T, vocab) float64."""
        c, w = self.cfg, self.w
        T = len(tokens)
        pos = torch.arange(T)
        x = w["model.embed_tokens.weight"][torch.as_tensor(tokens, dtype=torch.long)]  # (T, dim)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        group = c.n_heads // c.n_kv_heads
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], c.rms_eps)
            q = self._lin(h, p + "self_attn.q_proj", c.qkv_bias)  # (T, n_heads*head_dim)
            k = self._lin(h, p + "self_attn.k_proj", c.qkv_bias)  # (T, n_kv*head_dim)
            v = self._lin(h, p + "self_attn.v_proj", c.qkv_bias)
            q = q.view(T, c.n_heads, c.head_dim).transpose(0, 1)     # (n_heads, T, head_dim)
            k = k.view(T, c.n_kv_heads, c.head_dim).transpose(0, 1)  # (n_kv, T, head_dim)
            v = v.view(T, c.n_kv_heads, c.head_dim).transpose(0, 1)
            if c.qk_norm:  # Qwen3: per-head RMSNorm over head_dim, before RoPE
                q = rms_norm(q, w[p + "self_attn.q_norm.weight"], c.rms_eps)
                k = rms_norm(k, w[p + "self_attn.k_norm.weight"], c.rms_eps)
            q = apply_rope(q, pos, self.inv_freq)
            k = apply_rope(k, pos, self.inv_freq)
            k = k.repeat_interleave(group, dim=0)  # query head j reads kv head j // group
            v = v.repeat_interleave(group, dim=0)
            s = (q @ k.transpose(1, 2)) / math.sqrt(c.head_dim)  # (n_heads, T, T)
            s = s.masked_fill(~causal, float("-inf"))
            a = torch.softmax(s, dim=-1) @ v                        # (n_heads, T, head_dim)
            a = a.transpose(0, 1).reshape(T, c.n_heads * c.head_dim)
            x = x + self._lin(a, p + "self_attn.o_proj")
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_eps)
            g = self._lin(h, p + "mlp.gate_proj")
            u = self._lin(h, p + "mlp.up_proj")
            x = x + self._lin(torch.nn.functional.silu(g) * u, p + "mlp.down_proj")
        x = rms_norm(x, w["model.norm.weight"], c.rms_eps)
        hname = "model.embed_tokens.weight" if c.tie_embeddings else "lm_head.weight"
        return self._round(x, hname) @ w[hname].T

    def logprobs(self, tokens) -> torch.Tensor:
        return torch.log_softmax(self.forward(tokens), dim=-1)

    def greedy(self, prompt, n):
        """Argmax continuation of n tokens (full recompute each step: simple, and small models).
        Returns (tokens, logprob of each chosen token, top1-top2 logit margin at each step)."""
        toks, out, lps, margins = list(prompt), [], [], []
        for _ in range(n):
            lp = self.logprobs(toks)[-1]
            top2 = torch.topk(lp, 2)
            t = int(top2.indices[0])
            out.append(t)
            lps.append(float(top2.values[0]))
            margins.append(float(top2.values[0] - top2.values[1]))
            toks.append(t)
        return out, lps, margins
