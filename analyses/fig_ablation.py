"""Figure 7: ablation over K, window, tau and Sinkhorn iterations (docs/method.md §3, Table 9: "16
settings move fine-tuned PPL by only 0.6"). One axis at a time around the base setting, each a
short router training from the same initialization (``analyses/exp_ablation.py``), evaluated on
held-out Austen in soft mode and hard top-(K/2). Dotted: dense."""

from __future__ import annotations

from pathlib import Path

from analyses.common import read

TITLE = "Ablation: K, window, tau, Sinkhorn iterations (short runs)"
DATA = ("ablation",)
AXES = ("num_groups", "window", "tau", "sinkhorn_iters")


def make_figure(data_dir: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = read(data_dir, "ablation")
    base = df[df["axis"] == "base"]
    dense = base[base["mode"] == "dense"]["perplexity"]
    rows = df[df["mode"] != "dense"].copy()
    rows["kind"] = rows["mode"].map({"soft": "soft", "hard": "hard top-K/2"})
    axes = [a for a in AXES if a in set(df["axis"])]
    fig = make_subplots(rows=1, cols=len(axes), subplot_titles=axes, shared_yaxes=True)
    colors = {"soft": "#d62728", "hard top-K/2": "#1f77b4"}
    for c, axis in enumerate(axes, start=1):
        part = rows[(rows["axis"] == axis) | (rows["axis"] == "base")].sort_values(axis)
        for kind, p in part.groupby("kind"):
            fig.add_trace(go.Scatter(x=[str(v) for v in p[axis]], y=p["perplexity"], mode="lines+markers",
                                     name=kind, line=dict(color=colors[kind]), showlegend=c == 1,
                                     legendgroup=kind), row=1, col=c)
        if len(dense):
            fig.add_hline(y=float(dense.iloc[0]), line=dict(color="gray", dash="dot"), row=1, col=c)
        fig.update_xaxes(type="category", title=axis, row=1, col=c)
    spread = rows.groupby("kind")["perplexity"].agg(lambda s: s.max() - s.min())
    sub = ", ".join(f"{k}: {v:.2f}" for k, v in spread.items())
    fig.update_yaxes(title="held-out perplexity", row=1, col=1)
    fig.update_layout(title=f"{TITLE}<br><sup>PPL range over {rows['setting'].nunique()} settings: {sub}</sup>",
                      template="plotly_white", width=1400, height=500)
    return fig
