"""Overview: the run's manifest, its held-out perplexity table and its training curves."""

from __future__ import annotations

import json

import pandas as pd
import plotly.express as px
import streamlit as st

import lib


def manifest_summary(mf: dict) -> pd.DataFrame:
    model = mf.get("model", {}) or {}
    cfg = mf.get("focus_config", {}) or {}
    corpus = mf.get("corpus", {})
    routers = mf.get("routers", {}) or {}
    rows = [
        ("model", model.get("name", "?")),
        ("model type", model.get("model_type", "?")),
        ("layers / heads / kv heads", f"{model.get('num_layers', '?')} / {model.get('num_heads', '?')} / "
                                      f"{model.get('num_kv_heads', '?')}"),
        ("groups K / window w / top-k", f"{cfg.get('num_groups', '?')} / {cfg.get('window', '?')} / "
                                        f"{cfg.get('top_k', '?')}"),
        ("mode / tau / Sinkhorn iterations", f"{cfg.get('mode', '?')} / {cfg.get('tau', '?')} / "
                                             f"{cfg.get('sinkhorn_iters', '?')}"),
        ("router dim d_g", cfg.get("router_dim", "?")),
        ("windows x tokens", f"{mf.get('windows', '?')} x {mf.get('seq_len', '?')}"),
        ("documents", ", ".join(map(str, mf.get("documents", []))) or "?"),
        ("corpus", corpus.get("name", corpus) if isinstance(corpus, dict) else corpus),
        ("routers", routers.get("path", "?")),
        ("router sha256", str(routers.get("sha256", "?"))[:16]),
        ("created", mf.get("created", "?")),
        ("schema version", mf.get("schema_version", "?")),
        ("tables", ", ".join(mf.get("tables", []))),
    ]
    return pd.DataFrame(rows, columns=["field", "value"]).astype(str)


def page() -> None:
    run = lib.run_page("Overview", lambda r: f"`{r.path}`")
    mf = run.manifest
    cfg = run.config
    model = mf.get("model") if isinstance(mf.get("model"), dict) else {}
    st.markdown(f"model **{model.get('name', '?')}** ({model.get('model_type', '?')}) · corpus "
                f"**{(mf.get('corpus') or {}).get('name', '?') if isinstance(mf.get('corpus'), dict) else '?'}** · "
                f"held out: {', '.join(map(str, mf.get('documents', []))) or '?'} · recorded {mf.get('created', '?')}")
    c = st.columns(5)
    c[0].metric("layers", model.get("num_layers", "?"))
    c[1].metric("groups K", cfg.get("num_groups", "?"))
    c[2].metric("top-k", cfg.get("top_k", "?"))
    c[3].metric("window w", cfg.get("window", "?"))
    c[4].metric("tokens recorded", f"{int(mf.get('windows', 0)) * int(mf.get('seq_len', 0)):,}")

    st.subheader("Held-out perplexity")
    ev = lib.need_table(run, "eval", "the perplexity table")
    if ev is not None:
        show = ev.copy()
        dense = show.loc[show["label"] == "dense", "perplexity"]
        if len(dense):
            show["vs dense"] = show["perplexity"] / float(dense.iloc[0]) - 1.0
        cols = [c for c in ("label", "mode", "top_k", "perplexity", "vs dense", "nll", "distant_pairs_kept",
                            "max_group_share", "tokens", "tokens_per_second", "seconds") if c in show.columns]
        st.dataframe(show[cols], hide_index=True, width="stretch",
                     column_config={"perplexity": st.column_config.NumberColumn(format="%.3f"),
                                    "vs dense": st.column_config.NumberColumn(format="percent"),
                                    "nll": st.column_config.NumberColumn(format="%.4f"),
                                    "distant_pairs_kept": st.column_config.NumberColumn(format="%.3f"),
                                    "max_group_share": st.column_config.NumberColumn(format="percent"),
                                    "tokens_per_second": st.column_config.NumberColumn(format="%.0f"),
                                    "seconds": st.column_config.NumberColumn(format="%.2f")})
        fig = px.bar(show, x="label", y="perplexity", color="mode", text_auto=".2f",
                     hover_data=[c for c in ("nll", "distant_pairs_kept") if c in show.columns],
                     title="perplexity by attention pattern (lower is better)")
        lo = float(show["perplexity"].min())
        fig.update_layout(height=340, margin=dict(l=10, r=10, t=40, b=10),
                          yaxis_range=[lo * 0.95, float(show["perplexity"].max()) * 1.02])
        st.plotly_chart(fig, width="stretch")
        lib.download_csv(show[cols], f"{run.name}-eval.csv")

    st.subheader("Training")
    log = lib.need_table(run, "train_log", "the training curves")
    if log is not None and len(log):
        per_step = log.groupby("step").agg(loss=("loss", "mean"), lr=("lr", "mean"),
                                           max_group_share=("max_group_share", "max"),
                                           mean_max_share=("max_group_share", "mean")).reset_index()
        c1, c2 = st.columns(2)
        with c1:
            fig = px.line(per_step, x="step", y="loss", markers=len(per_step) < 80,
                          title="training loss (nats/token)")
            fig.update_layout(height=320, margin=dict(l=10, r=10, t=40, b=10))
            st.plotly_chart(fig, width="stretch")
        with c2:
            lay = log.copy()
            lay["layer"] = lay["layer_idx"].astype(str)
            fig = px.line(lay, x="step", y="max_group_share", color="layer",
                          title="largest group share per step, each layer")
            K = run.num_groups
            if K:
                fig.add_hline(y=1.0 / K, line_dash="dot", annotation_text="1/K (balanced)")
            fig.update_layout(height=320, margin=dict(l=10, r=10, t=40, b=10), yaxis_tickformat=".0%",
                              showlegend=lay["layer"].nunique() <= 12)
            st.plotly_chart(fig, width="stretch")
        first, last = per_step.iloc[0], per_step.iloc[-1]
        st.caption(f"{int(last['step'])} steps; loss {first['loss']:.4f} → {last['loss']:.4f}; largest group "
                   f"share (any layer) at the last step {last['max_group_share']:.1%}")

    st.subheader("Run manifest")
    st.dataframe(manifest_summary(mf), hide_index=True, width="stretch")
    with st.expander("full manifest (JSON)"):
        st.code(json.dumps(mf, indent=2, sort_keys=True, default=str), language="json")


lib.guarded(page)
