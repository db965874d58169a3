"""Figure 10: sequence-length transfer. The shipped routers (trained at 512 tokens, then distilled
at 4096) evaluated from 512 to 8192 tokens on held-out Austen (Persuasion) and Shakespeare
(Hamlet), the length table's windows (``data/transfer_length``: 8 windows up to 4K, 4 at 8K).
Top: perplexity change over dense at the same length with its 95% paired bootstrap interval over
windows; bottom: distant pairs kept. Random and shuffled groups at the router's sparsity are
the controls (docs/method.md §3: "centroids trained at T = 1024 transfer to T = 8192")."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analyses.common import change_table, read

TITLE = "Sequence-length transfer: shipped routers from 512 to 8192 tokens, against random and shuffled groups"
DATA = ("transfer_length", "router")
COLORS = {"window": "#7f7f7f", "hard_top1": "#ff9896", "hard_top2": "#d62728", "random_top1": "#aec7e8",
          "random_top2": "#1f77b4", "shuffled_top1": "#c49c94", "shuffled_top2": "#8c564b"}


def length_table(data_dir: Path) -> pd.DataFrame:
    """Per (corpus, length, pattern): perplexity, change vs dense (%, 95% interval), pairs kept."""
    t = read(data_dir, "transfer_length", per_window=True)
    return change_table(t, by=("corpus", "seq_len"), patterns=("label",), reference=("dense",))


def make_figure(data_dir: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = length_table(data_dir)
    corpora = list(dict.fromkeys(df["corpus"]))
    fig = make_subplots(rows=2, cols=len(corpora), shared_xaxes=True, row_heights=[0.65, 0.35],
                        subplot_titles=[f"{c}: PPL change vs dense (%)" for c in corpora]
                        + [f"{c}: distant pairs kept" for c in corpora], vertical_spacing=0.1)
    for j, corpus in enumerate(corpora, start=1):
        part = df[(df["corpus"] == corpus) & (df["label"] != "dense")]
        for label, g in part.groupby("label", sort=False):
            g = g.sort_values("seq_len")
            style = dict(color=COLORS.get(label, "#555"), dash="dot" if label.startswith(("random", "shuffled"))
                         else None)
            fig.add_trace(go.Scatter(x=g["seq_len"], y=g["change_pct"], mode="lines+markers", name=label,
                                     line=style, legendgroup=label, showlegend=j == 1,
                                     error_y=dict(type="data", symmetric=False, array=g["ci_hi"] - g["change_pct"],
                                                  arrayminus=g["change_pct"] - g["ci_lo"]),
                                     hovertext=[f"{label} at {t}: PPL {p:.2f} ({c:+.1f}% [{lo:+.1f}, {hi:+.1f}]), "
                                                f"{w} windows" for t, p, c, lo, hi, w in zip(
                                                    g.seq_len, g.perplexity, g.change_pct, g.ci_lo, g.ci_hi, g.windows)],
                                     hoverinfo="text"), row=1, col=j)
            if label != "window":
                fig.add_trace(go.Scatter(x=g["seq_len"], y=g["distant_pairs_kept"], mode="lines+markers",
                                         line=style, name=label, legendgroup=label, showlegend=False), row=2, col=j)
        fig.add_hline(y=0, line=dict(color="gray", dash="dash"), row=1, col=j)
    try:
        r = read(data_dir, "router").iloc[0]
        for t in sorted({512, int(r["train_seq_len"])} if pd.notna(r.get("train_seq_len")) else set()):
            fig.add_vline(x=t, line=dict(color="gray", dash="dot"))
    except FileNotFoundError:
        pass
    fig.update_xaxes(type="log", tickvals=sorted(df["seq_len"].unique()))
    fig.update_xaxes(title="tokens", row=2)
    fig.update_yaxes(range=[0, 1.02], row=2)
    n = df.groupby("seq_len")["windows"].max()
    fig.update_layout(title=f"{TITLE}<br><sup>windows per length: " + ", ".join(f"{t}: {w}" for t, w in n.items())
                            + "; dotted verticals: the routers' training lengths; bars: 95% paired bootstrap "
                              "interval over windows</sup>",
                      template="plotly_white", width=1400, height=760)
    return fig


if __name__ == "__main__":
    make_figure(Path(sys.argv[1] if len(sys.argv) > 1 else "figures/data")).write_html("fig_length_transfer.html")
