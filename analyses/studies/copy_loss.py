"""Where a sparse pattern's loss goes: copies from beyond the window, local copies, new text.

For each held-out window of each corpus, the next-token NLL of every position under dense
attention and under each pattern (``focus_lab.recording.recorder.next_token_nll``). Each
prediction (token t -> token t + 1) falls in one class by the bigram ``(x_t, x_{t+1})``:

* ``distant copy``: the bigram occurred earlier in the window, its latest occurrence at least
  ``window`` tokens back (only group attention can see it; the local window cannot);
* ``local copy``: its latest earlier occurrence is within the window;
* ``new``: the bigram has not occurred in the window.

The table splits each pattern's NLL increase over dense by class: on prose most of it is spread
over new text; on technical text most of it sits on distant copies, the induction-style
retrieval a token-grouping mask must keep (docs/results.md "Where the loss goes").

Output: ``<out>/copy_loss.parquet`` (tidy, one row per corpus, window, pattern and class:
tokens, summed dense NLL and summed NLL change, nats) and ``copy_loss.md``. Resumable per
(corpus, window). Usage (about 25 s per window and pattern on 2 CPU cores at 4096 tokens)::

    python -m analyses.studies.copy_loss --corpora austen,shakespeare,python-docs,man-pages,debian-reference,python-source \\
        --windows 2 --out checkpoints/copy_loss     # the committed figures/results/copy_loss.parquet
    python -m analyses.studies.copy_loss --report figures/results/copy_loss.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from analyses.studies import load_study, pending_windows, window_study_args

SCHEMA_VERSION = 1
CLASSES = ("new", "local copy", "distant copy")


def repeat_distance(ids: np.ndarray) -> np.ndarray:
    """For each prediction t (token t -> t + 1) of one window, the distance in tokens back to
    the latest earlier position s < t with the same bigram ``(ids[s], ids[s+1]) ==
    (ids[t], ids[t+1])``, or -1 when there is none.

    Args: ids: (T,) token ids. Returns: (T - 1,) int64 distances (t - s) or -1."""
    ids = np.asarray(ids)
    out = np.full(max(len(ids) - 1, 0), -1, dtype=np.int64)
    last: dict[tuple[int, int], int] = {}
    for t in range(len(ids) - 1):
        bigram = (int(ids[t]), int(ids[t + 1]))
        if bigram in last:
            out[t] = t - last[bigram]
        last[bigram] = t
    return out


def copy_class(distance: np.ndarray, window: int) -> np.ndarray:
    """``repeat_distance`` -> class index into ``CLASSES``: 0 new (-1), 1 local copy
    (distance < window), 2 distant copy (distance >= window). (T - 1,) int64."""
    d = np.asarray(distance)
    return np.where(d < 0, 0, np.where(d < window, 1, 2))


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per corpus and pattern: each class's share of tokens, share of the NLL increase over
    dense and mean change (nats per token), pooled over windows."""
    g = df.groupby(["corpus", "pattern", "copy_class"], sort=False)[["tokens", "delta_nll", "nll_dense"]].sum()
    tot = g.groupby(level=[0, 1]).transform("sum")
    out = pd.DataFrame({"token_share": g.tokens / tot.tokens, "loss_share": g.delta_nll / tot.delta_nll,
                        "mean_delta": g.delta_nll / g.tokens}).reset_index()
    return out


def report(df: pd.DataFrame) -> str:
    """Markdown: per corpus and pattern, total change over dense, and per class its token share,
    its share of the change and its mean change (nats per token)."""
    s = summarize(df)
    windows = df.groupby("corpus").window.nunique()
    lines = ["| corpus | windows | pattern | change over dense (nats/token) | "
             + " | ".join(f"{c}: tokens / share of change / nats" for c in CLASSES) + " |",
             "|---|---:|---|---:|" + "---:|" * len(CLASSES)]
    for (corpus, pattern), g in s.groupby(["corpus", "pattern"], sort=False):
        d = df[(df.corpus == corpus) & (df.pattern == pattern)]
        total = d.delta_nll.sum() / d.tokens.sum()
        cells = []
        for c in CLASSES:
            r = g[g.copy_class == c]
            cells.append("-" if r.empty else f"{r.token_share.iloc[0]:.2f} / {r.loss_share.iloc[0]:.2f} / "
                         f"{r.mean_delta.iloc[0]:+.3f}")
        lines.append(f"| {corpus} | {windows[corpus]} | {pattern} | {total:+.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    window_study_args(ap, "checkpoints/copy_loss", "hard_top1,hard_top2,random_top2")
    args = ap.parse_args(argv)
    if args.report is not None:
        print(report(pd.read_parquet(args.report)))
        return

    import focus_lab
    from focus_lab.io import atomic_path, write_parquet
    from focus_lab.recording.recorder import next_token_nll

    model, tok, routers, sha, cfg, patterns = load_study(args)
    repo = Path(__file__).resolve().parents[2]
    name = str(routers.resolve().relative_to(repo)) if routers.resolve().is_relative_to(repo) else str(routers)
    for corpus, w, path in pending_windows(args, tok):
        ids = w.input_ids
        cls = copy_class(repeat_distance(ids.numpy()), cfg.window)  # (T - 1,)
        dense = next_token_nll(model, ids, focus=focus_lab.forward_state(model, mode="dense")).numpy()
        rows = []
        for label, changes in patterns:
            nll = next_token_nll(model, ids, focus=focus_lab.forward_state(model, **changes)).numpy()
            for c, class_name in enumerate(CLASSES):
                m = cls == c
                rows.append({"corpus": corpus, "seq_len": args.seq_len, "window": w.index, "pattern": label,
                             "copy_class": class_name, "tokens": int(m.sum()), "nll_dense": float(dense[m].sum()),
                             "delta_nll": float((nll[m] - dense[m]).sum()), "routers": name, "routers_sha256": sha,
                             "focus_window": cfg.window, "schema_version": SCHEMA_VERSION})
        write_parquet(path, pd.DataFrame(rows))
        print(f"{corpus} window {w.index}: done", flush=True)
    df = pd.concat([pd.read_parquet(p) for p in sorted((args.out / "cells").glob("*.parquet"))], ignore_index=True)
    write_parquet(args.out / "copy_loss.parquet", df)
    md = report(df)
    with atomic_path(args.out / "copy_loss.md") as tmp:
        Path(tmp).write_text(md)
    print(md)


if __name__ == "__main__":
    main()
