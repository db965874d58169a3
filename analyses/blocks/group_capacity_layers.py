"""docs/studies/group-capacity-layers.md: the group capacity in some layers only
(``FocusConfig.capacity_layers``): the cost of the cap layer by layer, the set S, which layer
loses the needles (``group_capacity --leave-one-out``), E (S without layer 0, the keys over the cap
evicted) and E7 (E without layer 24, the shipped file's capacity for top-2), against the study's
hard top-2, on the retrieval suite (figures/results/retrieval_cases.parquet), on perplexity (tables
``capacity_layers``, ``capacity_evict``, ``capacity_evict_layers``, ``capacity_evict7`` of
length_cells.parquet) and in one forward per row (figures/group-capacity/layers.parquet and
leave_one_out.parquet). Names and shared helpers: ``analyses.blocks.group_capacity``."""

from __future__ import annotations

import pandas as pd

from analyses.blocks.common import case_routers, relative
from analyses.blocks.group_capacity import (
    CASES,
    CORPORA,
    E7,
    IN_CASES,
    LAYER_ROWS,
    NAMES,
    NOISE,
    S1,
    SUITE,
    E,
    S,
    _cases,
    _cells,
    _file_label,
    _study_cases,
    layer_rows,
    needles,
    pairs_grid,
)
from analyses.doc_blocks import (
    LENGTH_CELLS,
    REPO,
    Generated,
    MissingInput,
    block,
    router_label,
)

PAGE = "docs/studies/group-capacity-layers.md"
PROSE_PAGES = (PAGE,)
#: the interval's level; the suite's bounds (at least 0.90 of dense's score at no more than 0.60
#: of the distant pairs)
ALLOWED = {PAGE: {"95%", "0.90", "0.60"}}

LOO_ROWS = "figures/group-capacity/leave_one_out.parquet"  # ``group_capacity --leave-one-out --save``
S_EVICT = "hard_top2_evict@0+13+15-16+21+24-25+28-29"  # S with the keys over the cap evicted
L8 = "13+15-16+21+24-25+28-29"  # S without layer 0: E's layers


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
    lines = ["| pattern | " + " | ".join(CORPORA[c] for c in corpora) + f" | {NOISE} pairs, 4096 |",
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


@block("group-capacity-evict-layers", LENGTH_CELLS, LAYER_ROWS)
def group_capacity_evict_layers() -> Generated:
    """Where E's technical cost sits (table ``capacity_evict_layers``): eviction in one layer of E at
    a time, its paired change of perplexity over hard top-2 (%, 95% interval over 4 windows), and the
    distant pairs it leaves on niah_single_1 in one forward (seed 0, 4096 tokens, mean over the
    routed layers; hard top-2's in the header)."""
    from analyses.studies.group_capacity import EVICT_LAYER_PROBES
    cols, p, corpora = _probes("capacity_evict_layers", EVICT_LAYER_PROBES)
    m = layer_rows()
    m = m[m.input == NOISE].set_index("pattern")
    missing = [x for x in ("hard_top2_nocap", *EVICT_LAYER_PROBES) if x not in m.index]
    if missing:
        raise MissingInput(f"{LAYER_ROWS} ({NOISE}: {', '.join(missing)})")
    lines = ["| evicting in | " + " | ".join(CORPORA[c] for c in corpora)
             + f" | {NOISE} pairs (seed 0; hard top-2 {m.loc['hard_top2_nocap'].pairs:.3f}) |",
             "|---|" + "---|" * len(cols) + "---:|"]
    for pat, r in p.iterrows():
        lines.append(f"| {_layers(pat)} | " + " | ".join(r[c] for c in cols) + f" | {m.loc[pat].pairs:.3f} |")
    shas = sorted(set(m.loc[["hard_top2_nocap", *EVICT_LAYER_PROBES]].routers_sha256))
    inputs = (f"{LENGTH_CELLS} (table capacity_evict_layers; routers {_file_label()}; 4 windows of 4096 tokens a "
              "corpus; patterns dense, hard_top2, " + ", ".join(EVICT_LAYER_PROBES) + f"), {LAYER_ROWS} (the same "
              f"patterns, hard top-2 as hard_top2_nocap; routers {', '.join(router_label(x) for x in shas)}; one "
              "forward each)")
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


@block("group-capacity-layers-needles", CASES)
def group_capacity_layers_needles() -> Generated:
    """The cases on which S with layer 14, S, E or E7 answers otherwise than hard top-2 or dense
    (``group_capacity.needles``)."""
    return needles((S1, S, E, E7))


@block("group-capacity-leave-one-out", LOO_ROWS)
def group_capacity_leave_one_out() -> Generated:
    """Which layer of S loses the needles (``group_capacity --leave-one-out``, one forward of prompt
    and answer per cell): the answer's teacher-forced log-prob (nats) on niah_single_1 at 8192, one
    row per seed and overflow (keys moved: S; evicted), under hard top-2, the pattern, and the
    pattern without each of its layers in turn (without 0 and evicting: E); ``-`` where that
    variant did not run."""
    path = REPO / LOO_ROWS
    if not path.is_file():
        raise MissingInput(LOO_ROWS)
    d = pd.read_parquet(path)
    d = d[d.pattern.isin([S, S_EVICT])]
    if set(d.pattern) != {S, S_EVICT}:
        raise MissingInput(f"{LOO_ROWS} (patterns {S}, {S_EVICT})")
    seeds = sorted(set(d.seed))
    at = d.set_index(["pattern", "variant", "seed"]).answer_logprob
    layers = sorted({int(v.split()[1]) for v in d.variant if v.startswith("without ")})
    cols = {"hard_top2_nocap": "hard top-2", "set": "all nine", **{f"without {l}": f"without {l}" for l in layers}}
    lines = ["| keys over the cap, seed | " + " | ".join(cols.values()) + " |", "|---|" + "---:|" * len(cols)]
    for p in (S, S_EVICT):
        for seed in seeds:
            cells = []
            for v in cols:
                key = (p, p if v == "set" else v, seed)
                cells.append(f"{at.loc[key]:.2f}" if key in at.index else "-")
            lines.append(f"| {'moved (S)' if p == S else 'evicted'}, {seed} | " + " | ".join(cells) + " |")
    L = sorted(set(d.length))
    inputs = (f"{LOO_ROWS} (patterns {S}, {S_EVICT}, each without one of its layers; hard top-2: hard_top2_nocap); "
              f"routers {', '.join(router_label(x) for x in sorted(set(d.routers_sha256)))}; {NOISE} at "
              f"{'/'.join(map(str, L))} tokens, seeds {', '.join(map(str, seeds))}; one forward of prompt and answer a cell")
    return Generated(inputs, "\n".join(lines))


@block("group-capacity-evict-capacity", LAYER_ROWS)
def group_capacity_evict_capacity() -> Generated:
    """Moving or evicting without layer 0, and E's capacity: the distant pairs each pattern keeps
    in one forward (seed 0 of niah_single_1, man page 167, Debian Reference window 2; 4096 tokens;
    mean over the routed layers), ``-`` where it did not run."""
    pats = {"hard_top2_nocap": "hard top-2", f"hard_top2_cap@{L8}": "S without layer 0, moved",
            S_EVICT: "S, evicted", E: "E (c = 0.5)", f"hard_top2_evict55@{L8}": "E at c = 0.55",
            f"hard_top2_evict60@{L8}": "E at c = 0.6", f"hard_top2_evict70@{L8}": "E at c = 0.7",
            "hard_top2_evict@13+15-16+21+25+28": "evicted in 13, 15, 16, 21, 25, 28"}
    lines, routers = pairs_grid(layer_rows(), pats, (NOISE, "man-pages:167", "debian-reference:2"), 3)
    inputs = (f"{LAYER_ROWS} (patterns {', '.join(pats)}; one forward each, 4096 tokens, mean over the routed "
              f"layers); routers {', '.join(routers)}, hard_top2_nocap its tensors without a capacity")
    return Generated(inputs, "\n".join(lines))
