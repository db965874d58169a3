"""Issue 9: what each router recipe changes in the dense attention mass the hard mask drops.

For each recipe's routers (``<recipes>/<name>/routers.safetensors``, from
``analyses/studies/recipes_sweep.py``) the recorder (``focus_lab.record``) audits the *dense* model on
the same held-out windows (Persuasion) under the recipe's hard top-k mask: the dense mass the
mask drops per query (``crossing.dense_dropped``), coverage by distance
(``coverage_distance``, patterns focus and random groups at equal sparsity), and the dropped
edges (``dropped_edges``, P_ij >= --edge-threshold) summed by key position. Writes
``<out>/recipe_audit.md`` and ``recipe_audit_*.parquet``.

Usage (~3 min per recipe for one 1024-token window on 2 CPU cores)::

    python analyses/studies/recipe_audit.py --recipes paper sinks sinks64 coverage64
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

import focus_lab
from focus_lab.data import load_corpus, make_windows
from focus_lab.io import write_parquet
from focus_lab.models import load_model

KEY_BUCKETS = [0, 4, 16, 64, 128, 256, 1 << 30]


def bucket_label(lo: int, hi: int) -> str:
    return f"{lo}+" if hi >= 1 << 30 else f"{lo}-{hi - 1}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", nargs="+", default=["paper", "sinks", "sinks64", "coverage64"])
    ap.add_argument("--dir", type=Path, default=Path("figures/recipes"), help="where the recipes' routers are")
    ap.add_argument("--out", type=Path, default=Path("figures/recipes"))
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--edge-threshold", type=float, default=0.01)
    args = ap.parse_args(argv)
    missing = [r for r in args.recipes if not (args.dir / r / "routers.safetensors").is_file()]
    if missing:
        raise SystemExit(f"error: no routers for {missing} under {args.dir}; train them first "
                         f"(python analyses/studies/recipes_sweep.py --recipes {' '.join(missing)})")
    model, tok = load_model()
    corp = load_corpus("austen")
    wins = make_windows(corp.heldout, tok, args.seq_len, max_windows=args.windows)
    ids = torch.stack([w.input_ids for w in wins])  # (windows, T)
    focus_lab.attach(model)
    summary, dist_rows, key_rows = [], [], []
    for name in args.recipes:
        cfg = focus_lab.load_routers(model, args.dir / name / "routers.safetensors")
        focus_lab.set_config(model, mode="dense", top_k=args.top_k)  # audit the dense model
        with focus_lab.record(model, metrics=("coverage", "crossing", "dropped_edges"),
                              edge_threshold=args.edge_threshold, edge_top_n=0,
                              sink_positions=max(4, cfg.sink_tokens), per_query=False) as rec:
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)
        t = rec.tables()
        cr, cd, de = t["crossing"], t["coverage_distance"], t["dropped_edges"]
        queries = ids.numel()
        heads = cr[["layer_idx", "head"]].drop_duplicates().shape[0]
        summary.append({"recipe": name, "sink_tokens": cfg.sink_tokens, "top_k": args.top_k,
                        "dense_dropped": cr.dense_dropped.mean(),
                        "dense_dropped_distant_queries": cr.dense_dropped_distant_queries.mean(),
                        "dense_distant": cr.dense_distant.mean(),
                        "worst_layer": int(cr.groupby("layer_idx").dense_dropped.mean().idxmax()),
                        "worst_layer_dropped": cr.groupby("layer_idx").dense_dropped.mean().max()})
        d = cd[cd.pattern.isin(["focus", "random"])].groupby(["pattern", "distance_lo", "distance_hi"])
        d = d.agg(coverage=("coverage", "mean"), mass=("mass", "mean")).reset_index()
        d["recipe"] = name
        dist_rows.append(d)
        for lo, hi in zip(KEY_BUCKETS[:-1], KEY_BUCKETS[1:]):
            sel = de[(de.key_position >= lo) & (de.key_position < hi)]
            key_rows.append({"recipe": name, "key_positions": bucket_label(lo, hi),
                             "dropped_mass_per_query": float(sel.weight.sum()) / (queries * heads),
                             "edges": len(sel)})
        print(pd.DataFrame(summary[-1:]).to_string(index=False), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    s, dd, kk = pd.DataFrame(summary), pd.concat(dist_rows, ignore_index=True), pd.DataFrame(key_rows)
    for nm, df in (("summary", s), ("distance", dd), ("key_position", kk)):
        write_parquet(args.out / f"recipe_audit_{nm}.parquet", df)
    f = lambda x: f"{x:.3f}"  # noqa: E731
    lines = [f"# What the hard top-{args.top_k} mask drops, per recipe (dense SmolLM2 audited; "
             f"{args.windows} x {args.seq_len} tokens of Persuasion)", "",
             "Means over 30 layers x 9 heads. `dropped` = dense attention mass per query the mask removes.", "",
             "| recipe | sinks | dropped (all queries) | dropped (queries >= w) | dense mass beyond the window | worst layer (dropped) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in summary:
        lines.append(f"| {r['recipe']} | {r['sink_tokens']} | {f(r['dense_dropped'])} | "
                     f"{f(r['dense_dropped_distant_queries'])} | {f(r['dense_distant'])} | "
                     f"{r['worst_layer']} ({f(r['worst_layer_dropped'])}) |")
    lines += ["", f"Dropped edges with P_ij >= {args.edge_threshold}, mass per query and head, by key position:", "",
              "| recipe | " + " | ".join(bucket_label(a, b) for a, b in zip(KEY_BUCKETS[:-1], KEY_BUCKETS[1:])) + " |",
              "|---|" + "---:|" * (len(KEY_BUCKETS) - 1)]
    for name in args.recipes:
        row = kk[kk.recipe == name]
        lines.append(f"| {name} | " + " | ".join(f(x) for x in row.dropped_mass_per_query) + " |")
    lines += ["", "Coverage of the dense mass by distance (focus / random groups at equal sparsity):", ""]
    buckets = dd[["distance_lo", "distance_hi"]].drop_duplicates().sort_values("distance_lo").values.tolist()
    lines += ["| recipe | " + " | ".join(f"{a}-{b - 1}" for a, b in buckets) + " |",
              "|---|" + "---:|" * len(buckets)]
    for name in args.recipes:
        cells = []
        for a, b in buckets:
            q = dd[(dd.recipe == name) & (dd.distance_lo == a)]
            fo = q[q.pattern == "focus"].coverage
            ra = q[q.pattern == "random"].coverage
            cells.append(f"{fo.iloc[0]:.3f} / {ra.iloc[0]:.3f}" if len(fo) and len(ra) else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (args.out / "recipe_audit.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
