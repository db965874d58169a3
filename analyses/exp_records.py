"""Experiment ``records``: ``make_data(ctx)`` makes ``<out>/data/records.parquet`` (run and cached by
``analyses/figures.py``, ``focus-lab-figures``). Read by ``analyses/fig_coverage_distance.py``,
``analyses/fig_groups_pos.py``, ``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import time

import pandas as pd

from focus_lab.method.config import FocusConfig

from analyses.common import RECORD_METHODS, Context


def _moba_matched_k(ctx: Context, moba_cfg: FocusConfig, block_size: int) -> int | None:
    """MoBA's block top-k at the Focus router's sparsity at its own top-k
    (``baselines.moba_matched_top_k`` applied to the pairs kept in ``data/baselines``); None
    before that experiment has run."""
    p = ctx.data / "baselines.parquet"
    if not p.is_file():
        return None
    from focus_lab.eval.baselines import moba_matched_top_k
    from focus_lab.eval.evaluate import pool_windows
    from focus_lab.hf.retrofit import read_router_file
    k_focus = read_router_file(ctx.routers())[0].top_k
    b = pool_windows(pd.read_parquet(p))
    f = b[(b.method == "focus") & (b.label == f"hard_top{k_focus}")]["distant_pairs_kept"]
    if not len(f):
        return None
    return moba_matched_top_k(float(f.iloc[0]), ctx.settings.seq_len, block_size, moba_cfg.window,
                              moba_cfg.sink_tokens)


def make_data(ctx: Context) -> pd.DataFrame:
    """Recorded runs (``record.record_run``, hard mode at the router's top-k) of Focus (every
    metric but the edge audit, with spaCy POS) and of the k-means, online k-means and MoBA
    baselines (coverage), under ``data/runs/<method>``; all at the router's top-k except MoBA, at
    the top-k whose pairs kept match Focus's (``_moba_matched_k``). The Focus run also holds the recorder's
    window, matched-window and random-group coverage and the k-means / random NMI."""
    from focus_lab.eval.baselines import fit_kmeans_routers, fit_online_kmeans_routers, use_moba
    from focus_lab.recording.recorder import record_run
    from focus_lab.hf.retrofit import load_routers, routers, set_config
    s = ctx.settings
    rows = []
    ev = ctx.windows("austen", "heldout", s.seq_len, s.record_windows)
    texts = ctx.texts("austen")
    with_pos = True
    try:
        from focus_lab.recording.linguistics import load_spacy
        load_spacy()
    except Exception as e:  # spaCy pipeline missing: record without POS
        ctx.log(f"  spaCy unavailable ({e}); recording without POS")
        with_pos = False
    for method in RECORD_METHODS:
        path = ctx.data / "runs" / method
        t0 = time.perf_counter()
        if not (path / "manifest.json").is_file():
            model = ctx.model()
            cfg = load_routers(model, ctx.routers())
            if method == "kmeans":
                fit_kmeans_routers(model, ctx.windows("austen", "train", s.seq_len, s.fit_windows), seed=cfg.seed)
            elif method == "online_kmeans":
                fit_online_kmeans_routers(model, ctx.windows("austen", "train", s.seq_len, s.fit_windows))
            elif method == "moba":
                cfg = use_moba(model, cfg, s.seq_len)
                k = _moba_matched_k(ctx, cfg, next(iter(routers(model).values())).block_size)
                if k is not None:
                    set_config(model, top_k=k)
            set_config(model, mode="hard")
            metrics = ("assignments", "balance", "coverage", "crossing", "linguistics") if method == "focus" \
                else ("coverage",)
            record_run(model, ctx.tokenizer, ev, texts, path, meta={"method": method, "by": "focus-lab-figures"},
                       with_pos=with_pos and method == "focus", progress=False, metrics=metrics, per_query=False)
            ctx.log(f"  [records] {method}: {time.perf_counter() - t0:.0f}s")
        rows.append({"method": method, "path": str(path), "seconds": time.perf_counter() - t0})
    return pd.DataFrame(rows)
