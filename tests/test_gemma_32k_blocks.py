"""docs/studies/gemma-routers.md's 32K tables (analyses/blocks/gemma_32k.py): cells recomputed by
hand from the committed benchmark rows, the recorder-memory row and the dashboard timings."""

from __future__ import annotations

import json

import pandas as pd

from analyses import doc_blocks
from analyses.doc_blocks import REPO


def _row(text: str, *first: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if tuple(cells[:len(first)]) == first:
            return cells
    raise AssertionError(f"no row {first!r}")


def test_the_32k_forward_ratio_and_peak_from_the_benchmark_rows():
    df = pd.read_csv(REPO / "figures/gemma/bench_forward_32k.csv")
    dense = df[(df["T"] == 32768) & (df.pattern == "focus_dense")].iloc[0]
    top1 = df[(df["T"] == 32768) & (df.pattern == "hard_top1")].iloc[0]
    row = _row(doc_blocks.render("gemma-32k-forward"), "32768", "hard top-1")
    assert row[5] == f"{dense.total_s / top1.total_s:.2f}x"
    assert row[4] == str(round(top1.body_s + top1.head_s)) or abs(float(row[4]) - top1.total_s) <= 0.5
    assert row[7] == f"{top1.peak_rss_gib:.1f}" and float(row[7]) < 12  # the bound on a 32K process
    assert row[6].startswith(f"{round(100 * top1.global_layers_s / top1.body_s)}%")


def test_the_32k_recording_row_and_the_dashboard_pages_by_hand():
    rm = pd.read_parquet(REPO / "figures/results/record_memory.parquet")
    r = rm[rm.label.str.startswith("gemma3-270m: 32768 tokens")].iloc[0]
    row = _row(doc_blocks.render("gemma-32k-record"), r.label)
    assert row[1] == f"{r.seconds:.0f}" and row[2] == f"{r.measured_gib:.2f}" and row[3] == f"{r.estimate_gib:.2f}"
    d = json.loads((REPO / "figures/gemma/dashboard_32k.json").read_text())
    text = doc_blocks.render("gemma-32k-dashboard")
    for page in ("audit", "groups", "retrieval"):
        cells = _row(text, page)
        assert cells[1] == f"{d['pages'][page]['seconds']:.1f}" and cells[3] == "0"
    assert sum(line.startswith("|") for line in text.splitlines()) == 2 + len(d["pages"])  # header, rule, a row a page


def test_the_32k_restored_drops_from_the_tables():
    from by_hand import on_page
    d = "figures/gemma/restored_32k"
    text = on_page("gemma-routers.md", "gemma-32k-restored")
    r = pd.read_parquet(REPO / f"{d}/restored_drops.parquet")
    meta = json.loads((REPO / f"{d}/restored_drops.json").read_text())
    assert meta["seq_len"] == 32768 and len(r) == 50
    for col, what in (("recovered", "the heaviest dropped edge alone"),
                      ("recovered_all", "every recorded dropped edge of the query")):
        x = r[col].to_numpy()
        x = x[~pd.isna(x)]
        q1, med, q3 = pd.Series(x).quantile([0.25, 0.5, 0.75])
        assert _row(text, what)[1:] == [f"{med:.3f}", f"{q1:.3f} to {q3:.3f}", str((x >= 0.5).sum()),
                                        str((x < 0.1).sum()), str((x < 0).sum())]
    half = r[r.recovered >= 0.5]
    copies = sum(k.strip() == n.strip() for k, n in zip(half.key_token, half.next_token))
    assert f"The {len(half)} edges that recover at least half" in text and f"; {copies} of them end on an" in text
    g = pd.read_parquet(REPO / f"{d}/group_ablation.parquet")
    layer = meta["ablated_layers"][0]
    for group, part in g[g.layer_idx == layer].groupby("group"):
        mean = (part.delta * part.tokens).sum() / part.tokens.sum()
        assert _row(text, f"{layer}, {group}")[1:3] == [str(part.tokens.sum()), f"{mean:+.4f}"]
        assert part.tokens.sum() == 32767  # every predicted token of the window


def test_the_retrieval_scores_and_router_against_random_by_hand():
    from by_hand import on_page
    text = on_page("gemma-routers.md", "gemma-retrieval")
    files = doc_blocks.GEMMA_RETRIEVAL
    cases = pd.concat([pd.read_parquet(REPO / f) for f in files], ignore_index=True)
    for (task, length), c in cases.groupby(["task", "length"]):
        by = c.pivot_table(index="seed", columns="pattern", values="score")
        for pattern in ("dense", "default", "random_default"):
            row = [r for r in text.splitlines() if r.startswith(f"| {task} |") and f"| {length} | `{pattern}` |" in r]
            assert len(row) == 1
            cells = [x.strip() for x in row[0].strip("|").split("|")]
            assert cells[4:6] == [str(by[pattern].notna().sum()), f"{by[pattern].mean():.2f}"]
        both = by[["default", "random_default"]].dropna()
        diff = (both["default"] - both["random_default"]).mean()
        assert f"| score | {task} | {length} | {diff:+.2f} |" in text
