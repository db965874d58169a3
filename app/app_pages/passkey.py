"""Passkey: retrieval of a 5-digit key hidden in held-out text, per attention pattern, and where a
miss comes from (``focus-lab probe passkey``, docs/passkey.md; the question of docs/method.md §6,
the patterns and controls of §2.4 and §7).

Reads a passkey output folder below the runs root (``cases.parquet``, ``needle_layers.parquet``,
``passkey.json``; not a recorder run): the length x depth heatmaps and the pattern x length table
are computed here from ``cases.parquet`` (the probe's HTML figure is not read), the per-layer
needle audit of one case from ``needle_layers.parquet``. Where the runs root holds none: the committed
probe tables of the shipped router file (``figures/results/passkey_cases.parquet`` via
``focus_lab.eval.committed``: heatmaps and table, no needle audit).
"""

from __future__ import annotations


import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from focus_lab.app import lib
from focus_lab.eval.passkey_figure import heatmap_figure


def summary_table(cases: pd.DataFrame) -> pd.DataFrame:
    """Per (pattern, length) of one format's cases: cases, hits, exact-match rate, mean key log-prob
    (nats), mean distant pairs kept (the pattern's sparsity, docs/method.md §2.5) and needle edges
    kept: ``committed.passkey_summary``'s table (the committed view's), patterns in first-seen order."""
    from focus_lab.eval.committed import passkey_summary
    tab = passkey_summary(cases).drop(columns=["format", "dense_hits", "dense_hits_kept"])
    order = {p: i for i, p in enumerate(dict.fromkeys(cases["pattern"]))}
    tab = tab.sort_values(["pattern", "length"], key=lambda s: s.map(order) if s.name == "pattern" else s,
                          kind="stable")
    return tab[["pattern", "length", *[c for c in tab.columns if c not in ("pattern", "length")]]].reset_index(drop=True)


def audit_figure(lay: pd.DataFrame, title: str) -> go.Figure:
    """The needle audit of one case, per routed layer: the dense attention mass from the answer
    position to the needle's key tokens (bar: mean over heads; markers: the largest head), and
    the share of those (query, key) edges the hard top-1 / top-2 masks keep (0..1)."""
    x = lay["layer_idx"].to_numpy(int)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=("dense attention mass, answer position → needle key tokens",
                                        "share of those edges the hard mask keeps"))
    fig.add_trace(go.Bar(x=x, y=lay["dense_mass_to_needle"].to_numpy(float), name="mass, mean over heads",
                         marker_color="#4e79a7"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=lay["max_head_mass_to_needle"].to_numpy(float), mode="markers",
                             name="mass, largest head", marker=dict(color="#e15759", size=7)), row=1, col=1)
    for name, colr, dash in (("kept_top1", "#f28e2b", "solid"), ("kept_top2", "#59a14f", "dot")):
        fig.add_trace(go.Scatter(x=x, y=lay[name].to_numpy(float), mode="lines+markers",
                                 name=f"kept by {name.split('_')[1].replace('top', 'top-')}",
                                 line=dict(color=colr, dash=dash)), row=2, col=1)
    fig.update_yaxes(title_text="attention mass", row=1, col=1)
    fig.update_yaxes(title_text="kept", range=[-0.05, 1.05], row=2, col=1)
    fig.update_xaxes(title_text="layer", row=2, col=1)
    fig.update_layout(title=title, height=540, margin=dict(l=10, r=10, t=70, b=10),
                      legend=dict(orientation="h", y=-0.16, x=0))
    lib.layer_xaxis(fig)
    return fig


def _kept_share(lay: pd.DataFrame, col: str) -> float:
    """Mass-weighted share of the needle mass a mask keeps: sum_l m_l kept_l / sum_l m_l."""
    m = lay["dense_mass_to_needle"].to_numpy(float)
    k = lay[col].to_numpy(float)
    ok = ~np.isnan(k)
    return float((m[ok] * k[ok]).sum() / m[ok].sum()) if m[ok].sum() > 0 else float("nan")


def settings_caption(name: str, info: dict) -> str:
    """One line from ``passkey.json``'s settings; fields it lacks are left out."""
    s = info.get("settings", {}) if isinstance(info.get("settings"), dict) else {}
    model = s.get("model", {}) if isinstance(s.get("model"), dict) else {}
    routers = s.get("routers", {}) if isinstance(s.get("routers"), dict) else {}
    parts = [f"output **{name}**"]
    if model.get("name"):
        parts.append(f"model **{model['name']}**")
    if routers.get("path"):
        parts.append(f"routers `{str(routers['path']).rsplit('/', 1)[-1]}`")
    if s.get("haystack") or s.get("corpus"):
        parts.append(f"haystack {s.get('haystack') or s.get('corpus')}")
    over = s.get("config_overrides") if isinstance(s.get("config_overrides"), dict) else {}
    if over.get("layer_top_k"):
        from focus_lab.method.config import format_layer_top_k
        parts.append(f"per-layer k `{format_layer_top_k(over['layer_top_k'])}`")
    if "random_layers" in over:
        parts.append(f"random groups in layers `{','.join(map(str, over['random_layers'])) or 'none'}`")
    if s.get("keys"):
        parts.append(f"{s['keys']} keys a cell")
    if isinstance(info.get("seconds"), (int, float)):
        parts.append(f"{info['seconds']:,.0f} s of probe time")
    return " · ".join(parts)


ABOUT = ("a 5-digit key hidden at a depth of held-out text; exact match: the key in the greedy answer; key "
         "log-prob: teacher forced, nats (0 = certain)")


def committed_page(root) -> None:
    """No passkey output below the runs root: the committed probe tables of the shipped router file
    (``focus_lab.eval.committed.committed_passkey``: its tables plus dense rows of the same cases),
    the length x depth heatmaps and the pattern x length table, or a message that there is none
    (no ``figures/results`` beside the installed package)."""
    res, why = lib.committed_result("passkey")
    if res is None:
        st.info(f"No passkey output below the runs root `{root}`. Make one with `{lib.PASSKEY_HINT}` "
                f"(docs/passkey.md), then reload this page. No committed result to show either: {why}.")
        return
    src = res.source
    lib.committed_intro("passkey", root, src, lib.PASSKEY_HINT, "docs/passkey.md", inline_command=False)
    ref = (f"; dense rows of the same cases from the tables {', '.join(f'`{t}`' for t in src.reference_tables)} "
           "(dense does not depend on the router file)" if src.reference_tables else "")
    st.caption(f"tables {', '.join(f'`{t}`' for t in src.tables)}{ref} · {ABOUT}")
    cases = res.cases
    formats = list(dict.fromkeys(cases["format"]))
    fmt = formats[0]
    if len(formats) > 1:
        fmt = st.selectbox("Prompt format", formats, index=formats.index("chat") if "chat" in formats else 0,
                           key="passkey_format")
    st.subheader("Retrieval by length and depth")
    st.plotly_chart(heatmap_figure(cases[cases["format"] == fmt]), width="stretch")
    st.subheader("Per pattern and length")
    st.caption("dense hits kept: of the cases dense retrieves, those the pattern retrieves too (paired on the "
               "same cases)")
    tab = res.summary[res.summary["format"] == fmt].drop(columns="format")
    st.dataframe(tab, hide_index=True, width="stretch", key="passkey_summary",
                 column_config=summary_columns(committed=True))
    lib.download_csv(tab, f"passkey_committed_{src.router_name.replace('/', '_')}_{fmt}.csv")


def summary_columns(committed: bool = False) -> dict:
    """The per-pattern table's column labels and formats (a run's, or the committed results' with
    the dense-paired counts)."""
    num = st.column_config.NumberColumn
    cols = {"exact_match": num("exact match", format="%.2f"),
            "key_logprob": num("mean key log-prob (nats)", format="%.2f"),
            "distant_pairs_kept": num("distant pairs kept", format="%.3f"),
            "needle_edges_kept": num("needle edges kept", format="%.3f")}
    if committed:
        cols |= {"dense_hits": num("dense hits"), "dense_hits_kept": num("dense hits kept")}
    return cols


def page() -> None:
    st.title("Passkey")
    root = lib.runs_root()
    dirs = lib.passkey_dirs(root)
    if not dirs:
        committed_page(root)
        return
    name = lib.pick_probe_output("Passkey", dirs, "passkey_dir", root, lib.PASSKEY_FILES,
                                 lib.PASSKEY_HINT, "docs/passkey.md")
    if name is None:
        return
    cases, layers, info = lib.open_passkey(name, root)
    st.caption(settings_caption(name, info) + " · " + ABOUT)
    if cases.empty:
        st.info(f"The cases table of **{name}** is empty; run the probe again: `{lib.PASSKEY_HINT}`.")
        return
    formats = list(dict.fromkeys(cases["format"]))
    fmt = formats[0]
    if len(formats) > 1:
        fmt = st.selectbox("Prompt format", formats, index=formats.index("chat") if "chat" in formats else 0,
                           key="passkey_format")
    cases = cases[cases["format"] == fmt]
    layers = layers[layers["format"] == fmt]

    st.subheader("Retrieval by length and depth")
    st.plotly_chart(heatmap_figure(cases), width="stretch")

    st.subheader("Per pattern and length")
    tab = summary_table(cases)
    st.dataframe(tab, hide_index=True, width="stretch", key="passkey_summary",
                 column_config=summary_columns())
    lib.download_csv(tab, f"passkey_{name.replace('/', '_')}_{fmt}.csv")

    st.subheader("Needle audit of one case")
    st.caption("In the dense forward, per routed layer: the attention of the answer position (the last prompt "
               "token) to the needle's key tokens, and the share of those edges the hard top-1 / top-2 masks keep "
               "(groups routed from the same forward; docs/method.md §2.2, §6).")
    c1, c2, c3 = st.columns(3)
    lengths = sorted(int(x) for x in cases["length"].unique())
    depths = sorted(float(x) for x in cases["depth"].unique())
    L = c1.selectbox("length (tokens)", lengths, key="passkey_length")
    D = c2.selectbox("depth", depths, index=depths.index(50.0) if 50.0 in depths else 0,
                     format_func=lambda d: f"{d:g}%", key="passkey_depth")
    seeds = sorted(int(x) for x in cases.loc[(cases["length"] == L) & (cases["depth"] == D), "seed"].unique())
    if not seeds:
        st.info(f"No case at length {L} and depth {D:g}%.")
        return
    S = c3.selectbox("seed", seeds, key="passkey_seed")
    case = cases[(cases["length"] == L) & (cases["depth"] == D) & (cases["seed"] == S)]
    lay = layers[(layers["length"] == L) & (layers["depth"] == D) & (layers["seed"] == S)].sort_values("layer_idx")
    key = str(case["key"].iloc[0])
    pos = case["needle_position"].iloc[0]
    st.markdown(f"key **{key}**, needle at token {int(pos)} (depth {float(case['needle_depth'].iloc[0]):.0%} "
                f"of the haystack)")
    show = case[["pattern", "exact_match", "key_logprob", "first_key_token_rank", "needle_edges_kept",
                 "distant_pairs_kept", "continuation"]]
    st.dataframe(show, hide_index=True, width="stretch", key="passkey_case",
                 column_config={"key_logprob": st.column_config.NumberColumn("key log-prob (nats)", format="%.2f"),
                                "needle_edges_kept": st.column_config.NumberColumn(format="%.3f"),
                                "distant_pairs_kept": st.column_config.NumberColumn(format="%.3f")})
    if lay.empty:
        st.info("This case has no needle audit rows (the probe audits the layers in its dense forward); run the "
                f"probe again with this focus-lab: `{lib.PASSKEY_HINT}`.")
        return
    m = st.columns(4)
    heaviest = lay.loc[lay["dense_mass_to_needle"].idxmax()]
    m[0].metric("needle mass, sum over layers", f"{lay['dense_mass_to_needle'].sum():.3f}")
    m[1].metric("heaviest layer", f"{int(heaviest['layer_idx'])} ({heaviest['dense_mass_to_needle']:.3f})")
    m[2].metric("top-1 keeps (mass-weighted)", f"{_kept_share(lay, 'kept_top1'):.0%}")
    m[3].metric("top-2 keeps (mass-weighted)", f"{_kept_share(lay, 'kept_top2'):.0%}")
    st.plotly_chart(audit_figure(lay, f"needle audit: length {L}, depth {D:g}%, seed {S} (key {key})"),
                    width="stretch")


lib.guarded(page, subject=lambda: f"passkey output **{st.session_state.get('passkey_dir')}**")
