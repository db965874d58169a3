"""docs/studies/key-shift.md's tables: the shipped file with ``FocusConfig.key_shift = 1`` (the
pattern suffix ``_keyshift``) on held-out text, the paired change the shift makes, the `pooled`
top-2 budget with the shift, and the passkey probe with the shift.

Also the helpers the other study pages' length-table blocks share (the key-shift pages, the
per-layer k, the LM objective, the key router, the needle mix): one cell of a committed table
against dense, a paired change between two tables' cells on their common windows, a control's
margin over the router, the passkey summary of a set of probe tables, and the inputs line's
router files.
"""

from __future__ import annotations

import pandas as pd

from analyses.doc_blocks import (LENGTH_CELLS, PASSKEY_CASES, PASSKEY_MODEL, PASSKEY_TABLES, REPO, Generated,
                                 MissingInput, _Cells, block, router_label)

PAGE = "docs/studies/key-shift.md"
PROSE_PAGES = (PAGE,)
#: settings: the bootstrap interval's level
ALLOWED = {PAGE: {"95%"}}

#: how a corpus reads in a table's first column
TEXT = {"austen": "*Persuasion*", "shakespeare": "*Hamlet*"}
#: the held-out technical domains, in the pages' order
TECH = ("python-docs", "man-pages", "debian-reference")


# ============================================================================================
# shared helpers (imported by the other study modules)

def text(corpus: str, L: int, with_length: bool | None = None) -> str:
    """``python-docs`` or ``*Persuasion* 4096``: a novel carries its length, a domain (4096 only) not."""
    if with_length is None:
        with_length = corpus in TEXT
    return f"{TEXT.get(corpus, corpus)} {L}" if with_length else TEXT.get(corpus, corpus)


def pct(x: float, nd: int = 1) -> str:
    return f"{x:+.{nd}f}%"


def over_dense(c: _Cells, table: str, corpus: str, L: int, label: str, kept: bool = True, ci: bool = True) -> str:
    """``+4.1% [+3.1, +5.1] [0.33]``: the change of ``label`` over dense in ``table``'s cell, its 95%
    paired interval over windows (from 3 windows up) and the distant pairs kept."""
    r = c.summary(table, corpus, L, label)
    out = pct(r.delta_vs_dense_pct)
    if ci and r.windows >= 3:
        out += f" [{r.ci_lo:+.1f}, {r.ci_hi:+.1f}]"
    if kept:
        out += f" [{r.distant_pairs_kept:.2f}]"
    return out


def paired(c: _Cells, a: tuple[str, str], b: tuple[str, str], corpus: str, L: int, nd: int = 2,
           ci: bool = True) -> str:
    """``-1.37% [-2.49, -0.64]``: perplexity of ``a`` = (table, label) over ``b`` on the windows both
    cells have, with its 95% paired bootstrap interval (``evaluate.paired_change``)."""
    from focus_lab.eval.evaluate import paired_change
    x, y = c.rows(a[0], corpus, L, a[1]), c.rows(b[0], corpus, L, b[1])
    m, lo, hi = paired_change(x, y)
    if m != m:  # NaN: no common window
        raise MissingInput(f"{LENGTH_CELLS} (tables {a[0]} and {b[0]}: no common window on {corpus} at {L})")
    n = len(set(x.window) & set(y.window))
    return pct(m, nd) + (f" [{lo:+.{nd}f}, {hi:+.{nd}f}]" if ci and n >= 3 else "")


def margin(c: _Cells, table: str, corpus: str, L: int, control: str, ci: bool = False) -> str:
    """``+2.3%``: the control's change over the router at the same k (> 0: the router is better),
    with its interval when ``ci``."""
    r = c.summary(table, corpus, L, control)
    out = pct(r.control_vs_router_pct)
    return out + (f" [{r.control_ci_lo:+.1f}, {r.control_ci_hi:+.1f}]" if ci and r.windows >= 3 else "")


def routers_of(c: _Cells, tables) -> str:
    """``table: router label`` of each table, tables of one file grouped (the inputs line)."""
    by: dict[str, list[str]] = {}
    for t in tables:
        shas = sorted(c.cells.loc[c.cells["table"] == t, "routers_sha256"].unique())
        if not shas:
            raise MissingInput(f"{LENGTH_CELLS} (table {t})")
        for s in shas:
            by.setdefault(s, []).append(t)
    return "; ".join(f"{', '.join(ts)}: {router_label(s)}" for s, ts in by.items())


def windows_of(c: _Cells, tables, cells=None) -> str:
    """``windows austen 8 of 4096, 4 of 8192; man-pages 4 of 4096``: the most windows a cell of
    ``tables`` has, per corpus and length (only the (corpus, length) pairs of ``cells`` if given)."""
    g = c.cells[c.cells["table"].isin(tables)].groupby(["table", "corpus", "seq_len"]).window.nunique()
    g = g.groupby(level=["corpus", "seq_len"]).max()
    per = {}
    for (corpus, L), n in g.items():
        if cells is not None and (corpus, L) not in cells:
            continue
        per.setdefault(corpus, []).append(f"{n} of {L}")
    return "windows " + "; ".join(f"{corpus} {', '.join(v)}" for corpus, v in sorted(per.items()))


def passkey(tables, pattern: str, length: int = 4096) -> pd.Series:
    """The passkey summary (``committed.passkey_summary``) of ``pattern``'s rows in the committed
    probe ``tables``, paired with the dense rows of the shipped file's reference tables (same
    cases): cases, hits, key_logprob, distant_pairs_kept, dense_hits, dense_hits_kept."""
    from focus_lab.eval.committed import PASSKEY_CASE, committed_passkey, passkey_summary
    rows = pd.read_parquet(REPO / PASSKEY_CASES)
    rows = rows[rows.table.isin(tables) & (rows.pattern == pattern) & (rows.length == length)]
    if not len(rows):
        raise MissingInput(f"{PASSKEY_CASES} ({pattern} in tables {', '.join(tables)} at {length})")
    dense = committed_passkey(model=PASSKEY_MODEL).cases
    dense = dense[(dense.pattern == "dense") & (dense.length == length)].merge(rows[PASSKEY_CASE], on=PASSKEY_CASE)
    if len(dense) != len(rows):
        raise MissingInput(f"{PASSKEY_CASES} (dense rows of the cases of {', '.join(tables)})")
    s = passkey_summary(pd.concat([dense, rows], ignore_index=True)).set_index("pattern")
    return s.loc[pattern]


def passkey_cell(r: pd.Series) -> str:
    """``57/60 (57 of dense's 59), -0.98 [0.527]``: exact matches, of the keys dense retrieves
    those kept, mean key log-prob (nats) and distant pairs kept."""
    return (f"{r.hits}/{r.cases} ({r.dense_hits_kept} of dense's {r.dense_hits}), {r.key_logprob:.2f} "
            f"[{r.distant_pairs_kept:.3f}]")


def passkey_inputs(tables, length: int = 4096) -> str:
    """The inputs line's passkey part: the probe tables and the tables their dense rows come from."""
    from focus_lab.eval.committed import PASSKEY_CASE, committed_passkey
    rows = pd.read_parquet(REPO / PASSKEY_CASES)
    rows = rows[rows.table.isin(tables) & (rows.length == length)]
    dense = committed_passkey(model=PASSKEY_MODEL).cases
    dense = dense[(dense.pattern == "dense") & (dense.length == length)].merge(
        rows[PASSKEY_CASE].drop_duplicates(), on=PASSKEY_CASE)
    return (f"{PASSKEY_CASES} with {PASSKEY_TABLES} (tables {', '.join(tables)}, {length} tokens; dense from "
            f"{', '.join(dict.fromkeys(dense.table))})")


# ============================================================================================
# the page's blocks

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
