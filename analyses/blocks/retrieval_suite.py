"""docs/studies/retrieval-suite.md: RULER's retrieval families with ``smollm2-135m/soup-budget``
(retrieval_cases_5710775e.parquet, retrieval_trace_5710775e.parquet): the suite's table
(``analyses.studies.retrieval_table.markdown``), the patterns against each other paired over cases
(``retrieval_tables.paired_difference``), the cases dense solves among the tasks it mostly fails,
the needle attention each pattern keeps, and the heads a failing case lost
(``retrieval_tables.failures``)."""

from __future__ import annotations

import pandas as pd

from analyses.blocks.common import case_routers
from analyses.doc_blocks import REPO, Generated, MissingInput, block

PAGE = "docs/studies/retrieval-suite.md"
PROSE_PAGES = (PAGE,)
#: the interval's level (a setting); the software versions of the runs' machines (identifiers); the suite's
#: bounds (hard top-2 at 90% of dense's score, at most 0.60 of the distant pairs: docs/recipes.md)
#: and the score under which only the log-prob ranks patterns (50%)
ALLOWED = {PAGE: {"95%", "2.11", "13.0", "5.23", "2.13", "90%", "0.60", "50%"}}

CASES = "figures/results/retrieval_cases_5710775e.parquet"
TRACE = "figures/results/retrieval_trace_5710775e.parquet"
#: the four tasks dense mostly solves at 4096 tokens, and the seven it mostly fails
FOUR = ("passkey", "niah_single_1", "niah_single_2", "niah_multikey_1")
SEVEN = ("niah_single_3", "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe")
#: (a, b, heading): a minus b, paired over the cases both ran
COMPARISONS = (("hard_top2", "random_top2", "hard_top2 - random_top2"),
               ("hard_top2", "shuffled_top2", "hard_top2 - shuffled_top2"),
               ("shuffled_top2", "random_top2", "shuffled_top2 - random_top2"),
               ("hard_top2", "moba_matched", "hard_top2 - moba_matched"),
               ("random_top2", "moba_matched", "random_top2 - moba_matched"),
               ("hard_top2_match", "hard_top2", "hard_top2_match - hard_top2"),
               ("random_top2_match", "random_top2", "random_top2_match - random_top2"),
               ("hard_top2_match", "random_top2_match", "hard_top2_match - random_top2_match"))
RANDOM_LAYERS = range(1, 10)  # the shipped file's random-group layers


def _cases() -> pd.DataFrame:
    return pd.read_parquet(REPO / CASES)


def _source(cases: pd.DataFrame) -> str:
    """The inputs line's router file and machines."""
    devices = "; ".join(f"{d} ({n} rows)" for d, n in cases.groupby("device").size().items())
    return f"routers {case_routers(cases)}; machines {devices}"


def _order(cases: pd.DataFrame) -> list[tuple[str, int]]:
    """(task, length) in the suite table's order: per length, the tasks dense scores at least 50% on
    first, each group in the order the table holds them (``retrieval_table.markdown``)."""
    from focus_lab.eval.retrieval_tables import summary
    s = summary(cases)
    d = s[s.pattern == "dense"]
    keys = list(zip(d.task, d.length))
    below = dict(zip(keys, d.dense_below_half))
    return sorted(keys, key=lambda k: (k[1], bool(below[k])))


@block("retrieval-suite", CASES)
def retrieval_suite() -> Generated:
    """The suite's table (``analyses.studies.retrieval_table.markdown``): per task and length, dense's
    score and each pattern's score relative to dense [paired 95% interval over cases], the mean
    change of the answers' log-prob (nats) and the distant pairs kept; ``-`` where dense scores
    below 50%, ``(n=N)`` where a pattern ran on fewer cases than dense."""
    from analyses.studies.retrieval_table import markdown
    cases = _cases()
    seeds = sorted(cases.seed.unique())
    inputs = (f"{CASES}; {_source(cases)}; case seeds {seeds[0]}-{seeds[-1]} (the cases each row counts); "
              "patterns " + ", ".join(dict.fromkeys(cases.pattern)))
    return Generated(inputs, markdown(cases))


def _difference(r, column: str) -> str:
    """``+0.45 [+0.20, +0.70]``: score in two decimals; nats in one, two under one nat."""
    nd = 2 if column == "score" or abs(r.difference) < 1 else 1
    return f"{r.difference:+.{nd}f} [{r.lo:+.{nd}f}, {r.hi:+.{nd}f}]"


@block("retrieval-suite-paired", CASES)
def retrieval_suite_paired() -> Generated:
    """The patterns against each other, paired over the cases both ran (``COMPARISONS``: a minus b):
    per task and length, the score difference, then the answers' log-prob difference (nats), each
    with its 95% bootstrap interval, and the cases (``retrieval_tables.paired_difference``)."""
    from focus_lab.eval.retrieval_tables import paired_difference
    cases = _cases()
    diffs = {}
    for a, b, head in COMPARISONS:
        per = {}
        for column in ("score", "answer_logprob"):
            d = paired_difference(cases, a, b, column)
            for r in d.itertuples() if len(d) else ():
                per.setdefault((r.task, r.length), {})[column] = r
        diffs[head] = per
    heads = [h for *_, h in COMPARISONS]
    lines = ["| task | tokens | " + " | ".join(heads) + " |", "|---|---:|" + "---|" * len(heads)]

    def cell(both: dict) -> str:
        if not both:
            return ""
        sc, lp = both["score"], both["answer_logprob"]
        if sc.cases != lp.cases:
            raise MissingInput(f"{CASES} (score and log-prob paired over different cases: {sc.task} {sc.length})")
        return f"{_difference(sc, 'score')} / {_difference(lp, 'answer_logprob')} ({sc.cases})"
    for task, L in _order(cases):
        cells = [cell(diffs[h].get((task, L), {})) for h in heads]
        if any(cells):
            lines.append(f"| {task} | {L} | " + " | ".join(cells) + " |")
    inputs = (f"{CASES}; {_source(cases)}; pattern a minus pattern b, the score then the answers' log-prob (nats), "
              "each the mean over the cases both ran with its 95% bootstrap interval "
              "(focus_lab.eval.retrieval_tables.paired_difference), cases in parentheses")
    return Generated(inputs, "\n".join(lines))


@block("retrieval-suite-hard-cases", CASES)
def retrieval_suite_hard_cases() -> Generated:
    """The cases dense solves (score 1) among the seven tasks it mostly fails: per pattern, how many
    of them it ran and solves, and its answers' log-prob against dense's on them (lowest to highest
    change, nats)."""
    cases = _cases()
    d = cases[(cases.pattern == "dense") & cases.task.isin(SEVEN) & (cases.score == 1)]
    if not len(d):
        raise MissingInput(f"{CASES} (dense rows of the seven tasks)")
    key = ["task", "length", "seed"]
    ref = d[key + ["answer_logprob"]].rename(columns={"answer_logprob": "dense_logprob"})
    tasks = ", ".join(f"{t} {n}" for t, n in d.groupby("task", sort=False).size().items())
    lines = ["| pattern | cases | solved | answers' log-prob against dense's (nats), lowest / highest |", "|---|---:|---:|---|"]
    for p in ("hard_top2", "random_top2", "hard_top2_match", "random_top2_match"):
        m = cases[cases.pattern == p].merge(ref, on=key)
        delta = m.answer_logprob - m.dense_logprob
        lines.append(f"| {p} | {len(m)} | {int((m.score == 1).sum())} | {delta.min():+.2f} / {delta.max():+.2f} |")
    inputs = f"{CASES}; {_source(cases)}; the {len(d)} cases dense scores 1 on ({tasks}), every length"
    return Generated(inputs, "\n".join(lines))


@block("retrieval-suite-needle", TRACE)
def retrieval_suite_needle() -> Generated:
    """From the trace at 4096 tokens on the four tasks dense solves: per pattern the share of dense's
    needle attention it keeps (summed over cases, layers and heads; then per task) and of the
    attention on copy pairs; then where hard top-2's dropped needle attention lies, random-group layers 1-9 or the
    routed layers, and the share of it on copy pairs."""
    trace = pd.read_parquet(REPO / TRACE)
    t = trace[(trace.length == 4096) & trace.task.isin(FOUR)]
    if not len(t):
        raise MissingInput(f"{TRACE} (the four tasks at 4096 tokens)")
    cols = ["dense_mass", "mass_kept", "copy_mass", "copy_mass_kept"]
    g = t.groupby("pattern", sort=False)[cols].sum()
    per = t.groupby(["pattern", "task"])[cols].sum()
    n = t.groupby("pattern", sort=False).apply(lambda x: x[["task", "seed"]].drop_duplicates().shape[0],
                                               include_groups=False)
    lines = ["| pattern | cases | needle attention kept | " + " | ".join(FOUR) + " | on copy pairs: kept |",
             "|---|---:|---:|" + "---:|" * len(FOUR) + "---:|"]
    for p, r in g.iterrows():
        if p == "dense":
            continue
        tasks = [f"{per.loc[(p, x)].mass_kept / per.loc[(p, x)].dense_mass:.0%}" if (p, x) in per.index else ""
                 for x in FOUR]
        lines.append(f"| {p} | {n[p]} | {r.mass_kept / r.dense_mass:.0%} | " + " | ".join(tasks)
                     + f" | {r.copy_mass_kept / r.copy_mass:.0%} |")
    h = t[t.pattern == "hard_top2"].assign(early=lambda x: x.layer_idx.isin(RANDOM_LAYERS))
    h = h.assign(dropped=h.dense_mass - h.mass_kept, copy_dropped=h.copy_mass - h.copy_mass_kept)
    by = h.groupby("early")[["dropped", "copy_dropped"]].sum()
    lines += ["", "| hard_top2's dropped needle attention | share of it | of that, on copy pairs |", "|---|---:|---:|"]
    for early, name in ((True, "in the random-group layers 1-9"), (False, "in the routed layers")):
        r = by.loc[early]
        lines.append(f"| {name} | {r.dropped / by.dropped.sum():.0%} | {r.copy_dropped / r.dropped:.0%} |")
    inputs = (f"{TRACE}; {_source(trace)}; 4096 tokens, tasks {', '.join(FOUR)}; dense attention to the needle and the "
              "part of it each pattern's mask keeps, per case, layer and head, summed")
    return Generated(inputs, "\n".join(lines))


@block("retrieval-suite-failures", CASES, TRACE)
def retrieval_suite_failures() -> Generated:
    """Every case dense solves (score at least 0.5) and hard top-2, or hard top-2 with the pairs,
    scores lower (``retrieval_tables.failures``), by pattern, length, task and seed: the share of
    dense's needle attention the pattern keeps on that case and the three heads whose needle
    attention it dropped most, each ``LxHy dropped of dense's mass (share of the dropped mass on
    copy pairs, RH: a retrieval head of the task)``."""
    from focus_lab.eval.retrieval_tables import failures
    cases, trace = _cases(), pd.read_parquet(REPO / TRACE)
    f = failures(cases, trace, top=3)
    kept = cases.set_index(["task", "length", "seed", "pattern"]).needle_mass_kept
    tasks = {t: i for i, t in enumerate((*FOUR, *SEVEN))}
    lines = ["| case | pattern | dense / pattern score | needle attention kept | heads that dropped most needle attention |",
             "|---|---|---|---:|---|"]
    for pattern in ("hard_top2", "hard_top2_match"):
        g = f[f.pattern == pattern]
        order = sorted(g.groupby(["task", "length", "seed"]).groups, key=lambda k: (k[1], tasks[k[0]], k[2]))
        for task, L, seed in order:
            h = g[(g.task == task) & (g.length == L) & (g.seed == seed)]
            heads = "; ".join(f"L{r.layer_idx}H{r.head} {r.mass_dropped:.2f} of {r.dense_mass:.2f} "
                              f"({r.copy_share_of_dropped:.0%}{', RH' if r.retrieval_head else ''})" for r in h.itertuples())
            r = h.iloc[0]
            lines.append(f"| {task}, {L}, seed {seed} | {pattern} | {r.dense_score:.2f} / {r.score:.2f} | "
                         f"{kept[(task, L, seed, pattern)]:.2f} | {heads} |")
    inputs = (f"{CASES}, {TRACE}; {_source(cases)}; the cases dense scores at least 0.5 on and the pattern lower; "
              "retrieval heads: retrieval score at least 0.1 under dense (Wu et al.)")
    return Generated(inputs, "\n".join(lines))
