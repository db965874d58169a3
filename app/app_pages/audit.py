"""Dependency audit: the long-range dense-attention edges the hard Focus mask drops, drawn as
arcs over the text, filtered by layer, head, distance, relation and weight; a table with CSV.
Then the costly drops: the queries whose next-token loss rises most under the hard mask, with
their heaviest dropped keys (tables loss_delta / costly_drops, docs/method.md §6), and, when the
run has them, the share of each query's loss delta that restoring its heaviest dropped edge
recovers (table restored_drops) and the loss change per part of speech when one group of one
layer is cut (table group_ablation; both from ``python -m analyses.studies.restored_drops``)."""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from focus_lab.app import lib

MAX_ARCS = 400
MAX_ROWS = 2000
NONE_REL = "(no relation)"
COSTLY_QUERIES = 20  # queries shown in the costly-drops section
COSTLY_KEYS = 3  # dropped keys shown per query
COSTLY_COLS = ("window", "query_position", "query_rank", "delta", "nll_dense", "nll_hard", "next_token",
               "layer_idx", "head", "key_position", "distance", "weight", "key_token", "relation")
TOKEN_COLS = ("window", "position", "token", "char_start", "char_end")
RESTORED_COLS = ("window", "query_position", "layer_idx", "key_position", "recovered", "recovered_all",
                 "edges_of_query")
HOW_TO_RESTORE = "`python -m analyses.studies.restored_drops --run <run>` (docs/studies/restored-drops.md)"
HOW_TO_RECORD_COSTLY = ("`focus-lab record --metrics all` (or the default metrics), or name `loss_delta,dropped_edges` "
                        "in `--metrics`")


def normalize(df: pd.DataFrame, tokens: pd.DataFrame) -> pd.DataFrame:
    q = lib.col(df, "query_position", "q_position", "query_pos", "query", "i")
    k = lib.col(df, "key_position", "k_position", "key_pos", "key", "j")
    w = lib.col(df, "weight", "attention", "prob", "mass")
    layer = lib.col(df, "layer_idx", "layer")
    head = lib.col(df, "head", "head_idx", required=False)
    win = lib.col(df, "window", required=False)
    rel = lib.col(df, "relation", "dep_relation", "rel", required=False)
    out = pd.DataFrame({"window": df[win].astype(int) if win else 0, "layer": df[layer].astype(int),
                        "head": df[head].astype(int) if head else -1,
                        "query_position": df[q].astype(int), "key_position": df[k].astype(int),
                        "weight": df[w].astype(float)})
    out["distance"] = df["distance"].astype(int) if "distance" in df.columns else out["query_position"] - out[
        "key_position"]
    out["relation"] = (df[rel].fillna("").astype(str).replace({"": NONE_REL, "None": NONE_REL})
                       if rel else NONE_REL)
    for c in ("query_group", "key_group", "soft_weight", "key_is_sink"):
        if c in df.columns:
            out[c] = df[c]
    disp = tokens.set_index(["window", "position"])["display"]
    out["query_token"] = disp.reindex(pd.MultiIndex.from_arrays([out["window"], out["query_position"]])).to_numpy()
    out["key_token"] = disp.reindex(pd.MultiIndex.from_arrays([out["window"], out["key_position"]])).to_numpy()
    return out


@st.cache_resource(show_spinner=False, max_entries=4)  # shared, read-only (see lib._read_table)
def load_edges(name: str, path: str, key: tuple) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(normalized dropped edges, token frame) of a run; cached by path and file stats."""
    run = lib.RunView(name, lib.Path(path))
    tokens = lib.token_frame(run)
    return normalize(run.table("dropped_edges"), tokens), tokens


def arc_figure(edges: pd.DataFrame, tokens_w: pd.DataFrame, title: str) -> go.Figure:
    """Arcs from key (left) to query (right) over the token positions of one window."""
    fig = go.Figure()
    rels = sorted(edges["relation"].unique(), key=lambda r: (r == NONE_REL, r))
    palette = px.colors.qualitative.D3 + px.colors.qualitative.Set2
    wmax = float(edges["weight"].max()) if len(edges) else 1.0
    t = np.linspace(0, np.pi, 25)
    for n, rel in enumerate(rels):
        sub = edges[edges["relation"] == rel]
        xs, ys, mx, my, mt = [], [], [], [], []
        for r in sub.itertuples(index=False):
            c = (r.query_position + r.key_position) / 2
            rad = (r.query_position - r.key_position) / 2
            xs += list(c - rad * np.cos(t)) + [None]
            ys += list(rad * np.sin(t)) + [None]
            mx.append(c)
            my.append(rad)
            mt.append(f"{html.escape(str(r.query_token))} @{r.query_position} → {html.escape(str(r.key_token))} "
                      f"@{r.key_position}<br>layer {r.layer} head {r.head}, distance {r.distance}, "
                      f"weight {r.weight:.3f}<br>{html.escape(rel)}")
        color = "#9e9e9e" if rel == NONE_REL else palette[n % len(palette)]
        opacity = 0.35 if rel == NONE_REL else 0.8
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=color, width=1.2), opacity=opacity,
                                   name=rel, legendgroup=rel, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", marker=dict(color=color, size=5), name=rel,
                                 legendgroup=rel, showlegend=False, hovertext=mt, hoverinfo="text"))
    ends = pd.concat([edges["query_position"], edges["key_position"]]).value_counts().head(60).index
    labels = tokens_w.set_index("position")["display"]
    ticks = sorted(int(p) for p in ends)
    fig.update_layout(title=title, height=430, margin=dict(l=10, r=10, t=40, b=80),
                      xaxis=dict(title=None, tickvals=ticks, ticktext=[html.escape(str(labels.get(p, "?"))) for p in ticks],
                                 tickangle=-60, range=[-1, int(tokens_w["position"].max()) + 1]),
                      yaxis=dict(title="distance / 2", rangemode="tozero"), legend_title_text="relation",
                      hovermode="closest")
    return fig


def text_html(tokens_w: pd.DataFrame, edges: pd.DataFrame) -> str:
    """The window's text (escaped), keys of dropped edges in orange, queries in blue."""
    keys = set(edges["key_position"])
    queries = set(edges["query_position"])
    parts, prev_end = [], None
    for r in tokens_w.sort_values("position").itertuples(index=False):
        text = str(r.token)
        if prev_end is not None and r.char_start > prev_end and not text[:1].isspace():
            parts.append(" ")
        piece = html.escape(text).replace("\n", "⏎<br>")
        style = None
        if r.position in keys and r.position in queries:
            style = "background:#d1c4e9"
        elif r.position in keys:
            style = "background:#ffcc80"
        elif r.position in queries:
            style = "background:#90caf9"
        if style:
            piece = f'<span style="{style};border-radius:3px" title="position {r.position}">{piece}</span>'
        parts.append(piece)
        prev_end = r.char_end
    return ('<div style="font-family:Georgia,serif;line-height:1.7;max-height:320px;overflow-y:auto;'
            'border:1px solid #ddd;padding:8px;border-radius:6px">' + "".join(parts) + "</div>")


def costly_queries(drops: pd.DataFrame, n: int = COSTLY_QUERIES, keys: int = COSTLY_KEYS) -> pd.DataFrame:
    """One row per query of the ``n`` costliest (``query_rank`` 1..n) of a costly_drops frame:
    window, query_position, query_rank, delta, nll_dense, nll_hard, next_token, edges (its dropped
    edges recorded) and ``keys``: a list of its ``keys`` heaviest dropped edges (dicts with
    key_token, key_position, distance, layer_idx, head, weight, relation), heaviest first."""
    top = drops[drops["query_rank"] <= n].sort_values(["query_rank", "weight"], ascending=[True, False])
    rows = []
    for rank, g in top.groupby("query_rank", sort=True):
        first = g.iloc[0]
        heavy = g.head(keys)
        rows.append({"query_rank": int(rank), "window": int(first["window"]),
                     "query_position": int(first["query_position"]), "delta": float(first["delta"]),
                     "nll_dense": float(first["nll_dense"]), "nll_hard": float(first["nll_hard"]),
                     "next_token": str(first["next_token"]), "edges": len(g),
                     "keys": heavy[["key_token", "key_position", "distance", "layer_idx", "head", "weight",
                                    "relation"]].to_dict("records")})
    return pd.DataFrame(rows, columns=["query_rank", "window", "query_position", "delta", "nll_dense",
                                       "nll_hard", "next_token", "edges", "keys"])


def restored_cell(r: dict | None) -> str:
    """The restored-drops cell of a costly query: the share of its delta that its heaviest
    dropped edge restored alone recovers, and (all) every recorded one at once; '-' when the
    query was not restored."""
    if r is None:
        return "-"
    return (f'<span title="layer {int(r["layer_idx"])}, key position {int(r["key_position"])}">'
            f'<b>{r["recovered"]:+.0%}</b></span> <small>(all {int(r["edges_of_query"])}: '
            f'{r["recovered_all"]:+.0%})</small>')


def costly_html(queries: pd.DataFrame, tokens: pd.DataFrame, radius: int = 12,
                restored: dict | None = None) -> str:
    """A compact HTML table (escaped), one short row per query of ``costly_queries``: rank, delta,
    NLL dense → hard, with ``restored`` ({(window, query_position): restored_drops row}) the share
    of the delta that restoring its heaviest dropped edge recovers, the text before the query
    with the query token marked and the token it predicts, the heaviest dropped keys (token,
    distance back in tokens, layer / head, weight)."""
    cell = "padding:2px 6px;border-bottom:1px solid #eee;vertical-align:top"
    restore_col = ["Δ recovered: heaviest edge restored (all edges)"] if restored is not None else []
    head = "".join(f'<th style="{cell};text-align:left">{h}</th>' for h in (
        "#", "Δ nats", "dense → hard", *restore_col, "text up to the query → predicted token",
        "heaviest dropped keys: token, tokens back, layer/head, weight"))
    body = []
    for q in queries.itertuples(index=False):
        before = tokens[(tokens["window"] == q.window) & (tokens["position"] <= q.query_position)]
        ctx = lib.render_context(before, q.window, q.query_position, radius=radius).rstrip("…")
        ctx += f' → <b style="color:#c62828">{html.escape(lib.show_token(q.next_token))}</b>'
        keys = []
        for k in q.keys:
            rel = f" <i>{html.escape(str(k['relation']))}</i>" if k["relation"] else ""
            keys.append(f'<span title="key position {int(k["key_position"])}" style="white-space:nowrap">'
                        f"<code>{html.escape(lib.show_token(k['key_token']))}</code> −{int(k['distance']):,} "
                        f"L{int(k['layer_idx'])}/H{int(k['head'])} {float(k['weight']):.2f}{rel}</span>")
        more = f" <small>(of {q.edges})</small>" if q.edges > len(q.keys) else ""
        rest = (f'<td style="{cell};white-space:nowrap">{restored_cell(restored.get((q.window, q.query_position)))}'
                '</td>' if restored is not None else "")
        body.append(f'<tr><td style="{cell}">{q.query_rank}</td>'
                    f'<td style="{cell};white-space:nowrap"><b>Δ {q.delta:+.3f}</b></td>'
                    f'<td style="{cell};white-space:nowrap">{q.nll_dense:.2f} → {q.nll_hard:.2f}</td>{rest}'
                    f'<td style="{cell};font-family:Georgia,serif" title="window {q.window}, position '
                    f'{q.query_position}">{ctx}</td>'
                    f'<td style="{cell}">{", ".join(keys)}{more}</td></tr>')
    return ('<div class="fl-costly"><table style="border-collapse:collapse;width:100%;font-size:0.82em;'
            f'line-height:1.35"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def costly_section(run) -> None:
    """The 20 costliest queries of ``costly_drops``, or an info line naming how to record it."""
    st.subheader("Costly drops")
    if not run.has("costly_drops"):
        why = (" (the run has loss_delta, but costly_drops also needs the dropped_edges metric)"
               if run.has("loss_delta") else "")
        st.info(f"This run has no **costly_drops** table (per-token loss deltas, dense vs hard, joined to "
                f"the dropped edges){why}; record it with {HOW_TO_RECORD_COSTLY}.")
        return
    drops = run.columns("costly_drops", COSTLY_COLS)
    if drops.empty:
        st.success("No recorded query has a dropped edge above the audit's thresholds: nothing to rank.")
        return
    queries = costly_queries(drops)
    loss = run.columns("loss_delta", ("delta",))["delta"] if run.has("loss_delta") else pd.Series(dtype=float)
    overall = (f" Over all {len(loss):,} predicted tokens the hard mask changes the loss by "
               f"{loss.mean():+.4f} nats on average; {(loss > 0).mean():.0%} get worse." if len(loss) else "")
    st.caption(f"The {len(queries)} queries (of {int(drops['query_rank'].max()):,} kept) whose next-token loss "
               "rises most under the hard mask, delta = NLL hard − NLL dense in nats, with their heaviest "
               "dropped dense edges (key token, position, distance in tokens, layer / head, dense weight). "
               "A query's loss also depends on edges dropped at earlier queries: these are candidates, "
               f"not causes.{overall}")
    wanted = set(queries["window"])
    tokens = run.columns("tokens", TOKEN_COLS)
    tokens = tokens[tokens["window"].isin(wanted)]
    restored = None
    if run.has("restored_drops"):
        rd = run.columns("restored_drops", RESTORED_COLS)
        restored = {(int(r["window"]), int(r["query_position"])): r for r in rd.to_dict("records")}
        st.markdown(restored_summary(rd))
    st.html(costly_html(queries, tokens, restored=restored))
    lib.download_csv(drops, f"{run.name}-costly-drops.csv",
                     label=f"Download the {len(drops):,} costly dropped edges as CSV")
    if restored is None:
        st.info(f"Restore the costly drops one by one to see the share of each query's loss delta an edge "
                f"recovers: {HOW_TO_RESTORE}.")


def restored_summary(rd: pd.DataFrame) -> str:
    """One line: over the restored queries, the median and quartiles of the share of the loss
    delta recovered by the heaviest dropped edge alone and by every recorded edge together."""
    def q(col: str) -> str:
        a, m, b = np.nanquantile(rd[col].to_numpy(dtype=float), [0.25, 0.5, 0.75])
        return f"median **{m:+.1%}** (quartiles {a:+.1%} to {b:+.1%})"
    return (f"**Restored drops** ({len(rd)} costliest queries): putting the query's heaviest dropped edge "
            f"back into that layer's mask recovers a {q('recovered')} of its loss delta; every recorded "
            f"dropped edge of the query at once: {q('recovered_all')}.")


def ablation_section(run) -> None:
    """group_ablation: per layer and group cut, the mean loss change per part of speech."""
    st.subheader("Group ablation")
    if not run.has("group_ablation"):
        st.info(f"This run has no **group_ablation** table (one group of one layer cut, the loss change per "
                f"part of speech): {HOW_TO_RESTORE}.")
        return
    ab = run.table("group_ablation")
    layers = sorted(ab["layer_idx"].unique().tolist())
    layer = st.selectbox("Layer", layers, key="ablation_layer") if len(layers) > 1 else layers[0]
    min_tokens = st.number_input("Parts of speech with at least this many tokens", 1, 10_000, 20,
                                 key="ablation_min_tokens")
    d = ab[(ab["layer_idx"] == layer) & (ab["tokens"] >= min_tokens)].copy()
    d["group"] = d["group"].astype(str)
    order = d.groupby("pos")["delta"].max().sort_values(ascending=False).index.tolist()
    window = int(ab["window"].iloc[0])
    fig = px.bar(d, x="pos", y="delta", color="group", barmode="group", category_orders={"pos": order},
                 hover_data=["tokens", "tokens_in_group", "nll_hard", "nll_ablated", "delta_in_group"],
                 title=f"layer {layer}, window {window}: loss change when one group is cut, per part of speech",
                 labels={"delta": "mean loss change, nats (> 0: the group helped)", "pos": "part of speech"})
    st.plotly_chart(fig, width="stretch")
    st.caption("Each group of the layer cut alone: its distant pairs (beyond the window, not sinks) dropped "
               "from the hard mask. Bars: the mean change of the next-token loss over every token of that "
               "part of speech (the query token's); hover for the tokens whose query joins the group "
               "(tokens_in_group) and their own mean (delta_in_group).")


# distance presets, tokens (inclusive bounds): the long-context buckets of the audit
DISTANCE_BUCKETS = {"all": (0, 1 << 30), "128-512": (128, 511), "512-2K": (512, 2047), "2K+": (2048, 1 << 30),
                    "custom": None}


def page() -> None:
    run = lib.run_page("Dependency audit", "dense edges beyond the local window that the hard mask drops")
    edges_section(run)
    far_section(run)
    costly_section(run)
    ablation_section(run)


def far_section(run, min_distance: int = 512) -> None:
    """Per layer: the dense mass the hard mask drops, and the share of it on edges longer than
    ``min_distance`` tokens (``runs.dropped_mass_by_distance``, from coverage_distance)."""
    if not run.has("coverage_distance"):
        return
    from focus_lab.runs import RunError, dropped_mass_by_distance
    try:
        df = dropped_mass_by_distance(run.table("coverage_distance"), min_distance)
    except RunError as e:
        st.info(str(e))
        return
    st.subheader(f"Dropped dense mass beyond {min_distance} tokens, per layer")
    st.caption(f"Dense attention mass per query the hard top-{run.config.get('top_k', '?')} mask drops "
               f"(mean over heads), and the share of it on edges at least {min_distance} tokens long. "
               f"Mean share over layers: {df['far_share'].mean():.1%}.")
    fig = go.Figure(go.Bar(x=df["layer_idx"], y=df["far_share"], name="share beyond",
                           customdata=df[["dropped_mass", "far_dropped_mass"]],
                           hovertemplate="layer %{x}<br>share %{y:.1%}<br>dropped %{customdata[0]:.3f}"
                                         "<br>beyond: %{customdata[1]:.3f}<extra></extra>"))
    fig.update_layout(height=260, margin=dict(l=10, r=10, t=10, b=30), xaxis_title="layer",
                      yaxis=dict(title="share of dropped mass", tickformat=".0%", range=[0, 1]))
    st.plotly_chart(fig, width="stretch")


def edges_section(run) -> None:
    """The dropped-edge audit: filters, arcs over one window, relations, the table with CSV."""
    raw = lib.need_table(run, "dropped_edges", "the dependency audit")
    if raw is None:
        return
    edges, tokens = load_edges(run.name, str(run.path), lib.stat_key(run.table_path("dropped_edges")))
    if edges.empty:
        st.success("The recorded run has no dropped edge above the recorder's threshold.")
        return
    rec = run.manifest.get("recorder") or {}
    how = ""
    if "edge_threshold" in rec:
        how = (f" (dense weight > {rec['edge_threshold']}, plus each query's top {rec.get('edge_top_n', 0)} "
               f"above {rec.get('edge_min_weight', 0)})")
    st.caption(f"{len(edges):,} dropped edges recorded{how}")

    c1, c2, c3 = st.columns(3)
    layers = sorted(edges["layer"].unique().tolist())
    heads = sorted(edges["head"].unique().tolist())
    rels = sorted(edges["relation"].unique().tolist(), key=lambda r: (r == NONE_REL, r))
    with c1:
        sel_layers = st.multiselect("Layers", layers, default=[], key="audit_layers", placeholder="all layers")
        sel_heads = st.multiselect("Heads", heads, default=[], key="audit_heads", placeholder="all heads")
    with c2:
        dmin, dmax = int(edges["distance"].min()), int(edges["distance"].max())
        bucket = st.radio("Distance bucket", list(DISTANCE_BUCKETS), horizontal=True, key="audit_bucket",
                          help="presets for long contexts; 'custom' shows a slider")
        if bucket != "custom":
            lo, hi = DISTANCE_BUCKETS[bucket]
            dist = (max(dmin, lo), min(dmax, hi))
        elif dmin < dmax:
            dist = st.slider("Distance (tokens)", dmin, dmax, (dmin, dmax), key="audit_distance")
        else:
            dist = (dmin, dmax)
        wmin = st.number_input("Minimum weight (dense attention probability)", min_value=0.0, max_value=1.0,
                               value=math.floor(edges["weight"].min() * 1e4) / 1e4, step=0.01, format="%.4f",
                               key="audit_weight")
    with c3:
        sel_rels = st.multiselect("Relations", rels, default=[], key="audit_relations", placeholder="all relations")
        only_rel = st.checkbox("only edges with a spaCy relation", key="audit_only_rel")
        no_sink = st.checkbox("hide edges to sink tokens", key="audit_no_sink", disabled="key_is_sink" not in edges,
                              help="keys among the first positions (attention sinks, docs/method.md §6)")

    f = edges
    if sel_layers:
        f = f[f["layer"].isin(sel_layers)]
    if sel_heads:
        f = f[f["head"].isin(sel_heads)]
    f = f[f["distance"].between(*dist) & (f["weight"] >= wmin)]
    if sel_rels:
        f = f[f["relation"].isin(sel_rels)]
    if only_rel:
        f = f[f["relation"] != NONE_REL]
    if no_sink and "key_is_sink" in f.columns:
        f = f[~f["key_is_sink"].astype(bool)]
    if f.empty:
        st.warning("No dropped edge matches these filters.")
        return
    m = st.columns(4)
    m[0].metric("matching edges", f"{len(f):,}", help=f"of {len(edges):,} recorded")
    m[1].metric("median dense weight", f"{f['weight'].median():.3f}")
    m[2].metric("median distance", f"{int(f['distance'].median())}")
    m[3].metric("with a spaCy relation", f"{(f['relation'] != NONE_REL).mean():.1%}")

    windows = sorted(f["window"].unique().tolist())
    counts = f["window"].value_counts()
    win = st.selectbox("Window to draw", windows, index=windows.index(int(counts.idxmax())), key="audit_window",
                       format_func=lambda w: f"window {w} ({counts.get(w, 0)} edges)")
    fw = f[f["window"] == win]
    tokens_w = tokens[tokens["window"] == win]
    shown = fw.nlargest(MAX_ARCS, "weight")  # heaviest first; no full sort of a 4K run's edges
    st.plotly_chart(arc_figure(shown, tokens_w, f"window {win}: {len(shown)} of {len(fw)} dropped edges "
                                                f"(heaviest first), key ← query"), width="stretch")
    st.html(text_html(tokens_w, shown))  # raw HTML, no markdown parse of a 4K-token window
    st.caption("orange: keys of dropped edges, blue: their queries, violet: both")

    by_rel = f.groupby("relation").agg(edges=("weight", "size"), mass=("weight", "sum")).reset_index()
    by_rel = by_rel.sort_values("edges", ascending=False)
    fig = px.bar(by_rel.head(25), x="relation", y="edges", hover_data=["mass"], log_y=True,
                 title="dropped edges by spaCy relation (top 25, log scale)")
    fig.update_layout(height=300, margin=dict(l=10, r=10, t=40, b=10))
    st.plotly_chart(fig, width="stretch")

    st.subheader("Dropped edges")
    cols = ["window", "layer", "head", "query_position", "query_token", "key_position", "key_token", "distance",
            "weight", "relation"] + [c for c in ("soft_weight", "query_group", "key_group", "key_is_sink")
                                  if c in f.columns]
    if len(f) > MAX_ROWS:
        st.caption(f"the {MAX_ROWS:,} heaviest of {len(f):,} edges; the CSV has them all")
    st.dataframe(f.nlargest(MAX_ROWS, "weight")[cols], hide_index=True, width="stretch", height=360,
                 column_config={"weight": st.column_config.NumberColumn(format="%.4f")})
    lib.download_csv(lambda: f.sort_values("weight", ascending=False)[cols], f"{run.name}-dropped-edges.csv",
                     label=f"Download {len(f):,} edges as CSV")


lib.guarded(page)
