"""Balance: group shares per layer (hard top-1, Sinkhorn soft, plain softmax) and over training."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from focus_lab.app import lib

METHOD_NAMES = lib.BALANCE_METHOD_NAMES
#: Columns that are not a partition of the tokens (they do not sum to 1 over groups).
NOT_PARTITION = {"query"}
METHOD_COLS = ("method", "kind", "variant", "normalization", "routing", "source")
SHARE_COLS = ("share", "load", "group_share", "mass")


def recorded_shares(bal: pd.DataFrame) -> pd.DataFrame | None:
    """The balance table as long (layer_idx, group, method, share), or None if its layout is
    not one of: wide ``*_share`` columns per (layer, group), or long with a method column."""
    layer = lib.col(bal, "layer_idx", "layer", required=False)
    group = lib.col(bal, "group", required=False)
    if layer is None or group is None:
        return None
    wide = [c for c in bal.columns if c.endswith("_share") and c not in ("max_group_share", "min_group_share")]
    if wide:
        out = bal.melt(id_vars=[layer, group], value_vars=wide, var_name="method", value_name="share")
        out["method"] = out["method"].str.removesuffix("_share")
    else:
        method = lib.col(bal, *METHOD_COLS, required=False)
        share = lib.col(bal, *SHARE_COLS, required=False)
        if method is None or share is None:
            return None
        out = bal[[layer, group, method, share]].rename(columns={method: "method", share: "share"})
    out = out.rename(columns={layer: "layer_idx", group: "group"})
    out = out[~out["method"].isin(NOT_PARTITION)]
    out["method"] = out["method"].map(lambda m: METHOD_NAMES.get(m, m))
    return out.groupby(["layer_idx", "group", "method"], as_index=False)["share"].mean()


def page() -> None:
    run = lib.run_page("Balance", "are the groups balanced? Sinkhorn's hard constraint vs plain softmax "
                       "(docs/method.md §1: plain softmax puts almost every token in one group)",
                       need=("assignments", "group shares"))
    asg = run.table("assignments")
    K = run.num_groups

    hard = lib.hard_shares(asg, K)
    piv = hard.pivot(index="layer_idx", columns="group", values="share")
    fig = lib.layer_heatmap(piv.to_numpy(), [f"g{g}" for g in piv.columns], piv.index,
                            title="hard (top-1) group share per layer (white = 1/K)", xaxis_title="group",
                            hovertemplate="layer %{y}, %{x}: %{z:.1%}<extra></extra>",
                            colorbar=dict(title="share", tickformat=".0%"), colorscale="RdBu_r",
                            zmid=1.0 / K if K else None, text=piv.to_numpy(),
                            texttemplate="%{text:.0%}" if piv.shape[0] <= 40 else None)
    st.plotly_chart(fig, width="stretch")

    rec = recorded_shares(run.table("balance")) if run.has("balance") else None
    if rec is not None:
        shares = rec
        source = "recorded balance table"
    else:
        shares = hard.assign(method=METHOD_NAMES["hard"])
        source = "hard groups counted in the assignments table"
        if run.has("balance"):
            st.warning("The balance table has a layout this page does not know; showing shares derived from "
                       "the assignments instead (the raw table is below).")
        else:
            st.info("This run has no **balance** table (Sinkhorn soft shares, plain-softmax shares, "
                    f"marginal error, entropy); {lib.RECORD_HINT}. Showing the hard shares counted in the "
                    "assignments table.")
    largest = shares.groupby(["layer_idx", "method"], as_index=False)["share"].max()
    smallest = shares.groupby(["layer_idx", "method"], as_index=False)["share"].min()
    largest["stat"], smallest["stat"] = "largest", "smallest"
    both = pd.concat([largest, smallest])
    fig = px.line(both, x="layer_idx", y="share", color="method", line_dash="stat", markers=True,
                  title=f"largest and smallest group share per layer ({source})")
    if K:
        fig.add_hline(y=1.0 / K, line_dash="dot", annotation_text="1/K")
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=40, b=10), yaxis_tickformat=".0%",
                      xaxis_title="layer")
    lib.layer_xaxis(fig)
    st.plotly_chart(fig, width="stretch")
    summary = largest.pivot(index="layer_idx", columns="method", values="share")
    summary.columns = [f"largest share: {c}" for c in summary.columns]
    st.dataframe(summary.reset_index().rename(columns={"layer_idx": "layer"}), hide_index=True,
                 width="stretch")
    if run.has("balance_layer"):
        bl = run.table("balance_layer")
        keys = [c for c in ("layer_idx", "assignment") if c in bl.columns]
        stats = [c for c in ("soft_largest_share", "hard_largest_share", "soft_entropy", "hard_entropy",
                             "empty_groups", "marginal_error") if c in bl.columns]
        if len(keys) == 2 and stats:
            agg = bl.groupby(keys, as_index=False)[stats].mean()
            if "hard_entropy" in agg.columns:
                fig = px.line(agg, x="layer_idx", y="hard_entropy", color="assignment", markers=True,
                              title="balance per layer: normalized entropy of the hard load (1 = uniform, "
                                    "0 = one group), mean over windows")
                fig.update_layout(height=320, margin=dict(l=10, r=10, t=40, b=10), xaxis_title="layer",
                                  yaxis_range=[0, 1.02])
                lib.layer_xaxis(fig)
                st.plotly_chart(fig, width="stretch")
            st.caption("per layer and assignment, mean over windows: largest share, entropy / log K, empty "
                       "groups, Sinkhorn marginal error after the configured iterations")
            st.dataframe(agg.rename(columns={"layer_idx": "layer"}), hide_index=True, width="stretch")
    if run.has("balance"):
        with st.expander("recorded balance table"):
            st.dataframe(run.table("balance"), hide_index=True, width="stretch")

    st.subheader("Over training steps")
    log = lib.need_table(run, "train_log", "the shares over training")
    if log is None or log.empty:
        return
    p = log.pivot_table(index="layer_idx", columns="step", values="max_group_share")
    fig = lib.layer_heatmap(p.to_numpy(), p.columns.tolist(), p.index,
                            title="largest group share per layer over training steps", xaxis_title="step",
                            hovertemplate="layer %{y}, step %{x}: %{z:.1%}<extra></extra>",
                            colorbar=dict(title="largest", tickformat=".0%"), row_px=16, max_px=700,
                            colorscale="Magma", zmin=1.0 / K if K else 0, zmax=1)
    st.plotly_chart(fig, width="stretch")
    agg = log.groupby("step").agg(largest=("max_group_share", "max"), smallest=("min_group_share", "min"),
                                  mean_largest=("max_group_share", "mean")).reset_index()
    fig = px.line(agg.melt(id_vars="step", var_name="statistic", value_name="share"), x="step", y="share",
                  color="statistic", title="group share extremes over all layers")
    fig.update_layout(height=300, margin=dict(l=10, r=10, t=40, b=10), yaxis_tickformat=".0%")
    st.plotly_chart(fig, width="stretch")


lib.guarded(page)
