"""Figure 5: what the groups are. Top: group x POS heatmaps (share of each Focus group's tokens
per coarse spaCy POS tag) for a few layers; bottom: normalized mutual information between groups
and POS, per layer, for Focus vs k-means on the router input vs random groups (the recorder's
``pos_contingency`` and ``linguistic_scores`` tables of the recorded Focus run,
``data/runs/focus``; docs/method.md §5 "interpretability")."""

from __future__ import annotations

from pathlib import Path

from analyses.common import METHOD_COLORS

TITLE = "Groups vs part of speech by layer, with NMI against k-means and random groups"
DATA = ("records",)
SHOW_LAYERS = 5


def make_figure(data_dir: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    from focus_lab.runs import Run

    path = Path(data_dir) / "runs" / "focus"
    if not (path / "manifest.json").is_file():
        raise FileNotFoundError(f"{path} is missing: run `focus-lab-figures` (experiment 'records')")
    run = Run.open(path)
    if not run.has("pos_contingency"):
        raise FileNotFoundError(f"{path} has no pos_contingency table (recorded without spaCy)")
    ct = run.table("pos_contingency")
    sc = run.table("linguistic_scores")
    ct = ct[ct["assignment"] == "focus"]
    layers = sorted(ct["layer_idx"].unique())
    n = min(SHOW_LAYERS, len(layers))
    shown = [layers[round(i * (len(layers) - 1) / max(1, n - 1))] for i in range(n)] if n > 1 else layers[:1]
    shown = list(dict.fromkeys(shown))
    top_pos = ct.groupby("pos")["tokens"].sum().sort_values(ascending=False).index[:12].tolist()
    fig = make_subplots(rows=2, cols=len(shown), row_heights=[0.55, 0.45], vertical_spacing=0.15,
                        specs=[[{}] * len(shown), [{"colspan": len(shown)}] + [None] * (len(shown) - 1)],
                        subplot_titles=[f"layer {l}" for l in shown] + ["NMI(groups, POS) by layer"])
    for c, l in enumerate(shown, start=1):
        sub = ct[(ct["layer_idx"] == l) & (ct["pos"].isin(top_pos))]
        piv = sub.pivot_table(index="group", columns="pos", values="share_of_group", fill_value=0.0)
        piv = piv.reindex(columns=[p for p in top_pos if p in piv.columns])
        fig.add_trace(go.Heatmap(z=piv.to_numpy(), x=list(piv.columns), y=[f"g{g}" for g in piv.index],
                                 coloraxis="coloraxis", hovertemplate="group %{y}, %{x}: %{z:.1%}<extra></extra>"),
                      row=1, col=c)
    pos_sc = sc[sc["labels"] == "pos"]
    names = {"focus": "Focus", "kmeans": "k-means", "random": "random"}
    for a, part in pos_sc.groupby("assignment"):
        part = part.sort_values("layer_idx")
        fig.add_trace(go.Scatter(x=part["layer_idx"], y=part["nmi"], mode="lines+markers", name=names.get(a, a),
                                 line=dict(color=METHOD_COLORS.get(a, "#555"))), row=2, col=1)
    mean = pos_sc.groupby("assignment")["nmi"].mean()
    sub = ", ".join(f"{names.get(a, a)} {v:.3f}" for a, v in mean.items())
    fig.update_layout(title=f"{TITLE}<br><sup>mean NMI over layers: {sub}; {run.manifest.get('windows')} windows "
                            f"of {run.manifest.get('seq_len')} tokens</sup>",
                      coloraxis=dict(colorscale="Viridis", colorbar=dict(title="share", len=0.5, y=0.78)),
                      legend=dict(orientation="h", x=0, y=0.44, xanchor="left", yanchor="bottom"),
                      template="plotly_white", width=1500, height=850)
    fig.update_xaxes(title="layer", row=2, col=1)
    fig.update_yaxes(title="NMI", row=2, col=1)
    return fig
