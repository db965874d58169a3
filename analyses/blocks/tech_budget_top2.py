"""docs/studies/tech-budget-top2.md: a top-2 budget chosen on technical training text for the shipped
tensors. The sweep (study ``top2_tech`` of layer_budget.parquet, pooled with the literary ``top2``),
its two allocations measured with the length table's protocol (tables ``tech_budget_*``,
``pooled_budget_*`` of length_cells.parquet) against the shipped budget, with token-match pairs
(``tech_budget_match_domains``), and the passkey probe under the ``pooled`` budget
(passkey_cases.parquet)."""

from __future__ import annotations

import json

import pandas as pd

from analyses.blocks.common import margin, over_dense, paired, table_router, windows_a_domain
from analyses.blocks.tech_budget_top1 import LAYER_BUDGET, sweep_block
from analyses.doc_blocks import (LENGTH_CELLS, PASSKEY_CASES, PASSKEY_TABLES, REPO, Generated, MissingInput, _Cells,
                                 block, router_label)

PAGE = "docs/studies/tech-budget-top2.md"
PROSE_PAGES = (PAGE,)
#: the interval's level (a setting) and the criteria of docs/recipes.md (top-2 within +1.5% of dense,
#: a margin of 2% over random groups)
ALLOWED = {PAGE: {"95%", "+1.5%", "2%"}}

DOMAINS = ("python-docs", "man-pages", "debian-reference")
#: (row name, corpus, length, the shipped budget's table, the tech budget's, the pooled budget's)
TEXTS = [(d, d, 4096, "shipped_per_domain", "tech_budget_domains", "pooled_budget_domains") for d in DOMAINS] + [
    (f"*Persuasion* {L}", "austen", L, "shipped", "tech_budget_persuasion", "pooled_budget_persuasion")
    for L in (4096, 8192)] + [
    (f"*Hamlet* {L}", "shakespeare", L, "shipped", None, "pooled_budget_hamlet") for L in (4096, 8192)]
MATCH_TECH, MATCH_SHIPPED = "tech_budget_match_domains", "match_per_domain"
PASSKEY_POOLED = ("pooled_budget_4k", "pooled_budget_4k_seeds6-11")
PASSKEY_SHIPPED = ("shipped_4k_budget_top2", "shipped_4k_budget_top2_seeds6-11")  # the shipped tensors and budget


@block("tech-budget-top2-sweep", LAYER_BUDGET)
def tech_budget_top2_sweep() -> Generated:
    """The top-2 sweep on technical text (``tech_budget_top1.sweep_block``)."""
    return sweep_block("top2_tech", "top2", 2)


@block("tech-budget-top2", LENGTH_CELLS)
def tech_budget_top2() -> Generated:
    """Per text: hard top-2 over dense [distant pairs kept] and the router's margin over random
    groups under the shipped budget; under each technical budget the same, with the paired change
    against the shipped budget and its 95% interval over windows (< 0: better)."""
    c = _Cells()
    lines = ["| text | windows | shipped budget: top-2 [pairs], over random | `tech`: top-2 [pairs], paired change, "
             "over random | `pooled`: top-2 [pairs], paired change, over random |", "|---|---:|---|---|---|"]
    for name, d, L, base, tech, pooled in TEXTS:
        top2 = lambda t: over_dense(c, t, d, L, "hard_top2", ci=False)  # noqa: E731
        cells = [str(int(c.summary(pooled, d, L, "dense").windows)), f"{top2(base)}, {margin(c, base, d, L, 'random_top2')}"]
        for t in (tech, pooled):
            if t is None:
                cells.append("")
                continue
            cells.append(f"{top2(t)}, {paired(c, (t, 'hard_top2'), (base, 'hard_top2'), d, L)}, "
                         f"{margin(c, t, d, L, 'random_top2')}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    tables = ["tech_budget_domains", "tech_budget_persuasion", "pooled_budget_domains", "pooled_budget_persuasion",
              "pooled_budget_hamlet"]
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(tables)} against shipped_per_domain and shipped); routers "
              f"tech {table_router(c, 'tech_budget_domains')}, pooled {table_router(c, 'pooled_budget_domains')}, "
              f"shipped {table_router(c, 'shipped')}; the windows the table's column says; patterns dense, "
              "hard_top2, random_top2 (each under the file's top-2 budget)")
    return Generated(inputs, "\n".join(lines))


@block("tech-budget-top2-random", LENGTH_CELLS)
def tech_budget_top2_random() -> Generated:
    """Random groups under each technical budget, paired against random groups under the shipped
    budget, with the 95% interval over windows (< 0: the budget helps them too)."""
    c = _Cells()
    lines = ["| text | `tech` | `pooled` |", "|---|---|---|"]
    for name, d, L, base, tech, pooled in TEXTS:
        cells = ["" if t is None else paired(c, (t, "random_top2"), (base, "random_top2"), d, L) for t in (tech, pooled)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    inputs = (f"{LENGTH_CELLS} (the tables of tech-budget-top2); pattern random_top2 under each budget, paired on the "
              "windows both tables have")
    return Generated(inputs, "\n".join(lines))


@block("tech-budget-top2-match", LENGTH_CELLS)
def tech_budget_top2_match() -> Generated:
    """With token-match pairs (match shifts 0-1): hard top-2 under the ``tech`` budget over dense
    [distant pairs kept], the paired change against the shipped budget with the same pairs (95%
    interval over windows), and the router's margin over random groups with the same budget and
    pairs."""
    c = _Cells()
    lines = ["| text | `tech` with the pairs: top-2 [pairs] | paired change against the shipped budget with the pairs "
             "| over random, with the pairs |", "|---|---|---|---|"]
    for d in DOMAINS:
        lines.append(f"| {d} | {over_dense(c, MATCH_TECH, d, 4096, 'hard_top2', ci=False)} | "
                     f"{paired(c, (MATCH_TECH, 'hard_top2'), (MATCH_SHIPPED, 'hard_top2'), d, 4096)} | "
                     f"{c.margin(MATCH_TECH, d, 4096, 'random_top2'):+.2f}% |")
    inputs = (f"{LENGTH_CELLS} (tables {MATCH_TECH} against {MATCH_SHIPPED}); routers tech "
              f"{table_router(c, MATCH_TECH)}, shipped {table_router(c, MATCH_SHIPPED)}; "
              f"{windows_a_domain(c, MATCH_TECH, DOMAINS)}; patterns dense, hard_top2, random_top2, "
              "each with the token-match pairs")
    return Generated(inputs, "\n".join(lines))


@block("tech-budget-top2-passkey", PASSKEY_CASES, PASSKEY_TABLES)
def tech_budget_top2_passkey() -> Generated:
    """Passkey at 4096 tokens under the ``pooled`` budget and under the shipped budget (the shipped
    tensors under their top-2 budget), hard top-2: keys found, of the keys dense finds on the same
    cases how many it keeps, mean key log-prob (nats), distant pairs kept. Dense from the other
    committed tables with the same prompt settings (the first by name gives a case's row, as
    ``focus_lab.eval.committed.committed_passkey`` does)."""
    from focus_lab.eval.committed import PASSKEY_CASE, PASSKEY_SAME_PROMPT, passkey_summary
    meta = json.loads((REPO / PASSKEY_TABLES).read_text())
    missing = [t for t in (*PASSKEY_POOLED, *PASSKEY_SHIPPED) if t not in meta]
    if missing:
        raise MissingInput(f"{PASSKEY_TABLES} (tables {', '.join(missing)})")
    df = pd.read_parquet(REPO / PASSKEY_CASES)

    def prompt(t: str) -> dict:
        return {k: meta[t].get("settings", {}).get(k) for k in PASSKEY_SAME_PROMPT}
    columns = {"`pooled` budget": PASSKEY_POOLED, "shipped budget": PASSKEY_SHIPPED}
    mine = {name: df[df.table.isin(ts) & (df.pattern == "hard_top2")] for name, ts in columns.items()}
    keys = mine["`pooled` budget"][PASSKEY_CASE].drop_duplicates()
    others = [t for t in sorted(meta) if t not in PASSKEY_POOLED and prompt(t) == prompt(PASSKEY_POOLED[0])]
    dense = df[df.table.isin(others) & (df.pattern == "dense")]
    dense = (dense.assign(_o=dense.table.map(others.index)).sort_values("_o", kind="stable").drop(columns="_o")
             .merge(keys, on=PASSKEY_CASE).drop_duplicates(PASSKEY_CASE))
    if len(dense) != len(keys):
        raise MissingInput(f"{PASSKEY_CASES} (dense rows of the {len(keys)} cases of {PASSKEY_POOLED[0]})")
    s = passkey_summary(pd.concat([dense] + [r.assign(pattern=n) for n, r in mine.items()], ignore_index=True))
    s = s.set_index("pattern")
    lines = ["| hard top-2, 4096 tokens | found | of dense's | key log-prob | distant pairs kept |", "|---|---:|---:|---:|---:|"]
    for name in columns:
        r = s.loc[name]
        lines.append(f"| {name} | {r.hits} of {r.cases} | {r.dense_hits_kept} of {r.dense_hits} | {r.key_logprob:.2f} | "
                     f"{r.distant_pairs_kept:.3f} |")
    d = s.loc["dense"]
    lines.append(f"| dense | {d.hits} of {d.cases} | | {d.key_logprob:.2f} | |")
    seeds = sorted(keys.seed.unique())
    inputs = (f"{PASSKEY_CASES} with {PASSKEY_TABLES} (tables {', '.join(PASSKEY_POOLED)}; shipped budget "
              f"{', '.join(PASSKEY_SHIPPED)}; dense: tables {', '.join(dict.fromkeys(dense.table))}); routers pooled "
              f"sha256 {meta[PASSKEY_POOLED[0]]['settings']['routers']['sha256'][:12]}, shipped tensors "
              f"{router_label(meta[PASSKEY_SHIPPED[0]]['settings']['routers']['sha256'])} under the top-2 budget; "
              f"{len(keys)} cases: case seeds {seeds[0]}-{seeds[-1]} x depths "
              f"{', '.join(f'{x:g}' for x in sorted(keys.depth.unique()))}")
    return Generated(inputs, "\n".join(lines))
