"""docs/studies/layer-top-k.md's tables: a per-layer k (``--layer-top-k``, the budgets of
``analyses.studies.layer_budget``) against uniform top-1 / top-2 at the same mean sparsity, on the
novels and the held-out technical domains, with random groups under the same budget, and the
passkey probe under each."""

from __future__ import annotations

from analyses.blocks.common import (TECH, margin, over_dense, paired, passkey, passkey_cell, passkey_inputs,
                                    routers_of, text, windows_of)
from analyses.doc_blocks import LENGTH_CELLS, PASSKEY_CASES, PASSKEY_TABLES, Generated, _Cells, block

PAGE = "docs/studies/layer-top-k.md"
PROSE_PAGES = (PAGE,)
#: settings and criteria: the interval's level, the rule's margin over random groups (docs/recipes.md)
ALLOWED = {PAGE: {"95%", "3%"}}

#: top-1: (budget table, uniform table, corpus, length)
TOP1 = ([("shipped_budget_top1", "shipped", "austen", L) for L in (4096, 8192)]
        + [("shipped_budget_top1_hamlet", "shipped", "shakespeare", L) for L in (4096, 8192)]
        + [("shipped_budget_top1_domains", "shipped_per_domain", d, 4096) for d in TECH])
#: top-2: (budget table, uniform table, corpus, length); the same tensors at uniform top-2
TOP2 = ([("shipped_budget_top2_domains", "shipped_domains", d, 4096) for d in TECH]
        + [("shipped_budget_top2_persuasion", "shipped_uniform", "austen", L) for L in (4096, 8192)])
PASSKEY_BUDGET = ("shipped_4k_budget_top2", "shipped_4k_budget_top2_seeds6-11")
PASSKEY_UNIFORM = ("shipped_4k", "shipped_4k_seeds6-11")


def _has(c: _Cells, table: str, corpus: str, L: int, label: str) -> bool:
    g = c.cells
    return bool(((g["table"] == table) & (g.corpus == corpus) & (g.seq_len == L) & (g.label == label)).any())


def _row(c: _Cells, t: str, u: str, corpus: str, L: int, k: int) -> str:
    """A text's row at top-``k``: the budget's table ``t`` against uniform top-k's ``u`` ("-" where
    a table has no random groups; the uniform top-1 cell without its pairs kept)."""
    hard, rnd = f"hard_top{k}", f"random_top{k}"
    mine, uniform = _has(c, t, corpus, L, rnd), _has(c, u, corpus, L, rnd)
    cells = [text(corpus, L), str(int(c.summary(t, corpus, L, "dense").windows)),
             over_dense(c, u, corpus, L, hard, kept=k > 1, ci=False), over_dense(c, t, corpus, L, hard),
             paired(c, (t, hard), (u, hard), corpus, L),
             paired(c, (t, rnd), (u, rnd), corpus, L) if mine and uniform else "-",
             margin(c, t, corpus, L, rnd, ci=True) if mine else "-",
             margin(c, u, corpus, L, rnd) if uniform else "-"]
    return "| " + " | ".join(cells) + " |"


@block("layer-top-k", LENGTH_CELLS, PASSKEY_CASES, PASSKEY_TABLES)
def layer_top_k() -> Generated:
    """Top-1 budget and top-2 budget tables: per text, uniform top-k and the budget over dense
    [pairs kept], the budget paired against uniform top-k on the same windows, random groups under
    the same budget (paired against uniform random groups; the router's margin over them), and
    the router's margin under uniform top-k ("-": not measured); then the passkey probe."""
    c = _Cells()
    lines = ["**Top-1 budget** (tables `shipped_budget_top1`, `shipped_budget_top1_hamlet`, "
             "`shipped_budget_top1_domains`; uniform top-1: tables `shipped`, `shipped_per_domain`):", "",
             "| text | windows | uniform top-1 | top-1 budget | paired change | random top-1, same budget: paired change "
             "| router over random, same budget | router over random, uniform |",
             "|---|---:|---|---|---|---|---|---|"]
    lines += [_row(c, t, u, corpus, L, 1) for t, u, corpus, L in TOP1]
    lines += ["", "**Top-2 budget** (tables `shipped_budget_top2_domains`, `shipped_budget_top2_persuasion`; the same "
              "tensors at uniform top-2: tables `shipped_domains`, `shipped_uniform`):", "",
              "| text | windows | uniform top-2 | per-layer k | paired change | random top-2, same per-layer k: paired "
              "change | router over random, same per-layer k | router over random, uniform |",
              "|---|---:|---|---|---|---|---|---|"]
    lines += [_row(c, t, u, corpus, L, 2) for t, u, corpus, L in TOP2]
    lines += ["", "Passkey at 4096 tokens, the tensors of `smollm2-135m/soup` (exact matches / cases, of the keys "
              "dense retrieves those kept, mean key log-prob in nats [distant pairs kept]):", "",
              "| hard top-2 | tables | passkey |", "|---|---|---|",
              f"| top-2 budget | {', '.join(PASSKEY_BUDGET)} | {passkey_cell(passkey(PASSKEY_BUDGET, 'hard_top2'))} |",
              f"| uniform top-2 | {', '.join(PASSKEY_UNIFORM)} | {passkey_cell(passkey(PASSKEY_UNIFORM, 'hard_top2'))} |"]
    tables = list(dict.fromkeys([r[0] for r in TOP1 + TOP2] + [r[1] for r in TOP1 + TOP2]))
    specs = sorted({s for s in c.cells.loc[c.cells["table"].isin([r[0] for r in TOP1 + TOP2]), "layer_top_k"] if s})
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(tables)}); routers {routers_of(c, tables)}; "
              f"{windows_of(c, tables, {(r[2], r[3]) for r in TOP1 + TOP2})}; "
              f"patterns dense, hard_top1, hard_top2, random_top1, random_top2; per-layer k {' and '.join(specs)}; "
              f"{passkey_inputs(PASSKEY_BUDGET + PASSKEY_UNIFORM)}")
    return Generated(inputs, "\n".join(lines))
