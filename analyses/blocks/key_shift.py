"""docs/studies/key-shift.md's tables: the shipped file with ``FocusConfig.key_shift = 1`` (the
pattern suffix ``_keyshift``) on held-out text, the paired change the shift makes, the `pooled`
top-2 budget with the shift, and the passkey probe with the shift (the helpers in
``analyses.blocks.common``)."""

from __future__ import annotations

from analyses.blocks.common import (TECH, margin, over_dense, paired, passkey, passkey_cell, passkey_inputs,
                                    routers_of, text, windows_of)
from analyses.doc_blocks import LENGTH_CELLS, PASSKEY_CASES, PASSKEY_TABLES, Generated, _Cells, block

PAGE = "docs/studies/key-shift.md"
PROSE_PAGES = (PAGE,)
#: settings: the bootstrap interval's level
ALLOWED = {PAGE: {"95%"}}

#: (table, corpus, length) of each row: the technical domains, the novels, two training domains
ROWS = [("keyshift_domains", d, 4096) for d in TECH] + [
    ("keyshift_persuasion", "austen", 4096), ("keyshift_persuasion", "austen", 8192),
    ("keyshift_hamlet", "shakespeare", 4096),
    ("keyshift_train_domains", "kernel-docs", 4096), ("keyshift_train_domains", "python-source", 4096)]
POOLED = "keyshift_pooled_budget_domains"
PASSKEY_SHIFT = ("keyshift_4k", "keyshift_4k_seeds6-11")
PASSKEY_PLAIN = ("shipped_4k_budget_top2", "shipped_4k_budget_top2_seeds6-11")


@block("key-shift", LENGTH_CELLS, PASSKEY_CASES, PASSKEY_TABLES)
def key_shift() -> Generated:
    """The shipped file with the shift, untrained: per text, hard top-1 / top-2 with the shift over
    dense, the paired change the shift makes (the same table's unshifted pattern), the router's
    margin over random groups shifted too (unshifted in parentheses) and the paired change the
    shift makes to random groups; the `pooled` top-2 budget with the shift; the passkey probe."""
    c = _Cells()
    lines = ["| text | windows | top-1, keyshift | paired change | top-2, keyshift | paired change | "
             "router over random, top-2 | random top-2: paired change |",
             "|---|---:|---|---|---|---|---|---|"]
    for t, corpus, L in ROWS:
        ks = lambda a: paired(c, (t, f"{a}_keyshift"), (t, a), corpus, L)  # noqa: E731
        n = int(c.summary(t, corpus, L, "dense").windows)
        lines.append(f"| {text(corpus, L)} | {n} | {over_dense(c, t, corpus, L, 'hard_top1_keyshift')} | "
                     f"{ks('hard_top1')} | {over_dense(c, t, corpus, L, 'hard_top2_keyshift')} | {ks('hard_top2')} | "
                     f"{margin(c, t, corpus, L, 'random_top2_keyshift')} ({margin(c, t, corpus, L, 'random_top2')}) | "
                     f"{ks('random_top2')} |")
    lines += ["", "With the `pooled` top-2 budget (table `keyshift_pooled_budget_domains`), paired against the "
              "shipped budget with the shift (table `keyshift_domains`):", "",
              "| text | top-2, keyshift | paired change | random top-2, keyshift: paired change | "
              "router over random, top-2 |", "|---|---|---|---|---|"]
    for d in TECH:
        lines.append(f"| {d} | {over_dense(c, POOLED, d, 4096, 'hard_top2_keyshift')} | "
                     f"{paired(c, (POOLED, 'hard_top2_keyshift'), ('keyshift_domains', 'hard_top2_keyshift'), d, 4096)} | "
                     f"{paired(c, (POOLED, 'random_top2_keyshift'), ('keyshift_domains', 'random_top2_keyshift'), d, 4096)} | "
                     f"{margin(c, POOLED, d, 4096, 'random_top2_keyshift')} |")
    lines += ["", "Passkey at 4096 tokens (exact matches / cases, of the keys dense retrieves those kept, mean key "
              "log-prob in nats [distant pairs kept]):", "",
              "| pattern | tables | passkey |", "|---|---|---|",
              f"| hard top-2, keyshift | {', '.join(PASSKEY_SHIFT)} | {passkey_cell(passkey(PASSKEY_SHIFT, 'hard_top2_keyshift'))} |",
              f"| hard top-2 | {', '.join(PASSKEY_PLAIN)} | {passkey_cell(passkey(PASSKEY_PLAIN, 'hard_top2'))} |"]
    tables = list(dict.fromkeys([t for t, _, _ in ROWS] + [POOLED]))
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(tables)}); routers {routers_of(c, tables)}; "
              f"{windows_of(c, tables)}; patterns dense, hard_top1, hard_top2, random_top2, each also _keyshift; "
              f"{passkey_inputs(PASSKEY_SHIFT + PASSKEY_PLAIN)}")
    return Generated(inputs, "\n".join(lines))
