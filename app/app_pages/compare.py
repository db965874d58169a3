"""Compare two runs side by side: configuration, perplexity tables, group balance, coverage."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from focus_lab.app import lib

def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def page() -> None:
    run_a = lib.current_run()
    st.title("Compare")
    names = lib.available_runs(lib.runs_root())
    others = [n for n in names if n != run_a.name]
    if not others:
        st.info("Only one run below the runs root: record another (e.g. K = 8, or an untrained router) "
                "to compare.")
        return
    c1, c2 = st.columns(2)
    c1.markdown(f"**A:** {run_a.name} (sidebar)")
    name_b = c2.selectbox("B", others, index=0, key="compare_b")
    try:
        run_b = lib.open_run(name_b)
    except lib.RunError as e:
        st.error(f"Cannot open run **{name_b}**: {e}")
        return
    runs = {"A": run_a, "B": run_b}

    st.subheader("Configuration")
    fa, fb = flat(run_a.manifest), flat(run_b.manifest)
    keys = [k for k in sorted(set(fa) | set(fb))
            if (k.startswith(("focus_config.", "model.", "corpus.", "routers.")) or k in ("windows", "seq_len"))]
    cfg = pd.DataFrame({"field": keys, f"A: {run_a.name}": [str(fa.get(k, "")) for k in keys],
                        f"B: {run_b.name}": [str(fb.get(k, "")) for k in keys]})
    differs = cfg.iloc[:, 1] != cfg.iloc[:, 2]
    only_diff = st.checkbox("only fields that differ", value=True, key="compare_only_diff")
    st.dataframe(cfg[differs] if only_diff else cfg.assign(differs=differs), hide_index=True, width="stretch")

    st.subheader("Held-out perplexity")
    evs = []
    for tag, r in runs.items():
        if r.has("eval"):
            evs.append(r.table("eval").assign(run=f"{tag}: {r.name}"))
        else:
            st.info(f"Run {tag} ({r.name}) has no **eval** table; evaluate it with `focus-lab eval` before "
                    "recording.")
    if evs:
        ev = pd.concat(evs, ignore_index=True)
        wide = ev.pivot_table(index="label", columns="run", values="perplexity", sort=False).reset_index()
        st.dataframe(wide, hide_index=True, width="stretch")
        fig = px.bar(ev, x="label", y="perplexity", color="run", barmode="group", text_auto=".2f",
                     title="perplexity by pattern")
        fig.update_layout(height=340, margin=dict(l=10, r=10, t=40, b=10))
        st.plotly_chart(fig, width="stretch")

    st.subheader("Group balance")
    rows = []
    for tag, r in runs.items():
        if not r.has("assignments"):
            st.info(f"Run {tag} ({r.name}) has no assignments table.")
            continue
        sh = lib.hard_shares(r.table("assignments"), r.num_groups)
        agg = sh.groupby("layer_idx")["share"].agg(["max", "min"]).reset_index()
        agg["run"] = f"{tag}: {r.name} (K={r.num_groups})"
        rows.append(agg)
    if rows:
        bal = pd.concat(rows).melt(id_vars=["layer_idx", "run"], var_name="stat", value_name="share")
        fig = px.line(bal, x="layer_idx", y="share", color="run", line_dash="stat", markers=True,
                      title="largest / smallest hard group share per layer")
        fig.update_layout(height=340, margin=dict(l=10, r=10, t=40, b=10), yaxis_tickformat=".0%",
                          xaxis_title="layer")
        lib.layer_xaxis(fig)
        st.plotly_chart(fig, width="stretch")

    covs = []
    for tag, r in runs.items():
        if r.has("coverage"):
            c = r.table("coverage")
            layer = lib.col(c, "layer_idx", "layer")
            value = lib.col(c, "coverage", "mean_coverage", "kept_mass")
            pcol = lib.col(c, "pattern", "method", "baseline", "mask", "variant", required=False)
            if pcol:
                c = c[c[pcol].astype(str) == "focus"] if (c[pcol].astype(str) == "focus").any() else c
            covs.append(c.groupby(layer)[value].mean().rename("coverage").rename_axis("layer_idx").reset_index()
                        .assign(run=f"{tag}: {r.name}"))
    if covs:
        st.subheader("Coverage of dense attention (Focus mask)")
        fig = px.line(pd.concat(covs), x="layer_idx", y="coverage", color="run", markers=True)
        fig.update_layout(height=300, margin=dict(l=10, r=10, t=20, b=10), xaxis_title="layer")
        lib.layer_xaxis(fig)
        st.plotly_chart(fig, width="stretch")


lib.guarded(page)
