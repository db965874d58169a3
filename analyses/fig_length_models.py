"""Figure 13: the length table of both models in one figure. Each model's shipped routers on
held-out *Persuasion* (corpus ``austen``): the perplexity change of hard top-1, hard top-2 and
random groups at top-2 over dense at the same length, SmolLM2-135M from 512 to 8192 tokens
(table ``analyses.doc_blocks.SHIPPED_TABLE``), Gemma-3-270M from 4096 to 32768 (table
``analyses.doc_blocks.GEMMA_TABLE``), both read from the committed per-window rows
(``figures/results/length_cells.parquet``) and pooled as the docs' length tables pool them
(``analyses.length_table.summarize``: perplexity exp(token-weighted mean NLL), 95% paired
bootstrap interval over windows, drawn only where a length has 3 windows or more).
Sources: README.md (SmolLM2's table), docs/studies/gemma-routers.md (Gemma's).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from analyses.common import REPO

TITLE = "Length transfer of both models' shipped routers on held-out Persuasion: change of perplexity over dense"
DATA = ()  # the committed length-table cells, not an experiment's cache
CORPUS = "austen"
PATTERNS = {"hard_top1": ("hard top-1", "#ff9896", None), "hard_top2": ("hard top-2", "#d62728", None),
            "random_top2": ("random groups, top-2", "#1f77b4", "dot")}
MIN_WINDOWS = 3  # fewer windows: the change alone, no interval (as the docs' tables print it)
TICKS = [512 * 2 ** i for i in range(7)]  # 512 .. 32768


def model_tables() -> dict[str, str]:
    """{panel title: committed table}: SmolLM2's shipped table, then Gemma's."""
    from analyses.doc_blocks import GEMMA_TABLE, SHIPPED_TABLE
    return {"SmolLM2-135M": SHIPPED_TABLE, "Gemma-3-270M": GEMMA_TABLE}


def length_points(cells: Path | None = None) -> pd.DataFrame:
    """One row per (model, length, pattern) of ``PATTERNS`` on ``CORPUS``: model, table,
    router, seq_len, label, windows, perplexity, distant_pairs_kept, change_pct (over dense at
    the same length) and its interval ci_lo / ci_hi (NaN under ``MIN_WINDOWS`` windows).
    FileNotFoundError when the committed cells or a table are missing."""
    from analyses.doc_blocks import LENGTH_CELLS
    from analyses.length_table import committed_cells, summarize
    path = Path(cells) if cells is not None else REPO / LENGTH_CELLS
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (the committed length-table cells)")
    df = committed_cells(path)
    out = []
    for model, table in model_tables().items():
        rows = df[(df["table"] == table) & (df["corpus"] == CORPUS)].drop(columns="table")
        if not len(rows):
            raise FileNotFoundError(f"{path} has no rows of table {table} on {CORPUS}")
        rows = rows[rows["label"].isin(["dense", *PATTERNS])]  # the bootstrap runs only for what is drawn
        s = summarize(rows)
        s = s[s["label"].isin(list(PATTERNS))].copy()
        s["model"], s["table"] = model, table
        s["router"] = rows["router_name"].iloc[0] if "router_name" in rows else ""
        short = s["windows"] < MIN_WINDOWS
        s.loc[short, ["ci_lo", "ci_hi"]] = float("nan")
        out.append(s.rename(columns={"delta_vs_dense_pct": "change_pct"}))
    cols = ["model", "table", "router", "seq_len", "label", "windows", "perplexity", "distant_pairs_kept",
            "change_pct", "ci_lo", "ci_hi"]
    return pd.concat(out, ignore_index=True)[cols].sort_values(["model", "label", "seq_len"], kind="stable")


def _windows_text(g: pd.DataFrame) -> str:
    per = g.groupby("seq_len")["windows"].max()
    return ", ".join(f"{w} at {L}" for L, w in per.items())


def make_figure(data_dir: Path | None = None, cells: Path | None = None):
    """The figure (``data_dir`` is unused: the data are the committed cells, or ``cells``)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = length_points(cells)
    models = list(model_tables())
    titles = [f"{m} (routers {df[df.model == m].router.iloc[0]})" for m in models]
    fig = make_subplots(rows=1, cols=len(models), shared_yaxes=True, subplot_titles=titles, horizontal_spacing=0.04)
    for j, model in enumerate(models, start=1):
        part = df[df["model"] == model]
        for label, (name, color, dash) in PATTERNS.items():
            g = part[part["label"] == label].sort_values("seq_len")
            if not len(g):
                continue
            fig.add_trace(go.Scatter(
                x=g["seq_len"], y=g["change_pct"], mode="lines+markers", name=name, legendgroup=label,
                showlegend=j == 1, line=dict(color=color, dash=dash), marker=dict(size=8),
                error_y=dict(type="data", symmetric=False, array=g["ci_hi"] - g["change_pct"],
                             arrayminus=g["change_pct"] - g["ci_lo"], thickness=1.5, width=5),
                hovertext=[f"{model}, {name} at {L}: {c:+.2f}% over dense"
                           + (f" [{lo:+.2f}, {hi:+.2f}]" if not math.isnan(lo) else " (no interval)")
                           + f"; PPL {p:.2f}; distant pairs kept {k:.2f}; {w} window{'s' if w != 1 else ''}"
                           for L, c, lo, hi, p, k, w in zip(g.seq_len, g.change_pct, g.ci_lo, g.ci_hi, g.perplexity,
                                                             g.distant_pairs_kept, g.windows)],
                hoverinfo="text"), row=1, col=j)
        fig.add_hline(y=0, line=dict(color="gray", dash="dash"), row=1, col=j)
    lo, hi = math.log10(TICKS[0]) - 0.12, math.log10(TICKS[-1]) + 0.12
    fig.update_xaxes(type="log", tickvals=TICKS, ticktext=[str(t) for t in TICKS], range=[lo, hi], title="tokens")
    fig.update_yaxes(title="perplexity change over dense (%)", ticksuffix="%", zeroline=False, col=1)
    windows = "; ".join(f"{m}: {_windows_text(df[df.model == m])}" for m in models)
    fig.update_layout(title=f"{TITLE}<br><sup>windows per length: {windows}<br>bars: 95% paired bootstrap "
                            f"interval over windows (from {MIN_WINDOWS} windows); random groups: balanced, at the "
                            "router's k</sup>",
                      template="plotly_white", width=1400, height=620, margin=dict(t=130),
                      legend=dict(orientation="h", y=-0.15))
    return fig


if __name__ == "__main__":
    make_figure(Path(sys.argv[1]) if len(sys.argv) > 1 else None).write_html("fig_length_models.html")
