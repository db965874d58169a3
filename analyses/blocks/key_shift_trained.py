"""docs/studies/key-shift-trained.md's tables: routers trained with the key shift (`T`), under the
shipped top-2 budget, under both budgets (the `pooled` top-2 budget and the top-1 budget), and
under the shipped top-2 budget with the top-1 budget (a second training run): change over dense,
paired changes against the file before, the router's margins, and the passkey probe."""

from __future__ import annotations

from analyses.blocks.common import (TECH, margin, over_dense, paired, passkey, passkey_cell, passkey_inputs,
                                    routers_of, text, windows_of)
from analyses.doc_blocks import LENGTH_CELLS, PASSKEY_CASES, PASSKEY_TABLES, Generated, _Cells, block

PAGE = "docs/studies/key-shift-trained.md"
PROSE_PAGES = (PAGE,)
#: settings and criteria: the interval's level, the criteria's top-2 bar and retrieval bar (docs/recipes.md)
ALLOWED = {PAGE: {"95%", "90%", "+1.5%"}}

ROWS = [(d, 4096) for d in TECH] + [("austen", 4096), ("austen", 8192)]
TRAINED = {"domains": "keyshift_trained_domains", "persuasion": "keyshift_trained_persuasion"}
BUDGETS = {"domains": "keyshift_budgets_domains", "persuasion": "keyshift_budgets_persuasion"}
SHIFT = {"domains": "keyshift_domains", "persuasion": "keyshift_persuasion"}
TOP1 = "keyshift_top1_budget_domains"
PASSKEY_T = ("keyshift_trained_4k", "keyshift_trained_4k_seeds6-11")
PASSKEY_B = ("keyshift_budgets_4k", "keyshift_budgets_4k_seeds6-11")


def _kind(corpus: str) -> str:
    return "persuasion" if corpus == "austen" else "domains"


@block("key-shift-trained", LENGTH_CELLS, PASSKEY_CASES, PASSKEY_TABLES)
def key_shift_trained() -> Generated:
    """Three tables, one per file made from `T`, and the passkey rows: per text, hard top-1 / top-2
    (with the shift) over dense [pairs kept], each paired against the file it is compared with
    (the shipped file with the shift; `T` under the shipped budget; for the third file, the file
    with both budgets at top-1 and `T` at top-2), and the router's margin over random groups under
    the same budget and shift."""
    c = _Cells()
    t1, t2, r1, r2 = "hard_top1_keyshift", "hard_top2_keyshift", "random_top1_keyshift", "random_top2_keyshift"
    head = "| text | windows | top-1 | paired change | top-2 | paired change | {} |"
    rule = "|---|---:|---|---|---|---|---|"

    def line(table, against1, against2, corpus, L, lead):
        n = int(c.summary(table, corpus, L, "dense").windows)
        return (f"| {text(corpus, L)} | {n} | {over_dense(c, table, corpus, L, t1)} | "
                f"{paired(c, (table, t1), (against1, t1), corpus, L)} | {over_dense(c, table, corpus, L, t2)} | "
                f"{paired(c, (table, t2), (against2, t2), corpus, L)} | {lead} |")

    def leads(table, corpus, L):
        top1 = margin(c, table, corpus, L, r1) if (c.cells[(c.cells["table"] == table) & (c.cells.label == r1)
                                                          & (c.cells.corpus == corpus)].size) else "-"
        return f"{top1} / {margin(c, table, corpus, L, r2)}"

    lines = ["**`T`, shipped top-2 budget** (tables `keyshift_trained_domains`, `keyshift_trained_persuasion`; "
             "paired against the shipped file with the shift, tables `keyshift_domains`, `keyshift_persuasion`):", "",
             head.format("router over random, top-2"), rule]
    for corpus, L in ROWS:
        k = _kind(corpus)
        lines.append(line(TRAINED[k], SHIFT[k], SHIFT[k], corpus, L, margin(c, TRAINED[k], corpus, L, r2)))
    lines += ["", "**`T`, both budgets** (tables `keyshift_budgets_domains`, `keyshift_budgets_persuasion`; paired "
              "against `T` under the shipped top-2 budget, the table above):", "",
              head.format("router over random, top-1 / top-2"), rule]
    for corpus, L in ROWS:
        k = _kind(corpus)
        lines.append(line(BUDGETS[k], TRAINED[k], TRAINED[k], corpus, L, leads(BUDGETS[k], corpus, L)))
    lines += ["", "**`T`, shipped top-2 budget and the top-1 budget** (table `keyshift_top1_budget_domains`, a "
              "second training run; top-1 paired against `T` with both budgets, top-2 against `T` under the "
              "shipped top-2 budget):", "", head.format("router over random, top-1 / top-2"), rule]
    for d in TECH:
        lines.append(line(TOP1, BUDGETS["domains"], TRAINED["domains"], d, 4096, leads(TOP1, d, 4096)))
    lines += ["", "Passkey at 4096 tokens (exact matches / cases, of the keys dense retrieves those kept, mean key "
              "log-prob in nats [distant pairs kept]):", "", "| file | pattern | passkey |", "|---|---|---|",
              f"| `T`, shipped top-2 budget | hard top-2, keyshift | {passkey_cell(passkey(PASSKEY_T, t2))} |",
              f"| `T`, both budgets | hard top-2 (the file's shift and budgets) | "
              f"{passkey_cell(passkey(PASSKEY_B, 'hard_top2'))} |"]
    tables = [*TRAINED.values(), *BUDGETS.values(), TOP1, *SHIFT.values()]
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(tables)}); routers {routers_of(c, tables)}; "
              f"{windows_of(c, tables)}; patterns dense, hard_top1_keyshift, hard_top2_keyshift, random_top1_keyshift, "
              f"random_top2_keyshift; {passkey_inputs(PASSKEY_T + PASSKEY_B)}")
    return Generated(inputs, "\n".join(lines))
