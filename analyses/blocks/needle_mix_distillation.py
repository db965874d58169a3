"""docs/studies/needle-mix-distillation.md's tables: 30 distill steps on the needle mix
(`smollm2-135m/needle-mix-budget`) against the file it started from (`smollm2-135m/soup-budget`)
and the same steps on plain prose (the control).

- ``needle-mix-retrieval``: the run's retrieval cases paired with the shipped file's committed ones
  (``analyses.studies.retrieval_versus.versus``), the plain control, the controls' log-prob gaps,
  the needle attention kept (cases, and the trace by layer and head);
- ``needle-mix-perplexity``: the length table's windows and the technical domains, paired with the
  shipped file's cells;
- ``needle-mix-length``: the README's length table measured again, paired per length and pattern;
- ``needle-mix-shipping``: the passkey probe and the per-domain tables measured again;
- ``needle-mix-suite`` (on docs/studies/retrieval-suite.md, beside the suite of the file it started
  from): the committed retrieval suite's rows of the needle-mix file (the patterns
  ``hard_top2_nocap`` / ``hard_top2_match_nocap`` of ``retrieval_cases.parquet``, whose hard top-2
  is the capacity file's) against dense and against each control, paired over cases.
"""

from __future__ import annotations

import pandas as pd

from analyses.blocks.common import (TECH, margin, over_dense, paired, passkey, passkey_cell, passkey_inputs,
                                    passkey_rows, relative, routers_of, text, windows_of)
from analyses.doc_blocks import (LENGTH_CELLS, PASSKEY_CASES, PASSKEY_TABLES, REPO, Generated, MissingInput, _Cells,
                                 block)

PAGE = "docs/studies/needle-mix-distillation.md"
#: the page whose section "The needle-mix file on the whole suite" holds ``needle-mix-suite``
SUITE_PAGE = "docs/studies/retrieval-suite.md"
PROSE_PAGES = (PAGE, SUITE_PAGE)
#: settings, criteria, identifiers: the interval's level; the suite's bounds (0.60 of the distant pairs,
#: 90% / 0.90 of dense's score); the criteria's top-2 bar (+1.5%); DuoAttention's arXiv number; the torch version
ALLOWED = {PAGE: {"95%", "90%", "0.60", "0.90", "+1.5%", "2410.10819", "2.13"}, SUITE_PAGE: {"0.90"}}

RUN = "figures/results/needle_mix_cases.parquet"
SHIPPED_CASES = "figures/results/retrieval_cases_5710775e.parquet"
SHIPPED_TRACE = "figures/results/retrieval_trace_5710775e.parquet"
SUITE = "figures/results/retrieval_cases.parquet"
SUITE_TRACE = "figures/results/retrieval_trace.parquet"
NAME, PLAIN = "needle_mix", "plain"
#: the tasks dense solves, and the order of the others in the page's table
SOLVED = ("niah_single_1", "niah_single_2", "passkey")
OTHERS = ("niah_multikey_1", "niah_single_3", "niah_multivalue", "niah_multiquery", "niah_multikey_2",
          "niah_multikey_3", "vt", "cwe")
TASK_NAMES = {"niah_single_3": "niah_single_3 (UUID)", "niah_multikey_2": "niah_multikey_2 (needle haystack)",
              "niah_multikey_3": "niah_multikey_3 (UUID distractors)"}
#: the heads of the suite's failures (docs/studies/retrieval-suite.md) and the layers routed by the router
HEADS = ((17, 3), (17, 4), (18, 7), (18, 8), (14, 3), (15, 6), (22, 7), (7, 7))
ROUTED = 10
#: the needle-mix file's patterns in the committed suite
NOCAP, MATCH = "hard_top2_nocap", "hard_top2_match_nocap"


def _read(path: str) -> pd.DataFrame:
    return pd.read_parquet(REPO / path)


def _run(routers: str) -> pd.DataFrame:
    df = _read(RUN)
    df = df[df.routers == routers]
    if not len(df):
        raise MissingInput(f"{RUN} (routers {routers})")
    return df.drop(columns=["routers"])


def _versus(routers: str, patterns=("hard_top2",)) -> pd.DataFrame:
    from analyses.studies.retrieval_versus import versus
    return versus(_run(routers), _read(SHIPPED_CASES), routers, list(patterns))


def _rel(r) -> str:
    return "-" if r.dense_below_half else relative(r)


def _diff(d: pd.DataFrame, task: str, L: int, nd: int = 1) -> str:
    """``+0.5 [+0.1, +1.0]`` (``0`` when every case is equal) of a ``paired_difference`` frame."""
    r = d[(d.task == task) & (d.length == L)]
    if not len(r):
        return "-"
    r = r.iloc[0]
    if r.difference == 0 and r.lo == 0 and r.hi == 0:
        return "0"
    return f"{r.difference:+.{nd}f} [{r.lo:+.{nd}f}, {r.hi:+.{nd}f}]"


MAIN_ROWS = [(t, 4096) for t in SOLVED] + [(t, 8192) for t in SOLVED] + [(t, 4096) for t in OTHERS]


def _needle_kept(trace: pd.DataFrame, pattern: str, cases: pd.DataFrame) -> dict:
    """Needle attention kept, pooled over ``cases`` (task, length, seed): every layer, the routed
    layers, their copy pairs, and each of ``HEADS``."""
    t = trace[trace.pattern == pattern].merge(cases, on=["task", "length", "seed"])
    if not len(t):
        raise MissingInput(f"trace rows of {pattern}")
    r = t[t.layer_idx >= ROUTED]
    out = {"routed": r.mass_kept.sum() / r.dense_mass.sum(), "copy": r.copy_mass_kept.sum() / r.copy_mass.sum()}
    for L, H in HEADS:
        h = t[(t.layer_idx == L) & (t["head"] == H)]
        out[(L, H)] = h.mass_kept.sum() / h.dense_mass.sum()
    return out


@block("needle-mix-retrieval", RUN, SHIPPED_CASES, SHIPPED_TRACE, SUITE_TRACE)
def needle_mix_retrieval() -> Generated:
    """The needle mix's retrieval run against the shipped file's committed cases of the same seeds:
    per task, the score relative to dense [paired interval], the log-prob change against dense
    (nats) [distant pairs kept], and the needle mix minus the shipped file, paired; then the plain
    control, the controls (random / shuffled top-2 of the shipped suite) and the needle attention."""
    from focus_lab.eval.retrieval_tables import paired_difference, summary
    both = _versus(NAME, ("hard_top2", "random_top2", "shuffled_top2"))
    s = summary(both).set_index(["task", "length", "pattern"])
    mine = f"hard_top2@{NAME}"
    score = paired_difference(both, mine, "hard_top2", "score")
    lp = paired_difference(both, mine, "hard_top2", "answer_logprob")
    lines = ["| task | tokens | cases | dense | shipped hard top-2 | needle mix hard top-2 | score, paired | "
             "log-prob, paired |", "|---|---:|---:|---:|---|---|---|---|"]
    for task, L in MAIN_ROWS:
        a, b, d = s.loc[(task, L, "hard_top2")], s.loc[(task, L, mine)], s.loc[(task, L, "dense")]
        paired_n = int(score[(score.task == task) & (score.length == L)].cases.iloc[0])
        cases = f"{int(b.cases)}" + (f" ({paired_n})" if L == 8192 else "")
        lines.append(f"| {TASK_NAMES.get(task, task)} | {L} | {cases} | {d.score:.2f} | "
                     f"{_rel(a)}, {a.logprob_change:+.1f} [{a.distant_pairs_kept:.2f}] | "
                     f"{_rel(b)}, {b.logprob_change:+.1f} [{b.distant_pairs_kept:.2f}] | "
                     f"{_diff(score, task, L, 2)} | {_diff(lp, task, L)} |")

    # the plain control on the tasks dense solves at 4096
    plain = _versus(PLAIN)
    ps = summary(plain).set_index(["task", "length", "pattern"])
    p_lp = paired_difference(plain, f"hard_top2@{PLAIN}", "hard_top2", "answer_logprob")
    nm = _run(NAME).assign(pattern=lambda d: d.pattern.map(lambda p: p if p == "dense" else f"{p}@{NAME}"))
    pl = _run(PLAIN).assign(pattern=lambda d: d.pattern.map(lambda p: p if p == "dense" else f"{p}@{PLAIN}"))
    keys = pl[["task", "length", "seed"]].drop_duplicates()
    vs_plain = paired_difference(pd.concat([nm.merge(keys), pl[pl.pattern != "dense"]], ignore_index=True),
                                 mine, f"hard_top2@{PLAIN}", "answer_logprob")
    lines += ["", "The plain control (30 steps on Austen's novels without the needles), the same cases at 4096:", "",
              "| task | cases | plain hard top-2 | plain minus shipped, log-prob | needle mix minus plain, log-prob |",
              "|---|---:|---|---|---|"]
    for task in SOLVED:
        r = ps.loc[(task, 4096, f"hard_top2@{PLAIN}")]
        lines.append(f"| {task} | {int(r.cases)} | {_rel(r)}, {r.logprob_change:+.1f} [{r.distant_pairs_kept:.2f}] | "
                     f"{_diff(p_lp, task, 4096)} | {_diff(vs_plain, task, 4096, 2)} |")

    # the controls: the needle mix minus the shipped suite's random and shuffled groups
    lines += ["", "The needle mix's hard top-2 minus the shipped suite's controls on the same cases at 4096, "
              "answer log-prob (nats):", "", "| task | cases | random top-2 | shuffled top-2 |", "|---|---:|---|---|"]
    ctl = {p: paired_difference(both, mine, p, "answer_logprob") for p in ("random_top2", "shuffled_top2")}
    for task in SOLVED + OTHERS:
        n = ctl["random_top2"]
        n = int(n[(n.task == task) & (n.length == 4096)].cases.iloc[0])
        lines.append(f"| {TASK_NAMES.get(task, task)} | {n} | {_diff(ctl['random_top2'], task, 4096)} | "
                     f"{_diff(ctl['shuffled_top2'], task, 4096)} |")

    # the needle attention: cases (every layer) and the trace (routed layers, copy pairs, heads)
    seeds = nm[(nm.length == 4096) & nm.task.isin(SOLVED)][["task", "length", "seed"]].drop_duplicates()
    kept = lambda df, p: df[(df.pattern == p)].merge(seeds).needle_mass_kept.mean()  # noqa: E731
    shipped_cases = _read(SHIPPED_CASES)
    t_nm = _needle_kept(_read(SUITE_TRACE), NOCAP, seeds)
    t_sh = _needle_kept(_read(SHIPPED_TRACE), "hard_top2", seeds)
    lines += ["", f"Needle attention kept by hard top-2 over the {len(seeds)} cases of {', '.join(SOLVED)} at 4096 "
              "(the cases' mean; the trace pooled over cases, layer by layer: the needle mix's trace is the committed "
              f"suite's `{NOCAP}`):", "",
              "| needle attention kept | needle mix | shipped | plain |", "|---|---:|---:|---:|",
              f"| every layer (the cases) | {kept(nm, mine):.2f} | {kept(shipped_cases, 'hard_top2'):.2f} | "
              f"{kept(pl, f'hard_top2@{PLAIN}'):.2f} |",
              f"| routed layers {ROUTED}-29 | {t_nm['routed']:.3f} | {t_sh['routed']:.3f} | - |",
              f"| routed layers, copy pairs | {t_nm['copy']:.3f} | {t_sh['copy']:.3f} | - |"]
    for L, H in HEADS:
        lines.append(f"| L{L}H{H} | {t_nm[(L, H)]:.3f} | {t_sh[(L, H)]:.3f} | - |")
    inputs = (f"{RUN} (routers {NAME} and {PLAIN}: their runs' cases, dense their own); {SHIPPED_CASES} "
              f"(`smollm2-135m/soup-budget`'s hard_top2, random_top2, shuffled_top2 on the same seeds); "
              f"{SHIPPED_TRACE} and {SUITE_TRACE} (patterns hard_top2, {NOCAP}); paired 95% bootstrap intervals over cases")
    return Generated(inputs, "\n".join(lines))


# --------------------------------------------------------------------------------------------
# perplexity

NOVELS = "needle_mix_controls"
DOMAINS = "needle_mix_domains"


@block("needle-mix-perplexity", LENGTH_CELLS)
def needle_mix_perplexity() -> Generated:
    """Hard top-2 over dense [pairs kept] and paired against the shipped file's cells on the same
    windows (the novels: table ``shipped``; the technical domains: ``shipped_per_domain``, the
    shipped file at its own per-layer budget), the plain control on *Persuasion*; then hard top-1
    paired the same way and the router's margin over its own groups shuffled."""
    c = _Cells()
    rows = [("austen", L) for L in (4096, 8192)] + [("shakespeare", L) for L in (4096, 8192)] + [(d, 4096) for d in TECH]
    src = lambda corpus: (NOVELS, "shipped") if corpus in ("austen", "shakespeare") else (DOMAINS, "shipped_per_domain")  # noqa: E731
    lines = ["| text | tokens | windows | needle mix hard top-2 | paired vs shipped | plain control, paired vs shipped | "
             "hard top-1, paired vs shipped | router over shuffled, top-2 |", "|---|---:|---:|---|---|---|---|---|"]
    for corpus, L in rows:
        t, ship = src(corpus)
        n = int(c.summary(t, corpus, L, "dense").windows)
        plain = paired(c, ("plain_mix", "hard_top2"), ("shipped", "hard_top2"), corpus, L) if corpus == "austen" else ""
        shuf = margin(c, t, corpus, L, "shuffled_top2", ci=True) if t == NOVELS else ""
        lines.append(f"| {text(corpus, L, False)} | {L} | {n} | {over_dense(c, t, corpus, L, 'hard_top2')} | "
                     f"{paired(c, (t, 'hard_top2'), (ship, 'hard_top2'), corpus, L)} | {plain} | "
                     f"{paired(c, (t, 'hard_top1'), (ship, 'hard_top1'), corpus, L)} | {shuf} |")
    tables = [NOVELS, DOMAINS, "plain_mix", "shipped", "shipped_per_domain"]
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(tables)}); routers {routers_of(c, tables)}; "
              f"{windows_of(c, tables, set(rows))}; patterns dense, hard_top1, hard_top2, shuffled_top2")
    return Generated(inputs, "\n".join(lines))


# --------------------------------------------------------------------------------------------
# re-measured for shipping

LENGTH = "needle_mix_length"


@block("needle-mix-length", LENGTH_CELLS)
def needle_mix_length() -> Generated:
    """The README's length table with the needle-mix file (table ``needle_mix_length``): per corpus
    and length, hard top-1, hard top-2 and shuffled top-1 paired against the shipped file's cells
    (table ``shipped``) on the same windows, and the router's margin over random groups."""
    c = _Cells()
    g = c.cells[c.cells["table"] == LENGTH]
    lines = ["| text | tokens | windows | hard top-1, paired | hard top-2, paired | shuffled top-1, paired | "
             "router over random, top-1 / top-2 |", "|---|---:|---:|---|---|---|---|"]
    for (corpus, L), _ in g.groupby(["corpus", "seq_len"], sort=True):
        n = int(c.summary(LENGTH, corpus, L, "dense").windows)
        cells = [paired(c, (LENGTH, p), ("shipped", p), corpus, L) for p in ("hard_top1", "hard_top2", "shuffled_top1")]
        lines.append(f"| {text(corpus, L, False)} | {L} | {n} | " + " | ".join(cells) + " | "
                     f"{margin(c, LENGTH, corpus, L, 'random_top1')} / {margin(c, LENGTH, corpus, L, 'random_top2')} |")
    inputs = (f"{LENGTH_CELLS} (tables {LENGTH}, shipped); routers {routers_of(c, [LENGTH, 'shipped'])}; "
              f"{windows_of(c, [LENGTH])}; patterns dense, hard_top1, hard_top2, shuffled_top1, random_top1, random_top2")
    return Generated(inputs, "\n".join(lines))


PASSKEY_NM = ("needle_mix_4k", "needle_mix_4k_seeds6-11")
PASSKEY_SOUP = ("shipped_4k_budget_top2", "shipped_4k_budget_top2_seeds6-11")
#: per-domain tables measured again: (needle mix, shipped, corpora, length)
PER_DOMAIN = (("needle_mix_per_domain", "shipped_per_domain", ("kernel-docs", "python-source", "bible-kjv"), 4096),
              ("needle_mix_heldout_8k", "shipped_heldout_8k", TECH, 8192))


@block("needle-mix-shipping", LENGTH_CELLS, PASSKEY_CASES, PASSKEY_TABLES)
def needle_mix_shipping() -> Generated:
    """The passkey probe at 4096 tokens with the needle-mix file and with `smollm2-135m/soup-budget`
    (and dense's mean key log-prob on the same cases); the other held-out domains at 4096 and the
    technical ones at 8192, hard top-2 and hard top-1 paired against the shipped file's cells."""
    c = _Cells()
    nm, soup = passkey(PASSKEY_NM, "hard_top2"), passkey(PASSKEY_SOUP, "hard_top2")
    _, dense = passkey_rows(PASSKEY_NM)
    lines = ["| passkey, 4096 tokens | tables | exact matches (of dense's), key log-prob [distant pairs kept] |",
             "|---|---|---|",
             f"| dense | {', '.join(dict.fromkeys(dense.table))} | {int(dense.exact_match.sum())}/{len(dense)}, "
             f"{dense.key_logprob.mean():.2f} |",
             f"| needle mix, hard top-2 | {', '.join(PASSKEY_NM)} | {passkey_cell(nm)} |",
             f"| `smollm2-135m/soup-budget`, hard top-2 | {', '.join(PASSKEY_SOUP)} | {passkey_cell(soup)} |",
             "", "| domain | tokens | windows | hard top-2, paired vs shipped | hard top-1, paired vs shipped |",
             "|---|---:|---:|---|---|"]
    tables = []
    for t, ship, corpora, L in PER_DOMAIN:
        tables += [t, ship]
        for d in corpora:
            n = int(c.summary(t, d, L, "dense").windows)
            lines.append(f"| {d} | {L} | {n} | {paired(c, (t, 'hard_top2'), (ship, 'hard_top2'), d, L)} | "
                         f"{paired(c, (t, 'hard_top1'), (ship, 'hard_top1'), d, L)} |")
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(tables)}); routers {routers_of(c, tables)}; patterns dense, hard_top1, "
              f"hard_top2; {passkey_inputs(PASSKEY_NM + PASSKEY_SOUP)}")
    return Generated(inputs, "\n".join(lines))


#: the suite's patterns of the needle-mix file's rows and the controls, in the table's order
SUITE_PATTERNS = (("dense", "dense"), (NOCAP, "hard top-2"), ("hard_top1", "hard top-1"),
                  ("random_top2", "random top-2"), ("shuffled_top2", "shuffled top-2"),
                  (MATCH, "hard top-2 + pairs"), ("moba_matched", "MoBA gate"))
#: the paired gaps shown: hard top-2 minus each of these
GAPS = ("hard_top1", "random_top2", "shuffled_top2", "moba_matched", MATCH)


@block("needle-mix-suite", SUITE, SHIPPED_CASES)
def needle_mix_suite() -> Generated:
    """The committed suite's rows of the needle-mix file (``hard_top2_nocap``, hard top-1, the
    pairs ``hard_top2_match_nocap``) and of the router-free controls: per task and length, each
    pattern's score relative to dense [interval], the answers' log-prob change against dense and
    the distant pairs kept, with its cases; then hard top-2 minus each other pattern, paired over
    the cases both ran (score; log-prob in nats); the shipped file's hard top-1 beside; the seeds
    hard top-2 loses where dense succeeds."""
    from focus_lab.eval.retrieval_tables import paired_difference, summary
    cases = _read(SUITE)
    cases = cases[cases.pattern.isin([p for p, _ in SUITE_PATTERNS])]
    s = summary(cases).set_index(["task", "length", "pattern"])
    order = [(t, L) for L in (4096, 8192) for t in SOLVED + OTHERS if (t, L, NOCAP) in s.index]
    lines = ["Per pattern: the score relative to dense [95% interval] (where dense scores under half: the mean scores, "
             "dense's on the same cases), the answers' log-prob change against dense in nats [interval], {distant pairs "
             "kept}, (cases):", "",
             "| task | tokens | " + " | ".join(h for _, h in SUITE_PATTERNS[1:]) + " |",
             "|---|---:|" + "---|" * (len(SUITE_PATTERNS) - 1)]
    by = {k: g.set_index("seed") for k, g in cases.groupby(["task", "length", "pattern"])}
    for task, L in order:
        cells = []
        for p, _ in SUITE_PATTERNS[1:]:
            if (task, L, p) not in s.index:
                cells.append("")
                continue
            r = s.loc[(task, L, p)]
            if r.dense_below_half:  # the scores themselves, dense's on the same cases
                mine, dense = by[(task, L, p)], by[(task, L, "dense")]
                common = mine.index.intersection(dense.index)
                head = f"score {mine.loc[common, 'score'].mean():.2f} (dense {dense.loc[common, 'score'].mean():.2f})"
            else:
                head = _rel(r)
            cells.append(f"{head}, {r.logprob_change:+.1f} [{r.logprob_change_lo:+.1f}, {r.logprob_change_hi:+.1f}] "
                         f"{{{r.distant_pairs_kept:.2f}}} ({int(r.cases)})")
        lines.append(f"| {TASK_NAMES.get(task, task)} | {L} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Dense's score: " + "; ".join(f"{t} {L} {s.loc[(t, L, 'dense')].score:.2f} ({int(s.loc[(t, L, 'dense')].cases)})"
                                               for t, L in order) + ".")
    lines += ["", "Hard top-2 minus each pattern, paired over the cases both ran: score / answer log-prob (nats):", "",
              "| task | tokens | " + " | ".join(dict(SUITE_PATTERNS)[p] for p in GAPS) + " |",
              "|---|---:|" + "---|" * len(GAPS)]
    gaps = {p: (paired_difference(cases, NOCAP, p, "score"), paired_difference(cases, NOCAP, p, "answer_logprob"))
            for p in GAPS}
    for task, L in order:
        cells = []
        for p in GAPS:
            sc, lp = gaps[p]
            a, b = _diff(sc, task, L, 2), _diff(lp, task, L)
            cells.append("" if a == "-" else f"{a} / {b}")
        if any(cells):  # a task and length no other pattern ran on has no row
            lines.append(f"| {TASK_NAMES.get(task, task)} | {L} | " + " | ".join(cells) + " |")
    soup = summary(_read(SHIPPED_CASES).query("pattern in ['dense', 'hard_top1'] and length == 4096")).set_index(
        ["task", "length", "pattern"])
    notes = ["`smollm2-135m/soup-budget`'s hard top-1 (retrieval_cases_5710775e.parquet): " + "; ".join(
        f"{t} {soup.loc[(t, 4096, 'hard_top1')].relative:.2f} of dense ({int(soup.loc[(t, 4096, 'hard_top1')].cases)} cases)"
        for t in SOLVED) + "."]
    pv = cases[cases.pattern.isin(["dense", NOCAP])].pivot_table(index=["task", "length", "seed"], columns="pattern",
                                                               values="score")
    lost = pv[(pv["dense"] > 0) & (pv[NOCAP] < pv["dense"])].reset_index()
    found = pv[(pv["dense"] == 0) & (pv[NOCAP] > 0)].reset_index()
    for what, df in (("loses where dense scores", lost), ("scores where dense scores 0", found)):
        df = df[df.task.isin(SOLVED)]
        notes.append(f"Hard top-2 {what} ({', '.join(SOLVED)}): " + "; ".join(
            f"{t} {L} seeds {', '.join(str(int(x)) for x in g.seed)}" for (t, L), g in df.groupby(["task", "length"])) + ".")
    lines += ["", " ".join(notes)]
    inputs = (f"{SUITE} (patterns {', '.join(p for p, _ in SUITE_PATTERNS)}: the needle-mix file's rows are "
              f"{NOCAP}, {MATCH} and hard_top1; dense and the controls router-free); {SHIPPED_CASES} (hard_top1); "
              "paired 95% bootstrap intervals over cases")
    return Generated(inputs, "\n".join(lines))
