"""Figure 4: top-k sweep. Held-out PPL (left) and fraction of distant causal pairs kept (right)
for the top-k values the baselines ran at (``settings.baseline_top_ks``; 1..K when None): Focus,
random groups, k-means, online k-means (``data/baselines``), with dense and sliding-window PPL as
reference lines. MoBA is left out when its k counts blocks rather than the K groups (at 4096
tokens: 32 blocks of 128 tokens); it is in figure 1 at matched sparsity."""

from __future__ import annotations

from pathlib import Path

from analyses.common import METHOD_COLORS, METHOD_NAMES, read

TITLE = "Top-k sweep: perplexity and distant pairs kept by k"
DATA = ("baselines",)


def make_figure(data_dir: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = read(data_dir, "baselines")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("held-out perplexity", "distant causal pairs kept"))
    hard = df[df["mode"] == "hard"]
    K = int(df["num_groups"].iloc[0])
    left_out = hard[(hard["method"] == "moba") & (hard["top_k"] > K)]
    hard = hard[~hard.index.isin(left_out.index)] if len(left_out) else hard
    for method, part in hard.groupby("method", sort=False):
        part = part.sort_values("top_k")
        for col, y in ((1, "perplexity"), (2, "distant_pairs_kept")):
            fig.add_trace(go.Scatter(x=part["top_k"], y=part[y], mode="lines+markers",
                                     line=dict(color=METHOD_COLORS.get(method, "#555")),
                                     name=METHOD_NAMES.get(method, method), legendgroup=method,
                                     showlegend=col == 1), row=1, col=col)
    for method, dash in (("dense", "dash"), ("window", "dot")):
        v = df[df["method"] == method]["perplexity"]
        if len(v):
            fig.add_hline(y=float(v.iloc[0]), line=dict(color=METHOD_COLORS[method], dash=dash), row=1, col=1,
                          annotation_text=f"{method} {float(v.iloc[0]):.2f}")
    soft = df[(df["method"] == "focus") & (df["mode"] == "soft")]["perplexity"]
    if len(soft):
        fig.add_hline(y=float(soft.iloc[0]), line=dict(color=METHOD_COLORS["focus"], dash="dot"), row=1, col=1,
                      annotation_text=f"Focus soft {float(soft.iloc[0]):.2f}", annotation_position="bottom right")
    fig.update_xaxes(title="k (groups per query)", dtick=1)
    fig.update_yaxes(title="fraction", range=[0, 1.02], row=1, col=2)
    T = int(df["seq_len"].iloc[0])
    note = (f"<br><sup>held-out Austen, {int(df['tokens'].iloc[0] / (T - 1))} x {T} tokens, K = {K}"
            + ("; MoBA (k counts blocks) is in figure 1" if len(left_out) else "") + "</sup>")
    fig.update_layout(title=TITLE + note, template="plotly_white", width=1300, height=520)
    return fig
