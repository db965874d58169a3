"""Figure 8: domain transfer. The shipped routers, trained on Austen, on held-out Austen
(Persuasion), Shakespeare (Hamlet) and the Python docs (tutorial) at 4096 tokens: perplexity
change of each pattern over the dense model on the same windows, with its 95% paired bootstrap
interval (``data/transfer_length`` for Austen, ``data/transfer_domain`` for the others). Random
and shuffled groups at the router's sparsity are the controls."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from analyses.common import change_table, read

TITLE = "Domain transfer: Austen-trained routers on Shakespeare and Python docs (PPL change vs dense)"
DATA = ("transfer_domain", "transfer_length")


def domain_table(data_dir: Path) -> pd.DataFrame:
    """Per (corpus, pattern) at the domain cells' length: perplexity, change vs dense (%, 95% interval)."""
    t = read(data_dir, "transfer_domain", per_window=True)
    T = int(t["seq_len"].max())
    try:
        a = read(data_dir, "transfer_length", per_window=True)
        a = a[(a["corpus"] == "austen") & (a["seq_len"] == T)]
    except FileNotFoundError:
        a = t.iloc[:0]
    df = pd.concat([a, t[t["corpus"] != "austen"]], ignore_index=True)
    return change_table(df, by=("corpus", "seq_len"), patterns=("label",), reference=("dense",))


def make_figure(data_dir: Path):
    import plotly.graph_objects as go

    df = domain_table(data_dir)
    order = ["hard_top1", "random_top1", "shuffled_top1", "hard_top2", "random_top2", "shuffled_top2", "window"]
    df = df.assign(_o=df["label"].map(lambda l: order.index(l) if l in order else len(order))).sort_values(["_o"], kind="stable")
    fig = go.Figure()
    for corpus, part in df[df["label"] != "dense"].groupby("corpus", sort=False):
        fig.add_trace(go.Bar(x=part["label"], y=part["change_pct"], name=f"{corpus} ({int(part['windows'].max())} windows)",
                             error_y=dict(type="data", symmetric=False, array=part["ci_hi"] - part["change_pct"],
                                          arrayminus=part["change_pct"] - part["ci_lo"]),
                             hovertext=[f"{corpus} {p}: PPL {v:.2f}, kept {k:.2f}" for p, v, k in
                                        zip(part["label"], part["perplexity"], part["distant_pairs_kept"])],
                             hoverinfo="text", text=[f"{v:.2f}" for v in part["perplexity"]], textposition="inside",
                             insidetextanchor="start"))
    fig.add_hline(y=0.0, line=dict(color="gray", dash="dash"))
    T = int(df["seq_len"].iloc[0])
    fig.update_layout(title=f"{TITLE}<br><sup>{T} tokens per window; bar labels: absolute perplexity; error bars: "
                            "95% paired bootstrap interval over windows</sup>", barmode="group",
                      template="plotly_white", width=1300, height=560, yaxis_title="PPL change vs dense (%)")
    return fig


if __name__ == "__main__":
    make_figure(Path(sys.argv[1] if len(sys.argv) > 1 else "figures/data")).write_html("fig_domain_transfer.html")
