"""Where a recorded run's long-range dropped attention goes, from its tables (docs/run_tables.md):
the heavy dropped edges beyond a distance and the share on one key token (``long_range_drops``),
how often later queries keep the group of those keys (``group_kept_by_later_queries``), whether a
query's loss delta follows the weight of its dropped edges to that token (``loss_vs_token_drops``),
and the dense mass a pattern keeps per distance bucket (``coverage_by_distance``) or per layer
beyond the window (``coverage_by_layer``). docs/studies/secondary-sinks.md reads them.

Pure pandas and numpy over the run's tables; no model, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: the key token the secondary-sink study follows (SmolLM2's tokenizer writes the leading space)
THE = " the"


@dataclass(frozen=True)
class LongRangeDrops:
    """``long_range_drops``'s summary of one run's ``dropped_edges``.

    Attributes:
        edges: rows of the table (the recorded dropped edges: dense weight above the recorder's
            ``edge_threshold``, plus each query's heaviest above ``edge_min_weight``).
        far_share: share of their dense weight on edges longer than ``min_distance``.
        token_share: share of that long-range weight on keys whose token is ``token``.
        token_keys: distinct (window, key position) pairs of ``token`` among those long-range edges.
        top_keys_share: share of the long-range weight on the ``top_keys`` (window, key position)
            pairs that carry most of it.
        token_weight_by_layer: long-range weight on ``token`` keys per layer (a Series indexed by
            ``layer_idx``, every layer of the table, 0 where none).
        keys: the ``token_keys`` pairs, a frame (window, key_position).
    """

    edges: int
    far_share: float
    token_share: float
    token_keys: int
    top_keys_share: float
    token_weight_by_layer: pd.Series
    keys: pd.DataFrame


def long_range_drops(edges: pd.DataFrame, min_distance: int = 512, token: str = THE,
                     top_keys: int = 10) -> LongRangeDrops:
    """Summarize a run's ``dropped_edges`` (columns window, layer_idx, key_position, distance,
    weight, key_token) beyond ``min_distance`` tokens (``distance > min_distance``).

    Raises:
        ValueError: no dropped edge, or none longer than ``min_distance``.
    """
    if edges.empty:
        raise ValueError("no dropped edges")
    far = edges[edges["distance"] > min_distance]
    if far.empty:
        raise ValueError(f"no dropped edge longer than {min_distance} tokens")
    total = float(edges["weight"].sum())
    far_w = float(far["weight"].sum())
    on = far[far["key_token"] == token]
    by_key = far.groupby(["window", "key_position"])["weight"].sum().sort_values(ascending=False, kind="stable")
    layers = np.sort(edges["layer_idx"].unique())
    by_layer = on.groupby("layer_idx")["weight"].sum().reindex(layers, fill_value=0.0).astype(float)
    keys = on[["window", "key_position"]].drop_duplicates().sort_values(["window", "key_position"])
    return LongRangeDrops(edges=int(len(edges)), far_share=far_w / total, token_share=float(on["weight"].sum()) / far_w,
                          token_keys=int(len(keys)), top_keys_share=float(by_key.head(top_keys).sum()) / far_w,
                          token_weight_by_layer=by_layer, keys=keys.reset_index(drop=True))


def group_kept_by_later_queries(assignments: pd.DataFrame, keys: pd.DataFrame) -> pd.Series:
    """Per layer, how often the group of the given keys is among a later query's top-k groups:
    for each key (window, key_position), the share of the queries after it in its window whose
    ``top_k_groups`` hold the key's ``group`` (the group its key belongs to in the mask), averaged
    over the keys. Under balanced random groups with k of K groups kept the expectation is k / K.

    Args:
        assignments: the run's ``assignments`` (window, position, layer_idx, group, top_k_groups).
        keys: frame (window, key_position), e.g. ``LongRangeDrops.keys``.
    Returns:
        Series indexed by ``layer_idx`` (nan for a layer where no key has a later query).
    """
    out = {}
    for layer, g in assignments.groupby("layer_idx", sort=True):
        shares = []
        for window, gw in g.groupby("window", sort=True):
            gw = gw.sort_values("position")
            pos = gw["position"].to_numpy()
            top = np.stack(gw["top_k_groups"].to_numpy()).astype(np.int64)  # (T, k)
            grp = gw["group"].to_numpy().astype(np.int64)
            K = int(max(grp.max(), top.max())) + 1
            member = np.zeros((len(pos), K), dtype=bool)
            for j in range(top.shape[1]):
                member[np.arange(len(pos)), top[:, j]] = True
            # later[i, g]: queries after row i whose top-k holds group g (suffix sums)
            later = np.cumsum(member[::-1], axis=0)[::-1] - member
            n_after = len(pos) - 1 - np.arange(len(pos))
            want = keys.loc[keys["window"] == window, "key_position"].to_numpy()
            rows = np.minimum(np.searchsorted(pos, want), len(pos) - 1)
            rows = rows[(pos[rows] == want) & (n_after[rows] > 0)]
            shares += list(later[rows, grp[rows]] / n_after[rows])
        out[layer] = float(np.mean(shares)) if shares else float("nan")
    return pd.Series(out, name="kept_share").rename_axis("layer_idx")


@dataclass(frozen=True)
class LossVsDrops:
    """``loss_vs_token_drops``'s result: ``spearman`` between each query's loss delta and the dense
    weight of its dropped edges to the token; the mean delta (nats) of the ``top_share`` of
    queries with most of that weight (``delta_top``) and of the others (``delta_rest``);
    ``queries`` counted, ``queries_with_drops`` of them with such an edge."""

    spearman: float
    delta_top: float
    delta_rest: float
    queries: int
    queries_with_drops: int


def loss_vs_token_drops(loss_delta: pd.DataFrame, edges: pd.DataFrame, token: str = THE,
                        top_share: float = 0.1) -> LossVsDrops:
    """Per query of ``loss_delta`` (window, position, delta): the summed dense weight of its dropped
    edges (``edges``: window, query_position, weight, key_token; every layer, head and distance)
    whose key is ``token``, 0 for a query with none; the Spearman rank correlation of that weight
    with the query's loss delta, and the mean delta of the ``round(top_share * queries)`` queries of
    largest weight (ties: lower window, then lower position first) against the rest."""
    w = (edges[edges["key_token"] == token].groupby(["window", "query_position"])["weight"].sum()
         .rename_axis(["window", "position"]).rename("token_weight"))
    q = loss_delta[["window", "position", "delta"]].merge(w.reset_index(), on=["window", "position"], how="left")
    q["token_weight"] = q["token_weight"].fillna(0.0)
    rho = float(q["delta"].rank().corr(q["token_weight"].rank()))
    n_top = int(round(top_share * len(q)))
    order = q.sort_values(["token_weight", "window", "position"], ascending=[False, True, True], kind="stable")
    top = order.index[:n_top]
    rest = q.index.difference(top)
    return LossVsDrops(spearman=rho, delta_top=float(q.loc[top, "delta"].mean()),
                       delta_rest=float(q.loc[rest, "delta"].mean()), queries=int(len(q)),
                       queries_with_drops=int((q["token_weight"] > 0).sum()))


def coverage_by_distance(coverage_distance: pd.DataFrame, patterns=("focus", "random")) -> pd.DataFrame:
    """Per pattern and distance bucket, the dense mass kept over the dense mass, pooled over the
    layers, heads, queries and windows of a run's ``coverage_distance`` (every (layer, head) has
    the same queries, so the per-query means add up); docs/method.md §6.

    Args:
        coverage_distance: the run's table (pattern, layer_idx, head, distance_lo, distance_hi,
            kept_mass, mass).
        patterns: the patterns kept (None: every pattern of the table).
    Returns:
        Columns pattern, distance_lo, distance_hi, coverage (NaN where the bucket holds no dense
        mass), mass_share (the bucket's share of the pattern's dense mass over every bucket).
    Raises:
        ValueError: a pattern asked for is not in the table.
    """
    d = coverage_distance if patterns is None else coverage_distance[coverage_distance["pattern"].isin(patterns)]
    missing = set(patterns or ()) - set(d["pattern"])
    if missing:
        raise ValueError(f"patterns {sorted(missing)} not in coverage_distance")
    g = d.groupby(["pattern", "distance_lo", "distance_hi"])[["kept_mass", "mass"]].sum().reset_index()
    mass = g["mass"].where(g["mass"] > 0)  # an empty bucket: NaN, not a division by zero
    g["coverage"] = g["kept_mass"] / mass
    g["mass_share"] = g["mass"] / g.groupby("pattern")["mass"].transform("sum").where(lambda t: t > 0)
    return g[["pattern", "distance_lo", "distance_hi", "coverage", "mass_share"]]


def coverage_by_layer(coverage_distance: pd.DataFrame, min_distance: int, patterns=("focus", "random")) -> pd.DataFrame:
    """Per pattern and layer, the dense mass kept over the dense mass in the buckets from
    ``min_distance`` on (``distance_lo >= min_distance``; the window, where every pattern keeps
    everything, is left out with ``min_distance`` = the window), pooled over heads and buckets.
    Columns pattern, layer_idx, coverage."""
    d = coverage_distance[coverage_distance["pattern"].isin(patterns) & (coverage_distance["distance_lo"] >= min_distance)]
    g = d.groupby(["pattern", "layer_idx"])[["kept_mass", "mass"]].sum().reset_index()
    g["coverage"] = g["kept_mass"] / g["mass"]
    return g[["pattern", "layer_idx", "coverage"]]
