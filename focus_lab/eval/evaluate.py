"""Held-out perplexity of one model under several attention patterns, on the same windows.

Patterns (docs/method.md §2, §5): dense (full causal attention), sliding window only, Focus soft
(Sinkhorn gate; note its causal leak, docs/method.md §1), Focus hard top-k for k = 1..K.
"""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from focus_lab.method.core import distant_pairs_kept, hard_group_shares
from focus_lab.hf.hooks import hooks
from focus_lab.hf.retrofit import forward_state

EVAL_SCHEMA = 1
UNIFORM = "_uniform"  # pattern-name suffix: top-k in every layer (no per-layer budget)
MATCH = "_match"  # pattern-name suffix: token-match pairs with MATCH_SHIFTS (docs/method.md §2.8)
NO_MATCH = "_nomatch"  # pattern-name suffix: no token-match pairs, whatever the router file says
MATCH_SHIFTS = [0, 1]  # the shifts of the _match suffix: the earlier occurrence and the key after it
KEY_SHIFT = "_keyshift"  # pattern-name suffix: each key in its predecessor's group (docs/method.md §1.7)
NO_KEY_SHIFT = "_nokeyshift"  # pattern-name suffix: each key in its own group, whatever the file says
CAP = "_cap"  # pattern-name suffix: the group capacity CAPACITY (docs/method.md §2.9)
NO_CAP = "_nocap"  # pattern-name suffix: no group capacity, whatever the router file says
EVICT = "_evict"  # pattern-name suffix: the group capacity, the keys over it in no group (capacity_overflow)
CAPACITY = 0.5  # the group capacity of the _cap suffix: a group past half of the first choices overflows
# _cap, _capNN (the capacity NN / 100, _cap70 = 0.7), either + @LAYERS (only those layers, parts
# joined by '+': _cap@0+13-16 caps layers 0 and 13 to 16; capacity_layers); _evict the same, the
# keys over the capacity leaving every group instead of moving to their second
CAP_SUFFIX = re.compile(r"_(cap|evict)(\d{2})?(?:@([0-9+\-]+))?$")


def standard_patterns(num_groups: int) -> list[tuple[str, dict]]:
    """[(label, FocusConfig changes)]: dense, window, soft, hard top-1..K."""
    pats = [("dense", {"mode": "dense"}), ("window", {"mode": "window"}), ("soft", {"mode": "soft"})]
    pats += [(f"hard_top{k}", {"mode": "hard", "top_k": k}) for k in range(1, num_groups + 1)]
    return pats


def pattern_names(num_groups: int) -> list[str]:
    """Every pattern name ``parse_patterns`` accepts for K = ``num_groups``."""
    names = ["dense", "window", "soft"]
    for kind in ("hard", "random", "shuffled"):
        names += [f"{kind}_top{k}" for k in range(1, num_groups + 1)]
    return names


def split_suffixes(name: str) -> tuple[str, dict]:
    """A pattern name's base and the FocusConfig changes of its suffixes, stripped from the end in
    the order ``pattern_changes`` documents: ``hard_top2_uniform_match`` -> ``("hard_top2",
    {"match_shifts": [0, 1], "layer_top_k": {}})``; a name without suffixes comes back as is."""
    base, extra = name, {}
    if m := CAP_SUFFIX.search(base):
        from focus_lab.method.config import ConfigError, parse_int_list
        kind, nn, spec = m.groups()
        try:
            layers = parse_int_list(spec.replace("+", ",")) if spec else None
        except ValueError:
            raise ConfigError(f"pattern {name!r}: cannot read the capacity layers {spec!r}; write "
                              f"layer indices and ranges joined by '+', e.g. {CAP}@0+13-16") from None
        base, extra = base[:m.start()], {"group_capacity": int(nn) / 100 if nn else CAPACITY,
                                         "capacity_layers": layers,
                                         "capacity_overflow": "evict" if kind == "evict" else "second",
                                         "capacity_top_k": None}
    for pair in ((() if extra else ((NO_CAP, {"group_capacity": 0.0}),)),
                 ((NO_KEY_SHIFT, {"key_shift": 0}), (KEY_SHIFT, {"key_shift": 1})),
                 ((NO_MATCH, {"match_shifts": None}), (MATCH, {"match_shifts": list(MATCH_SHIFTS)})),
                 ((UNIFORM, {"layer_top_k": {}}),)):
        for suffix, change in pair:
            if base.endswith(suffix):
                base, extra = base.removesuffix(suffix), {**change, **extra}
                break
    return base, extra


def pattern_changes(name: str, num_groups: int) -> dict:
    """FocusConfig changes of one named pattern (docs/method.md §2, §5 controls).

    ``dense``, ``window`` (local window + sinks), ``soft`` (Sinkhorn gate), ``hard_topK``
    (the router's causal top-k groups), ``random_topK`` (balanced random groups, a control at
    equal sparsity), ``shuffled_topK`` (the router's own hard groups moved to random positions:
    identical group sizes, random membership). A top-k name ending in ``_uniform`` (e.g.
    ``hard_top2_uniform``) keeps k in every layer, whatever per-layer k the router file's budget
    or ``--layer-top-k`` sets (``layer_top_k = {}``, docs/method.md §2.7). A top-k name ending
    in ``_match`` adds the token-match pairs of ``MATCH_SHIFTS`` (``match_shifts``, docs/method.md
    §2.8), one ending in ``_nomatch`` drops any; a name ending in ``_keyshift`` puts each key in
    its predecessor's group (``key_shift = 1``, docs/method.md §1.7), ``_nokeyshift`` in its own;
    ``_cap`` caps each group at ``CAPACITY`` of the keys so far (``group_capacity``, docs/method.md
    §2.9), ``_capNN`` at NN / 100 (``_cap70``: 0.7), in every routed layer unless ``@LAYERS``
    follows (``_cap@0+13-16``: layers 0 and 13-16 only, ``capacity_layers``), the keys over it
    moving to their second group; ``_evict`` (``_evictNN``, ``@LAYERS`` alike) puts them in no
    group instead (``capacity_overflow = "evict"``); ``_nocap`` drops any cap; the suffixes
    combine in this order (``hard_top2_uniform_match_keyshift_cap``).
    Raises ConfigError naming the valid names.
    """
    from focus_lab.method.config import ConfigError
    if name in ("dense", "window", "soft"):
        return {"mode": name, "assignment": "router"}
    base, extra = split_suffixes(name)
    kind, _, k = base.partition("_top")
    assignment = {"hard": "router", "random": "random", "shuffled": "shuffled"}.get(kind)
    if assignment is None or not k.isdigit() or not 1 <= int(k) <= num_groups:
        raise ConfigError(f"unknown pattern {name!r}; choose from {', '.join(pattern_names(num_groups))} "
                          f"(a top-k name + '{UNIFORM}': k in every layer, no per-layer budget; + '{MATCH}' / "
                          f"'{NO_MATCH}': with / without token-match pairs; + '{KEY_SHIFT}' / '{NO_KEY_SHIFT}': "
                          f"keys in their predecessor's / own group; + '{CAP}' / '{NO_CAP}': with / without the "
                          f"group capacity, '{CAP}NN': capacity NN / 100, '{CAP}@0+13-16': in those layers only; "
                          f"'{EVICT}' as '{CAP}', the keys over it in no group)")
    return {"mode": "hard", "top_k": int(k), "assignment": assignment, **extra}


def parse_patterns(spec: str, num_groups: int) -> list[tuple[str, dict]]:
    """[(label, FocusConfig changes)] from a comma list such as ``dense,hard_top2,random_top2``;
    ``all`` is ``standard_patterns``. Raises ConfigError on an unknown or empty name list."""
    from focus_lab.method.config import ConfigError
    if spec.strip() == "all":
        return standard_patterns(num_groups)
    names = [x.strip() for x in spec.split(",") if x.strip()]
    if not names:
        raise ConfigError(f"--patterns is empty; choose from {', '.join(pattern_names(num_groups))}")
    return [(n, pattern_changes(n, num_groups)) for n in names]


def pattern_layer_top_k(config, changes: dict) -> dict[int, int]:
    """The per-layer k a pattern runs with, {layer_idx: k} ({} when uniform or not a hard pattern):
    ``FocusConfig.layer_top_k_in_force`` of ``config`` with the pattern's ``changes``
    (``pattern_changes``), e.g. the router file's top-2 budget for ``hard_top2`` (docs/method.md §2.7)."""
    if changes.get("mode") != "hard":
        return {}
    return config.replace(**{k: v for k, v in changes.items() if k in ("top_k", "layer_top_k")}).layer_top_k_in_force()


def pattern_layer_spec(config, changes: dict) -> str:
    """``pattern_layer_top_k`` written as a ``--layer-top-k`` spec (``config.format_layer_top_k``),
    '' when the pattern is uniform: what the CLI names and the length table records per row."""
    from focus_lab.method.config import format_layer_top_k
    in_force = pattern_layer_top_k(config, changes)
    return format_layer_top_k(in_force) if in_force else ""


def window_pairs_kept(T: int, window: int, sinks: int) -> float:
    """Fraction of distant causal pairs a sliding window (plus sinks) keeps: only sink pairs."""
    one = torch.zeros(1, T, dtype=torch.long)
    return distant_pairs_kept(one[..., None] + 1, one, window, sinks) if sinks else 0.0


@torch.no_grad()
def evaluate(model, windows: list, patterns: list[tuple[str, dict]] | None = None,
             batch_size: int = 1, progress: bool = True, per_window: bool = False) -> pd.DataFrame:
    """Perplexity of ``model`` (Focus attached) on ``windows`` under each pattern.

    Args:
        windows: held-out windows (``input_ids: (seq_len,)``), identical for every pattern; moved
            to the model's device (CPU or a GPU; tests/test_cuda.py checks the two agree).
        patterns: [(label, config changes)], default ``standard_patterns(K)``.
    Returns:
        DataFrame, one row per pattern: label, mode, top_k, nll (nats/token), perplexity,
        tokens (predicted), distant_pairs_kept (hard modes: fraction of causal pairs with
        i - j >= window that the mask keeps, averaged over routed layers; 1 for dense and soft,
        0 for window), max_group_share (hard modes: largest hard top-1 group's share of tokens,
        averaged over layers; 1/K is perfect balance), seconds, tokens_per_second.
    Each pattern runs with its own ``retrofit.FocusForward`` (the model's default config with the
    pattern's changes); nothing on the model is changed.
    """
    original = forward_state(model).config
    patterns = patterns or standard_patterns(original.num_groups)
    if per_window:
        frames = []
        for i, w in enumerate(windows):
            df = evaluate(model, [w], patterns, batch_size=1, progress=progress)
            df.insert(1, "window", int(getattr(w, "index", i)))
            frames.append(df)
        return pd.concat(frames, ignore_index=True)
    rows = []
    kept: list[float] = []
    shares: list[float] = []

    def groups(key_group, hook):  # pairs kept come from the groups: no (T, T) mask
        cfg, routing = hook.call.config, hook.call.routing
        if cfg.mode == "hard":
            kept.append(distant_pairs_kept(routing.query_groups, key_group, cfg.window, cfg.sink_tokens,
                                           hook.call.match_pairs))
            if cfg.top_k_at(hook.layer_idx) > 0:  # a window-only layer has no groups
                shares.append(float(hard_group_shares(key_group, cfg.num_groups).max()))

    device = next(model.parameters()).device  # the windows go where the model is
    with hooks(model, {"key_group": groups}, warn_unfired=False):  # dense / window patterns do not route
        for label, changes in patterns:
            state = forward_state(model, **changes)
            cfg = state.config
            kept.clear()
            shares.clear()
            nll_sum, n_tok = 0.0, 0
            t0 = time.perf_counter()
            for i in tqdm(range(0, len(windows), batch_size), desc=f"eval {label}",
                          disable=not progress, leave=False, dynamic_ncols=True):
                ids = torch.stack([w.input_ids for w in windows[i:i + batch_size]]).to(device)  # (b, T)
                logits = model(input_ids=ids, use_cache=False, focus=state).logits  # (b, T, V)
                nll = torch.nn.functional.cross_entropy(
                    logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum")
                nll_sum += float(nll)
                n_tok += ids[:, 1:].numel()
            dt = time.perf_counter() - t0
            mean = nll_sum / max(1, n_tok)
            if progress:
                tqdm.write(f"  {label}: perplexity {math.exp(mean):.3f} over {n_tok} tokens, "
                           f"{n_tok / dt:.0f} tokens/s")
            frac = {"dense": 1.0, "soft": 1.0}.get(cfg.mode)
            if cfg.mode == "window":
                frac = window_pairs_kept(windows[0].input_ids.shape[0], cfg.window, cfg.sink_tokens)
            if cfg.mode == "hard":
                frac = sum(kept) / len(kept) if kept else float("nan")
            rows.append({"label": label, "mode": cfg.mode,
                         "top_k": cfg.top_k if cfg.mode == "hard" else None,
                         "nll": mean, "perplexity": math.exp(mean), "tokens": n_tok,
                         "distant_pairs_kept": frac,
                         "max_group_share": sum(shares) / len(shares) if shares else float("nan"),
                         "seconds": dt,
                         "tokens_per_second": n_tok / dt if dt > 0 else float("nan")})
    df = pd.DataFrame(rows)
    df["schema_version"] = EVAL_SCHEMA
    return df


METRICS = ("nll", "perplexity", "tokens", "distant_pairs_kept", "max_group_share", "seconds",
           "tokens_per_second", "window", "speedup", "part_seconds")


def pool_windows(df: pd.DataFrame) -> pd.DataFrame:
    """Pool ``evaluate(..., per_window=True)`` rows over windows: one row per combination of the
    non-metric columns (label, mode, top_k, method, corpus, seq_len...), in first-seen order.

    perplexity = exp(sum(nll * tokens) / sum(tokens)) (token-weighted, nats); tokens and seconds
    summed; tokens_per_second = tokens / seconds; distant_pairs_kept and max_group_share are
    means over windows; ``windows`` counts them. A frame without a ``window`` column is returned
    unchanged.
    """
    if "window" not in df.columns:
        return df
    keys = [c for c in df.columns if c not in METRICS]
    d = df.assign(_nt=df["nll"] * df["tokens"])
    g = d.groupby(keys, sort=False, dropna=False)
    out = g.agg(_nt=("_nt", "sum"), tokens=("tokens", "sum"), seconds=("seconds", "sum"),
                distant_pairs_kept=("distant_pairs_kept", "mean"),
                max_group_share=("max_group_share", "mean"), windows=("window", "nunique")).reset_index()
    out["nll"] = out["_nt"] / out["tokens"]
    out["perplexity"] = out["nll"].map(math.exp)
    out["tokens_per_second"] = out["tokens"] / out["seconds"]
    return out.drop(columns="_nt")


def add_speedup(df: pd.DataFrame, by: tuple[str, ...] = ()) -> pd.DataFrame:
    """``df`` with a ``speedup`` column: each row's tokens/s over the dense pattern's tokens/s
    (the mean of the dense rows) within the same ``by`` group (e.g. corpus and seq_len, or a
    window); dense rows are those with ``method == "dense"`` when there is a method column, else
    ``label == "dense"``. NaN where a group has no dense row. The one speedup rule of the
    evaluation tables (``baselines.evaluate_baselines``, ``analyses/common.read``)."""
    out = df.copy()
    is_dense = (out["method"] == "dense") if "method" in out.columns else (out["label"] == "dense")
    by = [c for c in by if c in out.columns]
    if by:
        ref = out[is_dense].groupby(by, dropna=False)["tokens_per_second"].mean().rename("_dense_tps")
        out = out.join(ref, on=by)
    else:
        dense = out.loc[is_dense, "tokens_per_second"]
        out["_dense_tps"] = float(dense.mean()) if len(dense) else np.nan
    out["speedup"] = out["tokens_per_second"] / out["_dense_tps"]
    return out.drop(columns="_dense_tps")


def paired_change(a: pd.DataFrame, b: pd.DataFrame, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Perplexity change of ``a`` over ``b`` in % (pooled over the windows both have), with a 95%
    paired bootstrap interval (windows resampled with replacement, ``reps`` times).

    Args:
        a, b: per-window rows of one pattern each (``evaluate(..., per_window=True)``: columns
            window, nll (nats/token), tokens).
    Returns:
        (change %, interval low %, interval high %); NaNs when the two share no window.
    """
    x, y = a.set_index("window"), b.set_index("window")
    idx = x.index.intersection(y.index)
    if not len(idx):
        return float("nan"), float("nan"), float("nan")
    nx = (x.loc[idx, "nll"] * x.loc[idx, "tokens"]).to_numpy(float)
    ny = (y.loc[idx, "nll"] * y.loc[idx, "tokens"]).to_numpy(float)
    tok = x.loc[idx, "tokens"].to_numpy(float)

    def change(s):
        return 100 * (math.exp((nx[s].sum() - ny[s].sum()) / tok[s].sum()) - 1)

    rng = np.random.default_rng(seed)
    boots = [change(rng.integers(0, len(idx), len(idx))) for _ in range(reps)]
    return change(np.arange(len(idx))), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))
