"""Expected NLLs for tests/unit/test_eval.c, from the PyTorch oracle's saved log-softmax rows.

make_models.py stores, per reference model, log_softmax(logits) at every position of each prompt
as raw float32 [n_tokens, vocab] (oracle/<tag>.<prompt>.f32), computed in float64 by model_ref.py.
A window equal to prompt[0..T] has NLL sum = -sum_{i<T} row[i][prompt[i+1]]; this prints those
sums as JSON for the requested models and window lengths. Standard library only.

usage: eval_oracle.py REF_DIR PROMPT NAME[,NAME...] T[,T...]
  -> {"prompt": [...], "models": {NAME: {"path": ..., "sum": {"T": nll_sum, ...}}}}
"""
import array
import json
import os
import sys


def main():
    ref, prompt_name, names, ts = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(",")
    with open(os.path.join(ref, "oracle.json")) as f:
        idx = json.load(f)
    vocab = idx["vocab_size"]
    prompt = idx["prompts"][prompt_name]
    out = {"prompt": prompt, "vocab_size": vocab, "models": {}}
    for m in idx["models"]:
        if m["name"] not in names:
            continue
        rows = array.array("f")
        with open(os.path.join(ref, m["logprobs"][prompt_name]), "rb") as f:
            rows.frombytes(f.read())
        if sys.byteorder != "little":
            rows.byteswap()
        assert len(rows) == len(prompt) * vocab, "oracle rows have the wrong size"
        sums = {}
        for t in ts:
            T = int(t)
            assert 0 < T < len(prompt)
            sums[t] = -sum(float(rows[i * vocab + prompt[i + 1]]) for i in range(T))
        out["models"][m["name"]] = {"path": m["path"], "sum": sums}
    missing = [n for n in names if n not in out["models"]]
    if missing:
        sys.exit("eval_oracle.py: no such models in oracle.json: " + ",".join(missing))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
