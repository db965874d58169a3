"""Overview: the run's manifest, its held-out perplexity table (which windows it is of) and where
its routers came from: the training curves, or the shipped file's provenance."""

from __future__ import annotations

import json

import pandas as pd
import plotly.express as px
import streamlit as st

from focus_lab.app import lib


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


def eval_source(mf: dict) -> str:
    """Which windows the eval table is of: the manifest's ``eval`` entry (``focus-lab eval --run``),
    else the copied table's source (``copied_tables``: the router file's own evaluation)."""
    ev = mf.get("eval") if isinstance(mf.get("eval"), dict) else None
    if ev:
        wins = ev.get("windows") or []
        of = (f"all {len(wins)} recorded windows" if len(wins) == mf.get("windows")
              else f"{len(wins)} of the {mf.get('windows', '?')} recorded windows (window "
                   f"{', '.join(map(str, wins))})")
        return (f"On {of}, {ev.get('seq_len', '?')} tokens each; {ev.get('seconds', '?')} s; "
                f"`{ev.get('command', 'focus-lab eval --run')}` ({ev.get('created', '?')}). "
                "distant_pairs_kept: the share of pairs beyond the window that the pattern keeps.")
    copied = (mf.get("copied_tables") or {}).get("eval")
    if copied:
        return (f"Copied from `{copied}`: the evaluation made next to the router file, on its own windows "
                "(not necessarily the recorded ones; `focus-lab eval --run` evaluates these).")
    return "The evaluation's windows are not recorded in the manifest."


def shipped_provenance(routers: dict) -> None:
    """The routers shipped with focus-lab (manifest ``routers.shipped``, a copy of their entry in
    ``focus_lab/routers/MANIFEST.json``): the file, how it was made, and the whole entry."""
    sp = routers["shipped"]
    st.markdown(f"The router file **shipped with focus-lab** for `{sp.get('model', '?')}`: "
                f"`{sp.get('file', routers.get('path', '?'))}` (sha256 `{str(sp.get('sha256', '?'))[:12]}`, "
                f"{int(sp.get('bytes', 0)) / 1e6:.2f} MB). No training in this run; how the file was made:")
    scratch = sp.get("from_scratch") if isinstance(sp.get("from_scratch"), dict) else {}
    rows = [("command", sp.get("command")), ("data", sp.get("data")), ("machine", sp.get("machine")),
            ("peak RSS (GB)", sp.get("peak_rss_gb")),
            ("whole recipe from scratch", scratch.get("command")),
            ("from scratch: seconds", scratch.get("seconds")), ("from scratch: result", scratch.get("result")),
            ("from scratch: documented in", scratch.get("docs"))]
    table = pd.DataFrame([(k, str(v)) for k, v in rows if v not in (None, "")], columns=["field", "value"])
    st.dataframe(table, hide_index=True, width="stretch")
    with st.expander("full provenance (focus_lab/routers/MANIFEST.json)"):
        st.code(json.dumps(sp, indent=2, sort_keys=True, default=str), language="json")


def training_curves(run: lib.RunView, log: pd.DataFrame) -> None:
    """Loss per step and the largest group share per step and layer, from the train_log table."""
    if not len(log):
        st.info("The training log is empty.")
        return
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
        st.caption(eval_source(mf))
        show = ev.copy()
        dense = show.loc[show["label"] == "dense", "perplexity"]
        if len(dense):
            show["vs dense"] = show["perplexity"] / float(dense.iloc[0]) - 1.0
        cols = [c for c in ("label", "mode", "top_k", "perplexity", "vs dense", "nll", "distant_pairs_kept",
                            "max_group_share", "tokens", "tokens_per_second", "seconds", "canonical_pattern")
                if c in show.columns]  # canonical_pattern: the rules each label ran (docs/api.md, Patterns)
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

    st.subheader("Routers")
    routers = mf.get("routers") if isinstance(mf.get("routers"), dict) else {}
    if run.has("train_log"):
        st.caption(f"router file `{routers.get('path', '?')}` (sha256 `{str(routers.get('sha256', '?'))[:12]}`), "
                   "trained by `focus-lab train`; its training log:")
        training_curves(run, run.table("train_log"))
    elif isinstance(routers.get("shipped"), dict):
        shipped_provenance(routers)
    else:
        lib.need_table(run, "train_log", f"where the routers (`{routers.get('path', '?')}`) came from")

    st.subheader("Run manifest")
    st.dataframe(manifest_summary(mf), hide_index=True, width="stretch")
    with st.expander("full manifest (JSON)"):
        st.code(json.dumps(mf, indent=2, sort_keys=True, default=str), language="json")


lib.guarded(page)
