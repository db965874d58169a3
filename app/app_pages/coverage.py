"""Coverage: how much of the dense model's attention the hard Focus mask keeps, per layer and
head, and against distance, compared with sliding-window-only and random groups."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from focus_lab.app import lib

PATTERN_COLS = ("pattern", "method", "baseline", "mask", "variant")
DIST_TABLES = ("coverage_distance", "coverage_by_distance")


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    layer = lib.col(df, "layer_idx", "layer")
    cov = lib.col(df, "coverage", "mean_coverage", "kept_mass")
    pattern = lib.col(df, *PATTERN_COLS, required=False)
    head = lib.col(df, "head", "head_idx", required=False)
    out = pd.DataFrame({"layer_idx": df[layer].astype(int), "coverage": df[cov].astype(float),
                        "pattern": df[pattern].astype(str) if pattern else "focus",
                        "head": df[head].astype(int) if head else -1})
    for c in ("mass", "weight", "count", "queries", "pairs"):
        if c in df.columns:
            out["w"] = df[c].astype(float)
            break
    for c in ("distance_lo", "distance_bucket", "bucket", "distance", "distance_min"):
        if c in df.columns:
            out["distance"] = df[c]
            break
    if "distance_hi" in df.columns:
        out["distance_hi"] = df["distance_hi"]
    return out


def wmean(g: pd.DataFrame) -> float:
    if "w" in g and g["w"].sum() > 0:
        return float(np.average(g["coverage"], weights=g["w"]))
    return float(g["coverage"].mean())


CROSSING = {"dense_dropped": "dense mass the hard mask drops", "dense_distant": "dense mass on distant keys (d >= w)",
            "dense_sink_mass": "dense mass on sink tokens", "dense_sink_dropped": "dense sink mass dropped",
            "soft_crossing": "Focus-soft mass on distant keys of other groups",
            "soft_crossing_expected": "Focus-soft mass across soft groups (1 - p_i.p_j)"}


def crossing_section(run: lib.RunView) -> None:
    st.subheader("Crossing mass")
    if not run.has("crossing"):
        st.info(f"This run has no **crossing** table (mass across group boundaries); {lib.RECORD_HINT}.")
        return
    cr = run.table("crossing")
    layer = lib.col(cr, "layer_idx", "layer")
    cols = [c for c in CROSSING if c in cr.columns]
    if not cols:
        st.dataframe(cr, hide_index=True)
        return
    per_layer = cr.groupby(layer, as_index=False)[cols].mean().rename(columns={layer: "layer"})
    long = per_layer.melt(id_vars="layer", var_name="metric", value_name="mass")
    long["metric"] = long["metric"].map(CROSSING)
    fig = px.line(long, x="layer", y="mass", color="metric", markers=True,
                  title="mass per query crossing group boundaries, mean over heads and queries")
    fig.update_layout(height=340, margin=dict(l=10, r=10, t=40, b=10))
    lib.layer_xaxis(fig)
    st.plotly_chart(fig, width="stretch")
    st.dataframe(per_layer, hide_index=True, width="stretch")


def patterns_section(run: lib.RunView) -> None:
    """Full dense attention maps and the hard mask for the (layer, head) pairs the recorder was
    asked to keep (``patterns`` table)."""
    st.subheader("Recorded attention maps")
    if not run.has("patterns"):
        st.info("This run has no **patterns** table (full T x T maps for chosen layers and heads); record "
                "them with the recorder's `patterns` option.")
        return
    pt = run.table("patterns")
    if pt.empty or not {"layer_idx", "head", "query_position", "key_position", "dense_weight", "kept"} <= set(pt):
        st.info("The patterns table is empty.")
        return
    if "window" not in pt.columns:
        pt = pt.assign(window=0)
    combos = pt[["layer_idx", "head", "window"]].drop_duplicates().sort_values(["layer_idx", "head", "window"])
    options = [tuple(int(v) for v in r) for r in combos.itertuples(index=False)]
    pick = st.selectbox("layer, head, window", options, key="coverage_pattern_pick",
                        format_func=lambda o: f"layer {o[0]}, head {o[1]}, window {o[2]}")
    sel = pt[(pt["layer_idx"] == pick[0]) & (pt["head"] == pick[1]) & (pt["window"] == pick[2])]
    T = int(max(sel["query_position"].max(), sel["key_position"].max())) + 1
    dense = np.full((T, T), np.nan)
    dropped = np.full((T, T), np.nan)
    qi, kj = sel["query_position"].to_numpy(), sel["key_position"].to_numpy()
    w = sel["dense_weight"].to_numpy(dtype=float)
    kept = sel["kept"].to_numpy().astype(bool)
    dense[qi, kj] = w
    dropped[qi, kj] = np.where(kept, 0.0, w)
    c1, c2 = st.columns(2)
    for col_, z, name in ((c1, dense, "dense attention P"), (c2, dropped, "dense mass the hard mask drops")):
        fig = go.Figure(go.Heatmap(z=z, colorscale="YlOrRd", zmin=0, zmax=float(np.nanquantile(w, 0.99)) or 1.0,
                                   hovertemplate="query %{y}, key %{x}: %{z:.4f}<extra></extra>"))
        fig.update_layout(title=name, height=420, margin=dict(l=10, r=10, t=40, b=10), xaxis_title="key",
                          yaxis_title="query", yaxis_autorange="reversed", plot_bgcolor="#e8e8e8")
        col_.plotly_chart(fig, width="stretch")
    st.caption(f"{kept.mean():.1%} of the recorded pairs kept; dropped dense mass per query "
               f"{np.nansum(dropped) / max(1, len(np.unique(qi))):.3f}")


def page() -> None:
    run = lib.run_page("Coverage", "coverage = dense softmax mass on the pairs the hard mask keeps "
                       "(1 - total-variation distance), averaged over queries",
                       need=("coverage", "the coverage heatmap"))
    cov = normalize(run.table("coverage"))
    patterns = sorted(cov["pattern"].unique(), key=lambda p: (p != "focus", p))
    pattern = st.selectbox("Mask", patterns, index=0, key="coverage_pattern",
                           help="focus = the run's hard mask; window = sliding window only; "
                                "random = random groups at equal sparsity")
    sel = cov[cov["pattern"] == pattern]
    by_lh = sel.groupby(["layer_idx", "head"]).apply(wmean, include_groups=False).rename("coverage").reset_index()
    piv = by_lh.pivot(index="layer_idx", columns="head", values="coverage")
    fig = lib.layer_heatmap(piv.to_numpy(), [str(h) for h in piv.columns], piv.index,
                            title=f"coverage of dense attention (attention recall), {pattern} mask (layer x head)", xaxis_title="head",
                            hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>",
                            colorbar=dict(title="coverage"), base_px=180, colorscale="Viridis",
                            zmin=float(np.nanmin(piv.to_numpy())) if piv.size else 0, zmax=1.0)
    fig.update_layout(xaxis_type="category")
    if "output_error" in run.tables:
        err = run.table("output_error")
        err = err[err["pattern"] == pattern].pivot(index="layer_idx", columns="head", values="output_error")
        c1, c2 = st.columns(2)
        c1.plotly_chart(fig, width="stretch")
        efig = lib.layer_heatmap(err.to_numpy(), [str(h) for h in err.columns], err.index,
                                 title=f"output error ||O - O_sparse|| / ||O||, {pattern} mask", xaxis_title="head",
                                 hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>",
                                 colorbar=dict(title="output error"), base_px=180, colorscale="Magma_r", zmin=0)
        efig.update_layout(xaxis_type="category")
        c2.plotly_chart(efig, width="stretch")
    else:
        st.plotly_chart(fig, width="stretch")
        st.caption("Record with `--metrics default,output_error` to see each mask's output error beside it.")

    per_layer = cov.groupby(["layer_idx", "pattern"]).apply(wmean, include_groups=False).rename(
        "coverage").reset_index()
    fig = px.line(per_layer, x="layer_idx", y="coverage", color="pattern", markers=True,
                  title="mean coverage per layer: Focus vs the baselines")
    fig.update_layout(height=320, margin=dict(l=10, r=10, t=40, b=10), xaxis_title="layer")
    lib.layer_xaxis(fig)
    st.plotly_chart(fig, width="stretch")
    table = per_layer.pivot(index="layer_idx", columns="pattern", values="coverage").reset_index()
    st.dataframe(table.rename(columns={"layer_idx": "layer"}), hide_index=True, width="stretch")
    lib.download_csv(table, f"{run.name}-coverage.csv")

    crossing_section(run)

    st.subheader("Coverage against distance")
    dist_name = next((t for t in DIST_TABLES if run.has(t)), None)
    if dist_name is None and "distance" not in cov.columns:
        st.info(f"This run has no coverage-by-distance table ({' / '.join(DIST_TABLES)}); {lib.RECORD_HINT}.")
        return
    dist = normalize(run.table(dist_name)) if dist_name else cov
    if "distance" not in dist.columns:
        st.info(f"The table {dist_name} has no distance column; {lib.RECORD_HINT}.")
        return
    layers = ["all"] + sorted(int(x) for x in dist["layer_idx"].unique())
    layer = st.selectbox("Layer", layers, index=0, key="coverage_dist_layer")
    d = dist if layer == "all" else dist[dist["layer_idx"] == layer]
    keys = ["distance", "pattern"] + (["distance_hi"] if "distance_hi" in d.columns else [])
    curve = d.groupby(keys).apply(wmean, include_groups=False).rename("coverage").reset_index()
    if "distance_hi" in curve.columns:
        curve["bucket"] = curve.apply(lambda r: f"[{r['distance']}, {r['distance_hi']})"
                                      if r["distance_hi"] < 10 ** 5 else f">= {r['distance']}", axis=1)
    fig = px.line(curve.sort_values("distance"), x="distance", y="coverage", color="pattern", markers=True,
                  hover_data=["bucket"] if "bucket" in curve.columns else None,
                  title=f"coverage vs query-key distance ({'all layers' if layer == 'all' else f'layer {layer}'})")
    w = run.config.get("window")
    if w:
        fig.add_vline(x=w, line_dash="dot", annotation_text=f"window w={w}")
    fig.update_layout(height=340, margin=dict(l=10, r=10, t=40, b=10), xaxis_title="distance (bucket start)")
    st.plotly_chart(fig, width="stretch")
    patterns_section(run)


lib.guarded(page)
