"""Figure 2: speedup of hard Focus (two attention calls + LSE merge) over dense causal SDPA vs
sequence length, from the benchmark's own table (``analyses/bench_attention.py``):
``bench_attention/kernel.csv`` next to ``data/`` when present, else ``data/bench_attention/``.
Dashed: the ideal ``1 / (k/K + 2w/n)``. Thin dotted: the same call on the newest GPU measured, in
bf16, one line per backend (flash: circles, flex: diamonds; ``gpu_<tag>_kernel_bf16.csv`` beside it,
balanced groups, ``common.gpu_kernel_tables``), when present.
Right: the benchmark's end-to-end table (``e2e.csv``) when it exists: the embedded model with the shipped routers, tokens/s over dense's, for the prefill
(bare forward) at each length and for decoding (per-token time) at each context.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyses.common import bench_dir, gpu_kernel_tables, read, shown_path

TITLE = "Speedup of the decomposition over dense attention vs sequence length (CPU; GPU bf16 thin)"
DATA = ("bench",)


def make_figure(data_dir: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    b = bench_dir(Path(data_dir).parent)
    df = pd.read_csv(b / "kernel.csv") if b is not None else read(data_dir, "bench")
    e2e = pd.read_csv(b / "e2e.csv") if b is not None and (b / "e2e.csv").is_file() else None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("kernel: dense SDPA time / Focus time",
                                                        "end to end (SmolLM2-135M, shipped routers): speed vs dense"))
    palette = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    line_color = {}  # (K, k) -> the balanced CPU line's color, reused by the GPU lines
    for i, ((K, k, g), part) in enumerate(df.groupby(["K", "k", "groups"])):
        c = palette[i % len(palette)]
        if g == "balanced":
            line_color[(K, k)] = c
        name = f"K={K} k={k}" + ("" if g == "balanced" else f" ({g} groups)")
        fig.add_trace(go.Scatter(x=part["n"], y=part["speedup"], mode="lines+markers", name=name,
                                 line=dict(color=c, dash="solid" if g == "balanced" else "dot")), row=1, col=1)
        fig.add_trace(go.Scatter(x=part["n"], y=part["ideal_speedup"], mode="lines", name=f"ideal {name}",
                                 line=dict(color=c, dash="dash", width=1), showlegend=False), row=1, col=1)
    gpu, tables = gpu_kernel_tables(b)
    g = tables.get("bf16")
    for (K, k, backend), part in (g[g.groups == "balanced"].groupby(["K", "k", "backend"]) if g is not None else ()):
        fig.add_trace(go.Scatter(x=part["n"], y=part["speedup"], mode="lines+markers",
                                 name=f"{gpu} bf16 K={K} k={k} {backend}",
                                 marker=dict(size=5, symbol="diamond" if backend == "flex" else "circle"),
                                 line=dict(color=line_color.get((K, k), "gray"), width=1, dash="dot")), row=1, col=1)
    fig.add_hline(y=1, line=dict(color="gray", dash="dash"), row=1, col=1)
    if e2e is not None and "phase" in e2e:
        colors = {"window": "#7f7f7f", "hard_top1": "#d62728", "hard_top2": "#ff7f0e", "random_top2": "#1f77b4"}
        e2e = e2e.assign(x=[f"{ph} {int(t)}" for ph, t in zip(e2e.phase, e2e.tokens)],
                         speedup=e2e.speedup_bare.where(e2e.phase == "prefill", e2e.get("speedup_decode")))
        for pat, part in e2e[e2e.pattern != "dense"].groupby("pattern", sort=False):
            fig.add_trace(go.Bar(x=part["x"], y=part["speedup"], name=f"end to end, {pat}",
                                 marker_color=colors.get(pat)), row=1, col=2)
        fig.add_hline(y=1, line=dict(color="gray", dash="dash"), row=1, col=2)
    else:
        fig.add_annotation(text="no end-to-end table (bench_attention/e2e.csv) yet", showarrow=False,
                           xref="x2 domain", yref="y2 domain", x=0.5, y=0.5)
    fig.update_xaxes(type="log", title="tokens n", row=1, col=1)
    fig.update_yaxes(type="log", title="speedup", row=1, col=1)
    fig.update_xaxes(title="prefill length / decode context (tokens)", row=1, col=2)
    fig.update_layout(barmode="group")
    src = df["source"].iloc[0] if "source" in df else shown_path(b)
    fig.update_layout(title=f"{TITLE}<br><sup>source: {src}</sup>", template="plotly_white", width=1300, height=550)
    return fig
