"""The recorder's tables, one metric family per function (docs/run_schema.md).

Each function reads what a ``record.Recording`` collected during the forwards (``rec._routes``:
per-layer routing; ``rec._att``: per-query attention metrics; ``rec._edges``,
``rec._patterns``) and returns tidy DataFrames. ``Recording.tables()`` calls them; nothing
here touches the model. Each table takes its columns, in order, from ``runs.SCHEMA`` (the one
column list; ``schema_frame`` / ``_rows_frame``). Sources: docs/method.md §1-§2, §6.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from focus_lab.method import core
from focus_lab.method import metrics as M
from focus_lab.runs import SCHEMA


def schema_frame(name: str, df: pd.DataFrame, optional: Sequence[str] = ()) -> pd.DataFrame:
    """``df`` with the columns of ``runs.SCHEMA[name]``, in that order. Columns named in
    ``optional`` may be absent (left out); a missing other column, or a column of ``df`` the
    schema does not list, is a recorder bug: KeyError naming them."""
    cols = list(SCHEMA[name])
    extra = [c for c in df.columns if c not in cols]
    missing = [c for c in cols if c not in df.columns and c not in optional]
    if extra or missing:
        raise KeyError(f"table {name}: columns {extra} not in runs.SCHEMA, {missing} missing")
    return df[[c for c in cols if c in df.columns]]


def _rows_frame(name: str, rows: list[dict]) -> pd.DataFrame:
    """A table of ``rows`` (dicts keyed by column) with the columns of ``runs.SCHEMA[name]``,
    in that order (also when there are no rows); KeyError as ``schema_frame``."""
    if not rows:
        return pd.DataFrame(columns=list(SCHEMA[name]))
    return schema_frame(name, pd.DataFrame(rows))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """Compact dtypes: layer/head/group int16, window/position int32, floats float32."""
    df = df.copy()
    for c in df.columns:
        if c in ("layer_idx", "head", "group"):
            df[c] = df[c].astype(np.int16)
        elif c in ("window", "position", "query_position", "key_position", "distance", "distance_lo",
                   "distance_hi"):
            df[c] = df[c].astype(np.int32)
        elif df[c].dtype == np.float64:
            df[c] = df[c].astype(np.float32)
    return df



def routes_sorted(rec) -> list[dict]:
    """The routing records in (window, layer) order."""
    return sorted(rec._routes, key=lambda r: (r["base"], r["layer"]))

def assignment_dists(r: dict) -> dict:
    """``metrics.assignment_distributions`` of one routing record, computed once."""
    if "dists" not in r:
        cfg = r["cfg"]
        r["dists"] = M.assignment_distributions(r["scores"], cfg.tau, cfg.sinkhorn_iters, r["group_bias"])
    return r["dists"]

def assignments_table(rec) -> pd.DataFrame:
    frames = []
    for r in routes_sorted(rec):
        cfg, scores, kg = r["cfg"], r["scores"], r["key_group"]
        prob = assignment_dists(r)["sinkhorn"][0]
        K = prob.shape[-1]  # key group K: evicted by the group capacity, in no group (prob NaN)
        prob = prob.gather(2, kg.clamp(max=K - 1)[..., None])[..., 0].masked_fill(kg == K, float("nan")).numpy()
        margin = M.top1_margin(scores, cfg.tau, r["group_bias"]).numpy()
        B, T, _ = scores.shape
        for b in range(B):
            frames.append(pd.DataFrame({
                "window": np.full(T, r["base"] + b, dtype=np.int32),
                "position": np.arange(T, dtype=np.int32),
                "layer_idx": np.full(T, r["layer"], dtype=np.int16),
                "group": kg[b].numpy().astype(np.int16),
                "top_k_groups": list(r["query_groups"][b].numpy().astype(np.int16)),
                "prob": prob[b].astype(np.float32),
                "margin": margin[b].astype(np.float32),
                "scores": list(scores[b].numpy().astype(np.float32)),
            }))
    if not frames:
        return _rows_frame("assignments", [])
    return schema_frame("assignments", pd.concat(frames, ignore_index=True).sort_values(
        ["window", "layer_idx", "position"], kind="stable").reset_index(drop=True))

def balance_tables(rec) -> dict[str, pd.DataFrame]:
    pools: dict[int, dict] = {}
    rows_layer = []
    for r in routes_sorted(rec):
        cfg, layer, qg = r["cfg"], r["layer"], r["query_groups"]
        K = cfg.num_groups
        dists = assignment_dists(r)
        pool = pools.setdefault(layer, {"tokens": 0, "query": np.zeros(K),
                                        **{f"soft_{k}": np.zeros(K) for k in M.ASSIGNMENT_KINDS},
                                        **{f"hard_{k}": np.zeros(K) for k in M.ASSIGNMENT_KINDS}})
        B, T = qg.shape[:2]
        pool["tokens"] += B * T
        pool["query"] += torch.bincount(qg[qg >= 0], minlength=K).numpy()  # a NO_GROUP slot joins none
        for kind, (q, g) in dists.items():
            pool[f"soft_{kind}"] += q.sum((0, 1)).double().numpy()
            pool[f"hard_{kind}"] += np.bincount(g.reshape(-1).numpy(), minlength=K)
            for b in range(B):
                rows_layer.append({"window": r["base"] + b, "layer_idx": layer, "assignment": kind,
                                   "tokens": T, **M.balance_stats(q[b], g[b], K)})
    rows = []
    for layer, p in sorted(pools.items()):
        n = max(p["tokens"], 1)
        for g in range(len(p["query"])):
            rows.append({"layer_idx": layer, "group": g,
                         "hard_share": p["hard_causal"][g] / n, "soft_share": p["soft_sinkhorn"][g] / n,
                         "softmax_share": p["soft_softmax"][g] / n,
                         "sinkhorn_hard_share": p["hard_sinkhorn"][g] / n,
                         "softmax_hard_share": p["hard_softmax"][g] / n,
                         "query_share": p["query"][g] / n, "tokens": int(p["hard_causal"][g])})
    bal = _rows_frame("balance", rows)
    layer = _rows_frame("balance_layer", rows_layer)
    layer = layer.sort_values(["window", "layer_idx", "assignment"], kind="stable").reset_index(drop=True)
    return {"balance": _typed(bal), "balance_layer": _typed(layer)}

def query_frame(rec, names: Sequence[str]) -> pd.DataFrame:
    """Per-query values of the attention metrics ``names``, wide, one row per
    (window, layer_idx, head, position)."""
    frames = []
    heads = np.asarray(rec.heads, dtype=np.int16)
    for r in rec._att:
        pq = r["per_query"]
        B, Hs, T = pq["dropped"].shape
        idx = np.indices((B, Hs, T)).reshape(3, -1)
        f = {"window": (r["base"] + idx[0]).astype(np.int32),
             "layer_idx": np.full(idx.shape[1], r["layer"], np.int16),
             "head": heads[idx[1]], "position": idx[2].astype(np.int32)}
        for n in names:
            if n in pq:
                f[n] = pq[n].reshape(-1).astype(np.float32)
        frames.append(pd.DataFrame(f))
    df = pd.concat(frames, ignore_index=True)
    df["_distant_query"] = df["position"].to_numpy() >= rec.config.window
    return df

def output_error_table(rec) -> pd.DataFrame:
    """``output_error``: per (layer_idx, head, pattern), ``sqrt(sum ||O - O^X||^2 / sum ||O||^2)``
    over every query of every window (``metrics.AttentionMetrics.output_error``): how far each
    mask's attention output is from the dense one, relative to its size (sparse-attention-hub)."""
    acc: dict[tuple, np.ndarray] = {}
    queries: dict[tuple, int] = {}
    for r in rec._att:
        for p, a in r.get("output_error", {}).items():  # a: (B, Hs, 2)
            for hi_, h in enumerate(rec.heads):
                key = (r["layer"], h, p)
                acc[key] = acc.get(key, 0) + a[:, hi_].sum(0)
                queries[key] = queries.get(key, 0) + a.shape[0] * r["T"]
    rows = [{"layer_idx": l, "head": h, "pattern": p,
             "output_error": float(np.sqrt(v[0] / v[1])) if v[1] > 0 else float("nan"), "queries": queries[(l, h, p)]}
            for (l, h, p), v in sorted(acc.items())]
    df = schema_frame("output_error", pd.DataFrame(rows, columns=list(SCHEMA["output_error"])))
    df["pattern"] = df["pattern"].astype(str)
    return _typed(df)


def coverage_tables(rec) -> dict[str, pd.DataFrame]:
    pats = [p for p in M.COVERAGE_PATTERNS if f"coverage_{p}" in rec._att[0]["per_query"]]
    q = query_frame(rec, [f"coverage_{p}" for p in pats])
    keys = ["layer_idx", "head"]
    rows = []
    # pair counts pooled over windows, per layer
    pairs: dict[int, dict[str, float]] = {}
    for r in rec._att:
        d = pairs.setdefault(r["layer"], {})
        for n, v in r["pairs"].items():
            d[n] = d.get(n, 0) + float(v.sum())
        d["_matched"] = d.get("_matched", []) + list(r["matched"])
    for p in pats:
        col = f"coverage_{p}"
        g = q.groupby(keys)[col]
        agg = g.agg(coverage="mean", min_coverage="min", queries="size").reset_index()
        agg["p10_coverage"] = g.quantile(0.1).to_numpy()
        dq = q[q["_distant_query"]].groupby(keys)[col].mean()
        agg["coverage_distant_queries"] = dq.reindex(pd.MultiIndex.from_frame(agg[keys])).to_numpy()
        agg.insert(2, "pattern", p)
        pc = {l: d for l, d in pairs.items()}
        agg["density"] = agg["layer_idx"].map(lambda l: pc[l][p] / pc[l]["causal"])
        agg["distant_density"] = agg["layer_idx"].map(
            lambda l: (pc[l][p] - pc[l]["window"]) / max(pc[l]["causal"] - pc[l]["window"], 1))
        agg["window_width"] = agg["layer_idx"].map(
            lambda l: float(np.mean(pc[l]["_matched"])) if p == "window_matched" else float(rec.config.window))
        rows.append(agg)
    cov = schema_frame("coverage", pd.concat(rows, ignore_index=True))
    cov["pattern"] = cov["pattern"].astype(str)
    out = {"coverage": _typed(cov.sort_values(["layer_idx", "head", "pattern"]).reset_index(drop=True))}
    if rec.options.per_query and pats:
        # long form, one block of q's rows per pattern (the largest table of a long recording: 4
        # rows per query), in query_frame's compact dtypes: no per-pattern copies, no _typed copy
        n, P = len(q), len(pats)
        out["coverage_query"] = schema_frame("coverage_query", pd.DataFrame({
            **{c: np.tile(q[c].to_numpy(), P) for c in ("window", "layer_idx", "head", "position")},
            "pattern": np.repeat(np.array(pats, dtype=object), n),
            "coverage": np.concatenate([q[f"coverage_{p}"].to_numpy() for p in pats])}))
    # distance buckets: sums over queries and windows
    drow = []
    heads = rec.heads
    acc: dict[tuple, list] = {}
    for r in rec._att:
        e = r["edges_d"]
        nq = r["bucket_mass"].shape[0] * r["T"]
        for hi_, h in enumerate(heads):
            for m in range(len(e) - 1):
                key = (r["layer"], h, e[m], e[m + 1])
                a = acc.setdefault(key, {"mass": 0.0, "queries": 0, **{p: 0.0 for p in pats}})
                a["mass"] += float(r["bucket_mass"][:, hi_, m].sum())
                a["queries"] += nq
                for p in pats:
                    a[p] += float(r["bucket_kept"][p][:, hi_, m].sum())
    for (layer, h, lo, hi), a in sorted(acc.items()):
        for p in pats:
            drow.append({"layer_idx": layer, "head": h, "pattern": p, "distance_lo": lo,
                         "distance_hi": hi,
                         "coverage": a[p] / a["mass"] if a["mass"] > 0 else float("nan"),
                         "mass": a["mass"] / a["queries"], "kept_mass": a[p] / a["queries"],
                         "queries": a["queries"]})
    out["coverage_distance"] = _typed(_rows_frame("coverage_distance", drow))
    return out

CROSS = ["dropped", "dense_distant", "sink_mass", "sink_dropped", "soft_distant", "soft_crossing",
          "soft_crossing_expected"]
CROSS_OUT = {"dropped": "dense_dropped", "dense_distant": "dense_distant", "sink_mass": "dense_sink_mass",
              "sink_dropped": "dense_sink_dropped", "soft_distant": "soft_distant",
              "soft_crossing": "soft_crossing", "soft_crossing_expected": "soft_crossing_expected"}

def crossing_tables(rec) -> dict[str, pd.DataFrame]:
    q = query_frame(rec, CROSS).rename(columns=CROSS_OUT)
    cols = [CROSS_OUT[c] for c in CROSS if CROSS_OUT[c] in q.columns]
    agg = q.groupby(["layer_idx", "head"])[cols].mean()
    agg["dense_dropped_distant_queries"] = q[q["_distant_query"]].groupby(["layer_idx", "head"])[
        "dense_dropped"].mean()
    if "soft_crossing" in q.columns:
        agg["soft_crossing_distant_queries"] = q[q["_distant_query"]].groupby(["layer_idx", "head"])[
            "soft_crossing"].mean()
    agg["queries"] = q.groupby(["layer_idx", "head"]).size()
    soft = ("soft_distant", "soft_crossing", "soft_crossing_expected", "soft_crossing_distant_queries")
    out = {"crossing": _typed(schema_frame("crossing", agg.reset_index(), optional=soft))}
    if rec.options.per_query:
        out["crossing_query"] = _typed(schema_frame("crossing_query", q.drop(columns=["_distant_query"]),
                                                     optional=soft))
    return out

def edges_table(rec, tokens, pos) -> pd.DataFrame:
    cols = list(SCHEMA["dropped_edges"])
    if not rec._edges:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("query_token", "key_token", "relation")
                                          else np.float32) for c in cols})
    df = pd.DataFrame({k: np.concatenate([e[k] for e in rec._edges]) for k in rec._edges[0]})
    df = df.sort_values(["window", "layer_idx", "head", "query_position", "key_position"],
                        kind="stable").reset_index(drop=True)
    if tokens is not None:
        t = tokens.set_index(["window", "position"])["token"]
        df["query_token"] = t.reindex(pd.MultiIndex.from_arrays([df["window"], df["query_position"]])).to_numpy()
        df["key_token"] = t.reindex(pd.MultiIndex.from_arrays([df["window"], df["key_position"]])).to_numpy()
    else:
        df["query_token"] = ""
        df["key_token"] = ""
    df["relation"] = ""
    if pos is not None:
        from focus_lab.recording.linguistics import relations_for_pairs
        rel = np.empty(len(df), dtype=object)
        for w, idx in df.groupby("window").indices.items():
            pw = pos[pos["window"] == w].sort_values("position").reset_index(drop=True)
            if len(pw) == 0:
                continue
            r = relations_for_pairs(pw, df["query_position"].to_numpy()[idx],
                                    df["key_position"].to_numpy()[idx])
            rel[idx] = [x or "" for x in r]
        df["relation"] = np.where(pd.isna(rel), "", rel).astype(object)
    return df[cols]

def patterns_table(rec) -> pd.DataFrame:
    frames = []
    for r in rec._patterns:
        B, T, _ = r["dense"].shape
        i, j = np.tril_indices(T)
        for b in range(B):
            frames.append(pd.DataFrame({
                "window": np.full(len(i), r["base"] + b, np.int32),
                "layer_idx": np.full(len(i), r["layer"], np.int16),
                "head": np.full(len(i), r["head"], np.int16),
                "query_position": i.astype(np.int32), "key_position": j.astype(np.int32),
                "dense_weight": r["dense"][b][i, j].astype(np.float32),
                "soft_weight": (r["soft"][b][i, j] if "soft" in r else np.full(len(i), np.nan)).astype(np.float32),
                "kept": r["kept"][b][i, j]}))
    return schema_frame("patterns", pd.concat(frames, ignore_index=True))

def linguistics_tables(rec, tokens, pos) -> dict[str, pd.DataFrame]:
    K = rec.config.num_groups
    p = pos.set_index(["window", "position"])
    cont, scores, labels = [], [], []
    tok = tokens.set_index(["window", "position"])["token"] if tokens is not None else None
    by_layer: dict[int, list] = {}
    for r in routes_sorted(rec):
        by_layer.setdefault(r["layer"], []).append(r)
    for layer, parts in sorted(by_layer.items()):
        win, position, focus, rand, hs = [], [], [], [], []
        for r in parts:
            B, T = r["key_group"].shape
            _, rk = rec._random_groups(B, T, r["cfg"], layer)
            for b in range(B):
                win.append(np.full(T, r["base"] + b))
                position.append(np.arange(T))
                focus.append(r["key_group"][b].numpy())
                rand.append(rk[b].numpy())
                if r["h"] is not None:
                    x = r["h"][b]  # the router's own input normalization (core.Router)
                    x = core.rms_normalize(x) if r["cfg"].normalize_input else x.float()
                    hs.append(x.numpy())
        idx = pd.MultiIndex.from_arrays([np.concatenate(win), np.concatenate(position)])
        assignments = {"focus": np.concatenate(focus), "random": np.concatenate(rand)}
        if hs and len(hs) == len(win):
            assignments["kmeans"] = M.kmeans_groups(np.concatenate(hs).astype(np.float32), K,
                                                    seed=rec.config.seed)
        upos = p["pos"].reindex(idx).fillna("").to_numpy()
        dep = p["dep"].reindex(idx).fillna("").to_numpy()
        aligned = upos != ""
        tk = tok.reindex(idx).fillna("").to_numpy() if tok is not None else None
        for name, groups in assignments.items():
            g = groups[aligned]
            ct = M.contingency(g, upos[aligned])
            ct.insert(0, "assignment", name)
            ct.insert(0, "layer_idx", layer)
            cont.append(ct)
            for kind, lab in (("pos", upos[aligned]), ("dep", dep[aligned])):
                scores.append({"layer_idx": layer, "assignment": name, "labels": kind,
                               **M.cluster_scores(g, lab), "tokens": int(aligned.sum()),
                               "groups_used": int(len(np.unique(g)))})
            dom_pos = M.dominant_labels(ct)
            dom_dep = M.dominant_labels(M.contingency(g, dep[aligned]))
            n = max(int(aligned.sum()), 1)
            for grp in range(K):
                sel = g == grp
                dp, dd = dom_pos.get(grp, []), dom_dep.get(grp, [])
                top_tok = []
                if tk is not None:
                    top_tok = pd.Series(tk[aligned][sel]).value_counts().head(5).index.tolist()
                labels.append({
                    "layer_idx": layer, "assignment": name, "group": grp, "tokens": int(sel.sum()),
                    "share": float(sel.sum() / n),
                    "label": " / ".join(f"{l} {s:.0%}" for l, s in dp) if dp else "(empty)",
                    "top_pos": dp[0][0] if dp else "", "top_pos_share": dp[0][1] if dp else float("nan"),
                    "top_dep": dd[0][0] if dd else "", "top_dep_share": dd[0][1] if dd else float("nan"),
                    "top_tokens": [str(x) for x in top_tok]})
    contab = pd.concat(cont, ignore_index=True).rename(columns={"label": "pos", "share_of_label": "share_of_pos"})
    return {"pos_contingency": _typed(schema_frame("pos_contingency", contab)),
            "linguistic_scores": _typed(_rows_frame("linguistic_scores", scores)),
            "group_labels": _typed(_rows_frame("group_labels", labels))}

def costly_drops_table(loss_delta: pd.DataFrame, dropped_edges: pd.DataFrame, top_n: int) -> pd.DataFrame:
    """The ``costly_drops`` table: the dropped edges of the queries whose loss delta is largest.

    ``loss_delta`` (window, position, next_token, nll_dense, nll_hard, delta; ``position`` t is
    the query that predicts token t + 1) is joined to ``dropped_edges`` on (window,
    ``query_position`` = position). Among the queries with at least one recorded dropped edge,
    the ``top_n`` of largest ``delta`` are kept (ties: lower window, then lower position first),
    with all their dropped edges. Sources: docs/method.md §6.

    Args:
        loss_delta: the loss_delta table (``record.loss_delta_frame``).
        dropped_edges: the dropped_edges table (``edges_table``).
        top_n: number of queries kept, >= 0.
    Returns:
        DataFrame with columns ``runs.SCHEMA["costly_drops"]``; ``query_rank`` 1 is the costliest
        query. Rows sorted by delta descending (ties by query_rank), then weight descending, then
        layer_idx, head, key_position. delta / nll in nats, distance in tokens.
    Raises:
        ValueError: ``top_n`` < 0.
    """
    cols = list(SCHEMA["costly_drops"])
    if top_n < 0:
        raise ValueError(f"top_n must be >= 0, got {top_n}")
    loss = loss_delta[["window", "position", "next_token", "nll_dense", "nll_hard", "delta"]].rename(
        columns={"position": "query_position"})
    joined = dropped_edges.merge(loss, on=["window", "query_position"], how="inner")
    if top_n == 0 or joined.empty:
        return _typed(pd.DataFrame({c: pd.Series(dtype=joined[c].dtype if c in joined.columns else np.int32)
                                    for c in cols}))
    queries = joined[["window", "query_position", "delta"]].drop_duplicates(["window", "query_position"])
    queries = queries.sort_values(["delta", "window", "query_position"], ascending=[False, True, True],
                                  kind="stable", na_position="last").head(top_n)
    queries = queries.assign(query_rank=np.arange(1, len(queries) + 1, dtype=np.int32))
    out = joined.merge(queries[["window", "query_position", "query_rank"]], on=["window", "query_position"])
    out = out.sort_values(["query_rank", "weight", "layer_idx", "head", "key_position"],
                          ascending=[True, False, True, True, True], kind="stable").reset_index(drop=True)
    return _typed(out[cols])
