"""Does restoring a costly drop recover its query's loss? And what does one group carry?

On a recorded run (the main job's ``runs/smollm2-austen`` by default: 4 windows of 4096 tokens of
*Persuasion*, the shipped routers), the audit's ``costly_drops`` joins each query whose loss
grows most under hard Focus (hard minus dense) to the dense attention edges the mask dropped.
That is a correlation. This study intervenes (``focus_lab.recording.restore``):

* ``restored_drops``: for each of the ``--top-n`` costliest queries, its heaviest recorded dropped
  edge is put back into that layer's mask alone (the ``kept`` hook point), and the query's loss
  measured again; then every recorded dropped edge of the query at once. Reported: the share of
  the query's loss delta each recovers (median and quartiles).
* ``group_ablation``: one group of one layer cut (its distant pairs dropped), the loss change of
  every token of one window per part of speech of the query token.

Both tables are written into the run (``restored_drops.parquet``, ``group_ablation.parquet``, and
the manifest) and copied to ``--out`` (``figures/results/``). The dashboard's audit page shows them.
Cost: one hard forward per window (its KV cache kept), then per query three decode steps of the
query token (no edge, one edge, all edges; the dense loss is the run's); one window forward per
ablated group, plus one.
Usage::

    python -m analyses.studies.restored_drops --run runs/smollm2-austen --top-n 50
    python -m analyses.studies.restored_drops --report figures/results   # the summary again
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd


def summary(restored: pd.DataFrame) -> dict:
    """Median and quartiles of the share of the loss delta recovered (one edge; all edges),
    the count of queries, and how many recover at least half / less than a tenth."""
    out = {"queries": int(len(restored))}
    for col in ("recovered", "recovered_all"):
        x = restored[col].dropna().to_numpy()
        q1, med, q3 = np.quantile(x, [0.25, 0.5, 0.75])
        out[col] = {"q1": float(q1), "median": float(med), "q3": float(q3),
                    "at_least_half": int((x >= 0.5).sum()), "below_tenth": int((x < 0.1).sum()),
                    "negative": int((x < 0).sum())}
    out["delta_median"] = float((restored["nll_hard"] - restored["nll_dense"]).median())
    out["edges_of_query_median"] = float(restored["edges_of_query"].median())
    return out


def report(restored: pd.DataFrame, ablation: pd.DataFrame | None) -> str:
    s = summary(restored)
    lines = [f"restored drops: {s['queries']} queries, loss delta median {s['delta_median']:.3f} nats, "
             f"{s['edges_of_query_median']:.0f} recorded dropped edges per query (median)"]
    for col, what in (("recovered", "heaviest edge alone"), ("recovered_all", "every recorded edge")):
        r = s[col]
        lines.append(f"  {what}: share of the delta recovered median {r['median']:.3f} [q1 {r['q1']:.3f}, "
                     f"q3 {r['q3']:.3f}]; >= 0.5: {r['at_least_half']}, < 0.1: {r['below_tenth']}, "
                     f"< 0: {r['negative']}")
    if ablation is not None and len(ablation):
        for (layer, g), d in ablation.groupby(["layer_idx", "group"]):
            w = (d["delta"] * d["tokens"]).sum() / d["tokens"].sum()
            top = d[d["tokens"] >= 20].sort_values("delta", ascending=False).head(3)
            tops = ", ".join(f"{r.pos} {r.delta:+.3f} ({r.tokens})" for r in top.itertuples())
            lines.append(f"  layer {layer} group {g} cut: mean loss change {w:+.4f} nats; most hurt: {tops}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, default=Path("runs/smollm2-austen"), help="a recorded run with costly_drops")
    ap.add_argument("--top-n", type=int, default=50, help="costliest queries restored")
    ap.add_argument("--ablate-layers", default="auto",
                    help="routed layers whose groups are cut one at a time (comma list, 'none', or 'auto': the "
                         "layer with groups of its router, not random ones, holding most of the restored edges)")
    ap.add_argument("--window", type=int, default=0, help="the recorded window the group ablation runs on")
    ap.add_argument("--out", type=Path, default=Path("figures/results"), help="folder for copies of the tables")
    ap.add_argument("--report", type=Path, default=None, help="print the summary of the tables in this folder")
    args = ap.parse_args(argv)
    if args.report is not None:
        ab = args.report / "group_ablation.parquet"
        print(report(pd.read_parquet(args.report / "restored_drops.parquet"),
                     pd.read_parquet(ab) if ab.is_file() else None))
        return

    import focus_lab
    from focus_lab.hf.models import EMBEDDED, load_model
    from focus_lab.io import write_json, write_parquet
    from focus_lab.recording.restore import group_ablation_table, restored_drops_table, write_intervention_table
    from focus_lab.runs import Run

    run = Run.open(args.run)
    mf = run.manifest
    name = mf["model"].get("name") or None
    model, _ = load_model(None if name in (None, EMBEDDED) else name)  # the model the run was recorded with
    focus_lab.load_routers(model, mf["routers"]["path"])
    restored = restored_drops_table(model, run, top_n=args.top_n)
    entry = {"top_n": args.top_n, "routers_sha256": mf["routers"].get("sha256"), "mode": "hard",
             "command": "python -m analyses.studies.restored_drops"}
    write_intervention_table(args.run, "restored_drops", restored, entry)
    if args.ablate_layers == "auto":  # the layer with a router of its own holding most restored edges
        cfg = focus_lab.focus_config(model)
        routed = restored[[cfg.assignment_at(int(x)) != "random" for x in restored["layer_idx"]]]
        layers = [int((routed if len(routed) else restored)["layer_idx"].mode().iloc[0])]
    else:
        layers = [] if args.ablate_layers == "none" else [int(x) for x in args.ablate_layers.split(",")]
    ablation = None
    if layers:
        ablation = group_ablation_table(model, Run.open(args.run), layers, window_idx=args.window)
        write_intervention_table(args.run, "group_ablation", ablation, {**entry, "layers": layers,
                                                                         "window": args.window})
    args.out.mkdir(parents=True, exist_ok=True)
    write_parquet(args.out / "restored_drops.parquet", restored)
    if ablation is not None:
        write_parquet(args.out / "group_ablation.parquet", ablation)
    write_json(args.out / "restored_drops.json", {"run": str(args.run), "seq_len": mf.get("seq_len"),
                                                  "windows": mf.get("windows"), **entry,
                                                  "ablated_layers": layers, "summary": summary(restored)})
    print(report(restored, ablation))
    print(json.dumps(summary(restored), indent=1))


if __name__ == "__main__":
    main()
