"""Figure 11: the causal leak of the soft gate (docs/method.md §1 [ours]). Sinkhorn normalizes over the
tokens of the whole window, so a token's soft groups depend on later tokens. Perplexity on the
same held-out windows with the same router: dense; soft mode with Sinkhorn over the whole
window (what training sees); soft mode with prefix-causal Sinkhorn (token i balanced over
tokens <= i only, ``baselines.PrefixCausalRouter``); causal hard top-k inference."""

from __future__ import annotations

from pathlib import Path

from analyses.common import read

TITLE = "The causal leak: soft (whole-window Sinkhorn) vs prefix-causal soft vs hard causal inference"
DATA = ("causal_leak",)


def make_figure(data_dir: Path):
    import plotly.graph_objects as go

    df = read(data_dir, "causal_leak")
    order = ["dense", "soft, Sinkhorn over the window", "soft, prefix-causal Sinkhorn"]
    order += sorted(v for v in df["variant"] if v.startswith("hard"))
    df = df.set_index("variant").reindex([o for o in order if o in set(df["variant"])]).reset_index()
    colors = ["#222222", "#ff9896", "#d62728"] + ["#1f77b4"] * (len(df) - 3)
    fig = go.Figure(go.Bar(x=df["variant"], y=df["perplexity"], marker_color=colors[: len(df)],
                           text=[f"{v:.3f}" for v in df["perplexity"]], textposition="outside"))
    dense = float(df.loc[df["variant"] == "dense", "perplexity"].iloc[0])
    fig.add_hline(y=dense, line=dict(color="gray", dash="dash"))
    fig.update_layout(title=TITLE, template="plotly_white", width=1100, height=520, yaxis_title="held-out perplexity",
                      yaxis_range=[float(df["perplexity"].min()) * 0.95, float(df["perplexity"].max()) * 1.05])
    return fig
