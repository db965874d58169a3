"""What the mask drops on technical text: add the token-match pairs, or as many random pairs.

docs/results.md "Where the loss goes" finds that on technical text and code most of hard
top-k's loss sits on *distant copies*: the model retrieves the token after an earlier
occurrence of the current token (induction), and that earlier occurrence lies beyond the
window in a group the query does not share. This study tests that diagnosis with a control at
equal sparsity. In every routed layer it adds to the pattern's mask either

* ``sK+K..``: the token-match pairs of those shifts (``core.match_mask``, docs/method.md §2.8:
  ``ids[j - s] == ids[i]``, distant; ``s1`` the induction pair, ``s0+1`` what
  ``FocusConfig.match_shifts = [0, 1]`` keeps), optionally only the ``--cap`` nearest per query
  (``match_latest``); or
* ``random``: as many distant pairs per query row as the last shift extra listed adds to that
  row, drawn uniformly from those the mask dropped,

and the layer attends under ``kept | extra`` (a patch of the ``kept`` hook point: the dense
masked reference, ``core.masked_attention``, attends with the edited mask). If the copies carry the loss,
the token-match pairs recover it and the random pairs do not.

Output: ``<out>/copy_pairs_cap<N>.parquet`` (tidy: one row per corpus, window, pattern and
extra: summed NLL in nats, tokens, distant pairs kept averaged over routed layers, the share of
them that the extra pairs make, and ``copies_kept``: the share of the distant induction pairs,
shift 1, that the pattern's own mask keeps, averaged over routed layers) and
``copy_pairs_cap<N>.md``; ``<out>/copy_pairs_layers_cap<N>.parquet`` has the pattern's own
mask per routed layer (``layer_idx``, ``pairs_kept``, ``copies_kept``): which layers keep the
copies. Resumable per (corpus, window).
Usage (about 1 min per forward at 4096 tokens on one busy core)::

    python -m analyses.studies.copy_pairs --corpora man-pages,python-docs,debian-reference --windows 2 \
        --patterns hard_top2 --extras s0+1,random --out checkpoints/copy_pairs   # figures/results/copy_pairs.parquet
    python -m analyses.studies.copy_pairs --corpora man-pages,python-docs --windows 1 \
        --patterns hard_top1,hard_top2 --extras s0+1 --cap 16 --out checkpoints/copy_pairs_cap
    python -m analyses.studies.copy_pairs --report figures/results/copy_pairs.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from analyses.studies import load_study, pending_windows, window_study_args

SCHEMA_VERSION = 2  # 2: copies_kept, and the per-layer table


def window_match_mask(ids: torch.Tensor, window: int, sinks: int, shifts: tuple[int, ...] = (1,),
                cap: int = 0) -> torch.Tensor:
    """The token-match pairs of one window as a (T, T) bool mask: ``core.match_mask`` with
    ``shifts`` and ``latest=cap`` (queries and keys the same tokens). ids: (T,) token ids."""
    from focus_lab.patterns.rules.match import match_mask
    pos = torch.arange(ids.shape[0])
    return match_mask(ids[None], ids[None], shifts, pos, pos, window, sinks, cap)[0]


def random_like(extra: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Per query row, about as many pairs as ``extra`` has in that row, drawn uniformly from
    ``candidates`` (Bernoulli at rate count / candidates). extra, candidates: (T, T) bool."""
    n = extra.sum(-1, keepdim=True).float()  # (T, 1)
    m = candidates.sum(-1, keepdim=True).clamp(min=1).float()  # (T, 1)
    u = torch.rand(candidates.shape, generator=generator)  # (T, T)
    return candidates & (u < n / m)


def parse_extra(name: str) -> tuple[int, ...] | None:
    """``none`` -> (), ``random`` -> None, ``s1`` / ``s0+1`` -> the shifts (module docstring).
    Raises SystemExit naming the valid forms."""
    if name == "none":
        return ()
    if name == "random":
        return None
    try:
        shifts = tuple(sorted({int(x) for x in name[1:].split("+")})) if name.startswith("s") else ()
        if shifts and min(shifts) >= 0:
            return shifts
    except ValueError:
        pass
    raise SystemExit(f"--extras: unknown {name!r}; use none, random, or shifts >= 0 such as s1 or s0+1+2")


def _hook(extra: torch.Tensor | None, matched: torch.Tensor, distant: torch.Tensor, stats: list, seed: int,
          copies: torch.Tensor | None = None):
    """``kept`` hook of one forward: the layer attends under ``kept | extra`` (a patch of the
    mask, which the layer then attends with through the dense masked reference; extra None:
    random pairs, per row as many as ``matched`` adds). Appends (pairs kept, extra pairs, layer
    index, share of ``copies`` (T, T) bool the layer's own mask keeps) per routed layer."""
    gen = torch.Generator().manual_seed(seed)
    n_distant = distant.sum().item()
    n_copies = max(int(copies.sum()), 1) if copies is not None else 1

    def fn(kept_b: torch.Tensor, hook) -> torch.Tensor | None:
        if hook.call.routing is None:  # dense / window pattern or an unrouted layer
            return None
        kept = kept_b[0]  # (T, T) bool
        add = extra & ~kept if extra is not None else random_like(matched & ~kept, distant & ~kept, gen)
        own = (kept & copies).sum().item() / n_copies if copies is not None else float("nan")
        stats.append((((kept | add) & distant).sum().item() / n_distant, add.sum().item() / n_distant,
                      hook.layer_idx, own))
        if not add.any():
            return None
        return (kept | add)[None]

    return fn


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per corpus, pattern and extra: windows, perplexity change over dense pooled over tokens
    (%), its min/max over windows, distant pairs kept and the extra pairs' share of them."""
    dense = df[df.pattern == "dense"].drop_duplicates(["corpus", "window"])
    d = df.merge(dense[["corpus", "window", "nll"]].rename(columns={"nll": "nll_dense"}), on=["corpus", "window"])
    d["change"] = np.expm1((d.nll - d.nll_dense) / d.tokens) * 100
    if "copies_kept" not in d:  # schema 1: not recorded
        d["copies_kept"] = np.nan
    g = d[d.pattern != "dense"].groupby(["corpus", "pattern", "extra", "cap"], sort=False)
    out = g.agg(windows=("window", "nunique"), nll=("nll", "sum"), nll_dense=("nll_dense", "sum"),
                tokens=("tokens", "sum"), lo=("change", "min"), hi=("change", "max"),
                pairs_kept=("pairs_kept", "mean"), extra_pairs=("extra_pairs", "mean"),
                copies_kept=("copies_kept", "mean")).reset_index()
    out["change"] = np.expm1((out.nll - out.nll_dense) / out.tokens) * 100
    return out


def report(df: pd.DataFrame) -> str:
    """Markdown table of ``summarize``."""
    s = summarize(df)
    lines = ["| corpus | windows | pattern | extra pairs | nearest per query (0: all) | change over dense "
             "[min, max over windows] | distant pairs kept | of them extra | induction pairs kept by the pattern |",
             "|---|---:|---|---|---:|---|---:|---:|---:|"]
    for r in s.itertuples():
        lines.append(f"| {r.corpus} | {r.windows} | {r.pattern} | {r.extra} | {r.cap} | {r.change:+.2f}% "
                     f"[{r.lo:+.1f}, {r.hi:+.1f}] | {r.pairs_kept:.3f} | {r.extra_pairs:.3f} | "
                     + ("-" if np.isnan(r.copies_kept) else f"{r.copies_kept:.3f}") + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    window_study_args(ap, "checkpoints/copy_pairs", "hard_top1,hard_top2")
    ap.add_argument("--extras", default="none,s1,random",
                    help="comma list: none, sK+K.. (keys j with ids[j-K] == ids[i], K in the shifts), random "
                         "(as many pairs per query as the last shift extra listed adds, at random)")
    ap.add_argument("--cap", type=int, default=0, help="keep only the cap nearest matching keys per query (0: all)")
    args = ap.parse_args(argv)
    if args.report is not None:
        print(report(pd.read_parquet(args.report)))
        return
    extras = {x.strip(): parse_extra(x.strip()) for x in args.extras.split(",") if x.strip()}
    shifted = [v for v in extras.values() if v]
    if None in extras.values() and not shifted:
        raise SystemExit("--extras: random needs a shift extra to match (e.g. --extras none,s1,random)")

    import focus_lab
    from focus_lab.io import atomic_path, write_parquet
    from focus_lab.method.core import distant_mask
    from focus_lab.recording.recorder import next_token_nll

    model, tok, routers, sha, cfg, patterns = load_study(args)
    for corpus, w, path in pending_windows(args, tok, f"_cap{args.cap}"):
        ids = w.input_ids.long()
        T = ids.shape[0]
        pos = torch.arange(T)
        distant = distant_mask(pos, pos, cfg.window, cfg.sink_tokens)  # (T, T)
        masks = {k: window_match_mask(ids, cfg.window, cfg.sink_tokens, v, args.cap) for k, v in extras.items() if v}
        matched = window_match_mask(ids, cfg.window, cfg.sink_tokens, shifted[-1], args.cap) if shifted else None
        copies = window_match_mask(ids, cfg.window, cfg.sink_tokens, (1,))  # (T, T) the induction pairs
        base = {"corpus": corpus, "seq_len": T, "window": w.index, "cap": args.cap, "tokens": T - 1,
                "routers_sha256": sha, "focus_window": cfg.window, "sinks": cfg.sink_tokens,
                "schema_version": SCHEMA_VERSION}
        dense = next_token_nll(model, ids, focus=focus_lab.forward_state(model, mode="dense"))
        rows = [{**base, "pattern": "dense", "extra": "none", "nll": float(dense.sum()),
                 "pairs_kept": 1.0, "extra_pairs": 0.0, "copies_kept": 1.0}]
        layer_rows = []
        for label, changes in patterns:
            for extra, shifts in extras.items():
                stats: list = []
                fn = _hook(masks.get(extra, torch.zeros_like(distant)) if shifts is not None else None,
                           matched, distant, stats, seed=w.index, copies=copies)
                with focus_lab.hooks(model, {"kept": fn}):
                    nll = next_token_nll(model, ids, focus=focus_lab.forward_state(model, **changes))
                rows.append({**base, "pattern": label, "extra": extra, "nll": float(nll.sum()),
                             "pairs_kept": float(np.mean([x[0] for x in stats])),
                             "extra_pairs": float(np.mean([x[1] for x in stats])),
                             "copies_kept": float(np.mean([x[3] for x in stats]))})
                if extra == "none":  # the pattern's own mask, per routed layer
                    layer_rows += [{**base, "pattern": label, "layer_idx": i, "pairs_kept": kept, "copies_kept": own}
                                   for kept, _, i, own in stats]
                print(f"{corpus} window {w.index} {label}+{extra}: "
                      f"{np.expm1((nll.sum() - dense.sum()).item() / (T - 1)) * 100:+.2f}% "
                      f"at {np.mean([x[0] for x in stats]):.3f}, copies kept {np.mean([x[3] for x in stats]):.3f}",
                      flush=True)
        write_parquet(path, pd.DataFrame(rows))
        write_parquet(path.with_name(path.stem + "_layers.parquet"), pd.DataFrame(layer_rows))
    df = pd.concat([pd.read_parquet(p) for p in sorted((args.out / "cells").glob(f"*_cap{args.cap}.parquet"))],
                   ignore_index=True)
    write_parquet(args.out / f"copy_pairs_cap{args.cap}.parquet", df)
    layers = [pd.read_parquet(p) for p in sorted((args.out / "cells").glob(f"*_cap{args.cap}_layers.parquet"))]
    if layers:
        write_parquet(args.out / f"copy_pairs_layers_cap{args.cap}.parquet", pd.concat(layers, ignore_index=True))
    md = report(df)
    with atomic_path(args.out / f"copy_pairs_cap{args.cap}.md") as tmp:
        Path(tmp).write_text(md)
    print(md)


if __name__ == "__main__":
    main()
