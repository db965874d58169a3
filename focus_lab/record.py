"""The recorder: ``focus_lab.record(model, ...)`` and run directories (schema v1, docs/run_schema.md).

``record`` is a context manager in the style of TransformerLens hooks. Inside it every forward
of the model is observed layer by layer (``retrofit.add_observer`` plus a forward pre-hook on
each recorded attention module that captures the router input); the metrics of ``metrics.py``
are reduced per layer as the forward runs, so memory stays O(layers x heads x tokens); a full
T x T map is kept only for the (layer, head) pairs named in ``patterns``. Every hook is removed
on exit, also on an exception: outside the block the model is exactly the unrecorded one. The
observers never change a tensor, so outputs inside the block are identical too.

    with focus_lab.record(model, metrics=["coverage", "dropped_edges"], layers=[0, 5]) as rec:
        model(input_ids=ids, use_cache=False)
    tables = rec.tables()              # {name: DataFrame}, schema in docs/run_schema.md

``record_run`` runs held-out windows through it and writes a run directory: tokens, pos (spaCy),
assignments, balance, coverage, dropped edges, crossing mass and linguistics tables, and (metric
``loss_delta``, two extra forwards per window outside the recording) per-token loss deltas dense
vs hard joined to the dropped edges (``loss_delta``, ``costly_drops``; ``loss_delta_table``).
Sources: docs/method.md §1-§2 (the method), §6 (the reviewers' question the recorder answers).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import types
import hashlib
import importlib.metadata as md
import json
import platform
import sys
from dataclasses import dataclass, field, asdict
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import core, metrics as M, record_tables as T
from .io import atomic_path
from .decomposition import torch_threads
from .retrofit import (_keep_from_hf_mask, add_observer, attention_modules, focus_config, model_identity,
                       is_plain_causal, set_config)
from .runs import MANIFEST, SCHEMA, SCHEMA_VERSION

PACKAGES = ("torch", "transformers", "spacy", "pandas", "pyarrow", "scikit-learn", "streamlit", "focus-lab")

#: Metrics the recorder knows. ``coverage`` includes the distance buckets and the window /
#: matched-window / random baselines; ``linguistics`` needs spaCy labels (``record_run``) and
#: captures the router input for the k-means baseline; ``loss_delta`` (per-token NLL dense vs
#: hard, and with ``dropped_edges`` the ``costly_drops`` join) is computed by ``record_run`` with
#: two extra forwards per window: ``record`` alone accepts it and records nothing for it.
ALL_METRICS = ("assignments", "balance", "coverage", "crossing", "dropped_edges", "linguistics", "loss_delta")
_ATTENTION_METRICS = {"coverage", "crossing", "dropped_edges"}


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = "not installed"
    return out


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# options and the recording

@dataclass
class RecordOptions:
    """What ``record`` records (every field is written to the run manifest).

    Attributes:
        metrics: subset of ``ALL_METRICS``.
        layers: layer indices to record (default: every layer with a router).
        heads: query-head indices to record in the attention metrics (default: all).
        patterns: (layer, head) pairs whose full T x T dense / soft maps and hard mask are kept.
        edge_threshold: dropped-edge audit: keep dropped pairs with dense weight above this.
        edge_top_n: also keep each query's n heaviest dropped pairs ...
        edge_min_weight: ... when their weight exceeds this.
        sink_positions: the first key positions reported as attention sinks (sink metrics and
            ``key_is_sink``; docs/method.md §6). Independent of the mask's own rule
            ``FocusConfig.sink_tokens``, which every mask of the recorder follows.
        per_query: write the per-query tables (coverage_query, crossing_query).
        chunk_elements: bound on batch x heads x queries x keys per chunk of dense attention.
        costly_top_n: ``costly_drops`` keeps the dropped edges of the n queries (among those
            with a recorded dropped edge) whose loss delta is largest (``record_run`` only).
    """

    metrics: tuple[str, ...] = ALL_METRICS
    layers: list[int] | None = None
    heads: list[int] | None = None
    patterns: list[tuple[int, int]] = field(default_factory=list)
    edge_threshold: float = 0.05
    edge_top_n: int = 1
    edge_min_weight: float = 0.01
    sink_positions: int = 4
    per_query: bool = True
    chunk_elements: int = 1 << 23
    costly_top_n: int = 200

    def validate(self) -> "RecordOptions":
        self.metrics = tuple(dict.fromkeys(self.metrics))
        unknown = [m for m in self.metrics if m not in ALL_METRICS]
        if unknown:
            raise ValueError(f"unknown metrics {unknown}; choose from {', '.join(ALL_METRICS)}")
        if self.edge_threshold is not None and not self.edge_threshold >= 0:
            raise ValueError(f"edge_threshold must be >= 0, got {self.edge_threshold}")
        if self.edge_top_n < 0:
            raise ValueError(f"edge_top_n must be >= 0, got {self.edge_top_n}")
        if isinstance(self.costly_top_n, bool) or not isinstance(self.costly_top_n, (int, np.integer)) \
                or self.costly_top_n < 0:
            raise ValueError(f"costly_top_n must be an integer >= 0, got {self.costly_top_n!r}")
        self.patterns = [(int(a), int(b)) for a, b in self.patterns]
        return self


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
        self.config = focus_config(model)
        self.model_config = model.config
        self.layers, self.modules, self.num_heads, self.heads = _recorded_layers_heads(model, self.options)
        self.num_windows = 0
        self.seq_lens: dict[int, int] = {}
        self._seen: dict[int, int] = {}  # layer -> sequences observed so far
        self._h: dict[int, torch.Tensor] = {}
        self._routes: list[dict] = []
        self._random: dict[tuple, tuple] = {}
        self._layer_cache: dict[int, dict] = {}
        self._att: list[dict] = []
        self._edges: list[dict] = []
        self._patterns: list[dict] = []
        self.matched_windows: dict[tuple[int, int], int] = {}

    # ---------------------------------------------------------------- hooks
    def _capture(self, layer: int):
        def hook(module, args, kwargs):
            self._h[layer] = (kwargs.get("hidden_states", args[0] if args else None),
                              kwargs.get("attention_mask"))
        return hook

    @torch.no_grad()
    def _observe(self, module, query, key, value, routing, bias, out) -> None:
        router = getattr(module, "focus_router", None)
        if router is None or router.layer_idx not in self.modules:
            return
        layer = router.layer_idx
        h, hf_mask = self._h.pop(layer, (None, None))
        B, H, T, D = query.shape
        if key.shape[2] != T:  # a decode step: nothing to audit
            return
        cfg = router.config
        if routing is None:
            if h is None:
                raise RuntimeError(f"layer {layer}: the router input was not captured")
            routing = core.route(router, h)
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
            self._attention(module, layer, base, query, key, routing, cfg, qg, kg, hf_mask)

    def _random_groups(self, B, T, cfg, layer):
        key = (B, T, layer, cfg.seed, cfg.num_groups, cfg.top_k, cfg.tau)
        if key not in self._random:
            self._random[key] = M.random_groups(B, T, cfg, layer)
        return self._random[key]

    def _attention(self, module, layer, base, query, key, routing, cfg, qg, kg, hf_mask=None) -> None:
        opts = self.options
        want = set(opts.metrics)
        B, H, T, D = query.shape
        heads = self.heads
        q = query.detach() if len(heads) == H else query[:, heads].detach()
        k = M.expand_kv(key.detach(), H, None if len(heads) == H else heads)
        with torch_threads(1):
            rq, rk = self._random_groups(B, T, cfg, layer) if "coverage" in want else (None, None)
        log_p = None
        if "crossing" in want:
            if routing.log_p is not None:
                log_p = routing.log_p
            else:
                with torch_threads(1):
                    log_p = core.sinkhorn(routing.scores, cfg.tau, cfg.sinkhorn_iters)[0]
            log_p = log_p.detach().float()
        edges_on = "dropped_edges" in want
        ph = [heads.index(hh) for (l, hh) in opts.patterns if l == layer]
        model_mask = None
        if hf_mask is not None:  # the model's own mask (sliding window, padding), if it hides more
            keep = _keep_from_hf_mask(hf_mask, B, T, T, query.device)
            if not is_plain_causal(keep):
                model_mask = keep
        res = M.attention_metrics(
            q, k, M.attention_scale(module, D), routing.query_groups, routing.key_group, cfg.window,
            sinks=cfg.sink_tokens, random_query_groups=rq, random_key_group=rk, log_p=log_p,
            eps=cfg.eps, sink_positions=opts.sink_positions,
            edge_threshold=opts.edge_threshold if edges_on else None,
            edge_top_n=opts.edge_top_n if edges_on else 0, edge_min_weight=opts.edge_min_weight,
            pattern_heads=ph, chunk_elements=opts.chunk_elements, model_mask=model_mask,
            softcap=getattr(module, "attn_logit_softcapping", None),
            cache=self._layer_cache.setdefault(layer, {}))
        for b in range(B):
            self.matched_windows[(base + b, layer)] = int(res.matched_window[b])
        self._att.append({"base": base, "layer": layer, "T": T, "window": cfg.window,
                          "per_query": {n: t.numpy() for n, t in res.per_query.items()},
                          "edges_d": res.edges_distance, "bucket_mass": res.bucket_mass.numpy(),
                          "bucket_kept": {n: t.numpy() for n, t in res.bucket_kept.items()},
                          "pairs": {n: t.numpy() for n, t in res.pairs.items()},
                          "matched": res.matched_window.numpy()})
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
        if self._patterns:
            out["patterns"] = T.patterns_table(self)
        if "linguistics" in want and pos is not None and self._routes:
            out.update(T.linguistics_tables(self, tokens, pos))
        return out


@contextlib.contextmanager
def record(model, metrics: Sequence[str] = ALL_METRICS, layers: Sequence[int] | None = None,
           heads: Sequence[int] | None = None, patterns: Sequence[tuple[int, int]] = (),
           **options) -> Iterator[Recording]:
    """Record Focus metrics of every forward run inside the block.

    Args:
        model: a model with Focus attached (any mode: dense / window / soft / hard; in dense and
            window modes the routers are run by the recorder on the captured input).
        metrics: subset of ``ALL_METRICS`` (default all).
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

    Hooks are removed on exit, also when the block raises. Call the model with
    ``use_cache=False`` (decode steps are skipped). Padding is not supported: record
    unpadded sequences (a batch of equal-length windows is fine).
    """
    opts = RecordOptions(metrics=tuple(metrics), layers=list(layers) if layers is not None else None,
                         heads=list(heads) if heads is not None else None, patterns=list(patterns),
                         **options)
    rec = Recording(model, opts)
    removers = []
    try:
        for layer, module in rec.modules.items():
            removers.append(module.register_forward_pre_hook(rec._capture(layer), with_kwargs=True).remove)
        removers.append(add_observer(model, rec._observe, rec.layers))
        yield rec
    finally:
        for r in reversed(removers):
            r()
        rec._h.clear()


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
def next_token_nll(model, input_ids: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Next-token negative log-likelihood of one window, in nats, in the model's current mode.

    Args:
        input_ids: (T,) long, T >= 2, one unpadded window.
        chunk: positions per ``cross_entropy`` call (bounds the log-softmax copy of the
            (T, V) logits; the result does not depend on it).
    Returns:
        (T - 1,) float32: entry t is ``-log p(x_{t+1} | x_{<=t})`` from the logits at position t.
    Raises:
        ValueError: ``input_ids`` is not 1-D or has fewer than 2 tokens.
    """
    if input_ids.dim() != 1 or input_ids.shape[0] < 2:
        raise ValueError(f"need one window of at least 2 token ids, shape (T,); got {tuple(input_ids.shape)}")
    ids = input_ids.long()
    logits = model(input_ids=ids[None], use_cache=False).logits[0]  # (T, V)
    n = ids.shape[0] - 1
    nll = torch.empty(n, dtype=torch.float32)
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        nll[s:e] = torch.nn.functional.cross_entropy(logits[s:e].float(), ids[s + 1:e + 1].to(logits.device),
                                                     reduction="none").cpu()
    return nll


@torch.no_grad()
def loss_delta_table(model, windows: Sequence, tokens: pd.DataFrame | None = None, progress: bool = False,
                     chunk: int = 1024) -> pd.DataFrame:
    """The ``loss_delta`` table: per token, the next-token loss under dense and hard Focus attention.

    Two forwards per window, outside any recording: ``set_config(mode="dense")`` (full causal
    attention) and ``set_config(mode="hard")`` (the top-k mask of the attached FocusConfig: its
    top_k, window, sink_tokens, groups). The config in force before the call is restored in a
    finally block, also when a forward raises. Sources: docs/method.md §6 (which dropped
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
    original = focus_config(model)
    frames = []
    try:
        for w_idx, w in enumerate(tqdm(windows, desc="loss_delta", disable=not progress, dynamic_ncols=True)):
            ids = w.input_ids
            set_config(model, mode="dense")
            dense = next_token_nll(model, ids, chunk).numpy()
            set_config(model, mode="hard")
            hard = next_token_nll(model, ids, chunk).numpy()
            n = len(dense)
            frames.append(pd.DataFrame({
                "window": np.full(n, w_idx, np.int32), "position": np.arange(n, dtype=np.int32),
                "nll_dense": dense.astype(np.float32), "nll_hard": hard.astype(np.float32)}))
    finally:
        set_config(model, **original.to_dict())
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


def record_run(model, tokenizer, windows: list, texts: dict[str, str], out_dir: str | Path,
               meta: dict | None = None, with_pos: bool = True, extra_tables: dict | None = None,
               progress: bool = True, metrics: Sequence[str] = ALL_METRICS,
               layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
               patterns: Sequence[tuple[int, int]] = (), **options) -> Path:
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
            ``metrics``, two more forwards per window after the recording (dense, then hard:
            ``loss_delta_table``) write the ``loss_delta`` table, and with ``dropped_edges`` also
            ``costly_drops`` (``record_tables.costly_drops_table``, option ``costly_top_n``).
    Returns:
        the run directory path.
    """
    out_dir = Path(out_dir)
    cfg = focus_config(model)
    tok_frames, pos_frames = [], []
    pos_table = None
    if with_pos:
        from .linguistics import load_spacy, pos_table
        load_spacy()  # fail early with a clear message
    with record(model, metrics=metrics, layers=layers, heads=heads, patterns=patterns, **options) as rec:
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
            with torch.no_grad():
                model(input_ids=ids[None], use_cache=False)
            if pos_table is not None:
                p = pos_table(texts[w.doc], offs)
                p.insert(0, "window", np.int32(w_idx))
                pos_frames.append(p)
    tables = {"tokens": pd.concat(tok_frames, ignore_index=True)}
    if pos_frames:
        tables["pos"] = pd.concat(pos_frames, ignore_index=True)
    tables.update(rec.tables(tokens=tables["tokens"], pos=tables.get("pos")))
    if "loss_delta" in rec.options.metrics and windows:  # after the block: the recorder sees none of these
        tables["loss_delta"] = loss_delta_table(model, windows, tokens=tables["tokens"], progress=progress)
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


class _CallableModule(types.ModuleType):
    """``focus_lab.record(model, ...)`` calls ``record``, while ``focus_lab.record.record_run``
    and ``import focus_lab.record`` keep working (no function shadows the module)."""

    def __call__(self, *args, **kwargs):
        return record(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
