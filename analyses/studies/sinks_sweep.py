"""How many always-visible initial tokens (attention sinks) does hard Focus need?

The recorder found that most of the dense attention mass the hard mask drops lands on a few
" " / " the" tokens just past the 4 kept sinks (positions 7-70 of each window: secondary
sinks). This script evaluates trained routers with ``sink_tokens`` in {0, 4, 8, 16, 32, 64}
at evaluation time (the routers are unchanged; the sinks are part of the mask rule,
``core.local_mask``), against random groups with the same sinks (the control at equal
sparsity), on the recipes sweep's held-out windows (Persuasion, 3 x 1024 tokens).

Outputs ``<out>/sinks_sweep.parquet`` and ``.md``. Usage (~10 min on 2 CPU cores)::

    python analyses/studies/sinks_sweep.py --routers figures/recipes/sinks/routers.safetensors
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

import focus_lab
from focus_lab.data import load_corpus, make_windows
from focus_lab.eval.evaluate import evaluate
from focus_lab.io import write_parquet
from focus_lab.hf.models import load_model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routers", type=Path, default=Path("figures/recipes/sinks/routers.safetensors"))
    ap.add_argument("--out", type=Path, default=Path("figures/recipes"))
    ap.add_argument("--name", default="sinks_sweep", help="output file stem under --out")
    ap.add_argument("--sinks", type=lambda s: [int(x) for x in s.split(",")], default=[0, 4, 8, 16, 32, 64])
    ap.add_argument("--top-k", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--eval-seq-len", type=int, default=1024)
    ap.add_argument("--eval-windows", type=int, default=3)
    ap.add_argument("--no-random", action="store_true", help="skip the random-groups control")
    args = ap.parse_args(argv)
    if not args.routers.is_file():
        raise SystemExit(f"error: no router file {args.routers}; train one first "
                         "(python analyses/studies/recipes_sweep.py --recipes sinks)")
    model, tok = load_model()
    corp = load_corpus("austen")
    eval_w = make_windows(corp.heldout, tok, args.eval_seq_len, max_windows=args.eval_windows)
    focus_lab.attach(model)
    focus_lab.load_routers(model, args.routers)
    pats = [("dense", {"mode": "dense"})]
    for s in args.sinks:
        for k in args.top_k:
            pats.append((f"router_sinks{s}_top{k}", {"mode": "hard", "top_k": k, "sink_tokens": s,
                                                     "assignment": "router"}))
            if not args.no_random:
                for a in ("random", "shuffled"):
                    pats.append((f"{a}_sinks{s}_top{k}", {"mode": "hard", "top_k": k, "sink_tokens": s,
                                                          "assignment": a}))
    rows = []
    for label, ch in pats:
        df = evaluate(model, eval_w, [(label, ch)], progress=False)
        df["sink_tokens"] = ch.get("sink_tokens", 0)
        df["assignment"] = ch.get("assignment", "dense")
        rows.append(df)
        print(df[["label", "perplexity", "distant_pairs_kept", "max_group_share"]].to_string(
            index=False, header=False, float_format=lambda x: f"{x:.4f}"), flush=True)
    out = pd.concat(rows, ignore_index=True)
    out["routers"] = str(args.routers)
    args.out.mkdir(parents=True, exist_ok=True)
    write_parquet(args.out / f"{args.name}.parquet", out)
    dense = float(out.loc[out.label == "dense", "perplexity"].iloc[0])
    lines = [f"# Sink tokens at evaluation time (routers: `{args.routers}`; dense PPL {dense:.2f})", "",
             "Controls: `random` = balanced random groups; `shuffled` = the router's own groups moved "
             "to random positions (same group sizes, so the same sparsity; random membership).", "",
             "| sinks | top-k | router PPL | random PPL | shuffled PPL | router vs dense | "
             "distant pairs kept (router / random / shuffled) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(label: str, col: str, fmt: str) -> str:
        q = out[out.label == label]
        return format(float(q[col].iloc[0]), fmt) if len(q) else "-"

    for s in args.sinks:
        for k in args.top_k:
            r = out[out.label == f"router_sinks{s}_top{k}"].iloc[0]
            lines.append(f"| {s} | {k} | {r.perplexity:.2f} | {cell(f'random_sinks{s}_top{k}', 'perplexity', '.2f')} | "
                         f"{cell(f'shuffled_sinks{s}_top{k}', 'perplexity', '.2f')} | "
                         f"{100 * (r.perplexity / dense - 1):+.1f}% | {r.distant_pairs_kept:.3f} / "
                         f"{cell(f'random_sinks{s}_top{k}', 'distant_pairs_kept', '.3f')} / "
                         f"{cell(f'shuffled_sinks{s}_top{k}', 'distant_pairs_kept', '.3f')} |")
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
