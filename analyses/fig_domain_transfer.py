"""Figure 8: domain transfer. The router trained on Austen, evaluated on held-out Austen
(Persuasion), Shakespeare (Hamlet) and the Python docs (tutorial): perplexity of each pattern
relative to the dense model on the same windows (``data/baselines``, ``data/transfer_domain``).
Random groups at the router's top-k are the control."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.common import read

TITLE = "Domain transfer: Austen router on Shakespeare and Python docs (PPL relative to dense)"
DATA = ("baselines", "transfer_domain")


def domain_table(data_dir: Path) -> pd.DataFrame:
    a = read(data_dir, "baselines")
    a = a[a["method"].isin(["dense", "window", "focus"]) |
          ((a["method"] == "random") & (a["label"] == f"hard_top{max(1, int(a['num_groups'].iloc[0]) // 2)}"))]
    t = read(data_dir, "transfer_domain")
    df = pd.concat([a, t], ignore_index=True)
    df["pattern"] = [("random " if m == "random" else "") + l for m, l in zip(df["method"], df["label"])]
    dense = df[df["label"] == "dense"].set_index("corpus")["perplexity"]
    df["ppl_vs_dense"] = df["perplexity"] / df["corpus"].map(dense)
    return df


def make_figure(data_dir: Path):
    import plotly.graph_objects as go

    df = domain_table(data_dir)
    fig = go.Figure()
    for corpus, part in df.groupby("corpus", sort=False):
        fig.add_trace(go.Bar(x=part["pattern"], y=part["ppl_vs_dense"], name=corpus,
                             hovertext=[f"{corpus} {p}: PPL {v:.3f}" for p, v in zip(part["pattern"], part["perplexity"])],
                             hoverinfo="text", text=[f"{v:.2f}" for v in part["perplexity"]], textposition="outside"))
    fig.add_hline(y=1.0, line=dict(color="gray", dash="dash"))
    r = df["ppl_vs_dense"]
    fig.update_yaxes(range=[min(1.0, r.min()) * 0.97, max(1.0, r.max()) * 1.05])  # zoomed
    fig.update_layout(title=TITLE + "<br><sup>bar labels: absolute perplexity</sup>", barmode="group",
                      template="plotly_white", width=1300, height=550, yaxis_title="PPL / dense PPL (same windows)")
    return fig
