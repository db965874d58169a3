"""Held-out perplexity of one model under several attention patterns, on the same windows.

Patterns (docs/method.md §2, §5; spelled as ``focus_lab.patterns.Pattern``): dense (full causal
attention), sliding window only, Focus soft (Sinkhorn gate; note its causal leak, docs/method.md
§1), Focus hard top-k for k = 1..K, with rules added by '+'.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from focus_lab.method.core import distant_pairs_kept, hard_group_shares
from focus_lab.hf.hooks import hooks
from focus_lab.hf.retrofit import forward_state
from focus_lab.patterns import Pattern

EVAL_SCHEMA = 3  # 2: the canonical pattern, window and sinks recorded per row (docs/api.md "Patterns");
# 3: block_nll and block_tokens, the loss of each run of BLOCK_TOKENS predicted tokens
BLOCK_TOKENS = 256  # predicted tokens per block of a row's block_nll: the unit of block intervals (paired_change)


def _routers_or_groups(routers) -> tuple:
    """(router file FocusConfig or None, num_groups) from a FocusConfig or an int."""
    return (None, int(routers)) if isinstance(routers, int) else (routers, routers.num_groups)


def standard_patterns(num_groups: int) -> list[tuple[str, dict]]:
    """[(label, FocusConfig changes)]: dense, window, soft, hard top-1..K (the paper's rule)."""
    return parse_patterns("all", num_groups)


def pattern_names(num_groups: int) -> list[str]:
    """The bare pattern heads for K = ``num_groups`` (rules are added with '+')."""
    names = ["dense", "window", "soft"]
    for kind in ("hard", "random", "shuffled"):
        names += [f"{kind}_top{k}" for k in range(1, num_groups + 1)]
    return names


def pattern_changes(name: str, routers, num_layers: int | None = None) -> dict:
    """FocusConfig changes of one pattern spelling (``focus_lab.patterns.Pattern.parse``; the
    same rules with every router file: ``hard_top2`` is the paper's top-2, ``default`` the file's
    own rules). ``routers``: the router file's FocusConfig, or just num_groups (then ``default``
    is refused). Raises PatternError (a ConfigError) naming the failing token."""
    from focus_lab.patterns import Pattern
    cfg, K = _routers_or_groups(routers)
    return Pattern.parse(name, cfg).check(K, num_layers).changes()


def parse_patterns(spec: str, routers, pattern_file=None, num_layers: int | None = None) -> list[tuple[str, dict]]:
    """[(label, FocusConfig changes)] from a comma list such as ``dense,hard_top2,default``
    (``focus_lab.patterns.parse_patterns``); ``all``: dense, window, soft, hard_top1..K; or,
    with ``pattern_file`` (``--pattern-file``: a JSON or YAML list of spellings or mapping
    {label: spelling}), from that file instead of ``spec``.
    ``routers``: the router file's FocusConfig or num_groups; ``num_layers``: the layers a rule
    may name (the router file's routed layers, ``shipped.routed_layers``; None: unchecked).
    Raises PatternError."""
    from focus_lab.patterns import parse_pattern_file, parse_patterns as parse
    cfg, K = _routers_or_groups(routers)
    pats = parse_pattern_file(pattern_file, cfg) if pattern_file else parse(spec, cfg, num_groups=K)
    return [(label, p.check(K, num_layers).changes()) for label, p in pats]


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


NLL_CHUNK = 512  # positions per slice of the output head: at Gemma-3's 262,144-token vocabulary a
# slice's fp32 logits take 0.5 GiB, where the full (T, vocab) logits take 17 GB at 16K tokens


def output_head(model):
    """The map from the body's final hidden states to the logits, as the model's forward applies
    it: the output embeddings (``model.get_output_embeddings()``, ``lm_head``), then, where the
    config sets ``final_logit_softcapping`` (Gemma-2, Gemma-3), ``cap * tanh(logits / cap)``
    (transformers' ``Gemma3ForCausalLM.forward``). Returns a function (..., d_model) -> (..., vocab)
    in the model's dtype. Raises ValueError when the model has no output head."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output head (get_output_embeddings() is None): "
                         "pass the causal-LM model (e.g. LlamaForCausalLM), not its body")
    cap = getattr(model.config, "final_logit_softcapping", None)

    def logits(hidden: torch.Tensor) -> torch.Tensor:
        out = head(hidden)
        if cap is None:
            return out
        if torch.is_grad_enabled():
            return torch.tanh(out / cap) * cap
        return out.div_(cap).tanh_().mul_(cap)  # in place: at Gemma-3's vocabulary each copy of a
        # 512-position slice is 0.5 GiB (docs/reliability.md)
    return logits


def next_token_nll(model, ids: torch.Tensor, chunk: int = NLL_CHUNK, *, release_after_body: bool = False,
                   **forward_kwargs) -> torch.Tensor:
    """Per-token negative log-likelihood (nats) of ``ids[:, 1:]`` given their prefixes, without the
    full logits: the model's body (``model.base_model``) gives the final hidden states, and the
    output head (``output_head``) runs on ``chunk`` positions at a time, each slice's NLL being
    ``logsumexp(logits) - logits[target]`` in fp32 (the logits cast as ``cross_entropy`` of the
    full logits cast them). Peak memory beyond the forward: O(chunk x vocab).

    Args:
        ids: (batch, seq) token ids.
        chunk: positions per slice of the head (>= 1), counted over batch x (seq - 1).
        release_after_body: hand the heap's free pages back to the kernel between the body and
            the head (``method.cpu.release_freed_memory``): the recorder's bound on its peak, at
            about 0.2 s a call (a window's forward takes tens of seconds there).
        forward_kwargs: passed to the body (e.g. ``use_cache=False``, ``focus=...``).
    Returns: (batch, seq - 1) float32 NLL, nats.
    Raises ValueError: ``chunk`` < 1, or no output head (``output_head``)."""
    if chunk < 1:
        raise ValueError(f"chunk {chunk}: need at least one position per slice")
    head = output_head(model)
    body = model.base_model
    hidden = body(input_ids=ids, **forward_kwargs).last_hidden_state[:, :-1]  # (b, T-1, d)
    if release_after_body:
        from focus_lab.method.cpu import release_freed_memory
        release_freed_memory()  # the body's freed activations: the head's slices do not fit their holes
    b, n = hidden.shape[:2]
    flat, targets = hidden.reshape(b * n, -1), ids[:, 1:].reshape(b * n)
    out = torch.empty(b * n, dtype=torch.float32, device=hidden.device)
    for s in range(0, b * n, chunk):
        logits = head(flat[s:s + chunk]).float()  # (c, vocab)
        tgt = targets[s:s + chunk, None]
        out[s:s + chunk] = torch.logsumexp(logits, -1) - logits.gather(-1, tgt).squeeze(-1)
        del logits  # freed before the next slice's head: two (c, vocab) slices, never three
    return out.view(b, n)


@torch.no_grad()
def evaluate(model, windows: list, patterns: list[tuple[str, dict]] | None = None,
             batch_size: int = 1, progress: bool = True, per_window: bool = False) -> pd.DataFrame:
    """Perplexity of ``model`` (Focus attached) on ``windows`` under each pattern.

    Args:
        windows: held-out windows (``input_ids: (seq_len,)``), identical for every pattern; moved
            to the model's device (CPU or a GPU; tests/test_cuda.py checks the two agree).
        patterns: [(label, config changes)], default ``standard_patterns(K)``.
    Returns:
        DataFrame, one row per pattern: label (as given), canonical_pattern (the canonical spelling of
        the rules in force, ``Pattern.from_config`` of the forward's config), mode, top_k, nll (nats/token), perplexity,
        tokens (predicted), distant_pairs_kept (hard modes: fraction of causal pairs with
        i - j >= window that the mask keeps, averaged over routed layers; 1 for dense and soft,
        0 for window), max_group_share (hard modes: largest hard top-1 group's share of tokens,
        averaged over layers; 1/K is perfect balance), seconds, tokens_per_second,
        window_tokens and sink_tokens (the local window and sinks in force), block_nll and
        block_tokens (lists: the summed NLL in nats and the count of each run of ``BLOCK_TOKENS``
        predicted tokens of each window in turn, the last of a window shorter; ``paired_change``'s
        block intervals).
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
                                           hook.call.rule_pairs))
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
            block_nll: list[float] = []
            block_tokens: list[int] = []
            t0 = time.perf_counter()
            for i in tqdm(range(0, len(windows), batch_size), desc=f"eval {label}",
                          disable=not progress, leave=False, dynamic_ncols=True):
                ids = torch.stack([w.input_ids for w in windows[i:i + batch_size]]).to(device)  # (b, T)
                # (b, T-1) nats, the head applied NLL_CHUNK positions at a time: no (b, T, V) logits
                nll = next_token_nll(model, ids, use_cache=False, focus=state)  # (b, T-1) float32
                nll_sum += float(nll.sum())
                n_tok += ids[:, 1:].numel()
                for row in nll.double().cpu():  # (T-1,) a window's tokens, in runs of BLOCK_TOKENS
                    runs = row.split(BLOCK_TOKENS)
                    block_nll.extend(float(r.sum()) for r in runs)
                    block_tokens.extend(len(r) for r in runs)
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
            rows.append({"label": label, "canonical_pattern": str(Pattern.from_config(cfg)), "mode": cfg.mode,
                         "top_k": cfg.top_k if cfg.mode == "hard" else None,
                         "nll": mean, "perplexity": math.exp(mean), "tokens": n_tok,
                         "distant_pairs_kept": frac,
                         "max_group_share": sum(shares) / len(shares) if shares else float("nan"),
                         "seconds": dt,
                         "tokens_per_second": n_tok / dt if dt > 0 else float("nan"),
                         "window_tokens": cfg.window, "sink_tokens": cfg.sink_tokens,
                         "block_nll": block_nll, "block_tokens": block_tokens})
    df = pd.DataFrame(rows)
    df["schema_version"] = EVAL_SCHEMA
    return df


METRICS = ("nll", "perplexity", "tokens", "distant_pairs_kept", "max_group_share", "seconds",
           "tokens_per_second", "window", "speedup", "part_seconds", "block_nll", "block_tokens")


def pool_windows(df: pd.DataFrame) -> pd.DataFrame:
    """Pool ``evaluate(..., per_window=True)`` rows over windows: one row per combination of the
    non-metric columns (label, mode, top_k, method, corpus, seq_len...), in first-seen order.

    perplexity = exp(sum(nll * tokens) / sum(tokens)) (token-weighted, nats); tokens and seconds
    summed; tokens_per_second = tokens / seconds; distant_pairs_kept and max_group_share are
    means over windows; ``windows`` counts them; block losses are left out (``paired_change``
    reads them per window). A frame without a ``window`` column is returned
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


def paired_change(a: pd.DataFrame, b: pd.DataFrame, reps: int = 2000, seed: int = 0,
                  block: int | None = None) -> tuple[float, float, float]:
    """Perplexity change of ``a`` over ``b`` in % (pooled over the windows both have), with a 95%
    paired bootstrap interval (the units resampled with replacement, ``reps`` times).

    The units are the windows (``block=None``), or, with ``block``, the runs of ``block``
    consecutive predicted tokens inside each window (a block bootstrap: the units are contiguous
    so that the dependence between neighbouring tokens stays inside a unit; the interval speaks for
    the tokens of these windows, not for other texts, which only more windows answer).

    Args:
        a, b: per-window rows of one pattern each (``evaluate(..., per_window=True)``: columns
            window, nll (nats/token), tokens; with ``block`` also block_nll, block_tokens).
        block: tokens per unit, a multiple of ``BLOCK_TOKENS``; None: a window per unit.
    Returns:
        (change %, interval low %, interval high %); NaNs when the two share no window.
    Raises ValueError: ``block`` not a positive multiple of ``BLOCK_TOKENS``, or rows without
        block losses (made before evaluation schema 3: run the cell again).
    """
    x, y = a.set_index("window"), b.set_index("window")
    idx = x.index.intersection(y.index)
    if not len(idx):
        return float("nan"), float("nan"), float("nan")
    if block is None:
        nx = (x.loc[idx, "nll"] * x.loc[idx, "tokens"]).to_numpy(float)
        ny = (y.loc[idx, "nll"] * y.loc[idx, "tokens"]).to_numpy(float)
        tok = x.loc[idx, "tokens"].to_numpy(float)
    else:
        nx, tok = block_units(x, idx, block)
        ny, tok_y = block_units(y, idx, block)
        if not np.array_equal(tok, tok_y):
            raise ValueError("paired_change: the two patterns' windows are split into different blocks "
                             "(not the same windows)")

    def change(s):
        return 100 * (math.exp((nx[s].sum() - ny[s].sum()) / tok[s].sum()) - 1)

    rng = np.random.default_rng(seed)
    boots = [change(rng.integers(0, len(nx), len(nx))) for _ in range(reps)]
    return change(np.arange(len(nx))), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def block_units(x: pd.DataFrame, windows, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(summed NLL in nats, tokens) of each run of ``block`` predicted tokens in each of ``windows``
    in turn, two arrays of shape (units,); ``x``: rows indexed by window, with block_nll and
    block_tokens. See ``paired_change``. Raises ValueError as ``paired_change``."""
    if block <= 0 or block % BLOCK_TOKENS:
        raise ValueError(f"block {block}: need a positive multiple of {BLOCK_TOKENS} tokens")
    if "block_nll" not in x or x.loc[windows, "block_nll"].isna().any():
        raise ValueError("no block losses in these rows (made before evaluation schema 3): "
                         "evaluate the windows again for block intervals")
    per = block // BLOCK_TOKENS
    nll, tok = [], []
    for w in windows:
        bn = np.asarray(x.at[w, "block_nll"], float)
        bt = np.asarray(x.at[w, "block_tokens"], float)
        for s in range(0, len(bn), per):
            nll.append(bn[s:s + per].sum())
            tok.append(bt[s:s + per].sum())
    return np.asarray(nll), np.asarray(tok)
