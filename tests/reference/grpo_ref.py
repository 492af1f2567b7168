"""PyTorch oracle for tandem's GRPO step (test_rl_grpo): float64 autograd of the clipped,
importance-weighted policy-gradient loss with a k3 KL to a reference (src/rl/grpo.h), two epochs
over one batch with torch.optim.AdamW between them, on the small random model of train_ref.py's
"mha_untied" config.

Writes under OUT = $TANDEM_TEST_DATA/grpo_oracle (or .cache/grpo_oracle):
  model/, ref/            HF directories (f32): the policy and the frozen reference
  oracle.safetensors      f32 tensors:
    rows                  [R, T] input token rows (prompt ++ completion without its last token)
    meta                  [R, 2] n_prompt, n_out per row
    out                   [R, T] completion ids (padded with 0)
    behav                 [R, T] behaviour log-probabilities (the policy's own minus an offset, so
                          the importance weights vary and some are truncated)
    rewards, adv          [R]    group rewards (groups of G rows) and GRPO advantages
    old                   [R, T] epoch-0 log-probabilities
    loss0, kl0            [1]    epoch-0 mean token loss and mean k3 KL
    clip1                 [1]    fraction of epoch-1 tokens clipped
    grad.<hf name>        epoch 1's d loss / d param (what the gradient buffer holds at the end)
    final.<hf name>       the weights after the two AdamW steps
Hyper-parameters are repeated in tests/unit/test_rl_grpo.c: change both together.
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_writer as S  # noqa: E402
import train_ref as TR  # noqa: E402
from model_ref import RefConfig, rope_inv_freq  # noqa: E402

torch.set_default_dtype(torch.float64)

R, G, T = 4, 2, 10          # rows (samples), group size, tokens per row
TEMP = 0.7
EPS_LO, EPS_HI, KL, CAP = 0.2, 0.28, 0.1, 2.0
LR, BETAS, EPS, WD = 0.05, (0.9, 0.99), 1e-4, 0.0  # a large eps: tiny gradients take small steps
PROMPT = [3, 4, 3, 4]
NOUT = [5, 3, 6, 4]


def logprobs(c, w, rows, out, inv_freq):
    """[R, T] log-probabilities of each completion token under softmax(logits / TEMP)."""
    logits = TR.forward(c, w, rows, inv_freq) / TEMP
    lp = torch.log_softmax(logits, dim=-1)
    res = torch.zeros(R, T)
    for i in range(R):
        for j in range(NOUT[i]):
            res[i, j] = lp[i, PROMPT[i] - 1 + j, out[i, j]]
    return res


def mask():
    m = torch.zeros(R, T)
    for i in range(R):
        m[i, :NOUT[i]] = 1
    return m


def grpo_loss(lp, old, behav, ref, adv, msk):
    r = torch.exp(lp - old)
    w = torch.clamp(torch.exp(old - behav), max=CAP)
    a = adv[:, None]
    pg = -w * torch.minimum(r * a, torch.clamp(r, 1 - EPS_LO, 1 + EPS_HI) * a)
    d = ref - lp
    kl = torch.exp(d) - d - 1
    n = msk.sum()
    clipped = ((torch.clamp(r, 1 - EPS_LO, 1 + EPS_HI) * a < r * a) & (msk > 0)).sum() / n
    return ((pg + KL * kl) * msk).sum() / n, (kl * msk).sum() / n, clipped


def main():
    out_dir = os.path.join(os.environ.get("TANDEM_TEST_DATA") or ".cache", "grpo_oracle")
    spec = TR.CONFIGS[0]
    name, mt, V, D, L, H, KV, hd, F, tied, rs = spec
    c = RefConfig(vocab_size=V, hidden_size=D, n_layers=L, n_heads=H, n_kv_heads=KV, head_dim=D // H, ffn_dim=F,
                  rms_eps=1e-5, rope_theta=10000.0, rope_scaling=rs, qkv_bias=False, qk_norm=False,
                  tie_embeddings=tied)
    rng = np.random.default_rng(12345)
    w0 = TR.init_weights(c, rng)
    wref = {n: (v + 0.05 * rng.standard_normal(v.shape)).astype(np.float32) for n, v in w0.items()}
    import json
    stored = {}
    for sub, ws in (("model", w0), ("ref", wref)):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
        with open(os.path.join(out_dir, sub, "config.json"), "w") as f:
            json.dump(TR.hf_config(spec, c), f, indent=1)
        stored[sub] = S.write(os.path.join(out_dir, sub, "model.safetensors"), ws, "F32", {"format": "pt"})

    seqs = [rng.integers(0, V, size=PROMPT[i] + NOUT[i]) for i in range(R)]
    rows = np.zeros((R, T), dtype=np.int64)
    out = np.zeros((R, T), dtype=np.int64)
    for i in range(R):
        s = seqs[i]
        rows[i, :len(s) - 1] = s[:-1]
        out[i, :NOUT[i]] = s[PROMPT[i]:]
    inv_freq = rope_inv_freq(c)
    names = TR.param_names(c)
    w = {n: torch.tensor(stored["model"][n], dtype=torch.float64, requires_grad=True) for n in names}
    wr = {n: torch.tensor(stored["ref"][n], dtype=torch.float64) for n in names}
    rows_t, out_t, msk = torch.as_tensor(rows), torch.as_tensor(out), mask()

    with torch.no_grad():
        old = logprobs(c, w, rows_t, out_t, inv_freq)
        ref = logprobs(c, wr, rows_t, out_t, inv_freq)
    behav = ((old.float().double() + torch.as_tensor(rng.uniform(-1.0, 0.5, size=(R, T)))) * msk).float().double()
    old32 = old.float().double()  # tandem keeps the first epoch's log-probabilities as f32
    rewards = np.array([1.0, 0.1, 0.0, 1.0])
    adv = np.zeros(R)
    for g in range(R // G):
        x = rewards[g * G:(g + 1) * G]
        adv[g * G:(g + 1) * G] = (x - x.mean()) / (x.std(ddof=1) + 1e-6)
    adv = adv.astype(np.float32).astype(np.float64)  # tandem reads them as f32
    adv_t = torch.as_tensor(adv)

    opt = torch.optim.AdamW([w[n] for n in names], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    res = {}
    for epoch in range(2):
        opt.zero_grad()
        lp = logprobs(c, w, rows_t, out_t, inv_freq)
        if epoch == 0:
            lp_old = lp  # r is exactly 1 in the first epoch: old is lp itself (detached)
            loss, kl, _ = grpo_loss(lp, lp_old.detach(), behav, ref, adv_t, msk)
            res["loss0"] = np.array([float(loss)], dtype=np.float32)
            res["kl0"] = np.array([float(kl)], dtype=np.float32)
        else:
            loss, _, clipped = grpo_loss(lp, old32, behav, ref, adv_t, msk)
            res["clip1"] = np.array([float(clipped)], dtype=np.float32)
        loss.backward()
        if epoch == 1:
            for n in names:
                res["grad." + n] = w[n].grad.detach().numpy().astype(np.float32)
        opt.step()
    for n in names:
        res["final." + n] = w[n].detach().numpy().astype(np.float32)
    res["rows"] = rows.astype(np.float32)
    res["meta"] = np.array([[PROMPT[i], NOUT[i]] for i in range(R)], dtype=np.float32)
    res["out"] = out.astype(np.float32)
    res["behav"] = behav.numpy().astype(np.float32)
    res["rewards"] = rewards.astype(np.float32)
    res["adv"] = adv.astype(np.float32)
    res["old"] = old.numpy().astype(np.float32)
    S.write(os.path.join(out_dir, "oracle.safetensors"), res, "F32", {"format": "pt"})


if __name__ == "__main__":
    main()
