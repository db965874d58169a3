"""The helpers the page modules of analyses/blocks/ share; no blocks.

- the length table's cells (``doc_blocks._Cells``): a cell against dense (``over_dense``), a paired
  change between two tables' cells on their common windows (``paired``), a control's margin over the
  router (``margin``), a text's name in a table's first column (``text``);
- the inputs line: the router file of one table (``table_router``), of each of some tables
  (``tables_routers``) or grouped by file (``routers_of``), the per-layer k a table ran with
  (``layer_top_k_spec``), the windows per corpus and length (``windows_of``) or per domain
  (``windows_a_domain``);
- the passkey probe: the summary of a set of probe tables (``passkey``) with the dense rows of the
  same cases (``passkey_rows``), as a table cell (``passkey_cell``) and in the inputs line
  (``passkey_inputs``);
- the retrieval suite: a score relative to dense (``relative``), the router files of a set of cases
  (``case_routers``).
"""

from __future__ import annotations

import pandas as pd

from analyses.doc_blocks import (LENGTH_CELLS, PASSKEY_CASES, PASSKEY_MODEL, PASSKEY_TABLES, REPO, TECHNICAL,
                                 MissingInput, _Cells, _pct, name_sha256, router_label)

#: how a corpus reads in a table's first column
TEXT = {"austen": "*Persuasion*", "shakespeare": "*Hamlet*"}
#: the held-out technical domains, in the pages' order
TECH = TECHNICAL
#: ``+1.2%``: a change in %, signed, ``nd`` decimals (``doc_blocks._pct``, the alternatives table's)
pct = _pct


# ============================================================================================
# the length table's cells

def text(corpus: str, L: int, with_length: bool | None = None) -> str:
    """``python-docs`` or ``*Persuasion* 4096``: a novel carries its length, a domain (4096 only) not."""
    if with_length is None:
        with_length = corpus in TEXT
    return f"{TEXT.get(corpus, corpus)} {L}" if with_length else TEXT.get(corpus, corpus)


def over_dense(c: _Cells, table: str, corpus: str, L: int, label: str, kept: bool = True, ci: bool = True,
               nd: int = 1) -> str:
    """``+4.1% [+3.1, +5.1] [0.33]``: the change of ``label`` over dense in ``table``'s cell (``nd``
    decimals), its 95% paired interval over windows (from 3 windows up) and the distant pairs kept."""
    r = c.summary(table, corpus, L, label)
    out = pct(r.delta_vs_dense_pct, nd)
    if ci and r.windows >= 3:
        out += f" [{r.ci_lo:+.1f}, {r.ci_hi:+.1f}]"
    if kept:
        out += f" [{r.distant_pairs_kept:.2f}]"
    return out


def paired(c: _Cells, a: tuple[str, str], b: tuple[str, str], corpus: str, L: int, nd: int = 2,
           ci: bool = True) -> str:
    """``-1.37% [-2.49, -0.64]``: perplexity of ``a`` = (table, label) over ``b`` on the windows both
    cells have, with its 95% paired bootstrap interval (``evaluate.paired_change``) from 3 common
    windows up."""
    from focus_lab.eval.evaluate import paired_change
    x, y = c.rows(a[0], corpus, L, a[1]), c.rows(b[0], corpus, L, b[1])
    m, lo, hi = paired_change(x, y)
    if m != m:  # NaN: no common window
        raise MissingInput(f"{LENGTH_CELLS} (tables {a[0]} and {b[0]}: no common window on {corpus} at {L})")
    n = len(set(x.window) & set(y.window))
    return pct(m, nd) + (f" [{lo:+.{nd}f}, {hi:+.{nd}f}]" if ci and n >= 3 else "")


def margin(c: _Cells, table: str, corpus: str, L: int, control: str, ci: bool = False) -> str:
    """``+2.3%``: the control's change over the router at the same k (> 0: the router is better),
    with its interval when ``ci`` (from 3 windows up)."""
    r = c.summary(table, corpus, L, control)
    out = pct(r.control_vs_router_pct)
    return out + (f" [{r.control_ci_lo:+.1f}, {r.control_ci_hi:+.1f}]" if ci and r.windows >= 3 else "")


# ============================================================================================
# the inputs line

def table_router(c: _Cells, table: str) -> str:
    """``name (sha256 abcdef123456)``: the router file of ``table``'s first row."""
    return router_label(c.cells.loc[c.cells["table"] == table, "routers_sha256"].iloc[0])


def tables_routers(c: _Cells, tables) -> str:
    """``table router; table router``: each table's router files (its manifest names and sha256),
    or the path it was run with when its rows recorded no sha256."""
    out = []
    for t in dict.fromkeys(tables):
        g = c.cells[c.cells["table"] == t]
        shas = sorted(set(g.routers_sha256.dropna()) - {""})
        out.append(f"{t} " + (", ".join(router_label(s) for s in shas) if shas
                              else f"`{g.routers.iloc[0]}` (no sha256 recorded)"))
    return "; ".join(out)


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


def layer_top_k_spec(c: _Cells, table: str, label: str) -> str:
    """``0,5-6,9:1``: the per-layer k (``--layer-top-k``) ``label``'s rows of ``table`` ran with,
    each spec once (comma-joined)."""
    g = c.cells[(c.cells["table"] == table) & (c.cells.label == label)]
    return ", ".join(sorted(set(g.layer_top_k.astype(str))))


def windows_a_domain(c: _Cells, table: str, domains, L: int = 4096) -> str:
    """``4/5 windows of 4096 tokens a domain``: the window counts of ``table``'s dense cells on
    ``domains``, each count once."""
    windows = sorted({int(c.summary(table, d, L, "dense").windows) for d in domains})
    return f"{'/'.join(map(str, windows))} windows of {L} tokens a domain"


# ============================================================================================
# the passkey probe

def passkey_rows(tables, length: int = 4096, pattern: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the committed probe rows of ``tables`` at ``length``, of ``pattern`` only if given; the dense
    rows of the shipped file's reference tables on the same cases)."""
    from focus_lab.eval.committed import PASSKEY_CASE, committed_passkey
    rows = pd.read_parquet(REPO / PASSKEY_CASES)
    rows = rows[rows.table.isin(tables) & (rows.length == length)]
    if pattern is not None:
        rows = rows[rows.pattern == pattern]
    dense = committed_passkey(model=PASSKEY_MODEL).cases
    dense = dense[(dense.pattern == "dense") & (dense.length == length)].merge(
        rows[PASSKEY_CASE].drop_duplicates(), on=PASSKEY_CASE)
    return rows, dense


def passkey(tables, pattern: str, length: int = 4096) -> pd.Series:
    """The passkey summary (``committed.passkey_summary``) of ``pattern``'s rows in the committed
    probe ``tables``, paired with the dense rows of the shipped file's reference tables (same
    cases): cases, hits, key_logprob, distant_pairs_kept, dense_hits, dense_hits_kept."""
    from focus_lab.eval.committed import passkey_summary
    rows, dense = passkey_rows(tables, length, pattern)
    if not len(rows):
        raise MissingInput(f"{PASSKEY_CASES} ({pattern} in tables {', '.join(tables)} at {length})")
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
    _, dense = passkey_rows(tables, length)
    return (f"{PASSKEY_CASES} with {PASSKEY_TABLES} (tables {', '.join(tables)}, {length} tokens; dense from "
            f"{', '.join(dict.fromkeys(dense.table))})")


# ============================================================================================
# the retrieval suite

def relative(r) -> str:
    """``0.95 [0.88, 1.00]``: a ``retrieval_tables.summary`` row's score relative to dense with its
    paired 95% interval over cases."""
    return f"{r.relative:.2f} [{r.relative_lo:.2f}, {r.relative_hi:.2f}]"


def case_routers(cases: pd.DataFrame, sep: str = "; ") -> str:
    """The router files the retrieval ``cases`` ran with (their ``router_name``s), by name."""
    return sep.join(router_label(name_sha256(n)) for n in sorted(cases.router_name.dropna().unique()))
