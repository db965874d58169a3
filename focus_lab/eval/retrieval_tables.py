"""The retrieval suite's tables read back (``focus_lab.eval.retrieval``): scores relative to
dense with paired intervals, the router against random groups, retrieval heads, failures traced
to layers and heads. pandas and numpy only, so the dashboard reads them without torch.

Source: docs/retrieval.md; RULER (arXiv 2404.06654) for the score; Wu et al. (arXiv 2404.15574)
for retrieval heads.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

RETRIEVAL_HEAD_THRESHOLD = 0.1  # Wu et al.: heads whose retrieval score is >= 0.1


def _bootstrap(x: np.ndarray, y: np.ndarray, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean(x) / mean(y), 2.5%, 97.5%) over a paired bootstrap of the cases (nan where the
    dense mean is 0)."""
    if len(x) == 0 or y.mean() == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(reps, len(x)))
    den = y[idx].mean(1)
    ratio = np.where(den > 0, x[idx].mean(1) / np.where(den > 0, den, 1), np.nan)
    return float(x.mean() / y.mean()), float(np.nanpercentile(ratio, 2.5)), float(np.nanpercentile(ratio, 97.5))


def _diff_ci(x: np.ndarray, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean(x), 2.5%, 97.5%) over a bootstrap of the cases."""
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    m = x[rng.integers(0, len(x), size=(reps, len(x)))].mean(1)
    return float(x.mean()), float(np.percentile(m, 2.5)), float(np.percentile(m, 97.5))


def summary(cases: pd.DataFrame, against: str = "dense") -> pd.DataFrame:
    """Per (task, length, pattern): cases, mean score, score relative to ``against`` (dense) with
    a paired 95% bootstrap interval over the cases both ran, the mean change of the answers'
    log-probability (nats) with its interval, distant pairs kept, needle pairs and attention mass
    kept, and ``dense_below_half`` (dense's score under 50%: the task is reported, and marked,
    but the ratio says little there)."""
    out = []
    for (task, L), g in cases.groupby(["task", "length"], sort=False):
        ref = g[g["pattern"] == against].set_index("seed")
        dense_score = float(ref["score"].mean()) if len(ref) else float("nan")
        for pat, p in g.groupby("pattern", sort=False):
            p = p.set_index("seed")
            common = p.index.intersection(ref.index).sort_values()  # seed order: intervals ignore row order
            rel = _bootstrap(p.loc[common, "score"].to_numpy(float), ref.loc[common, "score"].to_numpy(float))
            dlp = _diff_ci((p.loc[common, "answer_logprob"] - ref.loc[common, "answer_logprob"]).to_numpy(float))
            out.append({"task": task, "length": L, "pattern": pat, "cases": len(p), "score": p["score"].mean(),
                        "relative": rel[0], "relative_lo": rel[1], "relative_hi": rel[2],
                        "logprob": p["answer_logprob"].mean(), "logprob_change": dlp[0], "logprob_change_lo": dlp[1],
                        "logprob_change_hi": dlp[2], "distant_pairs_kept": p["distant_pairs_kept"].mean(),
                        "needle_pairs_kept": p["needle_pairs_kept"].mean(),
                        "needle_mass_kept": p["needle_mass_kept"].mean(),
                        "seconds": p["seconds"].mean(),
                        "cost_ratio": cost_ratio(p).mean(),
                        "dense_score": dense_score, "dense_below_half": bool(dense_score < 0.5)})
    return pd.DataFrame(out)


def paired_difference(cases: pd.DataFrame, a: str, b: str, column: str = "score") -> pd.DataFrame:
    """Per (task, length): mean of ``column`` under pattern ``a`` minus under ``b`` over the cases
    both ran, with a 95% bootstrap interval (the router against random groups: a = hard_top2,
    b = random_top2), and ``verdict``: ``a better`` / ``b better`` when the interval excludes 0."""
    out = []
    for (task, L), g in cases.groupby(["task", "length"], sort=False):
        x = g[g["pattern"] == a].set_index("seed")[column]
        y = g[g["pattern"] == b].set_index("seed")[column]
        common = x.index.intersection(y.index).sort_values()
        if not len(common):
            continue
        d = _diff_ci((x.loc[common] - y.loc[common]).to_numpy(float))
        verdict = f"{a} better" if d[1] > 0 else f"{b} better" if d[2] < 0 else "no difference"
        out.append({"task": task, "length": L, "cases": len(common), "column": column, "difference": d[0],
                    "lo": d[1], "hi": d[2], "verdict": verdict})
    return pd.DataFrame(out)


def retrieval_heads(trace: pd.DataFrame, threshold: float = RETRIEVAL_HEAD_THRESHOLD) -> pd.DataFrame:
    """Per (task, length, layer, head): the mean retrieval score over the cases (dense
    attention; Wu et al.) and the mean dense attention mass to the needle; ``retrieval_head``:
    score >= ``threshold`` (0.1, theirs). Sorted by score, best first."""
    d = trace[trace["pattern"] == "dense"]
    g = d.groupby(["task", "length", "layer_idx", "head"], as_index=False).agg(
        retrieval_score=("retrieval_score", "mean"), dense_mass=("dense_mass", "mean"))
    g["retrieval_head"] = g["retrieval_score"] >= threshold
    return g.sort_values(["task", "length", "retrieval_score"], ascending=[True, True, False]).reset_index(drop=True)


def failures(cases: pd.DataFrame, trace: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """For every case dense solves (score >= 0.5) and a pattern scores lower: the ``top`` layers
    and heads whose needle attention that pattern dropped most (dense mass minus the mass on
    the pairs it keeps), with the share of that dropped mass on copy pairs and whether the head
    is a retrieval head of the task (``retrieval_heads``)."""
    heads = retrieval_heads(trace)
    is_rh = {(r.task, r.length, r.layer_idx, r.head) for r in heads.itertuples() if r.retrieval_head}
    dense = cases[cases["pattern"] == "dense"].set_index(["task", "length", "seed"])["score"]
    out = []
    for r in cases[cases["pattern"] != "dense"].itertuples():
        ds = dense.get((r.task, r.length, r.seed))
        if ds is None or ds < 0.5 or r.score >= ds:
            continue
        t = trace[(trace["task"] == r.task) & (trace["length"] == r.length) & (trace["seed"] == r.seed)
                  & (trace["pattern"] == r.pattern)]
        dropped = (t["dense_mass"] - t["mass_kept"]).to_numpy()
        copy_dropped = (t["copy_mass"] - t["copy_mass_kept"]).to_numpy()
        for j in np.argsort(-dropped)[:top]:
            row = t.iloc[j]
            out.append({"task": r.task, "length": r.length, "seed": r.seed, "pattern": r.pattern,
                        "dense_score": ds, "score": r.score, "layer_idx": int(row["layer_idx"]), "head": int(row["head"]),
                        "mass_dropped": float(dropped[j]), "dense_mass": float(row["dense_mass"]),
                        "copy_share_of_dropped": float(copy_dropped[j] / dropped[j]) if dropped[j] > 0 else float("nan"),
                        "retrieval_head": (r.task, r.length, int(row["layer_idx"]), int(row["head"])) in is_rh})
    return pd.DataFrame(out)


CASE_KEY = ["task", "length", "seed", "pattern"]  # one row of the cases table
TRACE_KEY = CASE_KEY + ["layer_idx", "head"]  # one row of the trace table


def read_suite(out_dir, kind: str = "cases") -> pd.DataFrame:
    """One suite output's ``kind`` table (``cases`` or ``trace``), also from a run stopped early:
    its per-case files ``out_dir/cases/<fingerprint>/*.<kind>.parquet`` (``run_retrieval``), else
    ``out_dir/<kind>.parquet``; where several fingerprints hold one case, the first (in path
    order) is kept. Raises FileNotFoundError naming the folder when it holds neither."""
    from pathlib import Path
    out_dir = Path(out_dir)
    files = sorted(out_dir.glob(f"cases/*/*.{kind}.parquet"))
    if kind == "trace":  # a case is done when its cases file exists (written last)
        done = {f.name.removesuffix(".cases.parquet") for f in out_dir.glob("cases/*/*.cases.parquet")}
        files = [f for f in files if f.name.removesuffix(".trace.parquet") in done]
    if files:  # one row per key: runs of other settings (fingerprints) in the same folder may repeat a case
        return merge_suites([pd.read_parquet(f) for f in files], kind)
    if (out_dir / f"{kind}.parquet").is_file():
        return pd.read_parquet(out_dir / f"{kind}.parquet")
    raise FileNotFoundError(f"{out_dir} holds no retrieval {kind} table (cases/*/*.{kind}.parquet or {kind}.parquet): "
                            "pass the --out folder of `focus-lab probe retrieval`")


def rename_patterns(table: pd.DataFrame, renames: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """``table`` (a suite's cases or trace) with its ``pattern`` labels renamed, one ``(old, new)``
    after the other: when a router file starts to carry an option, rows its plain names measured
    before take the name that says so (``hard_top2`` -> ``hard_top2_nocap``), and rows measured
    under the option's explicit name take the plain one. The key columns (``CASE_KEY`` or
    ``TRACE_KEY``, whichever the table has) say which rows are one case. Raises ValueError when
    ``new`` already labels a case ``old`` labels (two measurements would merge under one name)."""
    key = [c for c in (TRACE_KEY if "layer_idx" in table else CASE_KEY) if c != "pattern"]
    out = table.copy()
    for old, new in renames:
        if old == new:
            continue
        src, dst = out["pattern"] == old, out["pattern"] == new
        both = out[src][key].merge(out[dst][key].drop_duplicates(), on=key)
        if len(both):
            raise ValueError(f"cannot rename pattern {old!r} to {new!r}: {len(both)} rows of the same cases "
                             f"are labelled {new!r}; rename those first")
        out.loc[src, "pattern"] = new
    return out


def merge_suites(tables: list[pd.DataFrame], kind: str = "cases", drop: Sequence[str] = ()) -> pd.DataFrame:
    """Several suite tables as one (runs on other machines or seeds): rows keyed by
    ``CASE_KEY`` (cases) or ``TRACE_KEY`` (trace); where two tables hold the same key the first
    one's row is kept, so a committed table is never overwritten by a rerun. A table's extra
    columns (e.g. ``device``) are kept, empty where another table lacks them. ``drop``: patterns
    whose rows in the first table are removed first (measured by an earlier protocol), so the
    later tables give them anew."""
    key = CASE_KEY if kind == "cases" else TRACE_KEY
    if drop and len(tables):
        tables = [tables[0][~tables[0]["pattern"].isin(list(drop))], *tables[1:]]
    df = pd.concat([t for t in tables if len(t)], ignore_index=True)
    return df.drop_duplicates(subset=key, keep="first").reset_index(drop=True)


COST_GOAL = 1.3  # a case's seconds over one bare forward of its prompt (docs/retrieval.md, "Cost")


def cost_ratio(cases: pd.DataFrame) -> pd.Series:
    """Per row of the cases table: the case's seconds under its pattern over one bare forward of
    its prompt under the same pattern (``seconds / bare_forward_seconds``; NaN without one)."""
    return cases["seconds"] / cases["bare_forward_seconds"]


def cost_summary(cases: pd.DataFrame) -> pd.DataFrame:
    """Per pattern, then ``all``: case-patterns, the median and quartiles of a case's seconds
    over one bare forward of its prompt under the same pattern (``seconds /
    bare_forward_seconds``, both timed in the same run), and the share at most ``COST_GOAL``
    (1.3x). Rows without a bare forward (the MoBA gate's, in tables written before it was timed)
    are left out."""
    d = cases.assign(ratio=cost_ratio(cases)).dropna(subset=["ratio"])
    out = []
    for pat, g in [*d.groupby("pattern", sort=False), ("all", d)]:
        r = g["ratio"].to_numpy(float)
        if not len(r):
            continue
        out.append({"pattern": pat, "cases": len(r), "median": float(np.median(r)), "q25": float(np.percentile(r, 25)),
                    "q75": float(np.percentile(r, 75)), "within_goal": float((r <= COST_GOAL).mean())})
    return pd.DataFrame(out)
