"""Figure 10: sequence-length transfer. The router trained on 512-token windows, evaluated at the
training length (``data/baselines``) and at longer contexts (``data/transfer_length``, default
2K and 4K tokens; docs/method.md §3: "centroids trained at T = 1024 transfer to T = 8192"). Left:
perplexity relative to dense at the same length; right: absolute perplexity."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.common import read

TITLE = "Sequence-length transfer: router trained at 512 tokens, evaluated longer"
DATA = ("baselines", "transfer_length")


def length_table(data_dir: Path) -> pd.DataFrame:
    t = read(data_dir, "transfer_length")
    keep = set(zip(t["method"], t["label"]))
    b = read(data_dir, "baselines")
    b = b[[(m, l) in keep for m, l in zip(b["method"], b["label"])]]
    df = pd.concat([b, t], ignore_index=True)
    df["pattern"] = [("random " if m == "random" else "") + l for m, l in zip(df["method"], df["label"])]
    dense = df[df["label"] == "dense"].set_index("seq_len")["perplexity"]
    df["ppl_vs_dense"] = df["perplexity"] / df["seq_len"].map(dense)
    return df.sort_values("seq_len")


def make_figure(data_dir: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = length_table(data_dir)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("PPL / dense PPL at the same length", "perplexity"))
    palette = ["#222222", "#7f7f7f", "#ff9896", "#d62728", "#8c0000", "#1f77b4", "#2ca02c", "#9467bd"]
    for i, (pattern, part) in enumerate(df.groupby("pattern", sort=False)):
        for col, y in ((1, "ppl_vs_dense"), (2, "perplexity")):
            fig.add_trace(go.Scatter(x=part["seq_len"], y=part[y], mode="lines+markers", name=pattern,
                                     line=dict(color=palette[i % len(palette)]),
                                     legendgroup=pattern, showlegend=col == 1), row=1, col=col)
    t0 = int(read(data_dir, "baselines")["seq_len"].iloc[0])
    fig.add_vline(x=t0, line=dict(color="gray", dash="dot"), annotation_text=f"router training length ({t0})")
    fig.update_xaxes(type="log", title="evaluation length (tokens)", tickvals=sorted(df["seq_len"].unique()))
    fig.update_layout(title=TITLE, template="plotly_white", width=1300, height=520)
    return fig
