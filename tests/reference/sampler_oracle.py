"""Oracle for tandem's sampler: the filtered next-token distribution, computed in torch with the
semantics of Hugging Face's logits processors/warpers (RepetitionPenalty, Temperature, TopK, TopP,
MinP, in generate()'s order) plus OpenAI's presence/frequency penalties and logit_bias.

Also the processed log-probabilities td_sampler_logprob returns (temperature 0 processed as 1, the
filters applied; null where a filter removes the token) and, for two kept tokens, their gradient with
respect to the raw logits by torch autograd through the same function.

Writes a JSON list of cases: {vocab, logits, params, prompt, output, probs, logprobs, grad_tokens,
grads}.
"""
import argparse
import json
import os

import torch


def processed_logits(logits, p, prompt, output, greedy_as_one=False):
    """Bias, penalties, temperature, then the filters as -inf: differentiable in logits."""
    x = logits.clone().double()
    for tok, b in p["logit_bias"]:
        x[tok] += b
    if p["repetition_penalty"] != 1.0:
        ids = torch.tensor(sorted(set(prompt + output)), dtype=torch.long)
        if len(ids):
            s = x[ids]
            x[ids] = torch.where(s < 0, s * p["repetition_penalty"], s / p["repetition_penalty"])
    if output:
        counts = torch.bincount(torch.tensor(output), minlength=len(x)).double()
        x -= counts * p["frequency_penalty"] + (counts > 0).double() * p["presence_penalty"]
    if p["temperature"] == 0 and not greedy_as_one:
        return x, True
    if p["temperature"] != 0:
        x = x / p["temperature"]
    if p["top_k"] > 0:
        kth = torch.topk(x, min(p["top_k"], len(x))).values[-1]
        x = torch.where(x < kth, torch.tensor(-float("inf"), dtype=x.dtype), x)
    if p["top_p"] < 1.0:
        sx, si = torch.sort(x, descending=False)
        cum = torch.softmax(sx, -1).cumsum(-1)
        remove = cum <= 1 - p["top_p"]
        remove[-1] = False
        x = x.clone()
        x[si[remove]] = -float("inf")
    if p["min_p"] > 0:
        pr = torch.softmax(x, -1)
        x = torch.where(pr < p["min_p"] * pr.max(), torch.tensor(-float("inf"), dtype=x.dtype), x)
    return x, False


def reference_probs(logits, p, prompt, output):
    x, greedy = processed_logits(logits, p, prompt, output)
    if greedy:
        out = torch.zeros_like(x)
        out[torch.argmax(x)] = 1
        return out
    return torch.softmax(x, -1)


def reference_logprobs(logits, p, prompt, output):
    """log_softmax over the kept set (temperature 0 as 1); the kept mask."""
    x, _ = processed_logits(logits, p, prompt, output, greedy_as_one=True)
    return torch.log_softmax(x, -1), torch.isfinite(x)


def reference_grad(logits, p, prompt, output, token):
    """d logprob[token] / d raw logits by autograd; the masks are constants of the function."""
    l = logits.clone().double().requires_grad_(True)
    x, _ = processed_logits(l, p, prompt, output, greedy_as_one=True)
    torch.log_softmax(x, -1)[token].backward()
    return l.grad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".cache/sampler_oracle.json")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(1234)
    cases = []
    grid = [
        dict(temperature=1.0), dict(temperature=0.7), dict(temperature=0.0),
        dict(top_k=5), dict(top_k=1, temperature=0.8), dict(top_p=0.9), dict(top_p=0.3, temperature=1.3),
        dict(min_p=0.1), dict(min_p=0.05, top_p=0.95, top_k=40, temperature=0.9),
        dict(repetition_penalty=1.3), dict(repetition_penalty=0.8, temperature=0.6),
        dict(presence_penalty=1.5), dict(frequency_penalty=0.7, presence_penalty=-0.5),
        dict(logit_bias=[[3, 5.0], [7, -100.0]]),
        dict(logit_bias=[[11, 2.0]], repetition_penalty=1.2, frequency_penalty=0.4, top_p=0.8, min_p=0.02),
    ]
    for vocab in (50, 1000):
        for over in grid:
            p = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                     presence_penalty=0.0, frequency_penalty=0.0, logit_bias=[])
            p.update(over)
            logits = (torch.randn(vocab, generator=g) * 3).float()
            prompt = torch.randint(0, vocab, (12,), generator=g).tolist()
            output = torch.randint(0, vocab, (9,), generator=g).tolist() + [prompt[0]] * 2
            probs = reference_probs(logits, p, prompt, output)
            lp, kept = reference_logprobs(logits, p, prompt, output)
            kept_ids = torch.nonzero(kept).flatten()
            order = kept_ids[torch.argsort(lp[kept_ids], descending=True)].tolist()
            grad_tokens = sorted(set([order[0], order[len(order) // 2], order[-1]]))[:2]
            grads = [reference_grad(logits, p, prompt, output, t).tolist() for t in grad_tokens]
            cases.append(dict(vocab=vocab, logits=logits.tolist(), params=p, prompt=prompt,
                              output=output, probs=probs.tolist(),
                              logprobs=[v if k else None for v, k in zip(lp.tolist(), kept.tolist())],
                              grad_tokens=grad_tokens, grads=grads))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(cases, f)


if __name__ == "__main__":
    main()
