"""Router in some layers, balanced random groups in others: which layers' groups help at length.

The length table finds the shipped routers worse than random groups at 8192 tokens, while the
recorder finds them keeping *more* of the dense mass there, in layers 1-9 (docs/results.md, "What
the 4096-token audit shows"). This evaluates the hard top-k patterns with random groups in the
``--random-layers`` and the routers everywhere else, on the same held-out windows as the length
table, and prints the paired change against that table's router and random rows (its cells
under ``--table``). The layers are ``FocusConfig.random_layers`` (``focus-lab eval
--random-layers``): same mask rule, attention path and sparsity rule as every pattern.

Usage (background; about 1 min per 8192-token window and pattern on 2 cores)::

    python analyses/layer_mix.py --random-layers 1-9 --seq-len 8192 --windows 4
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random-layers", required=True, help="layers given random groups, e.g. 1-9")
    ap.add_argument("--routers", type=Path, default=None, help="default: the shipped routers")
    ap.add_argument("--corpus", default="austen")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--patterns", default="hard_top1,hard_top2")
    ap.add_argument("--table", type=Path, default=Path("figures/length_table"),
                    help="length-table folder whose cell gives the router and random rows")
    ap.add_argument("--out", type=Path, default=Path("figures/layer_mix"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    from focus_lab.config import parse_int_list
    layers = parse_int_list(args.random_layers)

    import torch
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.evaluate import evaluate, paired_change, parse_patterns, pool_windows
    from focus_lab.io import write_parquet
    from focus_lab.models import load_model
    from focus_lab.retrofit import load_routers
    from focus_lab.shipped import resolve_routers

    torch.set_num_threads(args.threads)
    model, tok = load_model()
    cfg = load_routers(model, resolve_routers(args.routers), config_overrides={"random_layers": sorted(layers)})
    ws = make_windows(load_corpus(args.corpus).heldout, tok, args.seq_len, max_windows=args.windows)
    rows = []
    for w in ws:
        df = evaluate(model, [w], parse_patterns(args.patterns, cfg.num_groups), progress=False, per_window=True)
        rows.append(df)
        print(f"window {w.index}: " + ", ".join(f"{r.label} {r.perplexity:.2f} [{r.distant_pairs_kept:.2f}]"
                                               for r in df.itertuples()), flush=True)
    mix = pd.concat(rows, ignore_index=True).assign(random_layers=args.random_layers, seq_len=args.seq_len,
                                                     corpus=args.corpus)
    name = f"{args.corpus}_{args.seq_len}_random{args.random_layers.replace(',', '_')}"
    write_parquet(args.out / f"{name}.parquet", mix)
    ref = pd.read_parquet(args.table / "cells" / f"{args.corpus}_{args.seq_len}.parquet")
    ref = ref[ref.window.isin(mix.window.unique())]
    for label in mix.label.unique():
        k = label.removeprefix("hard_top")
        m = mix[mix.label == label]
        line = f"{label} with random groups in layers {args.random_layers}: " \
               f"{pool_windows(m).perplexity.iloc[0]:.2f} [{m.distant_pairs_kept.mean():.2f}]"
        for other in (label, f"random_top{k}", "dense"):
            o = ref[ref.label == other]
            if len(o):
                ch, lo, hi = paired_change(m, o)
                line += f"; vs {other} {pool_windows(o).perplexity.iloc[0]:.2f}: {ch:+.2f}% [{lo:+.2f}, {hi:+.2f}]"
        print(line, flush=True)


if __name__ == "__main__":
    main()
