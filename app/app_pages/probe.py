"""Live probe: type a passage, see each token's group in every layer, tokens coloured by POS.

The only page that runs a model: it loads the run's base model and routers once per process
(``st.cache_resource``), and only after the button is pressed.
"""

from __future__ import annotations

import html
import threading
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from focus_lab.app import lib

MAX_TOKENS = 256
DEFAULT_TEXT = ("Anne had been forced into prudence in her youth, she learned romance as she grew older: "
                "the natural sequel of an unnatural beginning.")


def router_file(run: lib.RunView) -> Path | None:
    """The run's router file (manifest ``routers.path``): absolute, or relative to the working
    directory or the repository."""
    p = (run.manifest.get("routers") or {}).get("path")
    if not p:
        return None
    p = Path(p)
    cands = [p] if p.is_absolute() else [Path.cwd() / p, lib.REPO / p]
    return next((c.resolve() for c in cands if c.is_file()), None)


@st.cache_resource(show_spinner=False, max_entries=2)
def load_probe_model(model_name: str, routers: str, router_mtime: int, mode: str, top_k: int):
    """(model, tokenizer, lock): the base model with the run's routers, in the run's mode."""
    import torch
    from focus_lab import load_routers
    from focus_lab.hf.models import load_model
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    model, tok = load_model(model_name or None, verbose=False)
    load_routers(model, routers, config_overrides={"mode": mode, "top_k": top_k})
    return model, tok, threading.Lock()


def probe(model, tok, lock, text: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tokens with POS, assignments) of ``text`` (first MAX_TOKENS tokens)."""
    import numpy as np
    import torch
    from focus_lab.recording.recorder import assignments_for_window
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    ids = np.asarray(enc["input_ids"][:MAX_TOKENS], dtype=np.int64)
    off = np.asarray(enc["offset_mapping"][:MAX_TOKENS], dtype=np.int64).reshape(-1, 2)
    tokens = pd.DataFrame({"window": 0, "position": np.arange(len(ids)),
                           "token": [tok.decode([int(i)]) for i in ids],
                           "char_start": off[:, 0], "char_end": off[:, 1]})
    tokens["pos"] = "(none)"
    try:
        from focus_lab.recording.linguistics import pos_table
        p = pos_table(text, off)
        tokens["pos"] = p["pos"].replace("", "(none)").to_numpy()
    except Exception as e:  # spaCy missing or linguistics unavailable: groups still shown
        st.caption(f"POS unavailable ({type(e).__name__}: {e})")
    tokens["display"] = tokens["token"].map(lib.show_token)
    with lock:
        asg = assignments_for_window(model, torch.from_numpy(ids))
    return tokens, asg


def chips(tokens: pd.DataFrame) -> str:
    out = []
    for r in tokens.itertuples(index=False):
        c = lib.POS_COLORS.get(r.pos, "#ddd")
        out.append(f'<span title="{html.escape(str(r.pos))} @{r.position}" style="background:{c}55;'
                   f'border:1px solid {c};border-radius:4px;padding:1px 4px;margin:2px;display:inline-block;'
                   f'font-family:monospace">{html.escape(str(r.display))}</span>')
    return "".join(out)


def page() -> None:
    run = lib.current_run()
    st.title("Live probe")
    model_name = str((run.manifest.get("model") or {}).get("name", ""))
    rfile = router_file(run)
    st.caption(f"run **{run.name}** · model `{model_name or 'embedded'}` · routers `{rfile}`")
    if rfile is None:
        st.info("This run's manifest names no router file that exists here (`routers.path`); the probe "
                "needs the trained routers. Record the run with `focus-lab record --routers <file>`.")
        return
    cfg = run.config
    text = st.text_area("Passage", DEFAULT_TEXT, height=110, key="probe_text", max_chars=4000)
    go_clicked = st.button("Run probe", type="primary", key="probe_run")
    if go_clicked:
        with st.spinner("loading the model (once) and routing the passage ..."):
            try:
                model, tok, lock = load_probe_model(model_name, str(rfile), rfile.stat().st_mtime_ns,
                                                    str(cfg.get("mode", "hard")), int(cfg.get("top_k", 2)))
                st.session_state["probe_result"] = (text, *probe(model, tok, lock, text))
            except Exception as e:  # the model failed to load: say why, on the page
                st.error(f"The probe failed: {type(e).__name__}: {e}")
                return
    res = st.session_state.get("probe_result")
    if res is None:
        st.info("Type a passage and press **Run probe** (the model loads only then).")
        return
    ptext, tokens, asg = res
    if ptext != text:
        st.caption("showing the last probed passage; press Run probe to route the new text")
    K = int(cfg.get("num_groups", asg["group"].max() + 1))
    st.markdown("**Tokens by POS**  " + " ".join(
        f'<span style="background:{lib.POS_COLORS.get(p, "#ddd")};padding:0 4px;border-radius:3px;'
        f'font-size:0.75rem">{html.escape(p)}</span>' for p in lib.pos_sorted(tokens["pos"])),
        unsafe_allow_html=True)
    st.markdown(chips(tokens), unsafe_allow_html=True)

    piv = asg.pivot(index="layer_idx", columns="position", values="group")
    disp = tokens.set_index("position")["display"]
    posx = tokens.set_index("position")["pos"]
    hover = [[f"{html.escape(str(disp[p]))} ({posx[p]}) → group {int(piv.loc[l, p])}" for p in piv.columns]
             for l in piv.index]
    scale = [[i / K, lib.group_color(g)] for g in range(K) for i in (g, g + 1)]
    fig = go.Figure(go.Heatmap(z=piv.to_numpy(), x=list(piv.columns), y=[str(l) for l in piv.index],
                               zmin=-0.5, zmax=K - 0.5, colorscale=scale, text=hover,
                               hovertemplate="layer %{y}: %{text}<extra></extra>",
                               colorbar=dict(title="group", tickvals=list(range(K)))))
    fig.update_layout(title="group of each token (columns) in every layer (rows)", height=min(200 + 16 * len(piv), 700),
                      margin=dict(l=10, r=10, t=40, b=90), yaxis_autorange="reversed", yaxis_type="category",
                      xaxis=dict(tickvals=list(piv.columns), ticktext=[html.escape(str(disp[p])) for p in piv.columns],
                                 tickangle=-60))
    st.plotly_chart(fig, width="stretch")

    layers = list(piv.index)
    layer = st.selectbox("Layer: its groups, tokens coloured by POS", layers, key="probe_layer")
    a = asg[asg["layer_idx"] == layer].merge(tokens, on="position")
    for g in range(K):
        sub = a[a["group"] == g].sort_values("position")
        st.markdown(f'<div style="margin:4px 0"><b style="color:{lib.group_color(g)}">group {g}</b> '
                    f"({len(sub)} tokens) {chips(sub)}</div>", unsafe_allow_html=True)


lib.guarded(page)
