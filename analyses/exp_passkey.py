"""Experiment ``passkey``: ``make_data(ctx)`` makes ``<out>/data/passkey.parquet`` (run and cached by
``analyses/figures.py``, ``focus-lab figures``). Read by ``analyses/fig_passkey.py``,
``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import json

import pandas as pd

from analyses.common import PASSKEY_TABLES, Context


def _committed(ctx: Context) -> list[pd.DataFrame]:
    """The committed probe tables (``figures/passkey/<run>/cases.parquet``, written by
    ``focus-lab probe passkey``) made with the routers in use (sha256 in their passkey.json) and
    their own configuration: a run with ``--layer-top-k`` / ``--random-layers`` (``config_overrides``
    in its settings) measures another pattern under the same label, so it is left out."""
    frames = []
    for meta in sorted(PASSKEY_TABLES.glob("*/passkey.json")):
        settings = json.loads(meta.read_text()).get("settings", {})
        if settings.get("routers", {}).get("sha256") == ctx.router_id() and not settings.get("config_overrides"):
            ctx.log(f"  [passkey] reusing {meta.parent}")
            frames.append(pd.read_parquet(meta.parent / "cases.parquet").assign(source=meta.parent.name))
    return frames


def make_data(ctx: Context) -> pd.DataFrame:
    """Passkey retrieval (``passkey.run_passkey``) on held-out Austen haystacks: one row per case
    (length, depth, pattern, seed: exact match, key log-prob in nats, distant pairs kept,
    needle edges kept). Full settings: the committed tables of ``focus-lab probe passkey`` runs
    with the same routers (``figures/passkey/``), else the probe at ``settings.passkey_*``
    (``chat`` prompt format; quick: ``bare``, the tiny tokenizer has no chat template)."""
    if not ctx.quick:
        frames = _committed(ctx)
        if frames:
            return pd.concat(frames, ignore_index=True)
    from focus_lab.evaluate import parse_patterns
    from focus_lab.passkey import load_haystack, run_passkey
    from focus_lab.retrofit import load_routers
    s = ctx.settings
    model = ctx.model()
    cfg = load_routers(model, ctx.routers())
    corp = ctx.corpus("austen")
    hay = load_haystack(corp.heldout, ctx.tokenizer, name="austen held-out")
    res = run_passkey(model, ctx.tokenizer, hay, ctx.data / "passkey_run", lengths=list(s.passkey_lengths),
                      depths=list(s.passkey_depths), patterns=parse_patterns(s.passkey_patterns, cfg.num_groups),
                      keys=s.passkey_keys, formats=("bare",) if ctx.quick else ("chat",),
                      settings={"routers": {"path": str(ctx.routers()), "sha256": ctx.router_id()}},
                      log=ctx.log)
    return res["cases"].assign(source="passkey_run")
