"""Figure 6: coverage of the dense model's attention by distance, Focus vs baselines.

For each distance bucket ``[lo, hi)``, the share of the dense (pretrained) attention mass that
each hard mask keeps: ``sum kept_mass / sum mass`` over layers, heads, queries and windows (the
recorder's ``coverage_distance`` tables; docs/method.md §6, the reviewers' question). Focus, sliding
window, window at matched sparsity and random groups come from the Focus run; k-means, online
k-means and MoBA from their own runs (``data/runs/<method>``), MoBA at the top-k whose pairs kept
match Focus's. Sink tokens (kept by every mask here) carry much of the far mass. Right: where the
dense mass lies.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.common import METHOD_COLORS, METHOD_NAMES, RECORD_METHODS

TITLE = "Coverage of dense attention mass vs distance: Focus vs baselines"
DATA = ("records",)
PATTERN_METHOD = {"focus": "focus", "window": "window", "window_matched": "window_matched", "random": "random"}


def coverage_by_distance(data_dir: Path) -> pd.DataFrame:
    """method, bucket, distance_lo, distance_hi, coverage, mass_share (dense mass in the bucket)."""
    from focus_lab.recording.long_range import coverage_by_distance as coverage_by_pattern
    from focus_lab.runs import Run
    rows = []
    for method in RECORD_METHODS:
        path = Path(data_dir) / "runs" / method
        if not (path / "manifest.json").is_file():
            continue
        run = Run.open(path)
        k = run.manifest.get("focus_config", {}).get("top_k")
        pats = None if method == "focus" else ["focus"]
        for r in coverage_by_pattern(run.table("coverage_distance"), pats).itertuples():
            rows.append({"method": PATTERN_METHOD.get(r.pattern, r.pattern) if method == "focus" else method,
                         "top_k": k if r.pattern in ("focus", "random") else None,
                         "bucket": f"[{r.distance_lo}, {r.distance_hi})", "distance_lo": r.distance_lo,
                         "distance_hi": r.distance_hi, "coverage": r.coverage, "mass_share": r.mass_share})
    if not rows:
        raise FileNotFoundError(f"{Path(data_dir) / 'runs'} has no recorded runs: run `focus-lab-figures` "
                                "(experiment 'records')")
    return pd.DataFrame(rows).sort_values(["method", "distance_lo"])


def make_figure(data_dir: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = coverage_by_distance(data_dir)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.7, 0.3],
                        subplot_titles=("dense attention mass kept by the hard mask", "dense mass by distance"))
    order = list(dict.fromkeys(df.sort_values("distance_lo")["bucket"]))
    for method, part in df.groupby("method", sort=False):
        part = part.set_index("bucket").reindex(order).reset_index()
        k = part["top_k"].dropna()
        name = METHOD_NAMES.get(method, method) + (f", top-{int(k.iloc[0])}" if len(k) else "")
        fig.add_trace(go.Scatter(x=part["bucket"], y=part["coverage"], mode="lines+markers", name=name,
                                 line=dict(color=METHOD_COLORS.get(method, "#555"))), row=1, col=1)
    m = df[df["method"] == "focus"].set_index("bucket").reindex(order)
    fig.add_trace(go.Bar(x=order, y=m["mass_share"], name="dense mass share", marker_color="#444",
                         showlegend=False), row=1, col=2)
    fig.update_yaxes(title="coverage", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(title="share of dense mass", row=1, col=2)
    fig.update_xaxes(title="distance i - j (tokens)")
    sub = ""
    try:
        from focus_lab.runs import Run
        man = Run.open(Path(data_dir) / "runs" / "focus").manifest
        sub = (f"<br><sup>held-out Austen, {man.get('windows')} recorded windows of {man.get('seq_len')} tokens, "
               "every layer and head; sink tokens (kept by every mask) carry much of the far mass</sup>")
    except Exception:  # noqa: BLE001 - the subtitle is optional
        pass
    fig.update_layout(title=TITLE + sub, template="plotly_white", width=1400, height=570)
    return fig
