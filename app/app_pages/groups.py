"""Groups: what the groups of a layer contain (size, tokens, POS, contexts), where a token goes
in every layer, and how tokens flow between the groups of adjacent layers."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from focus_lab.app import lib

EXAMPLES = 6
TOP_TOKENS = 12


def recorded_labels(run: lib.RunView, layer: int) -> dict[int, str]:
    """{group: label} from the recorder's group_labels table (Focus groups), if recorded."""
    if not run.has("group_labels"):
        return {}
    gl = run.table("group_labels")
    if "label" not in gl.columns:
        return {}
    sel = gl[gl[lib.col(gl, "layer_idx", "layer")] == layer]
    if "assignment" in sel.columns:
        sel = sel[sel["assignment"].astype(str) == "focus"]
    return {int(g): str(l) for g, l in zip(sel["group"], sel["label"])}


def group_summary(lf: pd.DataFrame, num_groups: int, labels: dict[int, str] | None = None) -> pd.DataFrame:
    """One row per group of one layer: size, share, label (dominant POS: the recorder's
    group_labels when present), top tokens."""
    labels = labels or {}
    total = len(lf)
    rows = []
    for g in range(num_groups):
        sub = lf[lf["group"] == g]
        n = len(sub)
        pos = sub["pos"].value_counts(normalize=True)
        label = labels.get(g) or (", ".join(f"{p} {v:.0%}" for p, v in pos.head(2).items()) if n else "(empty)")
        top = sub["display"].value_counts().head(TOP_TOKENS)
        rows.append({"group": g, "size": n, "share": n / total if total else 0.0, "label": label,
                     "top tokens": "  ".join(f"{t} ({c})" for t, c in top.items()),
                     "distinct tokens": int(sub["display"].nunique()),
                     "mean prob": float(sub["prob"].mean()) if n else np.nan,
                     "mean margin": float(sub["margin"].replace([np.inf, -np.inf], np.nan).mean()) if n else np.nan})
    return pd.DataFrame(rows)


def pos_composition(lf: pd.DataFrame, run: lib.RunView, layer: int) -> go.Figure:
    """Stacked POS shares per group: the recorder's pos_contingency when present, else counted
    from the pos table."""
    comp = None
    if run.has("pos_contingency"):
        pc = run.table("pos_contingency")
        sel = pc[pc[lib.col(pc, "layer_idx", "layer")] == layer]
        if "assignment" in sel.columns:
            sel = sel[sel["assignment"].astype(str) == "focus"]
        if len(sel) and {"group", "pos", "tokens"} <= set(sel.columns):
            comp = sel[["group", "pos", "tokens"]].copy()
            comp["pos"] = comp["pos"].fillna("").replace("", "(none)")
    if comp is None:
        comp = lf.groupby(["group", "pos"]).size().rename("tokens").reset_index()
    comp["fraction"] = comp["tokens"] / comp.groupby("group")["tokens"].transform("sum")
    groups = [f"g{g}" for g in sorted(comp["group"].unique())]
    comp["group"] = comp["group"].map(lambda g: f"g{g}")
    order = lib.pos_sorted(comp["pos"])
    fig = px.bar(comp, x="group", y="fraction", color="pos", category_orders={"pos": order, "group": groups},
                 color_discrete_map=lib.POS_COLORS, hover_data=["tokens"],
                 title="POS composition of each group")
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=40, b=10), yaxis_tickformat=".0%",
                      legend_title_text="POS")
    return fig


def nmi_score(a: np.ndarray, b: np.ndarray) -> float:
    """Normalized mutual information ``I(a; b) / mean(H(a), H(b))`` (scikit-learn's default,
    arithmetic normalization), 1 for identical partitions up to relabelling; 1 when both are
    constant."""
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    joint = np.zeros((ai.max() + 1, bi.max() + 1))
    np.add.at(joint, (ai, bi), 1.0)
    p = joint / joint.sum()
    pa, pb = p.sum(1), p.sum(0)
    nz = p > 0
    mi = float((p[nz] * np.log(p[nz] / np.outer(pa, pb)[nz])).sum())
    ha = float(-(pa[pa > 0] * np.log(pa[pa > 0])).sum())
    hb = float(-(pb[pb > 0] * np.log(pb[pb > 0])).sum())
    if ha == 0 and hb == 0:
        return 1.0
    return max(0.0, mi) / max((ha + hb) / 2, 1e-12)


def page() -> None:
    run = lib.run_page("Groups", "what each group of a layer contains", need=("assignments", "the groups"))
    asg = run.table("assignments")
    if not run.has("pos"):
        st.info("This run has no **pos** table: POS composition shows '(none)'; record it with "
                "`focus-lab record --pos` (spaCy).")
    layers = sorted(int(x) for x in asg["layer_idx"].unique())
    K = run.num_groups
    layer = st.selectbox("Layer", layers, index=0, key="groups_layer")
    lf = lib.layer_frame(run, layer)

    summary = group_summary(lf, K, recorded_labels(run, layer))
    st.subheader(f"Layer {layer}: {K} groups over {len(lf):,} tokens")
    st.dataframe(summary, hide_index=True, width="stretch",
                 column_config={"share": st.column_config.ProgressColumn("share", format="percent",
                                                                         min_value=0.0, max_value=1.0),
                                "mean prob": st.column_config.NumberColumn(format="%.3f"),
                                "mean margin": st.column_config.NumberColumn(format="%.2f")})
    st.plotly_chart(pos_composition(lf, run, layer), width="stretch")

    st.subheader("Inside each group")
    tokens = run.table("tokens")
    token_counts = lf["display"].value_counts()
    tabs = st.tabs([f"group {g} ({n})" for g, n in zip(summary["group"], summary["size"])])
    for g, tab in zip(summary["group"], tabs):
        with tab:
            sub = lf[lf["group"] == g]
            if sub.empty:
                st.info(f"Group {g} has no token in layer {layer}.")
                continue
            c1, c2 = st.columns([1, 2])
            with c1:
                counts = sub["display"].value_counts().head(TOP_TOKENS)
                pairs = sub[sub["display"].isin(counts.index)].groupby(["display", "pos"]).size()
                main_pos = pairs.sort_values().reset_index().drop_duplicates("display", keep="last")
                top = pd.DataFrame({"token": counts.index, "count": counts.to_numpy(),
                                    "pos": counts.index.map(main_pos.set_index("display")["pos"])})
                top["share of token"] = top["count"] / top["token"].map(token_counts)
                st.dataframe(top, hide_index=True, width="stretch",
                             column_config={"share of token": st.column_config.NumberColumn(format="%.2f")})
                st.caption("share of token: fraction of that token's occurrences that land in this group")
            with c2:
                ex = sub.sample(min(EXAMPLES, len(sub)), random_state=0).sort_values(["window", "position"])
                lines = [f'<div style="font-family:monospace;font-size:0.85rem;margin:2px 0">'
                         f'<span style="color:#888">w{int(r.window)}:{int(r.position)} '
                         f'{html.escape(str(r.pos))}</span> '
                         f'{lib.render_context(tokens, r.window, r.position, color=lib.group_color(g) + "66")}'
                         f"</div>" for r in ex.itertuples(index=False)]
                st.markdown("**Example contexts**\n\n" + "\n".join(lines), unsafe_allow_html=True)

    if run.has("linguistic_scores"):
        ls = run.table("linguistic_scores")
        if {"nmi", "labels"} <= set(ls.columns):
            ls = ls.rename(columns={"layer_idx": "layer"})
            ls["groups"] = ls["assignment"].astype(str) if "assignment" in ls.columns else "focus"
            fig = px.line(ls, x="layer", y="nmi", color="groups", line_dash="labels", markers=True,
                          hover_data=[c for c in ("homogeneity", "completeness") if c in ls.columns],
                          title="do groups follow POS / dependency labels? NMI per layer, Focus vs baselines")
            fig.update_layout(height=320, margin=dict(l=10, r=10, t=40, b=10))
            lib.layer_xaxis(fig)
            st.plotly_chart(fig, width="stretch")
    else:
        st.info("This run has no **linguistic_scores** table (NMI of groups vs POS, k-means and random "
                f"baselines); {lib.RECORD_HINT}.")

    st.subheader("Where does a token go?")
    query = st.text_input("Token (exact, case-insensitive; surrounding spaces ignored)", key="groups_query")
    if query.strip():
        tf = lib.token_frame(run)
        hits = tf[tf["display"].str.lower() == query.strip().lower()][["window", "position"]]
        if hits.empty:
            st.warning(f"The token {query.strip()!r} does not occur in this run.")
        else:
            m = asg.merge(hits, on=["window", "position"])
            tab = m.groupby(["layer_idx", "group"]).size().unstack(fill_value=0)
            tab = tab.reindex(columns=lib.group_ids(K, tab.columns), fill_value=0)
            tab.columns = [lib.group_label(c, K) for c in tab.columns]
            st.caption(f"{len(hits)} occurrences; rows: layers, columns: groups, cells: occurrences")
            fig = px.imshow(tab.to_numpy(), x=list(tab.columns), y=[str(i) for i in tab.index],
                            labels=dict(x="group", y="layer", color="occurrences"), text_auto=True,
                            aspect="auto", color_continuous_scale="Blues",
                            title=f"groups of {html.escape(repr(query.strip()))} in every layer")
            fig.update_layout(height=min(120 + 22 * len(tab), 800), margin=dict(l=10, r=10, t=40, b=10), yaxis_type="category")
            st.plotly_chart(fig, width="stretch")
            st.dataframe(tab.reset_index().rename(columns={"layer_idx": "layer"}), hide_index=True)

    st.subheader("Flow between adjacent layers")
    if len(layers) < 2:
        st.info("This run has a single routed layer: no flow to show.")
        return
    nxt_choices = [l for l in layers if l != layers[0]]
    default = layers[layers.index(layer) + 1] if layer != layers[-1] else nxt_choices[-1]
    to_layer = st.selectbox("to layer (from the layer before it)", nxt_choices,
                            index=nxt_choices.index(default), key="groups_flow_to")
    from_layer = layers[layers.index(to_layer) - 1]
    a = asg[asg["layer_idx"] == from_layer][["window", "position", "group"]]
    b = asg[asg["layer_idx"] == to_layer][["window", "position", "group"]]
    m = a.merge(b, on=["window", "position"], suffixes=("_from", "_to"))
    ids = lib.group_ids(K, pd.concat([m["group_from"], m["group_to"]]))
    ct = pd.crosstab(m["group_from"], m["group_to"]).reindex(index=ids, columns=ids, fill_value=0)
    frac = ct.div(ct.sum(axis=1).replace(0, np.nan), axis=0).fillna(0.0)
    fig = go.Figure(go.Heatmap(z=frac.to_numpy(), x=[lib.group_label(c, K) for c in ct.columns],
                               y=[lib.group_label(r, K) for r in ct.index], colorscale="Viridis", zmin=0, zmax=1,
                               text=ct.to_numpy(), texttemplate="%{text}",
                               hovertemplate="layer %{y} → %{x}: %{z:.0%} (%{text} tokens)<extra></extra>",
                               colorbar=dict(title="row share")))
    fig.update_layout(title=f"layer {from_layer} → layer {to_layer} (rows sum to 1; numbers: tokens)",
                      xaxis_title=f"group in layer {to_layer}", yaxis_title=f"group in layer {from_layer}",
                      height=380, margin=dict(l=10, r=10, t=40, b=10), yaxis_autorange="reversed", yaxis_type="category")
    st.plotly_chart(fig, width="stretch")

    piv = asg.pivot_table(index=["window", "position"], columns="layer_idx", values="group")
    nmi = [{"layers": f"{l0}→{l1}", "from": l0,
            "NMI": nmi_score(piv[l0].to_numpy(), piv[l1].to_numpy())}
           for l0, l1 in zip(layers[:-1], layers[1:])]
    nmi = pd.DataFrame(nmi)
    fig = px.line(nmi, x="from", y="NMI", markers=True, hover_data=["layers"],
                  title="agreement of adjacent layers' groups (NMI; 1 = same partition)")
    fig.update_layout(height=280, margin=dict(l=10, r=10, t=40, b=10), yaxis_range=[0, 1.02],
                      xaxis_title="from layer")
    lib.layer_xaxis(fig)
    st.plotly_chart(fig, width="stretch")


lib.guarded(page)
