"""Are the router's groups clustered in position? (issue 14: why routers lose to shuffled groups at 8K)

For held-out windows, per routed layer, the hard top-1 key group of every token (the shipped or
given routers, from one dense forward's router inputs) and the probability that two tokens at
distance d share a group, by distance bucket, against the same-size baseline ``sum_g share_g^2``
(what shuffled groups give at every distance). A ratio above 1 at long distances' complement,
i.e. high same-group probability at short distances and lower at long ones, means membership
drifts with position: a query then keeps fewer of the far keys than its group's size suggests.

    python analyses/studies/group_locality.py --seq-len 8192 --windows 1 --out figures/group_locality
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

EDGES = (1, 128, 512, 2048, 4096, 8192, 1 << 20)


def same_group_by_distance(key_group: np.ndarray, num_groups: int, edges=EDGES, pairs: int = 200_000,
                           seed: int = 0) -> pd.DataFrame:
    """key_group: (T,) ints. Monte-Carlo estimate of P(same group | distance in bucket), with the
    same-size baseline. Returns DataFrame (distance_lo, distance_hi, p_same, baseline, pairs)."""
    rng = np.random.default_rng(seed)
    T = len(key_group)
    share = np.bincount(key_group, minlength=num_groups) / T
    base = float((share ** 2).sum())
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        if lo >= T:
            break
        d = rng.integers(lo, min(hi, T), pairs)
        j = rng.integers(0, T - d)
        same = key_group[j] == key_group[j + d]
        rows.append({"distance_lo": lo, "distance_hi": min(hi, T), "p_same": float(same.mean()),
                     "baseline": base, "pairs": pairs})
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routers", type=Path, default=None)
    ap.add_argument("--corpus", default="austen")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("figures/group_locality"))
    args = ap.parse_args(argv)
    import torch
    from focus_lab.core import route
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.models import load_model
    from focus_lab.retrofit import forward_state, load_routers, router_inputs, routers
    from focus_lab.shipped import resolve_routers

    path = resolve_routers(args.routers)
    model, tok = load_model()
    cfg = load_routers(model, path)
    rs = routers(model)
    frames = []
    for w in make_windows(load_corpus(args.corpus).heldout, tok, args.seq_len, max_windows=args.windows):
        with router_inputs(model) as inputs, torch.no_grad():
            groups = {}
            model(input_ids=w.input_ids[None], use_cache=False, focus=forward_state(model, mode="dense"))
            # the dict holds the last forward's inputs of every routed layer
            for i, h in inputs.items():
                kg = route(rs[i], h, config=cfg.replace(mode="hard", top_k=1)).key_group[0].numpy()
                groups[i] = kg
        for i, kg in groups.items():
            df = same_group_by_distance(kg, cfg.num_groups)
            df.insert(0, "layer_idx", i)
            df.insert(0, "window", w.index)
            frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    out["ratio"] = out["p_same"] / out["baseline"]
    args.out.mkdir(parents=True, exist_ok=True)
    from focus_lab.io import write_parquet
    out["routers"] = str(path)
    write_parquet(args.out / "group_locality.parquet", out)
    summary = out.groupby(["distance_lo", "distance_hi"])[["p_same", "baseline", "ratio"]].mean()
    text = (f"Same-group probability by distance, hard top-1 groups of {path.name}, {args.corpus} held out, "
            f"{args.windows} x {args.seq_len} tokens, mean over {out.layer_idx.nunique()} layers "
            "(baseline: same group sizes, random membership)\n\n| distance | P(same group) | baseline | ratio |\n|---|---:|---:|---:|\n"
            + "".join(f"| {lo}-{hi} | {r.p_same:.3f} | {r.baseline:.3f} | {r.ratio:.2f} |\n"
                      for (lo, hi), r in summary.iterrows()))
    (args.out / "group_locality.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
