"""docs/studies/group-capacity.md: a causal cap on group sizes (``FocusConfig.group_capacity``) in
every routed layer against hard top-2 of ``smollm2-135m/needle-mix-budget`` (the study's "hard
top-2"), on the retrieval suite (figures/results/retrieval_cases.parquet), on perplexity (tables
``capacity`` and ``capacity_sweep`` of length_cells.parquet) and in one forward per capacity
(figures/group-capacity/layers.parquet). The study's own reader, ``analyses.studies.group_capacity``,
makes the rows; this module lays them out, and holds what the page of the cap in some layers
(``analyses.blocks.group_capacity_layers``) shares with it.

Names: in the length cells the study's hard top-2 is ``hard_top2``; in the retrieval cases, made
with ``smollm2-135m/needle-mix-capacity`` (the same tensors with E7's capacity for top-2), it is
``hard_top2_nocap`` and E7 is ``hard_top2`` (``group_capacity.RETRIEVAL_LABELS``); the one-forward
rows ran with that file too, so hard top-2 is ``hard_top2_nocap`` there."""

from __future__ import annotations

import pandas as pd

from analyses.blocks.common import case_routers
from analyses.doc_blocks import LENGTH_CELLS, REPO, Generated, MissingInput, block, name_sha256, router_label

PAGE = "docs/studies/group-capacity.md"
PROSE_PAGES = (PAGE,)
#: the interval's level; the suite's bounds (at least 0.90 of dense's score at no more than 0.60
#: of the distant pairs)
ALLOWED = {PAGE: {"95%", "0.90", "0.60"}}

CASES = "figures/results/retrieval_cases.parquet"
LAYER_ROWS = "figures/group-capacity/layers.parquet"  # ``group_capacity --layers --save``: one forward per row
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
#: the one-forward inputs as the tables name them
INPUTS = {NOISE: f"{NOISE} (seed 0)", "man-pages:167": "man page 167", "debian-reference:2": "Debian Reference 2"}


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


SUITE = ((NOISE, 4096), (NOISE, 8192), ("niah_single_2", 4096), ("passkey", 4096))


def _answer(text: str) -> str:
    """The start of a continuation as the page quotes it: up to the first newline or end-of-turn
    token, at most 24 characters (then ``...``), a pipe escaped."""
    t = text.split("<|im_end|>")[0].split("\n")[0]
    t = t if len(t) <= 24 else t[:24].rstrip() + "..."
    return "`" + t.replace("|", "\\|") + "`"


def needles(patterns) -> Generated:
    """The cases on which a capacity of ``patterns`` answers otherwise than hard top-2 or dense, per
    pattern, task and length of the study's suite (``SUITE``): the case's seed, the three scores,
    the pattern's answer against the expected one, and the answer's teacher-forced log-prob under
    hard top-2 and the pattern (a pattern column only for more than one pattern)."""
    cases = _cases()
    many = len(patterns) > 1
    head, name, whose = ("| pattern ", "pattern", "the pattern") if many else ("", *[NAMES[patterns[0]]] * 2)
    lines = [head + f"| task | tokens | seed | score: dense / hard top-2 / {name} | {whose}'s answer | expected | "
             f"answer log-prob: hard top-2 / {name} (nats) |", ("|---" if many else "") + "|---|---:|---:|---|---|---|---|"]
    for pattern in patterns:
        c = _study_cases(cases, pattern)
        key = ["task", "length", "seed"]
        w = c.pivot_table(index=key, columns="pattern", values="score")
        lp = c.pivot_table(index=key, columns="pattern", values="answer_logprob")
        rows = c[c.pattern == pattern].set_index(key)
        for (task, L, seed), r in w.iterrows():
            if (task, L) not in SUITE or r[pattern] == r["hard_top2"] == r["dense"]:
                continue
            x, at = rows.loc[(task, L, seed)], lp.loc[(task, L, seed)]
            lines.append((f"| {NAMES[pattern]} " if many else "") +
                         f"| {task} | {L} | {seed} | {r['dense']:.0f} / {r['hard_top2']:.0f} / "
                         f"{r[pattern]:.0f} | {_answer(x.continuation)} | `{x.expected}` | {at['hard_top2']:.2f} / "
                         f"{at[pattern]:.2f} |")
    inputs = (f"{CASES} (hard top-2: hard_top2_nocap; " + ", ".join(
        f"{NAMES[p]}: {IN_CASES.get(p, p)}" for p in patterns)
              + f"); routers {case_routers(cases, ', ')}; " + ", ".join(f"{task} at {L}" for task, L in SUITE)
              + ", every case dense, hard top-2 and the pattern ran")
    return Generated(inputs, "\n".join(lines))


@block("group-capacity-needles", CASES)
def group_capacity_needles() -> Generated:
    """The cases on which the cap in every layer answers otherwise than hard top-2 or dense
    (``needles``)."""
    return needles(("hard_top2_cap",))


def layer_rows() -> pd.DataFrame:
    """The committed one-forward rows (``group_capacity --layers --save``), one per input and
    pattern (``group_capacity.layer_means``: pairs and largest group, mean over layers)."""
    from analyses.studies.group_capacity import layer_means
    path = REPO / LAYER_ROWS
    if not path.is_file():
        raise MissingInput(LAYER_ROWS)
    return layer_means(pd.read_parquet(path))


def pairs_grid(means: pd.DataFrame, patterns: dict, inputs, nd: int, first: str = "pattern") -> tuple[list[str], list[str]]:
    """(table lines, routers): one row per pattern of ``patterns`` (pattern -> row name), one column
    per input of ``inputs`` (``INPUTS``' names), the distant pairs kept (``nd`` decimals), ``-``
    where that pattern did not run on that input; raises MissingInput when a pattern ran nowhere."""
    m = means.set_index(["input", "pattern"])
    lines = [f"| {first} | " + " | ".join(INPUTS.get(i, i) for i in inputs) + " |", "|---|" + "---:|" * len(inputs)]
    for pattern, name in patterns.items():
        if not any((i, pattern) in m.index for i in inputs):
            raise MissingInput(f"{LAYER_ROWS} (pattern {pattern})")
        lines.append(f"| {name} | " + " | ".join(f"{m.loc[(i, pattern)].pairs:.{nd}f}" if (i, pattern) in m.index
                                                 else "-" for i in inputs) + " |")
    shas = sorted(set(means[means.pattern.isin(patterns)].routers_sha256))
    return lines, [router_label(x) for x in shas]


@block("group-capacity-capacities", LAYER_ROWS)
def group_capacity_capacities() -> Generated:
    """The distant pairs each capacity keeps in one forward (seed 0 of niah_single_1, the man-page
    window 167; 4096 tokens; mean over the routed layers), hard top-2 without a capacity first."""
    from analyses.studies.group_capacity import SWEEP
    pats = {"hard_top2_nocap": "none (hard top-2)",
            **{p: f"0.{p.removeprefix('hard_top2_cap')[:1]}" if p != "hard_top2_cap" else "0.5 (`_cap`)"
               for p in SWEEP}}
    lines, routers = pairs_grid(layer_rows(), pats, (NOISE, "man-pages:167"), 2, "capacity c")
    inputs = (f"{LAYER_ROWS} (patterns {', '.join(pats)}; one forward each, 4096 tokens, mean over the routed "
              f"layers); routers {', '.join(routers)}, hard_top2_nocap its tensors without a capacity")
    return Generated(inputs, "\n".join(lines))
