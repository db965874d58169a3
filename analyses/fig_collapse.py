"""Figure 3: Sinkhorn vs plain softmax: the largest group's share of tokens over training steps
(docs/method.md §1: "with plain softmax one group absorbs almost every token, 99.4% vs 15.9% with
Sinkhorn, K = 8"). Same router initialization and windows, a few steps each
(``analyses/exp_collapse.py``). Left: share of tokens whose most probable group (under the gate the
training uses) is the largest group; right: the causal hard top-1 assignment. Mean over layers,
band = min..max over layers; dotted line = 1/K.
"""

from __future__ import annotations

from pathlib import Path

from analyses.common import read

TITLE = "Group collapse: Sinkhorn vs plain softmax during router training"
DATA = ("collapse",)


def make_figure(data_dir: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = read(data_dir, "collapse")
    K = int(df["num_groups"].iloc[0])
    fig = make_subplots(rows=1, cols=2, subplot_titles=("largest share, argmax of the gate's P",
                                                        "largest share, causal hard top-1"))
    colors = {"sinkhorn": "#d62728", "softmax": "#1f77b4"}
    for gate, part in df.groupby("gate"):
        for col, metric in ((1, "argmax_largest_share"), (2, "hard_largest_share")):
            g = part.groupby("step")[metric].agg(["mean", "min", "max"]).reset_index()
            c = colors.get(gate, "#555")
            fig.add_trace(go.Scatter(x=list(g.step) + list(g.step[::-1]), y=list(g["max"]) + list(g["min"][::-1]),
                                     fill="toself", line=dict(width=0), fillcolor=c, opacity=0.15,
                                     showlegend=False, hoverinfo="skip"), row=1, col=col)
            fig.add_trace(go.Scatter(x=g.step, y=g["mean"], mode="lines+markers", line=dict(color=c),
                                     name=gate, legendgroup=gate, showlegend=col == 1), row=1, col=col)
    for col in (1, 2):
        fig.add_hline(y=1 / K, line=dict(color="gray", dash="dot"), row=1, col=col,
                      annotation_text=f"1/K = {1 / K:.3f}")
    last = df[df.step == df.step.max()].groupby("gate")["argmax_largest_share"].mean()
    sub = ", ".join(f"{g}: {v:.1%}" for g, v in last.items())
    fig.update_yaxes(range=[0, 1.02], title="largest group's share of tokens")
    fig.update_xaxes(title="training step")
    fig.update_layout(title=f"{TITLE} (K={K})<br><sup>last step, mean over layers: {sub}</sup>",
                      template="plotly_white", width=1300, height=520)
    return fig
