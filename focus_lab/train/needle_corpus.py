"""Write a training corpus of prose windows that recall needles seen far back.

The lever the retrieval study names for dependencies the groups drop (DuoAttention's approach,
arXiv 2410.10819: distillation data that mixes in synthetic retrieval): each document is one
training window of the corpus's *training* prose (never its held-out text) with ``--needles``
short facts inserted at sentence boundaries in its first half and each fact restated, in a
random order, in its second half. A restatement's value is a copy of text seen 200 to 3900
tokens back: the dependency that the suite's failures lose (docs/studies/retrieval-suite.md).

The wording is not RULER's (``focus_lab.eval.retrieval.NEEDLE``): a fact reads "The {noun} of
the {key} is {value}." with a noun drawn from ``NOUNS``; keys are RULER's adjective-noun pairs
(the same word lists), values 7-digit numbers or words. Every document holds at least
``seq_len`` tokens, and every restatement ends before token ``seq_len - 1``, so the one window
``make_windows`` cuts from it holds them all.

    python -m focus_lab.train.needle_corpus --out data/needle_mix --docs 64
    focus-lab train --recipe distill64 --corpus data/needle_mix --seq-len 4096 --batch-size 1 \
        --steps 30 --lr 1e-3 --init-routers focus_lab/routers/smollm2-135m-instruct.safetensors

Writes ``<out>/needles_NNN.txt`` (the last one sorted is the folder's held-out file, unused by
training) and ``<out>/MANIFEST.json`` (settings, token counts, needle distances).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

from focus_lab.io import write_json

NOUNS = ("secret number", "code", "room number", "password", "serial number", "lucky number")
WORD_NOUNS = ("password", "code word", "secret word")


def _sentences(text: str) -> list[str]:
    """Sentences of ``text`` (split after . ! ? and whitespace), whitespace collapsed."""
    return [s for s in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)) if s]


def make_document(prose: str, tokenizer, rng: np.random.Generator, seq_len: int, needles: int,
                  keys: list[str], words: list[str]) -> tuple[str, list[int]]:
    """One document: prose from a random start with ``needles`` facts in its first half and their
    restatements in its second half. Returns (text, distances in tokens from each fact's value to
    its restatement's value). Raises ValueError when ``prose`` is too short for ``seq_len``."""
    sents = _sentences(prose)
    chars = int(seq_len * 4.6)  # Austen runs about 4.2 characters a token: overshoot, then check
    start = int(rng.integers(0, max(1, len(sents) - chars // 40)))
    body, n = [], 0
    for s in sents[start:]:
        body.append(s)
        n += len(s) + 1
        if n >= chars:
            break
    if n < chars:
        raise ValueError(f"prose of {len(prose)} characters is too short for {seq_len}-token documents")
    facts = []
    for key in rng.choice(keys, size=needles, replace=False):
        if rng.random() < 0.75:
            noun, value = NOUNS[int(rng.integers(len(NOUNS)))], str(int(rng.integers(1_000_000, 10_000_000)))
        else:
            noun, value = WORD_NOUNS[int(rng.integers(len(WORD_NOUNS)))], str(rng.choice(words))
        facts.append((f"The {noun} of the {key} is {value}.", f"Remember: the {noun} of the {key} is {value}."))
    S = len(body)
    first = np.sort(rng.choice(np.arange(1, int(S * 0.45)), size=needles, replace=False))
    second = np.sort(rng.choice(np.arange(int(S * 0.52), int(S * 0.76)), size=needles, replace=False))
    order = rng.permutation(needles)
    inserts = {int(p): [facts[i][0]] for i, p in enumerate(first)}
    for p, i in zip(second, order):
        inserts.setdefault(int(p), []).append(facts[int(i)][1])
    out = []
    for i, s in enumerate(body):
        out.extend(inserts.get(i, []))
        out.append(s)
    text = " ".join(out)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < seq_len:
        raise ValueError(f"a document of {len(ids)} tokens is shorter than {seq_len}")
    dist = []
    for fact, recall in facts:
        a = len(tokenizer(text[:text.index(fact) + len(fact)], add_special_tokens=False)["input_ids"])
        b = len(tokenizer(text[:text.index(recall) + len(recall)], add_special_tokens=False)["input_ids"])
        if b >= seq_len - 2:  # the window is BOS + seq_len - 1 text tokens
            raise ValueError(f"a restatement ends at token {b}, past the window of {seq_len}")
        dist.append(b - a)
    return text, dist


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output folder (created; must not exist)")
    ap.add_argument("--corpus", default="austen", help="corpus whose training documents give the prose")
    ap.add_argument("--docs", type=int, default=64, help="documents (one training window each)")
    ap.add_argument("--needles", type=int, default=12, help="facts per document")
    ap.add_argument("--seq-len", type=int, default=4096, help="tokens per training window")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="whose tokenizer counts the tokens (default: the embedded "
                    "SmolLM2-135M; gemma3-270m for Gemma's routers)")
    a = ap.parse_args(argv)
    if a.out.exists():
        print(f"{a.out} exists: give a new --out", file=sys.stderr)
        return 2
    from focus_lab.data import load_corpus
    from focus_lab.eval.retrieval import word_lists
    from focus_lab.hf.models import load_model
    words, nouns, adjs = word_lists()
    rng = np.random.default_rng(a.seed)
    keys = sorted({f"{x}-{y}" for x, y in zip(rng.choice(adjs, 4000), rng.choice(nouns, 4000))})
    corp = load_corpus(a.corpus)
    _, tok = load_model(a.model, verbose=False)
    tmp = a.out.with_name(a.out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=False)
    dists = []
    for d in range(a.docs):
        doc = corp.train[d % len(corp.train)]
        text, dist = make_document(doc.text, tok, rng, a.seq_len, a.needles, keys, words)
        (tmp / f"needles_{d:03d}.txt").write_text(text + "\n", encoding="utf-8")
        dists += dist
    write_json(tmp / "MANIFEST.json", {
        "what": "training prose with needles recalled far back (focus_lab/train/needle_corpus.py)",
        "corpus": corp.name, "prose_from": [x.name for x in corp.train], "docs": a.docs,
        "needles_per_doc": a.needles, "seq_len": a.seq_len, "seed": a.seed, "tokenizer": a.model or "smollm2-135m-instruct",
        "distance_tokens": {"min": int(min(dists)), "median": int(np.median(dists)), "max": int(max(dists))}})
    tmp.rename(a.out)
    print(f"{a.out}: {a.docs} documents of {a.needles} needles; fact-to-restatement distance "
          f"{min(dists)}-{max(dists)} tokens (median {int(np.median(dists))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
