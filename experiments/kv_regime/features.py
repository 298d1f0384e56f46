"""Where a kv model keeps what key-aware retrieval needs (issue 43, item 1): a diagnosis of the
key-blind copy, not a score of the gate.

A model that answers `key K is` by copying some needle's values, not K's, scores 1/(k+1) with k
distractors. To pick K's needle an induction head must match the question's key against a key
carried to the needle's first value (two tokens back: `key K is v1`). Linear probes on the
residual stream (embeddings, then after each layer) ask whether it is carried at all:

  key@v1  the needle's key at its first value (two back): what a key-aware match reads
  key@is  the needle's key at its `is` (one back)
  v1@v2   the first value at the second (one back): what the in-order copy reads
  tok@v1  the token itself at the first value: a control the embeddings must pass (~1.0)

key@v1, key@is and v1@v2 are also probed on the document's first needle and on its later ones
apart. A head that gathers tokens by kind (every key, every value before it), as a model without
position can, reads the token back exactly at the first needle and a blend at the later ones; a
previous-token head reads it at both.

Each probe is a multinomial logistic regression fit on the needles of 2/3 of the documents and
scored on the rest (held out), one per layer; chance is 1 / (classes). Documents: the distract
mixture (2-8 values, 1-3 distractors) at L over the held-out filler, the evaluation's test seed.

  python -m experiments.kv_regime.features --model HF_DIR [--docs 800] [--out probes.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from lenext_dist.flags import Parser

SPLIT = ("key@v1", "key@is", "v1@v2")
PROBES = (*SPLIT, "tok@v1", *(f"{p} {w}" for p in SPLIT for w in ("first", "later")))
CARRIED = 0.5
"""A model carries the key where key@v1 reaches this at some layer (written 28 Nov, before the
positive control's run: README.md here)."""


def carries_key(record: dict) -> bool:
    """The probes' verdict on one record of `run`: the needle's key is at its first value (key@v1
    >= CARRIED) after some layer; the embeddings do not count (a token's own holds no key). A model
    that reads the first value by its key must hold the key there by the reading layer."""
    return max(record["probes"]["key@v1"]["by_layer"][1:]) >= CARRIED


def samples(model, docs, bos: int | None) -> tuple[dict, float]:
    """probe -> (states [n, layers + 1, h], labels [n]) over the needles of `docs`; and the share
    of documents whose first answer token is the argmax (teacher forced)."""
    got = {p: ([], []) for p in PROBES}
    first = []
    for d in docs:
        ids = ([bos] if bos is not None else []) + d.ids
        with torch.no_grad():
            out = model(torch.tensor([ids], device=model.device), output_hidden_states=True)
        hs = torch.stack(out.hidden_states)[:, 0].float().cpu()  # [layers + 1, s, h]
        pos, needles = 0 if bos is None else 1, 0
        for i, s in enumerate(d.segments):
            at_is = pos + len(s.ids) - 1  # `key K is`: the segment's last token
            if s.role in ("needle", "distractor") and s.text.startswith("key "):
                key, vals = s.ids[-2], d.segments[i + 1].ids  # [key, K, is], then the values
                rows = {"key@v1": (at_is + 1, key), "key@is": (at_is, key), "tok@v1": (at_is + 1, vals[0])}
                if len(vals) > 1:
                    rows["v1@v2"] = (at_is + 2, vals[0])
                rows.update({f"{p} {'later' if needles else 'first'}": rows[p] for p in SPLIT if p in rows})
                needles += 1
                for p, (t, label) in rows.items():
                    got[p][0].append(hs[:, t])
                    got[p][1].append(label)
            elif s.role == "question":
                first.append(int(out.logits[0, at_is].argmax()) == d.segments[i + 1].ids[0])
            pos += len(s.ids)
    return {p: (torch.stack(x), torch.tensor(y)) for p, (x, y) in got.items() if y}, sum(first) / len(first)


def probe(x: torch.Tensor, y: torch.Tensor, steps: int = 300) -> list[float]:
    """Held-out accuracy of a linear probe for `y` on each layer of `x` [n, layers + 1, h]: fit
    on the first 2/3 of the rows (softmax regression, Adam, a little L2), scored on the rest."""
    cut = 2 * len(y) // 3
    classes, y = torch.unique(y, return_inverse=True)
    accs = []
    for layer in range(x.shape[1]):
        z = x[:, layer]
        z = (z - z[:cut].mean(0)) / (z[:cut].std(0) + 1e-6)
        w = torch.zeros(z.shape[1], len(classes), requires_grad=True)
        b = torch.zeros(len(classes), requires_grad=True)
        opt = torch.optim.Adam([w, b], lr=0.05)
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(z[:cut] @ w + b, y[:cut]) + 1e-3 * w.square().sum()
            loss.backward()
            opt.step()
        with torch.no_grad():
            accs.append(round(float(((z[cut:] @ w + b).argmax(1) == y[cut:]).float().mean()), 3))
    return accs


def run(model_dir: str, docs: int = 800, seed: int | None = None) -> dict:
    import sentencepiece as spm

    from experiments.nope_length.study import TEST_SEED
    from lenext_dist.eval.adapter import trained_with_bos
    from lenext_dist.eval.model_io import load_model
    from lenext_dist.eval.tasks import generator, make_documents
    from lenext_dist.prep.tasks import Toolkit

    from .data import kv_data
    from .grids import DISTRACT_MIX, L

    model = load_model(model_dir, dtype="fp32", progress=False)
    sp = spm.SentencePieceProcessor(model_file=str(Path(model_dir) / "tokenizer.model"))
    bos = sp.bos_id() if trained_with_bos(model, model_dir) else None
    texts = [json.loads(line)["text"] for line in (kv_data() / "heldout/filler.jsonl").read_text().splitlines()]
    params = dict(p.split("=") for p in DISTRACT_MIX)
    found = make_documents(generator(Toolkit(sp), "kv", L - (bos is not None), params), texts, docs,
                           TEST_SEED if seed is None else seed)
    rows, first = samples(model, found, bos)
    source = getattr(model.config, "lenext_source", None) or {}
    return {"model": Path(model_dir).name, "checkpoint": source.get("tag"), "docs": docs,
            "mix": list(DISTRACT_MIX), "bos": bos is not None, "first_answer_token": round(first, 3),
            "probes": {p: {"n": len(y), "chance": round(1 / len(torch.unique(y)), 3), "by_layer": probe(x, y)}
                       for p, (x, y) in rows.items()}}


def main(argv=None) -> int:
    ap = Parser(prog="python -m experiments.kv_regime.features", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="an exported kv model (HF folder)")
    ap.add_argument("--docs", type=int, default=800)
    ap.add_argument("--out", help="write the record here (JSON)")
    a = ap.parse_args(argv)
    if not (Path(a.model) / "config.json").is_file():
        raise SystemExit(f"error: --model {a.model}: no config.json (not an exported model)")
    res = run(a.model, a.docs)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"{a.model}: first answer token {res['first_answer_token']}")
    for p, r in res["probes"].items():
        print(f"  {p:12s} n={r['n']:5d} chance {r['chance']:.2f}  embeddings, layer 1..: {r['by_layer']}")
    print(f"  carries the key to the first value (key@v1 >= {CARRIED} after a layer): {carries_key(res)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
