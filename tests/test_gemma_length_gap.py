"""docs/studies/gemma-length-gap.md's blocks (analyses/blocks/gemma_length_gap.py): every number
recomputed by hand from the committed rows (the output-error parquet per (layer, head) and the
length table's per-window rows)."""

from __future__ import annotations

import numpy as np
import pandas as pd

import analyses.blocks  # noqa: F401  (registers the blocks)
from analyses import doc_blocks
from analyses.blocks import gemma_length_gap as G
from analyses.doc_blocks import REPO


_row = doc_blocks.table_row  # the cells of a block's row, by its leading cells


def _ppl(rows: pd.DataFrame, label: str) -> float:
    g = rows[rows.label == label]
    return float(np.exp((g.nll * g.tokens).sum() / g.tokens.sum()))


def test_the_gap_row_at_32768_from_the_heads_and_the_windows():
    heads = pd.read_parquet(REPO / G.OE)
    h = heads[heads.seq_len == 32768]
    assert len(h[h.pattern == "focus"]) == 12  # 3 routed layers x 4 heads
    row = _row(doc_blocks.render("gemma-length-gap"), "32768")
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)
    cells = cells[(cells.table == doc_blocks.GEMMA_G4_TABLE) & (cells.corpus == "austen") & (cells.seq_len == 32768)]
    assert row[1] == str(cells.window.nunique())
    assert row[2].startswith(f"{100 * (_ppl(cells, 'random_top2') / _ppl(cells, 'hard_top2') - 1):+.1f}% [")
    mean = lambda p, col: h[h.pattern == p][col].mean()  # noqa: E731
    assert row[3] == " / ".join(f"{mean(p, 'coverage'):.3f}" for p in ("focus", "random", "window_matched"))
    assert row[4] == " / ".join(f"{mean(p, 'output_error'):.3f}" for p in ("focus", "random", "window_matched"))
    f = h[h.pattern == "focus"].set_index(["layer_idx", "head"]).output_error
    r = h[h.pattern == "random"].set_index(["layer_idx", "head"]).output_error
    d = (f - r.loc[f.index]).to_numpy()
    assert row[5].startswith(f"{d.mean():+.3f} [")
    assert row[6] == f"{int((d < 0).sum())} of 12"


def test_head_difference_by_hand():
    heads = pd.DataFrame({"layer_idx": [5, 5, 11, 11], "head": [0, 0, 0, 0], "pattern": ["focus", "random"] * 2,
                          "output_error": [0.1, 0.3, 0.4, 0.2]})
    heads.loc[2:, "head"] = 1
    mean, lo, hi, lower, n = G.head_difference(heads)
    assert (round(mean, 6), lower, n) == (0.0, 1, 2)  # (-0.2 + 0.2) / 2; one head lower
    assert lo <= mean <= hi and lo >= -0.2 and hi <= 0.2


def test_the_distilled_file_at_32768_against_stage_g4s_and_random_groups():
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)
    d8k = cells[(cells.table == doc_blocks.GEMMA_G5_TABLE) & (cells.corpus == "austen") & (cells.seq_len == 32768)]
    wins = sorted(set(d8k[d8k.label == "hard_top1"].window))
    g4 = cells[(cells.table == doc_blocks.GEMMA_G4_TABLE) & (cells.corpus == "austen") & (cells.seq_len == 32768)
               & cells.window.isin(wins)]
    assert set(d8k.router_name) == {"gemma3-270m/distill64-8k"} and set(g4.router_name) == {"gemma3-270m/needle-mix"}
    row = _row(doc_blocks.render("gemma-length-gap-distill8k"), "*Persuasion*", "32768")
    assert row[2] == str(len(wins))
    needle_mix, distilled = row[3].split(" / ")
    assert needle_mix.startswith(f"{100 * (_ppl(g4, 'random_top1') / _ppl(g4, 'hard_top1') - 1):+.1f}%")
    assert distilled.startswith(f"{100 * (_ppl(g4, 'random_top1') / _ppl(d8k, 'hard_top1') - 1):+.1f}%")
    assert row[6].startswith(f"{100 * (_ppl(d8k, 'hard_top2') / _ppl(g4, 'hard_top2') - 1):+.1f}%")
    # the shipped table was committed again from its own rows: its controls' runs are stage g4's and
    # the top-2 runs that added block losses, never the table itself
    inputs = G.gemma_length_gap_distill8k().inputs
    runs = inputs.split("dense and random groups from ")[1].split("'s runs")[0].split(", ")
    assert "gemma3_needle_mix" in runs and G.GEMMA_G5_TABLE not in runs


def test_the_layer_rows_from_the_heads():
    oe = pd.read_parquet(REPO / G.OE_TRAIN)
    h = oe[(oe.seq_len == 32768) & (oe.layer_idx == 11)]
    f = h[h.pattern == "focus"].set_index("head").output_error
    r = h[h.pattern == "random"].set_index("head").output_error
    assert len(f) == 4  # Gemma-3-270M's 4 query heads
    row = _row(doc_blocks.render("gemma-length-gap-layers"), "32768", "11")
    assert row[2] == f"{f.mean():.3f} / {r.mean():.3f}"
    assert row[3] == f"{(f - r).mean():+.3f}"
    assert row[4] == f"{int(((f - r) < 0).sum())} of 4"


def _lever_cells(table: str, corpus: str, seq_len: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The committed rows of ``table`` and of the shipped file's table at one corpus and length."""
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)
    at = (cells.corpus == corpus) & (cells.seq_len == seq_len)
    return cells[(cells.table == table) & at], cells[(cells.table == doc_blocks.GEMMA_G5_TABLE) & at]


def test_random_groups_in_layer_11_on_hamlet_at_16384_by_hand():
    r11, ship = _lever_cells(G.RANDOM11_TABLE, "shakespeare", 16384)
    assert set(r11.random_layers) == {""} and r11.window.nunique() == 3
    assert set(r11[r11.label == "hard_top2"].routers_sha256) != set(ship[ship.label == "hard_top2"].routers_sha256)
    row = _row(doc_blocks.render("gemma-length-gap-random11"), "*Hamlet*", "16384")
    assert row[2] == "3"
    shipped, lever = row[4].split(" / ")
    assert shipped.startswith(f"{100 * (_ppl(ship, 'random_top2') / _ppl(ship, 'hard_top2') - 1):+.1f}% [")
    assert lever.startswith(f"{100 * (_ppl(ship, 'random_top2') / _ppl(r11, 'hard_top2') - 1):+.1f}% [")
    assert row[6].startswith(f"{100 * (_ppl(r11, 'hard_top2') / _ppl(ship, 'hard_top2') - 1):+.1f}% [")


def test_the_stage_at_16384_tokens_at_32768_by_hand():
    d16k, ship = _lever_cells(G.DISTILL16K_TABLE, "austen", 32768)
    assert d16k.window.nunique() == 3 and set(d16k.window) == set(ship.window)
    row = _row(doc_blocks.render("gemma-length-gap-distill16k"), "*Persuasion*", "32768")
    shipped, stage = row[4].split(" / ")
    assert shipped.startswith(f"{100 * (_ppl(ship, 'random_top2') / _ppl(ship, 'hard_top2') - 1):+.1f}% [")
    assert stage.startswith(f"{100 * (_ppl(ship, 'random_top2') / _ppl(d16k, 'hard_top2') - 1):+.1f}% [")
    assert row[5].startswith(f"{100 * (_ppl(d16k, 'hard_top1') / _ppl(ship, 'hard_top1') - 1):+.1f}% [")


def test_the_last_stage_on_both_corpora_by_hand():
    """A table with hard top-2 alone: its top-1 columns read '-', its top-2 ones are by hand."""
    mix, ship = _lever_cells(G.MIX_TABLE, "shakespeare", 16384)
    assert set(mix.label) == {"dense", "hard_top2", "random_top2"} and set(mix.window) == set(ship.window)
    row = _row(doc_blocks.render("gemma-length-gap-mix"), "*Hamlet*", "16384")
    assert row[3].endswith(" / -") and row[5] == "-"
    shipped, stage = row[4].split(" / ")
    assert shipped.startswith(f"{100 * (_ppl(ship, 'random_top2') / _ppl(ship, 'hard_top2') - 1):+.1f}% [")
    assert stage.startswith(f"{100 * (_ppl(ship, 'random_top2') / _ppl(mix, 'hard_top2') - 1):+.1f}% [")
    assert row[6].startswith(f"{100 * (_ppl(mix, 'hard_top2') / _ppl(ship, 'hard_top2') - 1):+.1f}% [")


def test_the_key_shift_on_hamlet_at_16384_by_hand():
    """The key shift is a rule on the shipped file's own tensors: its rows carry the shipped
    file's sha256 and the same distant-pair budget within a point; its columns by hand."""
    ks, ship = _lever_cells(G.KEYSHIFT_TABLE, "shakespeare", 16384)
    assert set(ks[ks.label.str.startswith("hard")].label) == {"hard_top1_keyshift", "hard_top2_keyshift"}
    assert set(ks[ks.label == "hard_top2_keyshift"].routers_sha256) == set(ship[ship.label == "hard_top2"].routers_sha256)
    assert set(ks.window) == set(ship.window) and ks.window.nunique() == 3
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)
    for k in (1, 2):  # every cell: the shift keeps the file's share of distant pairs within 0.01
        a = cells[(cells.table == G.KEYSHIFT_TABLE) & (cells.label == f"hard_top{k}_keyshift")]
        b = cells[(cells.table == doc_blocks.GEMMA_G5_TABLE) & (cells.label == f"hard_top{k}")]
        m = a.merge(b, on=["corpus", "seq_len", "window"], suffixes=("", "_file"))
        assert len(m) == len(a) == 22
        assert (m.distant_pairs_kept - m.distant_pairs_kept_file).abs().max() < 0.01
    row = _row(doc_blocks.render("gemma-length-gap-keyshift"), "*Hamlet*", "16384")
    for k, col in ((1, 3), (2, 4)):
        shipped, lever = row[col].split(" / ")
        assert shipped.startswith(f"{100 * (_ppl(ship, f'random_top{k}') / _ppl(ship, f'hard_top{k}') - 1):+.1f}% [")
        assert lever.startswith(f"{100 * (_ppl(ship, f'random_top{k}') / _ppl(ks, f'hard_top{k}_keyshift') - 1):+.1f}% [")
        assert row[4 + k].startswith(f"{100 * (_ppl(ks, f'hard_top{k}_keyshift') / _ppl(ship, f'hard_top{k}') - 1):+.1f}% [")
    assert row[7].startswith(f"{100 * (_ppl(ks, 'hard_top2_keyshift') / _ppl(ks, 'dense') - 1):+.1f}% [")
    assert np.isclose(_ppl(ks, "dense"), _ppl(ship, "dense"), rtol=1e-6)  # dense is the same rows


def test_the_key_shift_on_code_by_hand():
    """The third domain's block: one run's rows, every column recomputed from the windows."""
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)
    code = cells[cells.table == G.KEYSHIFT_CODE_TABLE]
    assert set(code.label) == {"dense", "hard_top2", "hard_top2_keyshift", "random_top2"}
    assert code.groupby("label").window.nunique().eq(3).all() and set(code.reused_from.fillna("")) == {""}
    row = _row(doc_blocks.render("gemma-length-gap-keyshift-code"), "`python_stdlib`", "16384")
    assert row[3] == f"{_ppl(code, 'dense'):.2f}"
    pct = lambda a, b: f"{100 * (_ppl(code, a) / _ppl(code, b) - 1):+.1f}% ["  # noqa: E731
    file_alone, shifted = row[4].split(" / ")
    assert file_alone.startswith(pct("hard_top2", "dense")) and shifted.startswith(pct("hard_top2_keyshift", "dense"))
    file_alone, shifted = row[5].split(" / ")
    assert file_alone.startswith(pct("random_top2", "hard_top2"))
    assert shifted.startswith(pct("random_top2", "hard_top2_keyshift"))
    assert row[6].startswith(pct("hard_top2_keyshift", "hard_top2"))


def test_the_key_shift_retrieval_run_reproduces_dense_case_by_case():
    """The shift's retrieval run: dense scores the shipped file's run's dense on every seed (an
    independent forward of the same case) within DENSE_AGREEMENT nats of log-prob; the block's
    scores are the case means by hand."""
    assert len(G.KEYSHIFT_RETRIEVAL) == len(doc_blocks.GEMMA_G5_RETRIEVAL)  # 16384, 32768 tokens
    table = doc_blocks.render("gemma-length-gap-keyshift-retrieval")
    for mine, theirs in zip(G.KEYSHIFT_RETRIEVAL, doc_blocks.GEMMA_G5_RETRIEVAL):
        ks, ship = pd.read_parquet(REPO / mine), pd.read_parquet(REPO / theirs)
        assert ks.length.nunique() == 1 and set(ks.length) == set(ship.length)
        a = ks[ks.pattern == "dense"].set_index("seed").sort_index()
        b = ship[ship.pattern == "dense"].set_index("seed").sort_index()
        assert list(a.index) == list(b.index) == list(range(10))
        assert (a.score == b.score).all()
        assert np.allclose(a.answer_logprob, b.answer_logprob, atol=doc_blocks.DENSE_AGREEMENT)
        row = _row(table, "niah_single_2", "*Persuasion*", str(ks.length.iloc[0]))
        shifted = ks[ks.pattern == "hard_top2+key_shift"].set_index("seed").score
        assert row[3] == "10" and row[4] == f"{a.score.mean():.2f}" and row[7] == f"{shifted.mean():.2f}"
        assert row[5] == f"{ship[ship.pattern == 'default'].score.mean():.2f}"


def test_the_hamlet_oracle_reproduces_the_length_table_and_beats_both_kinds_of_groups():
    """The oracle run on Hamlet at 16384 tokens: its dense, hard top-2 and random top-2 rows are
    the committed length table's on the same windows (the same perplexity per window, an
    independent run), so the block's last row is that table's router-against-random change; the
    oracle is below both kinds of groups on every window."""
    orc = pd.read_parquet(REPO / doc_blocks.GEMMA_ORACLE_HAMLET)
    cells = pd.read_parquet(REPO / "figures/results/length_cells.parquet")
    lt = cells[(cells.table == "gemma3_distill64_8k") & (cells.corpus == "shakespeare") & (cells.seq_len == 16384)]
    for label in ("dense", "hard_top2", "random_top2"):
        a = orc[orc.label == label].set_index("window").perplexity.sort_index()
        b = lt[lt.label == label].set_index("window").perplexity.sort_index()
        assert list(a.index) == list(b.index) and np.allclose(a.values, b.values, rtol=1e-5)
    by = orc.pivot_table(index="window", columns="label", values="perplexity")
    assert (by["hard_top2+oracle"] < by[["hard_top2", "random_top2"]].min(axis=1)).all()
    row = _row(doc_blocks.render("gemma-oracle-hamlet-16k"), "`random_top2`", "`hard_top2`")
    ppl = {lab: _ppl(lt, lab) for lab in ("random_top2", "hard_top2")}
    assert row[2] == f"{100 * (ppl['random_top2'] / ppl['hard_top2'] - 1):+.2f}%"


def test_random_groups_with_and_without_the_shift_by_hand():
    """gemma-keyshift-random: the shipped file's random rows ran ``random_topK+key_shift`` and g5's
    table's ``random_topK``, on the same windows; the change and the distant pairs kept on
    *Persuasion* at 32768 tokens recomputed from the pooled NLLs, and the pairs kept within a
    hundredth (shifting random groups keeps their sparsity)."""
    cells = pd.read_parquet(REPO / doc_blocks.LENGTH_CELLS)
    at = (cells.corpus == "austen") & (cells.seq_len == 32768)
    new, old = cells[(cells.table == doc_blocks.GEMMA_TABLE) & at], cells[(cells.table == doc_blocks.GEMMA_G5_TABLE) & at]
    row = _row(doc_blocks.render("gemma-keyshift-random"), "*Persuasion*", "32768")
    assert row[2] == "3"
    for k, (change, kept) in zip((1, 2), (row[3:5], row[5:7])):
        a, b = new[new.label == f"random_top{k}"], old[old.label == f"random_top{k}"]
        assert set(a.canonical_pattern) == {f"random_top{k}+key_shift"} and set(b.canonical_pattern) == {f"random_top{k}"}
        assert sorted(a.window) == sorted(b.window) and len(a) == 3
        assert change.startswith(f"{100 * (_ppl(a, f'random_top{k}') / _ppl(b, f'random_top{k}') - 1):+.2f}% [")
        assert kept == f"{a.distant_pairs_kept.mean():.3f} / {b.distant_pairs_kept.mean():.3f}"
        assert abs(a.distant_pairs_kept.mean() - b.distant_pairs_kept.mean()) < 0.01
    # the shipped file's hard rows are the key-shift study's rows, by the pattern they ran
    ks = cells[(cells.table == G.KEYSHIFT_TABLE) & at & (cells.label == "hard_top2_keyshift")].set_index("window")
    mine = new[new.label == "hard_top2"].set_index("window")
    assert set(mine.canonical_pattern) == {"hard_top2+key_shift"} and set(mine.router_name) == {"gemma3-270m/distill64-8k-keyshift"}
    assert np.allclose(mine.nll.sort_index(), ks.nll.loc[mine.index].sort_index(), atol=0)
