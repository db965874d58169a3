"""The passkey probe's figure: exact-match heatmaps per (format, pattern), written as HTML and
PNG (kaleido + Chromium). Used by ``focus-lab passkey``, the dashboard's Passkey page and
``analyses/fig_passkey.py``; the probe itself is ``focus_lab.eval.passkey``."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd


def heatmap_figure(cases: pd.DataFrame):
    """One heatmap per (format, pattern) in first-seen order (the format named only when there
    are several): rows = prompt length (tokens), columns = needle depth (% of the haystack);
    colour = exact-match rate over the cell's cases (0..1), text = their mean key log-prob
    (nats, summed over the key's tokens), hover = the cell's case count.

    cases: ``passkey.parquet`` rows (format, pattern, length, depth, exact_match, key_logprob)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    fmt = cases["format"] if "format" in cases else pd.Series("", index=cases.index)
    panels = list(dict.fromkeys(zip(fmt, cases["pattern"])))
    titles = [f"{f}: {p}" if fmt.nunique() > 1 else p for f, p in panels]
    lengths = sorted(cases["length"].unique())
    depths = sorted(cases["depth"].unique())
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.07,
                        vertical_spacing=0.18 if rows > 1 else 0.1)
    c = cases.assign(exact_match=cases["exact_match"].astype(float))
    for n, (f, p) in enumerate(panels):
        sub = c[(fmt == f) & (c["pattern"] == p)]
        piv = {v: sub.pivot_table(index="length", columns="depth", values=v, aggfunc="mean")
                      .reindex(index=lengths, columns=depths) for v in ("exact_match", "key_logprob")}
        count = sub.groupby(["length", "depth"]).size().unstack().reindex(index=lengths, columns=depths)
        text = [["" if np.isnan(v) else f"{v:.1f}" for v in row] for row in piv["key_logprob"].to_numpy(float)]
        fig.add_trace(go.Heatmap(
            z=piv["exact_match"].to_numpy(float), x=[f"{d:g}%" for d in depths], y=[str(x) for x in lengths],
            zmin=0, zmax=1, colorscale="Viridis", text=text, texttemplate="%{text}", name=titles[n],
            customdata=count.fillna(0).to_numpy(int), showscale=n == 0,
            colorbar=dict(title="exact match", len=0.9),
            hovertemplate=f"{titles[n]}<br>length %{{y}} tokens, depth %{{x}}<br>exact match %{{z:.2f}} of "
                          "%{customdata} cases<br>mean key log-prob %{text} nats<extra></extra>"),
            row=n // cols + 1, col=n % cols + 1)
    fig.update_xaxes(title_text="needle depth", type="category")
    fig.update_yaxes(type="category", autorange="reversed")  # shortest prompt on top
    for r in range(1, rows + 1):
        fig.update_yaxes(title_text="prompt tokens", row=r, col=1)
    fig.update_layout(title="exact-match rate (colour) and mean key log-prob in nats (text), per pattern",
                      template="plotly_white", width=420 * cols + 120, height=300 * rows + 120,
                      margin=dict(l=10, r=10, t=70, b=10))
    return fig


def write_figure(fig, stem: Path, png: bool = False) -> tuple[list[str], str | None]:
    """Write ``stem.html`` (self-contained) and, with ``png``, ``stem.png`` through kaleido
    (Chromium at ``$BROWSER_PATH``, default /usr/bin/chromium), atomically. A PNG failure is not
    an error: the PNG is left out. Returns (file names written, a note saying why the PNG is
    missing, or None)."""
    from focus_lab.io import atomic_path
    html = stem.with_suffix(".html")
    with atomic_path(html) as tmp:
        fig.write_html(tmp, include_plotlyjs=True, full_html=True)
    files, note = [html.name], None
    if png:
        # kaleido finds Chromium at $BROWSER_PATH; else the path is passed (the environment is not changed)
        browser = None if os.environ.get("BROWSER_PATH") or not Path("/usr/bin/chromium").is_file() \
            else "/usr/bin/chromium"
        target = stem.with_suffix(".png")
        try:
            import kaleido
            with atomic_path(target) as tmp:
                kaleido.write_fig_sync(fig, path=str(tmp), opts={"format": "png", "scale": 1.5},
                                       kopts={"path": browser} if browser else None)
            files.append(target.name)
        except Exception as e:  # noqa: BLE001 - kaleido/Chromium problems must not lose the run
            first = str(e).splitlines()[0] if str(e) else ""
            note = (f"PNG not written ({type(e).__name__}: {first}; kaleido needs Chromium at "
                    f"$BROWSER_PATH or /usr/bin/chromium); the HTML is")
    return files, note
