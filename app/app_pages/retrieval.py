"""Retrieval: RULER's retrieval families per attention pattern, and where each failure happens
(``focus-lab probe retrieval``, docs/retrieval.md).

Reads a retrieval output folder below the runs root (``cases.parquet``, ``trace.parquet``; not a
recorder run); where the runs root holds none, the committed suite of the shipped router file
(``figures/results/retrieval_cases.parquet`` via ``focus_lab.eval.committed``: grid and table, no
case view). The grid is each pattern's score relative to dense per task and length, with a
paired 95% bootstrap interval over the cases (``eval.retrieval_tables.summary``); a case view shows
the needle in its haystack, each pattern's answer, and a layer x head map of the dense attention
to the needle that the chosen pattern's mask drops, the retrieval heads marked (Wu et al.).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from focus_lab.app import lib
from focus_lab.eval.retrieval_tables import retrieval_heads, summary


def grid_figure(s: pd.DataFrame, length: int) -> go.Figure:
    """Task x pattern heatmap of the score relative to dense at one length (text: ratio and its
    interval; tasks where dense scores below 50% are marked and left grey)."""
    g = s[s["length"] == length]
    tasks = list(dict.fromkeys(g["task"]))
    pats = list(dict.fromkeys(g["pattern"]))
    z = np.full((len(tasks), len(pats)), np.nan)
    text = [["" for _ in pats] for _ in tasks]
    for r in g.itertuples():
        i, j = tasks.index(r.task), pats.index(r.pattern)
        if r.dense_below_half:
            text[i][j] = f"{r.score:.2f}"
            continue
        z[i, j] = r.relative
        text[i][j] = f"{r.relative:.2f}<br>[{r.relative_lo:.2f}, {r.relative_hi:.2f}]<br>n={r.cases}"
    labels = [t + (" (dense < 50%)" if g[g["task"] == t]["dense_below_half"].iloc[0] else "") for t in tasks]
    fig = go.Figure(go.Heatmap(z=z, x=pats, y=labels, text=text, texttemplate="%{text}", zmin=0, zmax=1.2,
                               colorscale="RdYlGn", colorbar=dict(title="score / dense"),
                               hovertemplate="%{y}<br>%{x}: %{text}<extra></extra>"))
    fig.update_layout(title=f"score relative to dense at {length} tokens (paired 95% interval over cases)",
                      height=110 + 46 * len(tasks), margin=dict(l=10, r=10, t=90, b=10))
    fig.update_xaxes(side="top")
    fig.update_yaxes(autorange="reversed")
    return fig


def dropped_figure(tr: pd.DataFrame, heads: pd.DataFrame, title: str) -> go.Figure:
    """Layer x head heatmap of the dense attention mass to the needle that the pattern's mask
    drops (dense mass minus the mass on the pairs it keeps), retrieval heads circled."""
    piv = (tr.assign(dropped=tr["dense_mass"] - tr["mass_kept"])
           .pivot_table(index="layer_idx", columns="head", values="dropped", aggfunc="mean"))
    fig = go.Figure(go.Heatmap(z=piv.to_numpy(), x=[f"H{h}" for h in piv.columns], y=piv.index.to_list(),
                               colorscale="Reds", colorbar=dict(title="mass dropped"),
                               hovertemplate="layer %{y}, %{x}: %{z:.3f} dropped<extra></extra>"))
    rh = heads[heads["retrieval_head"]]
    if len(rh):
        fig.add_trace(go.Scatter(x=[f"H{h}" for h in rh["head"]], y=rh["layer_idx"], mode="markers",
                                 marker=dict(symbol="circle-open", size=14, color="#1f77b4", line=dict(width=2)),
                                 name="retrieval head (score >= 0.1)",
                                 hovertemplate="retrieval head L%{y} %{x}<extra></extra>"))
    fig.update_layout(title=title, height=620, margin=dict(l=10, r=10, t=50, b=10),
                      legend=dict(orientation="h", y=-0.08, x=0))
    fig.update_yaxes(title_text="layer", autorange="reversed")
    return fig


def summary_table(s: pd.DataFrame, L: int, csv_name: str) -> None:
    """The summary rows at length ``L`` as a table, with a CSV download named ``csv_name``."""
    cols = ["task", "pattern", "cases", "score", "relative", "relative_lo", "relative_hi", "logprob_change",
            "distant_pairs_kept", "needle_pairs_kept", "dense_below_half"]
    if "canonical_pattern" in s.columns:
        cols.insert(2, "canonical_pattern")
    tab = s[s["length"] == L][cols]
    st.dataframe(tab, hide_index=True, width="stretch", key="retrieval_summary",
                 column_config={c: st.column_config.NumberColumn(format="%.2f")
                                for c in ("score", "relative", "relative_lo", "relative_hi", "logprob_change",
                                          "distant_pairs_kept", "needle_pairs_kept")})
    lib.download_csv(tab, csv_name)


SCORE_CAPTION = ("RULER's score: the share of the expected answers in the greedy output; answer log-prob: "
                 "teacher forced, nats, summed over the answers' tokens (0 = certain).")


def committed_page(root) -> None:
    """No retrieval output below the runs root: the committed suite of the shipped router file
    (``focus_lab.eval.committed.committed_retrieval``), its grid and table, or a message that
    there is none (no ``figures/results`` beside the installed package)."""
    res, why = lib.committed_result("retrieval")
    if res is None:
        st.info(f"No retrieval output below the runs root `{root}`. Make one with `{lib.RETRIEVAL_HINT}` "
                f"(docs/retrieval.md), then reload this page. No committed result to show either: {why}.")
        return
    lib.committed_intro("retrieval", root, res.source, lib.RETRIEVAL_HINT, "docs/retrieval.md")
    devices = list(dict.fromkeys(res.cases["device"].dropna())) if "device" in res.cases.columns else []
    st.caption(SCORE_CAPTION + (f" Measured on: {'; '.join(devices)}." if devices else ""))
    s = res.summary
    lengths = sorted(int(x) for x in s["length"].unique())
    L = st.selectbox("length (tokens)", lengths, key="retrieval_length") if len(lengths) > 1 else lengths[0]
    st.plotly_chart(grid_figure(s, L), width="stretch")
    summary_table(s, L, f"retrieval_committed_{res.source.router_name.replace('/', '_')}_{L}.csv")


def page() -> None:
    st.title("Retrieval")
    root = lib.runs_root()
    dirs = lib.retrieval_dirs(root)
    if not dirs:
        committed_page(root)
        return
    name = lib.pick_probe_output("Retrieval", dirs, "retrieval_dir", root, lib.RETRIEVAL_FILES,
                                 lib.RETRIEVAL_HINT, "docs/retrieval.md")
    if name is None:
        return
    cases, trace = lib.open_retrieval(name, root)
    if cases.empty:
        st.info(f"The cases table of **{name}** is empty; run the suite again: `{lib.RETRIEVAL_HINT}`.")
        return
    st.caption(SCORE_CAPTION)
    s = summary(cases)
    lengths = sorted(int(x) for x in s["length"].unique())
    L = st.selectbox("length (tokens)", lengths, key="retrieval_length") if len(lengths) > 1 else lengths[0]
    st.plotly_chart(grid_figure(s, L), width="stretch")
    summary_table(s, L, f"retrieval_{name.replace('/', '_')}_{L}.csv")

    st.subheader("One case")
    c1, c2, c3 = st.columns(3)
    at_L = cases[cases["length"] == L]
    task = c1.selectbox("task", list(dict.fromkeys(at_L["task"])), key="retrieval_task")
    seeds = sorted(int(x) for x in at_L.loc[at_L["task"] == task, "seed"].unique())
    seed = c2.selectbox("seed", seeds, key="retrieval_seed")
    case = at_L[(at_L["task"] == task) & (at_L["seed"] == seed)]
    pats = [p for p in case["pattern"] if p != "dense"]
    if "needle_context" in case.columns and isinstance(case["needle_context"].iloc[0], str):
        ctx = case["needle_context"].iloc[0]
        st.markdown("**The needle in its haystack** (answer tokens between `[[` and `]]`):")
        st.code(ctx, language=None, wrap_lines=True)
    st.markdown(f"expected: **{case['expected'].iloc[0]}**")
    st.dataframe(case[["pattern", "score", "answer_logprob", "needle_pairs_kept", "distant_pairs_kept",
                       "continuation"]], hide_index=True, width="stretch", key="retrieval_case",
                 column_config={"answer_logprob": st.column_config.NumberColumn("answer log-prob (nats)",
                                                                                format="%.2f"),
                                "needle_pairs_kept": st.column_config.NumberColumn(format="%.2f"),
                                "distant_pairs_kept": st.column_config.NumberColumn(format="%.2f")})
    if not pats:
        return
    pat = c3.selectbox("pattern", pats, key="retrieval_pattern")
    tr = trace[(trace["task"] == task) & (trace["length"] == L) & (trace["seed"] == seed) & (trace["pattern"] == pat)]
    if tr.empty:
        st.info("This case has no trace rows for that pattern.")
        return
    heads = retrieval_heads(trace[(trace["task"] == task) & (trace["length"] == L)])
    dropped = float((tr["dense_mass"] - tr["mass_kept"]).sum())
    total = float(tr["dense_mass"].sum())
    copy = float((tr["copy_mass"] - tr["copy_mass_kept"]).sum())
    m = st.columns(3)
    m[0].metric("needle attention dropped", f"{dropped / total:.0%}" if total > 0 else "-")
    m[1].metric("of it on copy pairs", f"{copy / dropped:.0%}" if dropped > 0 else "-")
    m[2].metric("retrieval heads of the task", int(heads["retrieval_head"].sum()))
    st.plotly_chart(dropped_figure(tr, heads, f"{task}, {L} tokens, seed {seed}: dense attention of the answer "
                                              f"to the needle that {pat} drops"), width="stretch")


lib.guarded(page, subject=lambda: f"retrieval output **{st.session_state.get('retrieval_dir')}**")
