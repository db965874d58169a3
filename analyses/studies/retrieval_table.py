"""The retrieval suite's result table (docs/results.md, docs/studies/retrieval-suite.md) from a suite
output: per task and length, dense's score and each pattern's score relative to dense with the
paired 95% interval over cases, the change of the answers' log-prob (nats), distant pairs kept; then
the router against random groups (paired over cases) and the heads a failing pattern dropped.

    python -m analyses.studies.retrieval_table [--cases figures/results/retrieval_cases.parquet]
    python -m analyses.studies.retrieval_table --add runs/retrieval --device "2-core AMD EPYC CPU (fp32)"
    python -m analyses.studies.retrieval_table --results     # docs/results.md's table
    python -m analyses.studies.retrieval_table --results --write   # ... written into the page

``--add`` merges a suite output (also one stopped early: its per-case files) into the two
tables first, labelled with ``--device``; a (task, length, seed, pattern) the tables already hold
keeps its row (``retrieval_tables.merge_suites``). ``--drop PATTERN`` first removes a pattern's rows
from both tables (rows measured by an earlier protocol), so the ``--add`` runs give them anew:

    python -m analyses.studies.retrieval_table --drop shuffled_top2 --add runs/retrieval_cpu4k_s --device "..."

``--rename OLD=NEW`` (repeatable, in order) relabels a pattern's rows in both tables after any
merge, when the router file starts to carry an option (``retrieval_tables.rename_patterns``): the
shipped file's group capacity (docs/method.md §2.9) was written with

    python -m analyses.studies.retrieval_table --rename hard_top2=hard_top2_nocap \
        --rename hard_top2_match=hard_top2_match_nocap --rename hard_top2_evict@13+15-16+21+25+28-29=hard_top2
"""

from __future__ import annotations

import argparse

import pandas as pd

from focus_lab.eval.retrieval_tables import (failures, merge_suites, paired_difference, read_suite,
                                             rename_patterns, retrieval_heads, summary)


def _relative(r) -> str:
    """A summary row's score relative to dense, ``ratio [lo, hi]`` (the ratio alone on one case)."""
    return f"{r.relative:.2f} [{r.relative_lo:.2f}, {r.relative_hi:.2f}]" if r.cases > 1 else f"{r.relative:.2f}"


def markdown(cases: pd.DataFrame) -> str:
    """The study's table as markdown (docs/studies/retrieval-suite.md): one row per (task, length),
    per length the tasks dense scores at least 50% on first; one cell per pattern
    ``ratio [lo, hi], Δlogprob [distant pairs kept]`` (ratio: mean score over dense's on the cases
    both ran; ``-`` where dense is below 50%), with ``(n=N)`` where the pattern ran on fewer cases
    than dense."""
    s = summary(cases)
    pats = [p for p in dict.fromkeys(s["pattern"]) if p != "dense"]
    lines = ["| task | tokens | cases | dense | " + " | ".join(pats) + " |",
             "|---|---:|---:|---:|" + "---|" * len(pats)]
    groups = list(s.groupby(["task", "length"], sort=False))
    dense = {k: g.set_index("pattern").loc["dense"] for k, g in groups}
    for (task, L), g in sorted(groups, key=lambda kg: (kg[0][1], bool(dense[kg[0]].dense_below_half))):
        g, d = g.set_index("pattern"), dense[(task, L)]
        cells = []
        for p in pats:
            if p not in g.index:
                cells.append("")
                continue
            r = g.loc[p]
            rel = "-" if d.dense_below_half else _relative(r)
            n = f" (n={int(r.cases)})" if r.cases != d.cases else ""
            cells.append(f"{rel}, {r.logprob_change:+.1f} [{r.distant_pairs_kept:.2f}]{n}")
        lines.append(f"| {task} | {L} | {int(d.cases)} | {d.score:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: the results page's columns (docs/results.md, "Retrieval beyond passkey"): (pattern, header)
RESULTS_PATTERNS = (("hard_top2", "hard top-2"), ("random_top2", "random top-2"), ("shuffled_top2", "shuffled top-2"),
                    ("hard_top1", "hard top-1"), ("hard_top2_nocap", "hard top-2 without the capacity"))


def results_markdown(cases: pd.DataFrame) -> str:
    """The results page's table (docs/results.md): one row per (task, length) where dense scores at
    least 50%, by length then the suite's task order; per pattern of ``RESULTS_PATTERNS``
    ``ratio [lo, hi], Δlogprob`` (score relative to dense with its paired interval over cases,
    the mean change of the answers' log-prob in nats), ``(N cases)`` where the pattern ran on
    fewer cases than dense."""
    from focus_lab.eval.retrieval import TASKS
    s = summary(cases)
    order = {t: i for i, t in enumerate(TASKS)}
    lines = ["| task | tokens | cases | dense score | " + " | ".join(h for _, h in RESULTS_PATTERNS) + " |",
             "|---|---:|---:|---:|" + "---|" * len(RESULTS_PATTERNS)]
    keys = sorted({(int(L), t) for t, L in zip(s["task"], s["length"])}, key=lambda k: (k[0], order.get(k[1], 99)))
    for L, task in keys:
        g = s[(s["task"] == task) & (s["length"] == L)].set_index("pattern")
        if "dense" not in g.index or g.loc["dense"].dense_below_half:
            continue
        d, cells = g.loc["dense"], []
        for p, _ in RESULTS_PATTERNS:
            if p not in g.index:
                cells.append("")
                continue
            r = g.loc[p]
            n = f" ({int(r.cases)} cases)" if r.cases != d.cases else ""
            cells.append(f"{_relative(r)}, {r.logprob_change:+.1f}{n}")
        lines.append(f"| {task} | {L} | {int(d.cases)} | {d.score:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: the first line of the results page's retrieval table (its header), which ``replace_results_table`` finds
RESULTS_HEADER = "| task | tokens | cases | dense score | "


def replace_results_table(page: str, table: str) -> str:
    """``page`` (docs/results.md's text) with its retrieval table, the block of lines from the one
    starting with ``RESULTS_HEADER`` to the next blank line, replaced by ``table``.

    Raises:
        ValueError: the page holds no such table, or more than one.
    """
    if page.count(RESULTS_HEADER) != 1:
        raise ValueError(f"docs/results.md holds {page.count(RESULTS_HEADER)} tables starting with "
                         f"{RESULTS_HEADER.strip()!r}, not one: put the table back by hand, then rerun")
    i = page.index(RESULTS_HEADER)
    j = page.find("\n\n", i)
    return page[:i] + table + (page[j:] if j >= 0 else "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="figures/results/retrieval_cases.parquet")
    ap.add_argument("--trace", default="figures/results/retrieval_trace.parquet")
    ap.add_argument("--add", action="append", default=[], metavar="DIR",
                    help="a `focus-lab probe retrieval` --out folder to merge into --cases and --trace first")
    ap.add_argument("--device", default="", help="the machine the --add runs ran on (the tables' device column)")
    ap.add_argument("--drop", action="append", default=[], metavar="PATTERN",
                    help="remove this pattern's rows from --cases and --trace before merging (needs --add)")
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                    help="relabel a pattern's rows in --cases and --trace (after any --add), in order")
    ap.add_argument("--results", action="store_true", help="print only the results page's table (docs/results.md)")
    ap.add_argument("--write", action="store_true", help="with --results: write the table into docs/results.md")
    a = ap.parse_args()
    if a.write and not a.results:
        ap.error("--write needs --results (it writes the results page's table)")
    if a.drop and not a.add:
        ap.error("--drop needs --add: the runs that give the dropped pattern's rows anew")
    pairs = [tuple(r.split("=", 1)) for r in a.rename]
    if any(len(p) != 2 or not all(p) for p in pairs):
        ap.error("--rename takes OLD=NEW, e.g. hard_top2=hard_top2_nocap")
    if a.add and not a.device:
        ap.error("--add needs --device (the machine the run ran on, e.g. '2-core AMD EPYC CPU (fp32)')")
    if a.add or pairs:  # merge and rename in memory, then write both tables: a refused rename writes nothing
        from focus_lab.io import write_parquet
        tables = {}
        for kind, path in (("cases", a.cases), ("trace", a.trace)):
            new = [read_suite(d, kind).assign(device=a.device) for d in a.add]
            tables[path] = merge_suites([pd.read_parquet(path), *new], kind, drop=a.drop)
        try:
            tables = {path: rename_patterns(t, pairs) for path, t in tables.items()}
        except ValueError as e:
            raise SystemExit(str(e))
        for path, t in tables.items():
            write_parquet(path, t)
            print(f"{path}: {len(t)} rows" + (f"; renamed {', '.join(f'{o} -> {n}' for o, n in pairs)}" if pairs else ""))
    cases = pd.read_parquet(a.cases)
    if a.results:
        table = results_markdown(cases)
        print(table)
        if a.write:
            from pathlib import Path
            from focus_lab.io import atomic_path
            page = Path(__file__).resolve().parents[2] / "docs" / "results.md"
            try:
                text = replace_results_table(page.read_text(), table)
            except ValueError as e:
                raise SystemExit(str(e))
            with atomic_path(page) as tmp:
                tmp.write_text(text)
            print(f"written into {page}")
        return
    print(markdown(cases))
    print()
    for col in ("score", "answer_logprob"):
        print(paired_difference(cases, "hard_top2", "random_top2", col).round(3).to_string(index=False))
    trace = pd.read_parquet(a.trace)
    f = failures(cases, trace)
    if len(f):
        print()
        print(f.round(3).to_string(index=False))
    h = retrieval_heads(trace)
    print()
    print(h[h.retrieval_head].groupby(["task", "length"]).size().to_string())


if __name__ == "__main__":
    main()
