"""How well an export completes generated task documents of its training format, on unseen text.

    python scripts/task_accuracy.py --model runs/tiny-cpu-nope-tasks/hf [--docs 100] [--seed 7]

Documents: passkey, recall and repeat (default parameters) over data/sample/heldout/books.jsonl.zst
(never in the training shards). Per document, its last answer: `exact` = greedy decoding from the
document's prefix reproduces it (the repeat's first token is given: it has no marker), `token` =
teacher-forced argmax accuracy on the answer's tokens. Prints one JSON line.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF export folder")
    p.add_argument("--text", default="data/sample/heldout/books.jsonl.zst")
    p.add_argument("--tokenizer", default="data/sample/tokenizer.model")
    p.add_argument("--docs", type=int, default=100, help="documents per task (default 100)")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from lenext_dist.eval.passkey import greedy_generate
    from lenext_dist.prep.task_source import generate, task_spec
    from lenext_dist.prep.tasks import TASKS
    from lenext_dist.prep.tokenizer import SpmTokenizer

    model = AutoModelForCausalLM.from_pretrained(args.model, trust_remote_code=True).eval()
    tok = SpmTokenizer(args.tokenizer)
    spec = task_spec(",".join(TASKS), [], args.seed, 1)
    n = {t: 0 for t in TASKS}
    exact = {t: 0 for t in TASKS}
    tokens = {t: [0, 0] for t in TASKS}
    for d in generate(args.text, None, spec, tok):
        if n[d.task] >= args.docs:
            if min(n.values()) >= args.docs:
                break
            continue
        _, ans, k = d.answers[-1]
        g = 1 if d.task == "repeat" else 0
        ids = d.ids
        out = greedy_generate(model, torch.tensor([ids[:ans + g]]), k - g)[0].tolist()
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids[:ans + k]])).logits[0]  # [s, vocab]
        pred = logits[ans + g - 1:ans + k - 1].argmax(-1).tolist()  # predicts ids[ans+g : ans+k]
        n[d.task] += 1
        exact[d.task] += out == ids[ans + g:ans + k]
        tokens[d.task][0] += sum(a == b for a, b in zip(pred, ids[ans + g:ans + k]))
        tokens[d.task][1] += k - g
    print(json.dumps({"model": args.model, "documents": n,
                      "exact": {t: exact[t] / max(n[t], 1) for t in TASKS},
                      "token": {t: round(c / max(m, 1), 4) for t, (c, m) in tokens.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
