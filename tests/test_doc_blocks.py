"""The docs' generated result blocks (analyses/doc_blocks.py, ``focus-lab-figures --docs``).

- every block committed in README.md, docs/ and figures/ is byte for byte what the command writes
  from the committed tables (the failure names the file and the block);
- the numbers a block prints agree with a computation straight from the committed rows;
- a changed number, a missing input, an unknown block and a begin marker without its end are
  each named in one line, and ``write`` leaves a failing block as it was.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyses import doc_blocks
from analyses.doc_blocks import REPO


def test_committed_blocks_are_what_the_command_writes():
    problems = doc_blocks.check()
    assert not problems, "\n".join(problems) + "\nrun `focus-lab-figures --docs`"


def test_the_main_pages_hold_blocks():
    # the README's length table and the results page's tables are blocks, not hand-typed
    found = {p.relative_to(REPO).as_posix(): {f.name for f in doc_blocks.find_blocks(p.read_text())}
             for p in doc_blocks.pages()}
    assert "length-table" in found["README.md"]
    assert {"per-domain", "retrieval", "output-error", "loss-split", "speed-e2e"} <= found["docs/results.md"]
    assert "length-table-full" in found["figures/length_table.md"]


def _table_row(text: str, first: str) -> list[str]:
    for line in text.splitlines():
        if line.startswith(f"| {first} |"):
            return [c.strip() for c in line.strip("|").split("|")]
    raise AssertionError(f"no row {first!r}")


def test_length_table_numbers_from_the_rows():
    # independent reference: pool the committed per-window rows by hand (exp of the token-weighted
    # mean NLL) for Persuasion at 4096 tokens
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)
    cells = cells[(cells.table == doc_blocks.SHIPPED_TABLE) & (cells.corpus == "austen") & (cells.seq_len == 4096)]

    def ppl(label):
        g = cells[cells.label == label]
        return float(np.exp((g.nll * g.tokens).sum() / g.tokens.sum()))

    row = _table_row(doc_blocks.render("length-table"), "4096")
    assert row[1] == f"{ppl('dense'):.2f}"
    change = 100 * (ppl("hard_top2") / ppl("dense") - 1)
    kept = cells[cells.label == "hard_top2"].distant_pairs_kept.mean()
    assert row[2] == f"{change:+.1f}% [{kept:.2f}]"


def test_gemma_length_table_numbers_from_the_rows():
    # Gemma-3-270M's table: pooled by hand from the committed rows of Persuasion at 4096 tokens;
    # the router's margin is random groups' perplexity over the router's at the same k
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)
    cells = cells[(cells.table == doc_blocks.GEMMA_TABLE) & (cells.corpus == "austen") & (cells.seq_len == 4096)]
    assert set(cells.model) == {"gemma3-270m"}

    def ppl(label):
        g = cells[cells.label == label]
        return float(np.exp((g.nll * g.tokens).sum() / g.tokens.sum()))

    row = _table_row(doc_blocks.render("gemma-length-table"), "*Persuasion*")
    assert row[1:4] == ["4096", str(cells.window.nunique()), f"{ppl('dense'):.2f}"]
    kept = cells[cells.label == "hard_top2"].distant_pairs_kept.mean()
    assert row[6].startswith(f"{100 * (ppl('hard_top2') / ppl('dense') - 1):+.1f}% [")
    assert row[6].endswith(f"{{{kept:.2f}}}")
    assert row[8].startswith(f"{100 * (ppl('random_top2') / ppl('hard_top2') - 1):+.1f}% [")


def test_output_error_numbers_from_the_rows():
    heads = pd.read_parquet(REPO / doc_blocks.OUTPUT_ERROR)
    focus = heads[heads.pattern == "focus"]
    row = _table_row(doc_blocks.render("output-error"), "Focus hard top-k")
    assert row[1] == f"{focus.coverage.mean():.3f}"
    assert row[2].startswith(f"{focus.output_error.median():.3f} [")


def test_intervene_nouns_cells_from_the_data():
    # independent reference: the JSON's numbers, compared as numbers within the cell's rounding
    import json
    d = json.loads((REPO / doc_blocks.INTERVENE_NOUNS).read_text())
    page = (REPO / "docs" / "intervene.md").read_text()
    assert "intervene-nouns" in {f.name for f in doc_blocks.find_blocks(page)}
    text = doc_blocks.render("intervene-nouns")

    def close(cell: str, x: float) -> bool:
        decimals = len(cell.split(".")[1])
        return abs(float(cell) - x) <= 0.5 * 10 ** -decimals + 1e-12 and float(cell) != 0

    for g in ("0", "2"):
        row, r = _table_row(text, g), d["groups"][g]
        assert close(row[1], r["mean_all"]) and close(row[2], r["mean_at_nouns"])
        rise, fall = row[3].split(" / ")
        assert close(rise, r["max"]) and close(fall, r["min"])


def test_alternatives_cells_from_the_rows():
    # independent reference: pooled perplexities by hand from the committed per-window rows (exp of
    # the token-weighted mean NLL), a paired change on the windows both tables have, the recipe
    # sweep's perplexities and the retrieval cases' mean pairs kept
    page = (REPO / "docs" / "recipes.md").read_text()
    assert "alternatives" in {f.name for f in doc_blocks.find_blocks(page)}
    text = doc_blocks.render("alternatives")
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)

    def rows(table, corpus, label):
        return cells[(cells.table == table) & (cells.corpus == corpus) & (cells.seq_len == 4096) & (cells.label == label)]

    def ppl(g):
        return float(np.exp((g.nll * g.tokens).sum() / g.tokens.sum()))

    top2, dense = rows("sinks64_512", "austen", "hard_top2"), rows("sinks64_512", "austen", "dense")
    row = _table_row(text, "stage 1 alone (`sinks64`, 512 tokens)")
    assert f"top-2 {100 * (ppl(top2) / ppl(dense) - 1):+.1f}% [{top2.distant_pairs_kept.mean():.2f}]" in row[2]

    a = rows("calibrated_python-docs", "python-docs", "hard_top2").set_index("window")
    b = rows("shipped_per_domain", "python-docs", "hard_top2").set_index("window")
    w = a.index.intersection(b.index)
    paired = 100 * (np.exp(((a.nll * a.tokens)[w].sum() - (b.nll * b.tokens)[w].sum()) / a.tokens[w].sum()) - 1)
    assert _table_row(text, "group bias re-fitted on the user's text")[2].startswith(f"technical top-2 {paired:+.2f}% to ")

    sweep = pd.read_parquet(REPO / doc_blocks.RECIPES_SWEEP)
    sweep = sweep[sweep.sweep == "30 steps"].set_index(["recipe", "label"]).perplexity
    assert (f"(top-2 {sweep[('paper', 'hard_top2')]:.1f} against {sweep[('controls', 'dense')]:.1f})"
            in _table_row(text, "other recipes, 30 steps at 512 tokens")[2])

    cases = pd.read_parquet(REPO / doc_blocks.RETRIEVAL_CASES)
    kept = [cases[(cases.task == "niah_single_1") & (cases.length == L) & (cases.pattern == "hard_top2")]
            .distant_pairs_kept.mean() for L in (4096, 8192)]
    shipped = _table_row(text, "**shipped** (stages 1-9: the needle-mix file with a group capacity for top-2)")
    assert shipped[2].startswith(f"niah_single_1 at {kept[0]:.2f} / {kept[1]:.2f} of the distant pairs")


def _page(tmp_path, text: str):
    (tmp_path / "docs").mkdir(exist_ok=True)
    page = tmp_path / "docs" / "x.md"
    page.write_text(text)
    return page


def test_a_changed_number_is_named(tmp_path):
    good = doc_blocks.render("speed-e2e")
    bad = good.replace("1.19x", "1.91x")
    assert bad != good
    _page(tmp_path, f"# x\n\n{bad}\n")
    problems = doc_blocks.check(tmp_path)
    assert problems == ["docs/x.md: block speed-e2e differs from what `focus-lab-figures --docs` writes: run it"]
    changed, problems = doc_blocks.write(tmp_path)
    assert changed == ["docs/x.md"] and not problems
    assert (tmp_path / "docs" / "x.md").read_text() == f"# x\n\n{good}\n"
    assert doc_blocks.check(tmp_path) == []


def test_a_missing_input_is_named_and_the_block_kept(tmp_path, monkeypatch):
    monkeypatch.setitem(doc_blocks.BLOCKS, "gone", doc_blocks.Block(
        "gone", lambda: doc_blocks.Generated("x", "y"), ("figures/results/no_such_table.parquet",)))
    text = "<!-- BEGIN generated:gone | focus-lab-figures --docs | inputs: old -->\n\nold\n\n<!-- END generated:gone -->\n"
    page = _page(tmp_path, text)
    assert doc_blocks.check(tmp_path) == ["docs/x.md: block gone: missing input figures/results/no_such_table.parquet"]
    changed, problems = doc_blocks.write(tmp_path)
    assert changed == [] and len(problems) == 1
    assert page.read_text() == text


def test_unknown_block_and_missing_end_marker(tmp_path):
    _page(tmp_path, "<!-- BEGIN generated:nope | focus-lab-figures --docs | inputs: - -->\n\n<!-- END generated:nope -->\n")
    (problem,) = doc_blocks.check(tmp_path)
    assert problem.startswith("docs/x.md: block nope: no generated block 'nope'")
    _page(tmp_path, "a\n<!-- BEGIN generated:speed-e2e | focus-lab-figures --docs | inputs: - -->\n| x |\n")
    assert doc_blocks.check(tmp_path) == [
        "docs/x.md:2: block 'speed-e2e' has no end marker '<!-- END generated:speed-e2e -->'"]


def test_render_unknown_name_lists_the_known():
    with pytest.raises(KeyError, match="known: .*length-table"):
        doc_blocks.render("no-such-block")


def test_passkey_cells_from_the_rows():
    # independent reference: the 4096-token table's cells by hand from passkey_cases.parquet, the
    # tables named by the page; dense from the tables of the same cases made with other files
    rows = pd.read_parquet(REPO / doc_blocks.PASSKEY_CASES)
    rows = rows[rows.length == 4096]
    dense = rows[rows.table.isin(["every_layer_routed_4k", "every_layer_routed_4k_seeds3-5",
                                  "stage2_distill64_4k_budget_top2_seeds6-11"]) & (rows.pattern == "dense")]
    shipped = rows[rows.table.isin(["capacity_4k", "capacity_4k_seeds6-11"])]
    uniform = rows[rows.table.isin(["shipped_4k", "shipped_4k_seeds6-11"])]
    assert len(dense) == len(shipped) == len(uniform) == 60
    page = (REPO / "docs" / "passkey_reference.md").read_text()
    assert {"passkey-4k", "passkey-8k", "passkey-random"} <= {f.name for f in doc_blocks.find_blocks(page)}
    text = doc_blocks.render("passkey-4k")
    at0 = shipped[shipped.depth == 0]
    assert _table_row(text, "0")[2] == f"{int(at0.exact_match.sum())}/{len(at0)}, {at0.key_logprob.mean():.2f}"
    case = ["seed", "depth"]
    paired = uniform.merge(dense[case + ["exact_match"]], on=case, suffixes=("", "_dense"))
    kept = int((paired.exact_match & paired.exact_match_dense).sum())
    assert _table_row(text, "all")[4] == (
        f"{int(uniform.exact_match.sum())}/60 ({kept} of dense's {int(dense.exact_match.sum())}), "
        f"{uniform.key_logprob.mean():.2f} [{uniform.distant_pairs_kept.mean():.3f}]")


def test_numbers_in_prose_come_from_blocks():
    problems = doc_blocks.prose_problems()
    assert not problems, "\n".join(problems)


def test_prose_check_flags_a_number_no_block_holds(tmp_path):
    (tmp_path / "docs").mkdir()
    block = doc_blocks.render("speed-e2e")
    (tmp_path / "docs" / "speed.md").write_text(f"# speed\n\n{block}\n")
    page = ("# x\n\nTop-1 is 1.19x dense ([speed](speed.md)), top-2 1.77x; K = 4 and `0.333` are not prose.\n\n"
            "| a |\n|---|\n| 9.99 |\n\n```\n5.55\n```\n")
    (tmp_path / "docs" / "x.md").write_text(page)
    problems = doc_blocks.prose_problems(tmp_path, ("docs/x.md",))
    # 1.19x is in the linked page's block; 1.77x is in none; tables, code and integers are not prose
    assert problems == ["docs/x.md:3: number 1.77x is in no generated block here or on a linked page"]
    (tmp_path / "docs" / "x.md").write_text(page.replace(" ([speed](speed.md))", ""))
    assert len(doc_blocks.prose_problems(tmp_path, ("docs/x.md",))) == 2
