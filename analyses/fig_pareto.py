"""Figure 1: quality-speed Pareto frontier of the retrofits.

Held-out perplexity (Austen, Persuasion) of every pattern of ``baselines.evaluate_baselines``
against (left) the measured end-to-end speedup: tokens/s over the dense pattern's in the same
run, at the evaluation length, and (right) the fraction of distant causal pairs the mask keeps
(the compute that remains; the speedup a kernel could reach is about its inverse at long
contexts). The black line is the Pareto frontier. When the benchmark's end-to-end table exists
(``bench_attention/e2e.csv``), its hard-Focus points at 4K/8K tokens are added on the left when
they were measured with the same router file (sha256); other routers' points are left out.
Window patterns go through the dense masked reference, so their measured speed is not what a
sliding-window kernel would give.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analyses.common import METHOD_COLORS, METHOD_NAMES, REPO, bench_dir, pareto_front, read

TITLE = "Quality vs speed of the retrofits (held-out PPL vs measured speedup and pairs kept)"
DATA = ("baselines",)


def _same_routers(data_dir: Path, routers: pd.Series) -> pd.Series:
    """Per benchmark row, whether its router file (``routers``: paths, relative to the repository
    or absolute) is the one of ``data/router``: sha256 compared, each file hashed once."""
    from focus_lab.io import file_sha256

    def sha(path: str) -> str | None:
        p = Path(path) if Path(path).is_absolute() else REPO / path
        return file_sha256(p) if p.is_file() else None
    try:
        mine = file_sha256(Path(read(data_dir, "router")["path"].iloc[0]))
    except (FileNotFoundError, OSError):
        return pd.Series(False, index=routers.index)
    same = {r: sha(r) == mine for r in routers.astype(str).unique()}
    return routers.astype(str).map(same)


def make_figure(data_dir: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = read(data_dir, "baselines")
    T = int(df["seq_len"].iloc[0])
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        f"PPL vs measured speedup (tokens/s / dense, T={T})", "PPL vs fraction of distant pairs kept"))
    for method, part in df.groupby("method", sort=False):
        lab = part["label"].str.replace("hard_", "").str.replace("window_matched_", "")
        hover = [f"{METHOD_NAMES.get(method, method)} {l}: PPL {p:.3f}, kept {k:.2f}, x{s:.2f}"
                 for l, p, k, s in zip(lab, part.perplexity, part.distant_pairs_kept, part.speedup)]
        style = dict(color=METHOD_COLORS.get(method, "#555"), size=9)
        for col, x in ((1, part["speedup"]), (2, part["distant_pairs_kept"])):
            fig.add_trace(go.Scatter(x=x, y=part["perplexity"], mode="markers+text", text=lab,
                                     textposition="top center", marker=style, hovertext=hover,
                                     hoverinfo="text", name=METHOD_NAMES.get(method, method),
                                     legendgroup=method, showlegend=col == 1), row=1, col=col)
    for col, x, larger in ((1, df["speedup"], True), (2, df["distant_pairs_kept"], False)):
        f = pareto_front(x.to_numpy(), df["perplexity"].to_numpy(), larger)
        fig.add_trace(go.Scatter(x=x.to_numpy()[f], y=df["perplexity"].to_numpy()[f], mode="lines",
                                 line=dict(color="black", width=1, dash="dot"), name="Pareto frontier",
                                 showlegend=col == 1, legendgroup="front"), row=1, col=col)
    b = bench_dir(Path(data_dir).parent)
    if b is not None and (b / "e2e.csv").is_file():
        e = pd.read_csv(b / "e2e.csv")
        # only the routers of this plot belong on it (the benchmark may use untrained or other routers)
        e = e[(e["attention"] == "hard") & _same_routers(data_dir, e["router"])]
        fig.add_trace(go.Scatter(x=e["speedup_vs_dense"], y=e["perplexity"], mode="markers+text",
                                 text=[f"T={t}" for t in e["tokens"]], textposition="bottom center",
                                 marker=dict(symbol="diamond", size=11, color=METHOD_COLORS["focus"]),
                                 name="Focus hard, benchmark end-to-end (longer T)"), row=1, col=1)
    dense = df[df["method"] == "dense"]["perplexity"]
    if len(dense):
        for col in (1, 2):
            fig.add_hline(y=float(dense.iloc[0]), line=dict(color="gray", dash="dash"), row=1, col=col)
    fig.add_vline(x=1.0, line=dict(color="gray", dash="dash"), row=1, col=1)
    fig.update_xaxes(title="speedup over dense (measured)", row=1, col=1)
    fig.update_xaxes(title="distant causal pairs kept (fraction)", row=1, col=2)
    fig.update_yaxes(title="held-out perplexity", row=1, col=1)
    fig.update_layout(title=f"{TITLE}<br><sup>held-out Austen, {int(df['tokens'].iloc[0] / (T - 1))} windows of {T} "
                            "tokens; speed measured inside the evaluation on a shared CPU, where load swings it by "
                            "tens of percent: figure 2 (the benchmark) is the speed measurement</sup>",
                      template="plotly_white", width=1400, height=620)
    return fig


if __name__ == "__main__":
    make_figure(Path(sys.argv[1] if len(sys.argv) > 1 else "figures/data")).write_html("fig_pareto.html")
