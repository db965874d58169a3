"""Interventions on a recorded run: does a dropped edge cost what the audit says, and what does
one group carry?

``restored_drops_table``: for the costliest queries of a run's ``costly_drops`` table, restore
the query's heaviest dropped edge alone (the pair added to that layer's mask through the
``kept`` hook point, ``hooks.Pairs``) and measure the query's next-token loss again. The share
of the query's loss delta (hard minus dense) that comes back says whether the edge the audit
blames is the cause of the loss or only beside it. Also restored: every dropped edge recorded
for the query at once, in every recorded layer.

``group_ablation_table``: cut one group of one layer (the distant pairs its keys give its
queries, through a ``kept`` patch) and measure every token's loss change, per part of speech
of the query token.

Both run hard-mode forwards of the model the run was recorded with (its routers loaded), on the
run's own windows (``tokens`` table). A restored edge changes only its query's own forward: the
keys and values of the tokens before it stay those of the plain hard forward. So each window
runs once through a KV cache (``FocusCache``), and each restore is one decode step of the query
token on that cache cut at the query, with the edge added to the step's mask: the loss is that of
a full forward with the edge restored, up to float rounding (tests/test_restore.py).
Source: docs/method.md §6 (the question the audit answers); docs/studies/restored-drops.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from focus_lab.hf.attach import forward_state
from focus_lab.hf.hooks import Pairs, hooks
from focus_lab.hf.state import FocusCache, FocusForward
from focus_lab.runs import SCHEMA, Run, write_table

#: columns of the ``restored_drops`` table (one row per restored edge)
RESTORED_DROPS = SCHEMA["restored_drops"]
#: columns of the ``group_ablation`` table (one row per layer, group and part of speech): ``runs.SCHEMA``
GROUP_ABLATION = SCHEMA["group_ablation"]


def _query_nll(model, ids: torch.Tensor, position: int, state, patch: dict | None = None) -> float:
    """-log p(ids[position + 1] | ids[:position + 1]) in nats, one forward of the prefix
    ``ids[:position + 1]`` with ``state`` and the hooks ``patch``."""
    prefix = ids[None, :position + 1].long()
    with torch.no_grad(), hooks(model, patch or {}):
        logits = model(input_ids=prefix, use_cache=False, focus=state).logits[0, -1].float()
    return float(torch.log_softmax(logits, -1)[int(ids[position + 1])].neg())


class _WindowCache:
    """One window's hard forward with its KV cache and key groups kept, so that the query at
    position i can run again alone (a decode step on the cache cut at i, ``step_nll``)."""

    @torch.no_grad()
    def __init__(self, model, ids: torch.Tensor):
        self.model, self.ids = model, ids.long()
        self.state = forward_state(model, mode="hard", cache=True)
        cfg = self.state.config
        if cfg.match_shifts:
            raise ValueError("restoring drops by decode steps needs a pattern without match (its state is not "
                             "cut at a position); record the run without it")
        from transformers import DynamicCache
        # a cache of every position in every layer: the model's own cache keeps only the last
        # window of a sliding layer (Gemma), and a decode step cuts the cache at any position
        # the body alone: its cache is what the steps need, not the (T, V) logits (32 GiB at 32K on Gemma)
        out = model.base_model(input_ids=self.ids[None], past_key_values=DynamicCache(), use_cache=True,
                               focus=self.state)
        self.kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        del out

    @torch.no_grad()
    def step_nll(self, position: int, patch: dict | None = None) -> float:
        """-log p(ids[position + 1] | ids[:position + 1]) in nats: the token at ``position`` as
        one decode step on the window's cache cut before it, with the hooks ``patch``."""
        from transformers import DynamicCache
        cache = DynamicCache(config=self.model.config)  # sliding layers keep their window, as the model's
        for layer, (k, v) in enumerate(self.kv):
            cache.update(k[:, :, :position].clone(), v[:, :, :position].clone(), layer)
        # the cut cache holds the earlier keys' groups as the forward routed them (under the key
        # shift, their predecessors'); the one rule state a step carries, the key shift's group for
        # the query's own key, cannot matter: that key is the query's own, inside its local window
        groups = {layer: g[:, :position].clone() for layer, g in self.state.cache.key_groups.items()}
        state = FocusForward(self.state.config, FocusCache(key_groups=groups))
        with hooks(self.model, patch or {}):
            logits = self.model(input_ids=self.ids[None, position:position + 1], past_key_values=cache,
                                use_cache=True, focus=state).logits[0, -1].float()
        return float(torch.log_softmax(logits, -1)[int(self.ids[position + 1])].neg())


def _add_pairs(pairs_by_layer: dict[int, list[tuple[int, int]]]) -> dict:
    """``kept`` hooks of a one-query decode step that add its (query, key) pairs per layer
    (``hooks.Pairs``, batch row 0, query row 0)."""
    out = {}
    for layer, pairs in pairs_by_layer.items():
        add = torch.tensor([[0, 0, j] for _, j in pairs], dtype=torch.long)  # the step's one query
        out[f"layers.{layer}.kept"] = lambda kept, hook, add=add: Pairs(add=add)
    return out


def restored_drops_table(model, run: Run, top_n: int = 50, progress: bool = True,
                         measure_base: bool = False) -> pd.DataFrame:
    """The ``restored_drops`` table: the ``top_n`` costliest queries of ``run.costly_drops``,
    each with its heaviest recorded dropped edge restored alone, and all its recorded dropped
    edges restored together.

    Args:
        model: the run's model with its routers attached (the hard mode of its default config
            is the mask the run's ``loss_delta`` measured).
        run: a recorded run with ``tokens`` and ``costly_drops`` (``record_run`` with the
            metrics ``dropped_edges`` and ``loss_delta``).
        top_n: queries, by ``query_rank`` (1 = the largest loss delta).
        measure_base: also measure the query's dense loss again (a forward of the prefix up to
            it; False: the run's own, ``costly_drops``). The hard loss is always the decode
            step's without the edge, the step the restored losses are measured by.
    Returns:
        DataFrame with columns ``RESTORED_DROPS``, one row per query (rank order): the edge
        (layer_idx, head, key_position, distance, dense weight, tokens, relation) is the
        query's heaviest recorded dropped edge; restoring it adds the pair (query, key) to the
        layer's mask for every head (the mask is shared by heads). ``nll_dense`` / ``nll_hard``
        / ``nll_restored``: the query's next-token loss (nats) dense, under the mask, and with
        the edge restored; ``recovered = (nll_hard - nll_restored) / (nll_hard - nll_dense)``
        (1: the whole delta comes back; < 0: restoring it costs more); ``edges_of_query``,
        ``nll_all_restored``, ``recovered_all``: the same with every dropped edge recorded for
        the query restored at once.
    Raises:
        RunError: the run lacks ``tokens`` or ``costly_drops``. ValueError: top_n < 1.
    """
    if top_n < 1:
        raise ValueError(f"top_n must be >= 1, got {top_n}")
    costly = run.table("costly_drops")
    costly = costly[costly["query_rank"] <= top_n]
    ids_of = run.window_token_ids()
    dense = forward_state(model, mode="dense")
    rows = []
    groups = sorted(costly.groupby("query_rank", sort=True), key=lambda g: (int(g[1]["window"].iloc[0]), g[0]))
    windows: dict[int, _WindowCache] = {}  # one window's cache at a time: the queries go window by window
    for rank, q in tqdm(groups, desc="restored drops", disable=not progress, dynamic_ncols=True):
        q = q.sort_values(["weight", "layer_idx", "head", "key_position"], ascending=[False, True, True, True],
                          kind="stable")
        top = q.iloc[0]
        w, i = int(top["window"]), int(top["query_position"])
        if w not in windows:
            windows.clear()
            windows[w] = _WindowCache(model, torch.from_numpy(np.array(ids_of[w])))
        win = windows[w]
        every: dict[int, list[tuple[int, int]]] = {}
        for layer, j in q[["layer_idx", "key_position"]].drop_duplicates().itertuples(index=False):
            every.setdefault(int(layer), []).append((i, int(j)))
        nll_d = _query_nll(model, win.ids, i, dense) if measure_base else float(top["nll_dense"])
        nll_h = win.step_nll(i)
        nll_r = win.step_nll(i, _add_pairs({int(top["layer_idx"]): [(i, int(top["key_position"]))]}))
        nll_a = win.step_nll(i, _add_pairs(every))
        delta = nll_h - nll_d
        rows.append({"window": w, "query_position": i, "query_rank": int(rank), "layer_idx": int(top["layer_idx"]),
                     "head": int(top["head"]), "key_position": int(top["key_position"]),
                     "distance": int(top["distance"]), "weight": float(top["weight"]),
                     "query_token": top["query_token"], "key_token": top["key_token"],
                     "next_token": top["next_token"], "relation": top["relation"],
                     "edges_of_query": int(sum(len(v) for v in every.values())),
                     "nll_dense": nll_d, "nll_hard": nll_h, "nll_restored": nll_r,
                     "recovered": (nll_h - nll_r) / delta if delta else np.nan,
                     "nll_all_restored": nll_a, "recovered_all": (nll_h - nll_a) / delta if delta else np.nan})
    out = pd.DataFrame(rows, columns=list(RESTORED_DROPS))
    return out.sort_values("query_rank", kind="stable").reset_index(drop=True)


def _cut_group(layer: int, group: int) -> dict:
    """The hook that cuts ``group`` out of layer ``layer``'s mask: a ``query_groups`` patch in
    which each query slot naming ``group`` joins no group (``core.NO_GROUP``), so the distant
    pairs (beyond the window, not a sink) whose key is in ``group`` leave the mask. Every query
    keeps its other groups, its window and its sinks, and the token-match pairs
    (``match_shifts``: they do not come through a group); the forward keeps its fast path, for
    any top_k. The same mask as editing ``kept`` (tests/test_restore.py)."""
    from focus_lab.method.core import NO_GROUP

    def cut(qg: torch.Tensor, hook) -> torch.Tensor:  # (B, T, k) long, each query's groups
        return qg.masked_fill(qg == group, NO_GROUP)
    return {f"layers.{layer}.query_groups": cut}


def group_ablation_table(model, run: Run, layers: Sequence[int], window_idx: int = 0,
                         groups: Sequence[int] | None = None, progress: bool = True) -> pd.DataFrame:
    """The ``group_ablation`` table: one group of one layer cut at a time (taken out of every
    query's groups, so the distant pairs it kept leave the hard mask), the loss change of every token of one recorded window, per
    part of speech of the query token.

    Args:
        model: the run's model with its routers attached (hard mode of its default config).
        run: a recorded run with ``tokens`` and ``pos`` (spaCy labels).
        layers: routed layers to ablate, one group at a time; groups: default every group.
        window_idx: the recorded window to run.
    Returns:
        DataFrame with columns ``GROUP_ABLATION``: per (layer_idx, group, pos), the tokens of
        that part of speech (``tokens``; ``tokens_in_group``: those whose query joins the
        group), their mean next-token loss under the mask (``nll_hard``) and with the group cut
        (``nll_ablated``), ``delta`` = their difference (nats, > 0: the group helped), and
        ``delta_in_group`` the mean over the tokens in the group (NaN when none).
    Raises:
        RunError: the run lacks ``tokens`` or ``pos``. ValueError: a layer without a router.
    """
    from focus_lab.hf.attach import routers
    from focus_lab.recording.recorder import next_token_nll
    rs = routers(model)
    bad = [layer for layer in layers if layer not in rs]
    if bad:
        raise ValueError(f"layers {bad} have no router (routed layers: {sorted(rs)})")
    ids = torch.from_numpy(np.array(run.window_token_ids()[window_idx]))
    pos = run.table("pos")
    pos = pos[pos["window"] == window_idx].set_index("position")["pos"]
    pos = pos.reindex(range(len(ids) - 1)).fillna("").to_numpy()  # the query token's part of speech
    state = forward_state(model, mode="hard")
    cfg = state.config
    groups_in: dict[int, torch.Tensor] = {}

    def keep_groups(qg, hook):  # (1, T, k): each query's groups
        groups_in[hook.layer_idx] = qg[0, :-1].cpu()
    with hooks(model, {f"layers.{layer}.query_groups": keep_groups for layer in layers}):
        base = next_token_nll(model, ids, focus=state).numpy()  # (T - 1,)
    frames = []
    todo = [(layer, g) for layer in layers for g in (range(cfg.num_groups) if groups is None else groups)]
    for layer, g in tqdm(todo, desc="group ablation", disable=not progress, dynamic_ncols=True):
        with hooks(model, _cut_group(layer, g)):
            cut = next_token_nll(model, ids, focus=state).numpy()
        in_group = (groups_in[layer] == g).any(-1).numpy()  # (T - 1,)
        df = pd.DataFrame({"pos": pos, "nll_hard": base, "nll_ablated": cut, "in": in_group})
        df["delta"] = df["nll_ablated"] - df["nll_hard"]
        df["delta_in"] = df["delta"].where(df["in"])
        agg = df.groupby("pos", sort=True).agg(tokens=("delta", "size"), tokens_in_group=("in", "sum"),
                                               nll_hard=("nll_hard", "mean"), nll_ablated=("nll_ablated", "mean"),
                                               delta=("delta", "mean"), delta_in_group=("delta_in", "mean"))
        agg = agg.reset_index()
        agg.insert(0, "group", g)
        agg.insert(0, "layer_idx", layer)
        agg.insert(0, "window", window_idx)
        frames.append(agg)
    out = pd.concat(frames, ignore_index=True)
    out["tokens"] = out["tokens"].astype(np.int64)
    out["tokens_in_group"] = out["tokens_in_group"].astype(np.int64)
    return out[list(GROUP_ABLATION)]


def write_intervention_table(run_dir: str | Path, name: str, df: pd.DataFrame, entry: dict) -> Path:
    """Add ``restored_drops`` or ``group_ablation`` to a run directory (``runs.write_table``:
    parquet, then the manifest's ``tables`` list and its entry ``name``, how the table was made,
    each written atomically)."""
    return write_table(run_dir, name, df, entry)
