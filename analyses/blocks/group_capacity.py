"""docs/studies/group-capacity.md: a causal cap on group sizes (``FocusConfig.group_capacity``)
against hard top-2 of ``smollm2-135m/needle-mix-budget`` (the study's "hard top-2"), on the
retrieval suite (figures/results/retrieval_cases.parquet) and on perplexity (tables
``capacity``, ``capacity_sweep``, ``capacity_layers``, ``capacity_evict``,
``capacity_evict_layers``, ``capacity_evict7`` of length_cells.parquet). The study's own reader,
``analyses.studies.group_capacity``, makes the rows; this module lays them out.

Names: in the length cells the study's hard top-2 is ``hard_top2``; in the retrieval cases, made
with ``smollm2-135m/needle-mix-capacity`` (the same tensors with E7's capacity for top-2), it is
``hard_top2_nocap`` and E7 is ``hard_top2`` (``group_capacity.RETRIEVAL_LABELS``)."""

from __future__ import annotations

import pandas as pd

from analyses.blocks.common import case_routers, relative
from analyses.doc_blocks import LENGTH_CELLS, REPO, Generated, MissingInput, block, name_sha256, router_label

PAGE = "docs/studies/group-capacity.md"
PROSE_PAGES = (PAGE,)
#: the interval's level; the suite's bounds (at least 0.90 of dense's score at no more than 0.60
#: of the distant pairs)
ALLOWED = {PAGE: {"95%", "0.90", "0.60"}}

CASES = "figures/results/retrieval_cases.parquet"
S = "hard_top2_cap@0+13+15-16+21+24-25+28-29"  # the cap in nine layers
S1 = "hard_top2_cap@0+13-16+21+25+28"  # the first set, with layer 14
E = "hard_top2_evict@13+15-16+21+24-25+28-29"  # S without layer 0, the keys over the cap evicted
E7 = "hard_top2_evict@13+15-16+21+25+28-29"  # E without layer 24: the shipped file's capacity for top-2
#: the study's patterns as the committed retrieval cases name them
IN_CASES = {"hard_top2": "hard_top2_nocap", E7: "hard_top2"}
NAMES = {"hard_top2_cap": "the cap", S1: "S with layer 14", S: "S", E: "E", E7: "E7"}
CORPORA = {"austen": "*Persuasion*", "python-docs": "Python docs", "man-pages": "man pages",
           "debian-reference": "Debian Reference", "kernel-docs": "kernel docs", "python-source": "Python source",
           "bible-kjv": "Bible (KJV)"}
NOISE = "niah_single_1"


def _cells(*tables: str) -> pd.DataFrame:
    from analyses.length_table import committed_cells
    c = committed_cells(REPO / LENGTH_CELLS)
    missing = [t for t in tables if t not in set(c["table"])]
    if missing:
        raise MissingInput(f"{LENGTH_CELLS} (tables {', '.join(missing)})")
    return c[c["table"].isin(tables)]


def _cases() -> pd.DataFrame:
    return pd.read_parquet(REPO / CASES)


def _study_cases(cases: pd.DataFrame, pattern: str) -> pd.DataFrame:
    """dense, the study's hard top-2 and ``pattern`` (length-cell names) on the cases all three ran,
    renamed to the length cells' names."""
    theirs = IN_CASES.get(pattern, pattern)
    names = {"dense": "dense", IN_CASES["hard_top2"]: "hard_top2", theirs: pattern}
    c = cases[cases.pattern.isin(names)].assign(pattern=lambda d: d.pattern.map(names))
    have = c.groupby(["task", "length", "seed"]).pattern.agg(set)
    keep = have[have.map(lambda s: s == {"dense", "hard_top2", pattern})].index
    c = c.set_index(["task", "length", "seed"]).loc[keep].reset_index()
    if not len(c):
        raise MissingInput(f"{CASES} (pattern {theirs})")
    return c


def _file_label() -> str:
    return router_label(name_sha256("smollm2-135m/needle-mix-budget"))


# ------------------------------------------------------------------------------------------
# the cap in every layer (c = 0.5)

@block("group-capacity-retrieval", CASES)
def group_capacity_retrieval() -> Generated:
    """The cap in every layer on the retrieval suite (``group_capacity.retrieval_rows``): per task
    and length, dense's score, hard top-2's and the cap's score relative to dense (paired 95%
    interval over cases) with their distant pairs kept, and the cap's answer log-prob minus hard
    top-2's (nats, paired over cases)."""
    from analyses.studies.group_capacity import retrieval_rows
    cases = _cases()
    r = retrieval_rows(cases)
    lines = ["| task | tokens | cases | dense score | hard top-2 | pairs | with the cap | pairs | cap - hard top-2 (nats) |",
             "|---|---:|---:|---:|---|---:|---|---:|---|"]
    for _, row in r.iterrows():
        lines.append(f"| {row['task']} | {row['tokens']} | {row['cases']} | {row['dense score']:.2f} | "
                     f"{row['hard_top2 vs dense']} | {row['hard_top2 pairs']:.2f} | {row['hard_top2_cap vs dense']} | "
                     f"{row['hard_top2_cap pairs']:.2f} | {row['cap - hard_top2 (nats)']} |")
    inputs = (f"{CASES} (hard top-2: pattern hard_top2_nocap; the cap: hard_top2_cap, c = 0.5 in every layer); routers "
              f"{case_routers(cases, ', ')}, whose tensors are needle-mix-budget's (hard_top2_nocap runs them without the "
              "capacity); every case both patterns ran")
    return Generated(inputs, "\n".join(lines))


@block("group-capacity-perplexity", LENGTH_CELLS)
def group_capacity_perplexity() -> Generated:
    """The cap in every layer on perplexity (table ``capacity``, ``group_capacity.perplexity_rows``):
    per corpus and length, hard top-2's and the cap's change over dense, the cap's paired change
    over hard top-2 (95% interval over windows), distant pairs kept and the largest group's share of
    the keys (mean over layers and windows), each without and with the cap."""
    from analyses.studies.group_capacity import perplexity_rows
    p = perplexity_rows(_cells("capacity"))
    lines = ["| corpus | tokens | windows | hard top-2 | with the cap | cap - hard top-2 (%) | pairs | largest group |",
             "|---|---:|---:|---:|---:|---|---|---|"]
    for _, r in p.iterrows():
        lines.append(f"| {CORPORA.get(r.corpus, r.corpus)} | {r.tokens} | {r.windows} | {r['hard_top2 vs dense %']:+.2f} | "
                     f"{r['hard_top2_cap vs dense %']:+.2f} | {r['cap - hard_top2 (%)']} | "
                     f"{r['hard_top2 pairs']:.2f} / {r['hard_top2_cap pairs']:.2f} | "
                     f"{r['hard_top2 largest group']:.2f} / {r['hard_top2_cap largest group']:.2f} |")
    inputs = (f"{LENGTH_CELLS} (table capacity); routers {_file_label()}; windows of 4096 and 8192 tokens as the "
              "table says; patterns dense, hard_top2, hard_top2_cap")
    return Generated(inputs, "\n".join(lines))


@block("group-capacity-sweep", LENGTH_CELLS)
def group_capacity_sweep() -> Generated:
    """Which capacity (tables ``capacity`` and ``capacity_sweep``, ``group_capacity.sweep_rows``): per
    technical corpus, hard top-2's change over dense, then each capacity's paired change over
    hard top-2 (%, 95% interval over windows; > 0: the cap is worse)."""
    from analyses.studies.group_capacity import SWEEP, SWEEP_TABLES, sweep_rows
    p = sweep_rows(_cells(*SWEEP_TABLES)).set_index("corpus")
    order = [d for d in ("python-docs", "man-pages", "debian-reference") if d in p.index]
    lines = ["| capacity c | " + " | ".join(CORPORA[d] for d in order) + " |", "|---|" + "---|" * len(order),
             "| none (hard top-2), change over dense | " + " | ".join(f"{p.loc[d, 'hard_top2 vs dense %']:+.2f}%"
                                                                  for d in order) + " |"]
    for pat in SWEEP:
        c = pat.removeprefix("hard_top2_cap")
        name = "0.5 (`_cap`)" if not c else f"0.{c[0]}"
        lines.append(f"| {name} | " + " | ".join(p.loc[d, f"{pat} - hard_top2 (%)"] for d in order) + " |")
    windows = sorted(set(p.windows))
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(SWEEP_TABLES)}); routers {_file_label()}; "
              f"{'/'.join(map(str, windows))} windows of 4096 tokens a corpus; patterns dense, hard_top2, "
              + ", ".join(SWEEP))
    return Generated(inputs, "\n".join(lines))


# ------------------------------------------------------------------------------------------
# the cap in some layers only, and evicting

def _probes(table: str, probes, extra=()) -> tuple[list[str], pd.DataFrame, list[str]]:
    """(columns, rows, corpora): each pattern's paired change over hard top-2 per corpus of
    ``table`` (``group_capacity.over_hard_top2``), on the corpora every probe ran on."""
    from analyses.studies.group_capacity import over_hard_top2
    p = over_hard_top2(_cells(table), tuple(probes) + tuple(extra)).set_index("pattern")
    cols = [c for c in p.columns if p.loc[list(probes), c].notna().all()]
    return cols, p, [c.split()[0] for c in cols]


def _layers(pattern: str) -> str:
    spec = pattern.split("@", 1)[1]
    parts = spec.replace("+", ", ").split(", ")
    word = "layer" if len(parts) == 1 and "-" not in parts[0] else "layers"
    return f"{word} {', '.join(parts)}"


@block("group-capacity-layer-probes", LENGTH_CELLS, CASES)
def group_capacity_layer_probes() -> Generated:
    """What the cap in one layer (or a few) costs (table ``capacity_layers``): each probe's paired
    change of perplexity over hard top-2 (%, 95% interval over 4 windows; > 0: the cap is worse);
    for the first set tried in full (with layer 14), its distant pairs on niah_single_1 (mean over
    the suite's 22 cases at 4096)."""
    from analyses.studies.group_capacity import LAYER_PROBES
    from focus_lab.eval.retrieval_tables import summary
    cols, p, corpora = _probes("capacity_layers", LAYER_PROBES, (S1,))
    s = summary(_study_cases(_cases(), S1)).set_index(["task", "length", "pattern"])
    lines = ["| the cap in | " + " | ".join(CORPORA[c] for c in corpora) + f" | {NOISE} pairs, 4096 |",
             "|---|" + "---|" * len(cols) + "---:|"]
    for pat, r in p.iterrows():
        where = _layers(pat) + (", c = 0.7" if pat.startswith("hard_top2_cap70") else "")
        if pat == S1:
            where += " (S with layer 14)"
            pairs = f"{s.loc[(NOISE, 4096, pat)].distant_pairs_kept:.2f}"
        else:
            pairs = "-"
        lines.append(f"| {where} | " + " | ".join(r[c] for c in cols) + f" | {pairs} |")
    inputs = (f"{LENGTH_CELLS} (table capacity_layers; the probes on {', '.join(corpora)}), {CASES} ({S1}); routers "
              f"{_file_label()}; 4 windows of 4096 tokens a corpus; c = 0.5 unless the row says")
    return Generated(inputs, "\n".join(lines))


@block("group-capacity-evict-layers", LENGTH_CELLS)
def group_capacity_evict_layers() -> Generated:
    """Where E's technical cost sits (table ``capacity_evict_layers``): eviction in one layer of E at
    a time, its paired change of perplexity over hard top-2 (%, 95% interval over 4 windows)."""
    from analyses.studies.group_capacity import EVICT_LAYER_PROBES
    cols, p, corpora = _probes("capacity_evict_layers", EVICT_LAYER_PROBES)
    lines = ["| evicting in | " + " | ".join(CORPORA[c] for c in corpora) + " |", "|---|" + "---|" * len(cols)]
    for pat, r in p.iterrows():
        lines.append(f"| {_layers(pat)} | " + " | ".join(r[c] for c in cols) + " |")
    inputs = (f"{LENGTH_CELLS} (table capacity_evict_layers); routers {_file_label()}; 4 windows of 4096 tokens a "
              "corpus; patterns dense, hard_top2, " + ", ".join(EVICT_LAYER_PROBES))
    return Generated(inputs, "\n".join(lines))


def _versus(pattern: str, table: str, tasks: tuple[tuple[str, int], ...]) -> Generated:
    """``pattern`` against hard top-2: the retrieval suite's ``tasks`` (score relative to dense with
    its paired 95% interval over cases; distant pairs kept, on niah_single_1 the mean and the case
    maximum; the answer log-prob's paired difference, nats) and perplexity on ``table``'s corpora
    (change over dense; pairs; the paired change over hard top-2 with its 95% interval over
    windows, > 0: worse)."""
    from analyses.length_table import paired_delta
    from analyses.studies.group_capacity import cells_with
    from focus_lab.eval.retrieval_tables import paired_difference, summary
    name = NAMES[pattern]
    cases = _study_cases(_cases(), pattern)
    s = summary(cases).set_index(["task", "length", "pattern"])
    lp = paired_difference(cases, pattern, "hard_top2", "answer_logprob").set_index(["task", "length"])
    lines = [f"| input | tokens | cases / windows | hard top-2 | {name} | pairs (hard top-2 / {name}) | "
             f"{name} - hard top-2 |", "|---|---:|---:|---|---|---|---|"]
    for task, L in tasks:
        if (task, L, pattern) not in s.index:
            raise MissingInput(f"{CASES} ({IN_CASES.get(pattern, pattern)} on {task} at {L})")
        h, x, d = s.loc[(task, L, "hard_top2")], s.loc[(task, L, pattern)], lp.loc[(task, L)]
        if task == NOISE:
            top = cases[(cases.task == task) & (cases.length == L) & (cases.pattern == pattern)].distant_pairs_kept.max()
            pairs = f"{h.distant_pairs_kept:.3f} / {x.distant_pairs_kept:.3f} [{top:.4f}]"
        else:
            pairs = f"{h.distant_pairs_kept:.2f} / {x.distant_pairs_kept:.2f}"
        lines.append(f"| {task} | {L} | {int(x.cases)} | {relative(h)} of dense | {relative(x)} | {pairs} | "
                     f"{d.difference:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}] nats |")
    rows = []
    for corpus, L, g in cells_with(_cells(table), ("dense", "hard_top2", pattern)):
        m, lo, hi = paired_delta(g, pattern, "hard_top2")
        rows.append((corpus != "austen", m if corpus != "austen" else L, corpus, L, g, m, lo, hi))
    for _, _, corpus, L, g, m, lo, hi in sorted(rows, key=lambda r: r[:2]):
        kept = lambda p: g[g.label == p].distant_pairs_kept.mean()  # noqa: E731
        lines.append(f"| {CORPORA.get(corpus, corpus)} | {L} | {g[g.label == pattern].window.nunique()} | "
                     f"{paired_delta(g, 'hard_top2', 'dense')[0]:+.2f}% | {paired_delta(g, pattern, 'dense')[0]:+.2f}% | "
                     f"{kept('hard_top2'):.2f} / {kept(pattern):.2f} | {m:+.2f}% [{lo:+.2f}, {hi:+.2f}] |")
    inputs = (f"{CASES} (hard top-2: hard_top2_nocap; {name}: {IN_CASES.get(pattern, pattern)}; routers "
              f"{case_routers(cases, ', ')}, every case the three patterns ran), {LENGTH_CELLS} (table {table}; routers "
              f"{_file_label()}; {pattern} against hard_top2)")
    return Generated(inputs, "\n".join(lines))


SUITE = ((NOISE, 4096), (NOISE, 8192), ("niah_single_2", 4096), ("passkey", 4096))


@block("group-capacity-s", LENGTH_CELLS, CASES)
def group_capacity_s() -> Generated:
    """The cap in the nine layers S against hard top-2 (``_versus``; table ``capacity_layers``)."""
    return _versus(S, "capacity_layers", SUITE)


@block("group-capacity-e", LENGTH_CELLS, CASES)
def group_capacity_e() -> Generated:
    """E (S without layer 0, keys over the cap evicted) against hard top-2 (``_versus``; table
    ``capacity_evict``)."""
    return _versus(E, "capacity_evict", SUITE)


@block("group-capacity-e7", LENGTH_CELLS, CASES)
def group_capacity_e7() -> Generated:
    """E7 (E without layer 24) against hard top-2 (``_versus``; table ``capacity_evict7``)."""
    return _versus(E7, "capacity_evict7", SUITE[:2])


def _answer(text: str) -> str:
    """The start of a continuation as the page quotes it: up to the first newline or end-of-turn
    token, at most 24 characters (then ``...``), a pipe escaped."""
    t = text.split("<|im_end|>")[0].split("\n")[0]
    t = t if len(t) <= 24 else t[:24].rstrip() + "..."
    return "`" + t.replace("|", "\\|") + "`"


@block("group-capacity-needles", CASES)
def group_capacity_needles() -> Generated:
    """The cases on which a capacity answers otherwise than hard top-2 or dense, per pattern, task
    and length of the study's suite (``SUITE``): the case's seed, the three scores, the pattern's answer against the expected one,
    and the answer's teacher-forced log-prob under hard top-2 and the pattern."""
    cases = _cases()
    lines = ["| pattern | task | tokens | seed | score: dense / hard top-2 / pattern | the pattern's answer | expected | "
             "answer log-prob: hard top-2 / pattern (nats) |", "|---|---|---:|---:|---|---|---|---|"]
    for pattern in ("hard_top2_cap", S1, S, E, E7):
        c = _study_cases(cases, pattern)
        key = ["task", "length", "seed"]
        w = c.pivot_table(index=key, columns="pattern", values="score")
        lp = c.pivot_table(index=key, columns="pattern", values="answer_logprob")
        rows = c[c.pattern == pattern].set_index(key)
        for (task, L, seed), r in w.iterrows():
            if (task, L) not in SUITE or r[pattern] == r["hard_top2"] == r["dense"]:
                continue
            x, at = rows.loc[(task, L, seed)], lp.loc[(task, L, seed)]
            lines.append(f"| {NAMES[pattern]} | {task} | {L} | {seed} | {r['dense']:.0f} / {r['hard_top2']:.0f} / "
                         f"{r[pattern]:.0f} | {_answer(x.continuation)} | `{x.expected}` | {at['hard_top2']:.2f} / "
                         f"{at[pattern]:.2f} |")
    inputs = (f"{CASES} (hard top-2: hard_top2_nocap; " + ", ".join(
        f"{NAMES[p]}: {IN_CASES.get(p, p)}" for p in ("hard_top2_cap", S1, S, E, E7))
              + f"); routers {case_routers(cases, ', ')}; " + ", ".join(f"{task} at {L}" for task, L in SUITE)
              + ", every case dense, hard top-2 and the pattern ran")
    return Generated(inputs, "\n".join(lines))


@block("group-capacity-other-tasks", CASES)
def group_capacity_other_tasks() -> Generated:
    """E7, shipped (``hard_top2`` of the committed cases), against hard top-2 without the capacity
    on the suite's other tasks and lengths: cases, dense's score, each one's mean score, distant
    pairs kept, and the answer log-prob's paired difference (nats, 95% interval over cases)."""
    from focus_lab.eval.retrieval_tables import paired_difference, summary
    cases = _study_cases(_cases(), E7)
    shown = {SUITE[0], SUITE[1]}  # E7's table above
    s = summary(cases).set_index(["task", "length", "pattern"])
    lp = paired_difference(cases, E7, "hard_top2", "answer_logprob").set_index(["task", "length"])
    lines = ["| task | tokens | cases | dense score | hard top-2 score | E7 score | pairs (hard top-2 / E7) | "
             "E7 - hard top-2, answer log-prob (nats) |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for (task, L), d in lp.sort_index().iterrows():
        if (task, L) in shown:
            continue
        h, x = s.loc[(task, L, "hard_top2")], s.loc[(task, L, E7)]
        lines.append(f"| {task} | {L} | {int(d.cases)} | {s.loc[(task, L, 'dense')].score:.2f} | {h.score:.2f} | "
                     f"{x.score:.2f} | {h.distant_pairs_kept:.2f} / {x.distant_pairs_kept:.2f} | "
                     f"{d.difference:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}] |")
    inputs = (f"{CASES} (hard top-2: hard_top2_nocap; E7: hard_top2, the shipped capacity); routers "
              f"{case_routers(cases, ', ')}; every case the three patterns ran, {NOISE}'s in E7's table above")
    return Generated(inputs, "\n".join(lines))
