"""The recorder: ``focus_lab.record(model, ...)`` and run directories (schema v1, docs/run_schema.md).

``record`` is a context manager in the style of TransformerLens hooks. Inside it every forward
of the model is observed layer by layer through the ``attn_out`` hook point of each recorded
layer (``focus_lab.hooks``: the router input, q, k, the routing and the model's mask of the
call); the metrics of ``method/metrics.py`` are reduced per layer as the forward runs, so memory stays O(layers x heads x tokens); a full
T x T map is kept only for the (layer, head) pairs named in ``patterns``. Every hook is removed
on exit, also on an exception: outside the block the model is exactly the unrecorded one. The
hook never changes a tensor, so outputs inside the block are identical too.

    with focus_lab.record(model, metrics=["coverage", "dropped_edges"], layers=[0, 5]) as rec:
        model(input_ids=ids, use_cache=False)
    tables = rec.tables()              # {name: DataFrame}, schema in docs/run_schema.md

``record_run`` runs held-out windows through it and writes a run directory: tokens, pos (spaCy),
assignments, balance, coverage, dropped edges, crossing mass and linguistics tables, and (metric
``loss_delta``: the recorded forward's own NLL plus one forward per window in the other mode,
outside the recording) per-token loss deltas dense vs hard joined to the dropped edges
(``loss_delta``, ``costly_drops``; ``loss_delta_frame``, ``loss_delta_table``).
Sources: docs/method.md §1-§2 (the method), §6 (the reviewers' question the recorder answers).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata as md
import json
import platform
import sys
from dataclasses import dataclass, asdict
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from focus_lab.method import core
from focus_lab.method import metrics as M
from focus_lab.recording import tables as T
from focus_lab.io import atomic_path
from focus_lab.method.cpu import release_freed_memory, torch_threads
from focus_lab.hf.hooks import hooks
from focus_lab.hf.retrofit import attention_modules, forward_state, model_identity
from focus_lab.runs import MANIFEST, SCHEMA, SCHEMA_VERSION
from focus_lab.eval.evaluate import NLL_CHUNK, next_token_nll as batch_next_token_nll
from focus_lab.recording.options import ALL_METRICS, DEFAULT_METRICS, RecordOptions  # noqa: F401  (re-exported)

PACKAGES = ("torch", "transformers", "spacy", "pandas", "pyarrow", "scikit-learn", "streamlit", "focus-lab")

_ATTENTION_METRICS = {"coverage", "crossing", "dropped_edges", "output_error"}


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = "not installed"
    return out


# --------------------------------------------------------------------------------------------
# options and the recording

def _log_p(log_p: torch.Tensor | None, scores: torch.Tensor, cfg) -> torch.Tensor:
    """(B, T, K) float log Sinkhorn probabilities of one role: the forward's, else from its scores."""
    return (log_p if log_p is not None else core.sinkhorn(scores, cfg.tau, cfg.sinkhorn_iters)[0]).detach().float()


def _recorded_layers_heads(model, options: "RecordOptions"):
    """(layers, {layer_idx: attention module}, num_heads, heads) the options select.
    Raises ValueError: no router attached, a layer without router, a head out of range, or a
    pattern (layer, head) that is not recorded."""
    mods = [(i, m) for i, m in attention_modules(model) if hasattr(m, "focus_router")]
    if not mods:
        raise ValueError("the model has no Focus router: attach() or load_routers() first")
    have = [i for i, _ in mods]
    if options.layers is not None:
        missing = sorted(set(options.layers) - set(have))
        if missing:
            raise ValueError(f"layers {missing} have no router; routed layers: {have}")
    layers = [i for i in have if options.layers is None or i in options.layers]
    modules = {i: m for i, m in mods if i in layers}
    H = int(model.config.num_attention_heads)
    heads = list(range(H)) if options.heads is None else sorted({int(h) for h in options.heads})
    if any(h < 0 or h >= H for h in heads):
        raise ValueError(f"heads {heads} outside 0..{H - 1}")
    for (l, h) in options.patterns:
        if l not in layers or h not in heads:
            raise ValueError(f"pattern ({l}, {h}) names a layer or head that is not recorded")
    return layers, modules, H, heads


def _edge_arrays(e: dict, base: int, layer: int, heads: list[int], qg: torch.Tensor, kg: torch.Tensor,
                 sink_positions: int) -> dict[str, np.ndarray]:
    """Columns of the dropped_edges table for one layer's edges (``metrics.attention_metrics``'s
    ``edges``: batch, head, query, key, weight, soft_weight), windows numbered from ``base``.
    qg: (B, T, k) query groups; kg: (B, T) key groups."""
    qi, kj = e["query"].numpy(), e["key"].numpy()
    bi = e["batch"].numpy()
    kgn, qgn = kg.numpy(), qg.numpy()
    return {
        "window": (base + bi).astype(np.int32), "layer_idx": np.full(len(qi), layer, np.int16),
        "head": np.asarray(heads, dtype=np.int16)[e["head"].numpy()],
        "query_position": qi.astype(np.int32), "key_position": kj.astype(np.int32),
        "distance": (qi - kj).astype(np.int32), "weight": e["weight"].numpy().astype(np.float32),
        "soft_weight": e["soft_weight"].numpy().astype(np.float32),
        "query_group": qgn[bi, qi, 0].astype(np.int16), "key_group": kgn[bi, kj].astype(np.int16),
        "key_is_sink": kj < sink_positions}


class Recording:
    """What one ``record`` block saw, reduced per layer. ``tables()`` turns it into DataFrames.

    Windows are numbered 0, 1, ... in the order the sequences reach the model (batch rows in
    order). Attributes: ``options``, ``config`` (the FocusConfig), ``layers``, ``heads``,
    ``num_windows``, ``seq_lens`` ({window: T}).
    """

    def __init__(self, model, options: RecordOptions):
        self.options = options.validate()
        self.config = forward_state(model).config  # then the config of the recorded forwards
        self.model_config = model.config
        self.layers, self.modules, self.num_heads, self.heads = _recorded_layers_heads(model, self.options)
        self.num_windows = 0
        self.seq_lens: dict[int, int] = {}
        self._seen: dict[int, int] = {}  # layer -> sequences observed so far
        self._routes: list[dict] = []
        self._random: dict[tuple, tuple] = {}
        self._layer_cache: dict[int, dict] = {}
        self._att: list[dict] = []
        self._edges: list[dict] = []
        self._patterns: list[dict] = []
        self.matched_windows: dict[tuple[int, int], int] = {}

    # ---------------------------------------------------------------- hooks
    @torch.no_grad()
    def _observe(self, out: torch.Tensor, hook) -> None:
        """The ``attn_out`` hook (``hooks``): reduce one recorded layer's call."""
        call = hook.call
        router = getattr(call.module, "focus_router", None)
        if router is None or router.layer_idx not in self.modules:
            return
        layer, module, query, key, routing, h = router.layer_idx, call.module, call.query, call.key, call.routing, call.router_in
        value = call.value
        B, H, T, D = query.shape
        if key.shape[2] != T:  # a decode step: nothing to audit
            return
        cfg = self.config = call.config
        if call.rule_pairs is not None:  # the rules in force keep pairs beyond the groups (FocusForward.layer_pairs)
            raise ValueError("recording measures the groups' mask and does not count the pairs a rule adds "
                             "(token-match pairs, FocusConfig.match_shifts, docs/method.md §2.8; the oracle) yet: "
                             "record with match_shifts=None (forward_state(model, match_shifts=None)) and no such rule")
        if routing is None:
            if h is None:
                raise RuntimeError(f"layer {layer}: the router input was not captured")
            routing = core.route(router, h, config=cfg)
        base = self._seen.get(layer, 0)
        self._seen[layer] = base + B
        self.num_windows = max(self.num_windows, base + B)
        for b in range(B):
            self.seq_lens[base + b] = T
        want = set(self.options.metrics)
        qg, kg = routing.query_groups.detach().cpu(), routing.key_group.detach().cpu()
        # O(T K) per layer: kept as is, reduced in tables() (assignments, balance, linguistics)
        self._routes.append({"base": base, "layer": layer, "scores": routing.scores.detach().float().cpu(),
                             "query_groups": qg, "key_group": kg,
                             "group_bias": router.group_bias.detach().float().cpu().clone(),
                             "h": h.detach().to(torch.float16).cpu() if "linguistics" in want and h is not None
                             else None, "cfg": cfg})
        if want & _ATTENTION_METRICS:
            self._attention(module, layer, base, query, key, routing, cfg, qg, kg,
                            None if call.plain_causal else call.model_mask, value)

    def _random_groups(self, B, T, cfg, layer):
        key = (B, T, layer, cfg.seed, cfg.num_groups, cfg.top_k_at(layer), cfg.tau)
        if key not in self._random:
            self._random[key] = M.random_groups(B, T, cfg, layer)
        return self._random[key]

    def _attention(self, module, layer, base, query, key, routing, cfg, qg, kg, model_mask=None,
                   value=None) -> None:
        """The attention metrics of one layer call; ``model_mask``: (B, T, T) bool, the model's own
        mask when it hides more than causality (sliding window, padding), else None; ``value``:
        (B, Hkv, T, D), for the output error (metric ``output_error``)."""
        opts = self.options
        want = set(opts.metrics)
        B, H, T, D = query.shape
        heads = self.heads
        q = query.detach() if len(heads) == H else query[:, heads].detach()
        k = M.expand_kv(key.detach(), H, None if len(heads) == H else heads)
        v = M.expand_kv(value.detach(), H, None if len(heads) == H else heads) \
            if "output_error" in want and value is not None else None
        with torch_threads(1):
            rq, rk = self._random_groups(B, T, cfg, layer) if "coverage" in want else (None, None)
        log_p = log_p_k = None
        if "crossing" in want:
            with torch_threads(1):
                log_p = _log_p(routing.log_p, routing.scores, cfg)
                if routing.key_scores is not None:  # a key router (docs/method.md §1.6)
                    log_p_k = _log_p(routing.key_log_p, routing.key_scores, cfg)
        edges_on = "dropped_edges" in want
        ph = [heads.index(hh) for (l, hh) in opts.patterns if l == layer]
        res = M.attention_metrics(
            q, k, M.attention_scale(module, D), routing.query_groups, routing.key_group, cfg.window,
            sinks=cfg.sink_tokens, random_query_groups=rq, random_key_group=rk, log_p=log_p, log_p_k=log_p_k,
            eps=cfg.eps, sink_positions=opts.sink_positions,
            edge_threshold=opts.edge_threshold if edges_on else None,
            edge_top_n=opts.edge_top_n if edges_on else 0, edge_min_weight=opts.edge_min_weight,
            pattern_heads=ph, chunk_elements=opts.chunk_elements, model_mask=model_mask,
            softcap=getattr(module, "attn_logit_softcapping", None),
            cache=self._layer_cache.setdefault(layer, {}), value=v)
        for b in range(B):
            self.matched_windows[(base + b, layer)] = int(res.matched_window[b])
        self._att.append({"base": base, "layer": layer, "T": T, "window": cfg.window,
                          "per_query": {n: t.numpy() for n, t in res.per_query.items()},
                          "edges_d": res.edges_distance, "bucket_mass": res.bucket_mass.numpy(),
                          "bucket_kept": {n: t.numpy() for n, t in res.bucket_kept.items()},
                          "pairs": {n: t.numpy() for n, t in res.pairs.items()},
                          "matched": res.matched_window.numpy(),
                          "output_error": {n: t.numpy() for n, t in res.output_error.items()}})
        if edges_on and len(res.edges["weight"]):
            self._edges.append(_edge_arrays(res.edges, base, layer, heads, qg, kg, opts.sink_positions))
        for hidx, maps in res.patterns.items():
            self._patterns.append({"base": base, "layer": layer, "head": heads[hidx],
                                   **{n: t.numpy() for n, t in maps.items()}})

    # ---------------------------------------------------------------- tables
    def tables(self, tokens: pd.DataFrame | None = None, pos: pd.DataFrame | None = None
               ) -> dict[str, pd.DataFrame]:
        """The recorded tables (docs/run_schema.md), as DataFrames.

        Args:
            tokens: optional tokens table (``window, position, token``): fills the token
                columns of dropped_edges and the top tokens of group_labels.
            pos: optional pos table (``window, position`` + ``linguistics.pos_table`` columns):
                needed for the linguistics tables and the relation of dropped edges.
        """
        with torch_threads(1):
            return self._tables(tokens, pos)

    def _tables(self, tokens, pos) -> dict[str, pd.DataFrame]:
        out: dict[str, pd.DataFrame] = {}
        want = set(self.options.metrics)
        if "assignments" in want:
            out["assignments"] = T.assignments_table(self)
        if "balance" in want:
            out.update(T.balance_tables(self))
        if "coverage" in want and self._att:
            out.update(T.coverage_tables(self))
        if "crossing" in want and self._att:
            out.update(T.crossing_tables(self))
        if "dropped_edges" in want:
            out["dropped_edges"] = T.edges_table(self, tokens, pos)
        if "output_error" in want and self._att:
            out["output_error"] = T.output_error_table(self)
        if self._patterns:
            out["patterns"] = T.patterns_table(self)
        if "linguistics" in want and pos is not None and self._routes:
            out.update(T.linguistics_tables(self, tokens, pos))
        return out


@contextlib.contextmanager
def record(model, metrics: Sequence[str] = DEFAULT_METRICS, layers: Sequence[int] | None = None,
           heads: Sequence[int] | None = None, patterns: Sequence[tuple[int, int]] = (),
           **options) -> Iterator[Recording]:
    """Record Focus metrics of every forward run inside the block.

    Args:
        model: a model with Focus attached (any mode: dense / window / soft / hard; in dense and
            window modes the routers are run by the recorder on the captured input).
        metrics: subset of ``ALL_METRICS`` (default ``DEFAULT_METRICS``: all but output_error).
        layers: layers to record (default every routed layer); heads: query heads (default all).
        patterns: (layer, head) pairs whose full T x T maps are kept (``patterns`` table).
        **options: further ``RecordOptions`` fields (edge_threshold, edge_top_n, edge_min_weight,
            sink_positions, per_query, chunk_elements, costly_top_n).
    Yields:
        a ``Recording``; call ``.tables()`` after the forwards.
    Raises:
        ValueError: an unknown metric, a negative edge option, no router attached, a layer
            without a router, a head out of range, or a pattern naming an unrecorded (layer, head).
        RuntimeError: (during a forward) a router input that was not captured.
        ValueError: (during a forward) a layer call that keeps token-match pairs (``match_shifts``
            in hard or soft mode), which the recorded metrics do not count yet.

    Hooks are removed on exit, also when the block raises. Call the model with
    ``use_cache=False`` (decode steps are skipped). Padding is not supported: record
    unpadded sequences (a batch of equal-length windows is fine).
    """
    opts = RecordOptions(metrics=tuple(metrics), layers=list(layers) if layers is not None else None,
                         heads=list(heads) if heads is not None else None, patterns=list(patterns),
                         **options)
    rec = Recording(model, opts)
    with hooks(model, {f"layers.{i}.attn_out": rec._observe for i in rec.layers}):
        yield rec


# --------------------------------------------------------------------------------------------
# compatibility helper and the run directory

@torch.no_grad()
def assignments_for_window(model, input_ids: torch.Tensor) -> pd.DataFrame:
    """One forward of ``input_ids: (T,)``; returns the assignments table of that window.

    Columns: position, layer_idx, group (hard top-1, the key's group), top_k_groups (list,
    best first), prob (Sinkhorn probability of ``group``), margin (top-1 minus top-2 score in
    logit units, group bias included), scores (list of K raw router scores).
    """
    with record(model, metrics=["assignments"]) as rec:
        model(input_ids=input_ids[None], use_cache=False)
    return rec.tables()["assignments"].drop(columns=["window"])


@torch.no_grad()
def next_token_nll(model, input_ids: torch.Tensor, chunk: int = NLL_CHUNK, focus=None) -> torch.Tensor:
    """Next-token negative log-likelihood of one window, in nats, without its (T, V) logits
    (``evaluate.next_token_nll``: the body's hidden states, then the output head ``chunk``
    positions at a time).

    Args:
        input_ids: (T,) long, T >= 2, one unpadded window.
        chunk: positions per slice of the output head (bounds its logits at (chunk, V); the
            result does not depend on it).
        focus: the forward's ``retrofit.FocusForward``; None: the model's
            default (and a model without Focus runs as it is).
    Returns:
        (T - 1,) float32: entry t is ``-log p(x_{t+1} | x_{<=t})`` from the logits at position t.
    Raises:
        ValueError: ``input_ids`` is not 1-D or has fewer than 2 tokens.
    """
    _check_window(input_ids)
    kw = {} if focus is None else {"focus": focus}
    return batch_next_token_nll(model, input_ids.long()[None], chunk, use_cache=False, release_after_body=True,
                                **kw)[0].cpu()  # (T - 1,)


def _check_window(input_ids: torch.Tensor) -> None:
    if input_ids.dim() != 1 or input_ids.shape[0] < 2:
        raise ValueError(f"need one window of at least 2 token ids, shape (T,); got {tuple(input_ids.shape)}")


@torch.no_grad()
def loss_delta_table(model, windows: Sequence, tokens: pd.DataFrame | None = None, progress: bool = False,
                     chunk: int = NLL_CHUNK) -> pd.DataFrame:
    """The ``loss_delta`` table: per token, the next-token loss under dense and hard Focus attention.

    Two forwards per window, outside any recording, each with its own ``FocusForward``:
    ``mode="dense"`` (full causal attention) and ``mode="hard"`` (the top-k mask of the model's
    FocusConfig: its top_k, window, sink_tokens, groups). The model's config is not changed. Sources: docs/method.md §6 (which dropped
    dependencies cost anything), §2.2 (the hard mask).

    Convention: the row at ``position`` t is the prediction made at query position t, of token
    t + 1 (``next_token``); it joins the dropped edges of query position t
    (``dropped_edges.query_position``). Its loss depends on the edges dropped at t in every layer
    and, through later layers, on edges dropped at earlier positions too.

    Args:
        model: a model with Focus attached (any current mode; routers loaded).
        windows: objects with ``input_ids`` (T,) long, T >= 2; numbered 0, 1, ... in order
            (the recorder's window index).
        tokens: optional tokens table (window, position, token): fills the token columns; else "".
        progress: show a progress bar.
        chunk: positions per cross-entropy call (``next_token_nll``).
    Returns:
        DataFrame with T - 1 rows per window, columns ``runs.SCHEMA["loss_delta"]``: window,
        position (t, 0..T-2), token (text at t), next_token (text at t + 1), nll_dense, nll_hard
        (nats, float32) and delta = nll_hard - nll_dense (nats, float32; > 0: the hard mask costs).
    Raises:
        ValueError: Focus is not attached, or a window has fewer than 2 tokens.
    """
    dense_state, hard_state = forward_state(model, mode="dense"), forward_state(model, mode="hard")
    dense, hard = [], []
    for w in tqdm(windows, desc="loss_delta", disable=not progress, dynamic_ncols=True):
        dense.append(next_token_nll(model, w.input_ids, chunk, dense_state).numpy())
        hard.append(next_token_nll(model, w.input_ids, chunk, hard_state).numpy())
    return loss_delta_frame(dense, hard, tokens)


def loss_delta_frame(nll_dense: Sequence[np.ndarray], nll_hard: Sequence[np.ndarray],
                     tokens: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ``loss_delta`` table from per-window NLLs (``loss_delta_table`` documents it).

    Args:
        nll_dense, nll_hard: one (T_w - 1,) array of nats per window (window w = index w), as
            ``next_token_nll`` returns them under dense and hard attention.
        tokens: optional tokens table (window, position, token) for the token columns.
    Returns:
        DataFrame with columns ``runs.SCHEMA["loss_delta"]``.
    Raises:
        ValueError: the two lists differ in length, or a window's arrays differ in shape.
    """
    if len(nll_dense) != len(nll_hard):
        raise ValueError(f"{len(nll_dense)} dense windows vs {len(nll_hard)} hard windows")
    frames = []
    for w_idx, (dense, hard) in enumerate(zip(nll_dense, nll_hard)):
        dense, hard = np.asarray(dense, np.float32), np.asarray(hard, np.float32)
        if dense.shape != hard.shape:
            raise ValueError(f"window {w_idx}: dense NLL shape {dense.shape} vs hard {hard.shape}")
        n = len(dense)
        frames.append(pd.DataFrame({
            "window": np.full(n, w_idx, np.int32), "position": np.arange(n, dtype=np.int32),
            "nll_dense": dense, "nll_hard": hard}))
    cols = list(SCHEMA["loss_delta"])
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("token", "next_token") else np.float32)
                             for c in cols})
    df = pd.concat(frames, ignore_index=True)
    df["delta"] = (df["nll_hard"].to_numpy() - df["nll_dense"].to_numpy()).astype(np.float32)
    if tokens is not None:
        t = tokens.set_index(["window", "position"])["token"]
        df["token"] = t.reindex(pd.MultiIndex.from_arrays([df["window"], df["position"]])).to_numpy()
        df["next_token"] = t.reindex(pd.MultiIndex.from_arrays([df["window"], df["position"] + 1])).to_numpy()
    else:
        df["token"] = ""
        df["next_token"] = ""
    return df[cols]


# --------------------------------------------------------------------------------------------
# memory: the peak a recording will need, estimated before anything is recorded

GiB = 1 << 30
#: Resident memory of ``focus-lab record`` before the model: Python, torch, transformers, pandas,
#: pyarrow, typer, the tokenizer, the corpus and its windows (measured: 0.60 GiB, Austen).
RUNTIME_BYTES = int(0.60 * GiB)
#: spaCy with its English pipeline (``with_pos``; measured 0.07 GiB).
SPACY_BYTES = int(0.07 * GiB)
#: spaCy's parse of one window's text, per token of the window (``with_pos``; measured: 0.07 GiB
#: for 4,096 tokens, 0.55 GiB for the 138K characters of 32,768 Gemma-3 tokens of Persuasion).
SPACY_PARSE_BYTES = 18_000
#: the phases whose transients are alternatives in the estimate (``memory_parts``): the largest counts
PHASES = ("record", "spacy", "tables", "loss_delta", "write")
#: Dropped edges the audit keeps per (query, head, layer) and per unit of ``edge_top_n``: the one
#: data-dependent term (measured 0.50 with the defaults on SmolLM2 / Persuasion at 4096 tokens, 0.37
#: at 1024).
EDGES_PER_QUERY = 0.5
#: Bytes per row of the recorder's pandas tables (measured with ``DataFrame.memory_usage(deep=True)``):
#: assignments (two list cells of numpy arrays a row), coverage_query (4 rows a query: str pattern),
#: crossing_query, dropped_edges (3 text columns), patterns.
ROW_BYTES = {"assignments": 260, "coverage_query": 32, "crossing_query": 40, "dropped_edges": 66, "patterns": 25}


class RecordMemoryError(MemoryError):
    """A recording whose estimated peak memory exceeds the limit (nothing was recorded or written).

    Attributes: ``estimate`` and ``limit`` in bytes; the message is one line naming both (GiB),
    the available memory and the options that lower the estimate."""

    def __init__(self, message: str, estimate: int, limit: int):
        super().__init__(message)
        self.estimate, self.limit = int(estimate), int(limit)


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs of a model: query heads H, head_dim D, hidden size d,
    MLP width f, vocabulary V (counts) and ``param_bytes`` (parameters and buffers as loaded,
    bytes: 4 per parameter in float32)."""

    num_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    param_bytes: int

    @classmethod
    def from_config(cls, config, param_bytes: int) -> "ModelShape":
        """From a transformers config (GPT-2's ``n_inner = None`` means 4 d)."""
        H = int(config.num_attention_heads)
        d = int(config.hidden_size)
        D = getattr(config, "head_dim", None) or d // H
        f = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d
        return cls(H, int(D), d, int(f), int(config.vocab_size), int(param_bytes))

    @classmethod
    def of(cls, model) -> "ModelShape":
        """From a loaded model: its config and the bytes of its (unique) parameters and buffers."""
        n = sum(p.numel() * p.element_size() for p in model.parameters())
        n += sum(b.numel() * b.element_size() for b in model.buffers())
        return cls.from_config(model.config, n)


def memory_parts(shape: ModelShape, seq_len: int, windows: int, layers: int, heads: int, *,
                 metrics: Sequence[str] = DEFAULT_METRICS, patterns: int = 0, per_query: bool = True,
                 with_pos: bool = True, mode: str = "dense", num_groups: int = 4, top_k: int = 2,
                 chunk_elements: int = 1 << 23, edge_top_n: int = 1) -> dict[str, int]:
    """The terms of ``estimate_memory``, in bytes (``"peak"``: the estimate itself).

    Args: as ``estimate_memory``. Returns {"runtime", "model", "recorded", "slack", "record",
    "spacy", "tables", "loss_delta", "write", "peak"}: ``peak = runtime + model + recorded + slack +
    max(record, spacy, tables, loss_delta, write)`` (the phases are alternatives, not a sum).
    """
    T, W, L, Hs = int(seq_len), int(windows), int(layers), int(heads)
    want = set(metrics)
    att = bool(want & _ATTENTION_METRICS)
    cross, cov, edges = "crossing" in want, "coverage" in want, "dropped_edges" in want
    d, f, V, D = shape.hidden_size, shape.intermediate_size, shape.vocab_size, shape.head_dim
    tok = W * T * L  # (window, position, layer) triples
    nq = tok * Hs if att else 0  # (window, position, layer, head): per-query rows
    n_edges = nq * EDGES_PER_QUERY * max(1, edge_top_n) if edges else 0
    whole = T <= M._WHOLE_MAX
    # kept by the Recording until the run is written (docs/run_schema.md, "Memory and cost of recording")
    recorded = tok * (16 * num_groups + 8 * top_k + 32 + (2 * d if "linguistics" in want else 0))
    recorded += nq * (36 + (12 if cross else 0)) + n_edges * 33
    recorded += patterns * W * T * T * (5 + (4 if cross else 0))
    recorded += (L * T * T if cov and T <= 1024 else 0) + (8 * T * T if att and whole else 0)
    # freed chunks of a recorded layer the allocator keeps: activations, per-chunk index tables
    elems = min(chunk_elements, Hs * T * T)  # dense-attention floats per chunk
    slack = 4 * T * (3 * f + 6 * d) + ((150 if not whole else 60) * elems // max(Hs, 1) if att else 0)
    # the largest transient of the recorded forwards: a layer's buffers or the output head's
    # (chunk, V) logits slice and its fp32 copy (next_token_nll), beside the (T, d) hidden states
    mask = {"dense": 1, "hard": 2, "soft": 13}.get(mode, 13) * T * T
    layer = mask + ((12 * elems + 16 * Hs * T * D + (2 * T * T if whole else 0)) if att else 0)
    ld = "loss_delta" in want
    head = 8 * min(T, NLL_CHUNK) * V + 4 * T * d  # a (chunk, V) logits slice, its logsumexp copy, the hidden states
    record = max(head if ld and mode in ("dense", "hard") else 0, layer)
    # tables(): what it keeps, and the largest build of one table family
    tabs = {"assignments": ROW_BYTES["assignments"] * tok if "assignments" in want else 0,
            "coverage_query": 4 * ROW_BYTES["coverage_query"] * nq if cov and per_query else 0,
            "crossing_query": ROW_BYTES["crossing_query"] * nq if cross and per_query else 0,
            "dropped_edges": int(ROW_BYTES["dropped_edges"] * n_edges),
            "patterns": ROW_BYTES["patterns"] * patterns * W * T * (T + 1) // 2}
    kept = sum(tabs.values())
    build = max(nq * (58 + (2 * 128 if per_query else 0)) if cov else 0,
                nq * (82 + (40 if per_query else 0)) if cross else 0,
                41 * patterns * W * T * (T + 1) // 2,
                8 * W * T * d if "linguistics" in want else 0, tabs["assignments"])
    held = 2 * kept  # after tables(): the tables, and about as much freed heap their build left
    parts = {"runtime": RUNTIME_BYTES + (SPACY_BYTES if with_pos else 0), "model": int(shape.param_bytes),
             "recorded": int(recorded), "slack": int(slack), "record": int(record),
             "spacy": SPACY_PARSE_BYTES * T if with_pos else 0,  # one window's parse, after its forward
             "tables": int(kept + build),
             # the other mode's forwards after the recording, before tables(): logits + a chunk
             "loss_delta": int(head) if ld else 0,
             "write": int(held + max(tabs.values()))}
    parts["peak"] = (parts["runtime"] + parts["model"] + parts["recorded"] + parts["slack"]
                     + max(parts[k] for k in PHASES))
    return parts


def estimate_memory(shape: ModelShape, seq_len: int, windows: int, layers: int, heads: int, *,
                    metrics: Sequence[str] = DEFAULT_METRICS, patterns: int = 0, per_query: bool = True,
                    with_pos: bool = True, mode: str = "dense", num_groups: int = 4, top_k: int = 2,
                    chunk_elements: int = 1 << 23, edge_top_n: int = 1) -> int:
    """Estimated peak resident memory (bytes) of ``record_run`` / ``focus-lab record``.

    Notation: T = ``seq_len`` tokens per window, W = ``windows`` (one forward each), L =
    recorded ``layers``, Hs = recorded ``heads``, P = ``patterns`` (layer, head) pairs, K =
    ``num_groups``, k = ``top_k``, E = min(``chunk_elements``, Hs T^2) dense-attention floats per
    chunk, e = ``EDGES_PER_QUERY`` x max(1, ``edge_top_n``); from ``shape``: d hidden, f MLP
    width, V vocabulary, D head_dim, the model's bytes; N = W T L and Nq = N Hs (0 without an
    attention metric: coverage, crossing, dropped_edges; [att]: one of them is recorded). [x] is
    1 when x holds, else 0.
    Every term in bytes::

        peak     = runtime + model + recorded + slack + max(record, spacy, tables, loss_delta, write)
        runtime  = 0.60 GiB + 0.07 GiB [with_pos]                       (RUNTIME_BYTES, SPACY_BYTES)
        model    = shape.param_bytes
        recorded = N (16K + 8k + 32 + 2d [linguistics])       routing: scores, groups, router input
                 + Nq (36 + 12 [crossing]) + 33 e Nq            per-query sums, dropped edges
                 + 9 P W T^2 (5 without crossing)               full maps of --pattern
                 + L T^2 [coverage, T <= 1024] + 8 T^2 [att, T <= 2048]   cached masks, pair tables
        slack    = 4 T (3f + 6d) + (60 if T <= 2048 else 150) E / Hs [att]   freed heap the allocator keeps
        record   = max(4 T V + 4 min(T, 1024) V [loss_delta, mode dense or hard],
                       m T^2 + (12 E + 16 Hs T D + 2 T^2 [T <= 2048]) [att])   logits | a layer;
                   m = 1 dense, 2 hard, 13 soft (soft: from the code, not measured)
        spacy    = 18,000 T [with_pos]                  spaCy's parse of one window (SPACY_PARSE_BYTES)
        tables   = kept + max(Nq (58 + 256 [per_query]) [coverage], Nq (82 + 40 [per_query]) [crossing],
                              41 P W T(T+1)/2, 8 W T d [linguistics], 260 N)
        kept     = 260 N + 128 Nq [coverage, per_query] + 40 Nq [crossing, per_query] + 66 e Nq
                   + 25 P W T(T+1)/2                             the tables (ROW_BYTES)
        loss_delta = 4 T V + 4 min(T, 1024) V  [loss_delta]   the other mode's forwards, after the
                                                    recording and before tables(): logits + a chunk
        write    = 2 kept + the largest table (its Arrow copy while parquet writes it)

    (2 kept: after ``tables()`` the heap holds the tables and about as much again that their
    build freed; measured 1.7-2.3 x kept when loss_delta's forwards still ran after it.)

    The attention metrics are the dense map of docs/method.md §2 reduced per chunk of queries
    (``metrics.attention_metrics``); only ``patterns`` keeps T x T maps, the rest grows with T
    (per layer and head), the logits with T V. ``per_query=False`` drops the largest tables.

    Calibration: ``figures/results/record_memory.parquet`` holds estimate and measured peak of
    each recording ``analyses/studies/record_memory.py --label`` ran (SmolLM2-135M and
    Gemma-3-270M, the shipped routers, Persuasion, one torch thread), shown as a table in
    docs/reliability.md. The same command's peak varies from run to run (the allocator's reuse of
    freed memory), and the dropped-edge count depends on the data.

    Args:
        shape: the model (``ModelShape.of(model)`` or ``ModelShape.from_config``).
        seq_len: tokens per window; windows: windows recorded; layers, heads: how many are recorded.
        metrics, per_query, chunk_elements, edge_top_n: as ``record`` (``RecordOptions``).
        patterns: number of (layer, head) pairs whose T x T maps are kept.
        with_pos: spaCy labels joined (``record_run``'s ``with_pos``).
        mode: the attention mode of the recorded forwards (dense, hard, soft).
        num_groups, top_k: the Focus config's K and k.
    Returns:
        bytes (int).
    """
    return memory_parts(shape, seq_len, windows, layers, heads, metrics=metrics, patterns=patterns,
                        per_query=per_query, with_pos=with_pos, mode=mode, num_groups=num_groups, top_k=top_k,
                        chunk_elements=chunk_elements, edge_top_n=edge_top_n)["peak"]


def memory_budget() -> tuple[int, int, int]:
    """(budget, available, held) in bytes: ``psutil.virtual_memory().available`` plus the resident
    memory this process already holds (the estimate is of the whole process's peak, which
    includes what it holds now)."""
    import psutil
    available = int(psutil.virtual_memory().available)
    held = int(psutil.Process().memory_info().rss)
    return available + held, available, held


#: The options that lower the estimate, named in the refusal.
LOWER_FLAGS = "--layers, --heads, --seq-len, --max-windows, --no-per-query, or fewer --pattern"


def check_memory(estimate: int, limit: float | None = None, what: str = "") -> None:
    """Raise ``RecordMemoryError`` when ``estimate`` (bytes) exceeds ``limit`` (bytes; None: the
    available memory plus what this process holds, ``memory_budget``); ``what`` describes the
    recording in the message."""
    budget, available, held = memory_budget()
    if limit is None:
        limit, source = budget, (f"the {available / GiB:.2f} GiB available (psutil) + {held / GiB:.2f} GiB "
                                 "this process holds")
    else:
        source = f"--memory-limit {limit / GiB:g} GiB; {available / GiB:.2f} GiB available (psutil)"
    if estimate > limit:
        raise RecordMemoryError(
            f"recording {what + ' ' if what else ''}needs an estimated {estimate / GiB:.2f} GiB at its peak, "
            f"more than {limit / GiB:.2f} GiB ({source}); lower it with {LOWER_FLAGS}",
            estimate, int(limit))


def memory_inputs(model, windows: Sequence, metrics: Sequence[str] = DEFAULT_METRICS,
                  layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                  patterns: Sequence = (), with_pos: bool = True, **options) -> dict:
    """The arguments of ``estimate_memory`` for ``record_run(model, ..., windows, ...)``:
    T = the longest window, the recorded layers (the routed ones, or ``layers``) and heads."""
    from focus_lab.hf.retrofit import routers as _routers
    cfg = forward_state(model).config
    routed = sorted(_routers(model))
    n_layers = len(routed) if layers is None else len(set(layers))
    n_heads = int(model.config.num_attention_heads) if heads is None else len(set(heads))
    T = max((int(w.input_ids.shape[-1]) for w in windows), default=0)
    known = {k: options[k] for k in ("per_query", "chunk_elements", "edge_top_n") if k in options}
    return {"shape": ModelShape.of(model), "seq_len": T, "windows": len(windows), "layers": n_layers,
            "heads": n_heads, "metrics": tuple(metrics), "patterns": len(list(patterns)), "with_pos": with_pos,
            "mode": cfg.mode, "num_groups": cfg.num_groups, "top_k": cfg.top_k, **known}


def record_run(model, tokenizer, windows: list, texts: dict[str, str], out_dir: str | Path,
               meta: dict | None = None, with_pos: bool = True, extra_tables: dict | None = None,
               progress: bool = True, metrics: Sequence[str] = DEFAULT_METRICS,
               layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
               patterns: Sequence[tuple[int, int]] = (), memory_limit: float | None = None,
               **options) -> Path:
    """Record ``windows`` (Focus attached, in the mode of its config) into a run directory.

    Args:
        windows: held-out windows (``doc``, ``input_ids (T,)``, ``offsets (T, 2)`` chars).
        texts: {document name: full text}, to resolve offsets.
        out_dir: the run directory to create (replaced if it exists, atomically).
        meta: provenance merged into the manifest (corpus, router file, command, ...).
        with_pos: join spaCy POS / dependency labels (needs the spaCy pipeline); the
            linguistics tables and the relations of dropped edges need it.
        extra_tables: {name: DataFrame} written as additional tables (eval, train_log).
        metrics, layers, heads, patterns, **options: as for ``record``. With ``loss_delta`` in
            ``metrics``, the NLL of the recorded forward's mode (dense or hard) is read off its
            own logits and the other mode (both, in soft or window mode) runs one forward per
            window after the recording, before the tables are built (``next_token_nll``); they
            give the ``loss_delta`` table (``loss_delta_frame``), and with ``dropped_edges`` also
            ``costly_drops`` (``record_tables.costly_drops_table``, option ``costly_top_n``).
        memory_limit: bytes the process may reach; before anything is recorded, the peak is
            estimated (``estimate_memory``) and compared with it. None: the available memory
            plus what this process holds (``memory_budget``); ``math.inf``: no check.
    Returns:
        the run directory path.
    Raises:
        RecordMemoryError (a MemoryError): the estimated peak exceeds ``memory_limit``; nothing
            was recorded and nothing written (the message names the estimate, the available
            memory and the options that lower it).
        ValueError: as ``record`` (metrics, layers, heads, patterns).
    """
    out_dir = Path(out_dir)
    cfg = forward_state(model).config
    if windows:
        inputs = memory_inputs(model, windows, metrics, layers, heads, patterns, with_pos, **options)
        check_memory(estimate_memory(**inputs), memory_limit,
                     what=f"{inputs['windows']} windows x {inputs['seq_len']} tokens, {inputs['layers']} layers x "
                          f"{inputs['heads']} heads")
    tok_frames, pos_frames = [], []
    pos_table = None
    if with_pos:
        from focus_lab.recording.linguistics import load_spacy, pos_table
        load_spacy()  # fail early with a clear message
    with record(model, metrics=metrics, layers=layers, heads=heads, patterns=patterns, **options) as rec:
        # loss_delta: the recorded forward's own logits give the NLL of its mode (dense or hard);
        # the other mode runs after the block (hooks removed), before the tables are built
        want_nll = bool(windows) and "loss_delta" in rec.options.metrics
        own = cfg.mode if want_nll and cfg.mode in ("dense", "hard") else None
        nll: dict[str, list[np.ndarray]] = {"dense": [], "hard": []}
        for w_idx, w in enumerate(tqdm(windows, desc="record", disable=not progress, dynamic_ncols=True)):
            ids = w.input_ids
            offs = np.asarray(w.offsets, dtype=np.int64)
            tok_frames.append(pd.DataFrame({
                "window": np.full(len(ids), w_idx, dtype=np.int32),
                "position": np.arange(len(ids), dtype=np.int32),
                "doc": w.doc,
                "token_id": ids.numpy().astype(np.int64),
                "token": [tokenizer.decode([int(i)]) for i in ids],
                "char_start": offs[:, 0], "char_end": offs[:, 1],
            }))
            with torch.no_grad():  # the body alone: no (T, V) logits (at Gemma-3's vocabulary 34 GB at 32K)
                if own is not None:
                    nll[own].append(next_token_nll(model, ids).numpy())
                else:
                    model.base_model(input_ids=ids[None], use_cache=False)
            if pos_table is not None:
                p = pos_table(texts[w.doc], offs)
                p.insert(0, "window", np.int32(w_idx))
                pos_frames.append(p)
            release_freed_memory()  # what the window freed goes back: windows do not pile up in the heap
    for mode in ("dense", "hard") if want_nll else ():
        if mode != own:
            state = forward_state(model, mode=mode)
            nll[mode] = [next_token_nll(model, w.input_ids, focus=state).numpy() for w in
                         tqdm(windows, desc=f"loss_delta ({mode})", disable=not progress, dynamic_ncols=True)]
    tables = {"tokens": T.schema_frame("tokens", pd.concat(tok_frames, ignore_index=True))}
    if pos_frames:
        tables["pos"] = T.schema_frame("pos", pd.concat(pos_frames, ignore_index=True))
    tables.update(rec.tables(tokens=tables["tokens"], pos=tables.get("pos")))
    if want_nll:
        tables["loss_delta"] = loss_delta_frame(nll["dense"], nll["hard"], tokens=tables["tokens"])
        if "dropped_edges" in tables:
            tables["costly_drops"] = T.costly_drops_table(tables["loss_delta"], tables["dropped_edges"],
                                                          rec.options.costly_top_n)
    tables.update(extra_tables or {})
    opts = asdict(rec.options)
    opts.update(layers=rec.layers, heads=rec.heads, mode=cfg.mode,
                distance_edges=M.distance_edges(int(windows[0].input_ids.shape[0]), cfg.window) if windows else [],
                matched_window={str(l): float(np.mean([v for (w, ll), v in rec.matched_windows.items() if ll == l]))
                                for l in rec.layers if any(ll == l for (_, ll) in rec.matched_windows)})
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "focus_config": cfg.to_dict(),
        "model": {**model_identity(model), "num_layers": int(model.config.num_hidden_layers),
                  "num_heads": int(model.config.num_attention_heads),
                  "num_kv_heads": int(getattr(model.config, "num_key_value_heads", None)
                                      or model.config.num_attention_heads)},
        "windows": len(windows), "seq_len": int(windows[0].input_ids.shape[0]) if windows else 0,
        "documents": sorted({w.doc for w in windows}),
        "packages": package_versions(),
        "command": " ".join(sys.argv),
        "recorder": opts,
        "tables": sorted(tables),
        **(meta or {}),
    }
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for name, df in tables.items():
            df.to_parquet(tmp / f"{name}.parquet", index=False)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    return out_dir
