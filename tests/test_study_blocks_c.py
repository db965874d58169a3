"""The study pages' generated blocks (analyses/blocks/: retrieval-suite, routers-in-early-layers,
secondary-sinks, tech-budget-top1, tech-budget-top2, three-times-training, token-match-pairs,
trained-with-pairs): each page holds its blocks and is in the prose check, and cells of each block
agree with a computation by hand from the committed rows, independent of the helpers the blocks use
(perplexity = exp of the token-weighted mean NLL over the windows; a paired change over the windows
both patterns have; a retrieval difference = the mean over the cases both patterns ran)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from by_hand import change, on_page, over_dense, ppl, rows, table_row

from analyses import doc_blocks
from analyses.doc_blocks import REPO

RESULTS = REPO / "figures" / "results"

PAGES = ("retrieval-suite", "routers-in-early-layers", "secondary-sinks", "tech-budget-top1", "tech-budget-top2",
         "three-times-training", "token-match-pairs", "trained-with-pairs")


@pytest.mark.parametrize("stem", PAGES)
def test_the_page_is_in_the_prose_check(stem):
    rel = f"docs/studies/{stem}.md"
    assert rel in doc_blocks.prose_pages()
    assert doc_blocks.prose_problems(pages_=(rel,)) == []


def test_routers_in_early_layers_cells(cells):
    text = on_page("routers-in-early-layers.md", "routers-in-early-layers")
    d, lab = "man-pages", "hard_top2_keyshift"
    routed = rows(cells, "keyshift90_all_routed_domains", d, 4096, lab)
    row = table_row(text, d)
    assert row[1].startswith(f"{over_dense(cells, 'keyshift90_all_routed_domains', d, 4096, lab):+.1f}% [")
    assert row[1].endswith(f"[{routed.distant_pairs_kept.mean():.2f}]")
    assert row[2].startswith(f"{change(routed, rows(cells, 'keyshift90_domains', d, 4096, lab)):+.2f}% [")
    top1 = change(rows(cells, "keyshift90_all_routed_domains", "debian-reference", 4096, "hard_top1_keyshift"),
                  rows(cells, "keyshift90_domains", "debian-reference", 4096, "hard_top1_keyshift"))
    assert table_row(text, "debian-reference")[4].startswith(f"{top1:+.2f}% [")


def test_three_times_training_cells(cells):
    text = on_page("three-times-training.md", "three-times-training")
    d = "man-pages"
    row = table_row(text, d)
    top2 = rows(cells, "keyshift90_domains", d, 4096, "hard_top2_keyshift")
    assert row[1] == str(top2.window.nunique())
    assert row[5].startswith(f"{over_dense(cells, 'keyshift90_domains', d, 4096, 'hard_top2_keyshift'):+.1f}% [")
    assert row[6].startswith(f"{change(top2, rows(cells, 'keyshift_budgets_domains', d, 4096, 'hard_top2_keyshift')):+.2f}% [")
    assert row[7] == f"{over_dense(cells, 'keyshift_budgets_domains', d, 4096, 'hard_top2_keyshift'):+.1f}%"
    top1 = rows(cells, "keyshift90_domains", d, 4096, "hard_top1_keyshift")
    assert row[3].startswith(f"{change(top1, rows(cells, 'keyshift_tech_top1_domains', d, 4096, 'hard_top1_keyshift')):+.2f}% [")
    # the controls: random groups' perplexity over the router's at the same k
    ctrl = on_page("three-times-training.md", "three-times-training-controls")
    t = "keyshift90_controls_domains"
    margin = 100 * (ppl(rows(cells, t, d, 4096, "shuffled_top2_keyshift")) / ppl(rows(cells, t, d, 4096, "hard_top2_keyshift")) - 1)
    assert table_row(ctrl, d)[4].startswith(f"{margin:+.1f}% [")
    # 8192 tokens: one window of the Python docs, so no interval there
    at8 = on_page("three-times-training.md", "three-times-training-8k")
    py = table_row(at8, "python-docs")
    g = rows(cells, "keyshift90_heldout_8k", "python-docs", 8192, "hard_top2_keyshift")
    assert py[1] == "1" and py[2] == (f"{over_dense(cells, 'keyshift90_heldout_8k', 'python-docs', 8192, 'hard_top2_keyshift'):+.1f}% "
                                      f"[{g.distant_pairs_kept.mean():.2f}]")
    assert table_row(at8, d)[6].startswith(f"{over_dense(cells, 'shipped_heldout_8k', d, 8192, 'hard_top1'):+.1f}% [")


def test_trained_with_pairs_cells(cells):
    text = on_page("trained-with-pairs.md", "trained-with-pairs")
    d = "man-pages"
    row = table_row(text, d)
    top2 = rows(cells, "match_trained_domains", d, 4096, "hard_top2")
    assert row[2] == f"{over_dense(cells, 'match_trained_domains', d, 4096, 'hard_top2'):+.1f}% [{top2.distant_pairs_kept.mean():.2f}]"
    margin = 100 * (ppl(rows(cells, "match_trained_domains", d, 4096, "random_top2")) / ppl(top2) - 1)
    assert row[3].startswith(f"{margin:+.1f}% [")
    top1 = change(rows(cells, "match_trained_domains", d, 4096, "hard_top1"),
                  rows(cells, "broad_s5_match_domains", d, 4096, "hard_top1"))
    assert row[4].startswith(f"{change(top2, rows(cells, 'broad_s5_match_domains', d, 4096, 'hard_top2')):+.2f}% [")
    assert row[4].endswith(f"({top1:+.2f}%)")
    shipped = rows(cells, "match_per_domain", d, 4096, "hard_top2")
    assert row[6] == f"{over_dense(cells, 'match_per_domain', d, 4096, 'hard_top2'):+.1f}% [{shipped.distant_pairs_kept.mean():.2f}]"
    prose = table_row(text, "*Persuasion* 8192 (4 windows)")
    assert prose[2].startswith(f"{over_dense(cells, 'match_trained_persuasion', 'austen', 8192, 'hard_top2'):+.1f}% [")


def sweep_delta(study: str, layer: int, k: int) -> float:
    """A layer-budget sweep's NLL change by hand: that layer alone at k minus the uniform base
    (layer -1) on the same corpus and window, averaged over them."""
    lb = pd.read_parquet(RESULTS / "layer_budget.parquet")
    lb = lb[lb.study == study]
    base = lb[lb.layer_idx == -1].set_index(["corpus", "window"]).nll
    one = lb[(lb.layer_idx == layer) & (lb.top_k == k)].set_index(["corpus", "window"]).nll
    assert len(one) and set(one.index) <= set(base.index)
    return float((one - base.loc[one.index]).mean())


def test_tech_budget_top1_cells(cells):
    sweep = on_page("tech-budget-top1.md", "tech-budget-top1-sweep")
    row = table_row(sweep, "18")
    assert row[1:3] == [f"{sweep_delta('top1_tech_keyshift', 18, 0):+.4f}", f"{sweep_delta('top1_tech_keyshift', 18, 2):+.4f}"]
    assert row[3:] == ["2", "2"]  # the costliest layer at k = 0 gets k = 2 in both allocations
    assert table_row(sweep, "19")[3:] == ["0", "0"] and sweep_delta("top1_tech_keyshift", 19, 0) < 0

    text = on_page("tech-budget-top1.md", "tech-budget-top1")
    d, lab = "man-pages", "hard_top1_keyshift"
    pooled = rows(cells, "keyshift_pooled_top1_domains", d, 4096, lab)
    row = table_row(text, d)
    assert row[2] == (f"{over_dense(cells, 'keyshift_trained_domains', d, 4096, lab):+.1f}% "
                      f"[{rows(cells, 'keyshift_trained_domains', d, 4096, lab).distant_pairs_kept.mean():.2f}]")
    assert row[4] == f"{over_dense(cells, 'keyshift_pooled_top1_domains', d, 4096, lab):+.1f}% [{pooled.distant_pairs_kept.mean():.2f}]"
    assert row[5].startswith(f"{change(pooled, rows(cells, 'keyshift_top1_budget_domains', d, 4096, lab)):+.2f}% [")
    margin = 100 * (ppl(rows(cells, "keyshift_tech_top1_domains", d, 4096, "random_top1_keyshift"))
                    / ppl(rows(cells, "keyshift_tech_top1_domains", d, 4096, lab)) - 1)
    assert row[9] == f"{margin:+.1f}%"
    at8 = table_row(text, "*Persuasion* 8192")
    tech = rows(cells, "keyshift_tech_top1_persuasion", "austen", 8192, lab)
    assert at8[8].startswith(f"{change(tech, rows(cells, 'keyshift_budgets_persuasion', 'austen', 8192, lab)):+.2f}% [")

    rnd = on_page("tech-budget-top1.md", "tech-budget-top1-random")
    r = "random_top1_keyshift"
    assert table_row(rnd, d)[1].startswith(
        f"{change(rows(cells, 'keyshift_pooled_top1_domains', d, 4096, r), rows(cells, 'keyshift_top1_budget_domains', d, 4096, r)):+.2f}% [")


def test_tech_budget_top2_cells(cells):
    sweep = on_page("tech-budget-top2.md", "tech-budget-top2-sweep")
    assert table_row(sweep, "20")[1] == f"{sweep_delta('top2_tech', 20, 1):+.4f}"
    assert table_row(sweep, "9")[3:] == ["1", "1"] and sweep_delta("top2_tech", 9, 1) < 0

    text = on_page("tech-budget-top2.md", "tech-budget-top2")
    d = "man-pages"
    pooled = rows(cells, "pooled_budget_domains", d, 4096, "hard_top2")
    margin = 100 * (ppl(rows(cells, "pooled_budget_domains", d, 4096, "random_top2")) / ppl(pooled) - 1)
    cell = table_row(text, d)[4]
    assert cell.startswith(f"{over_dense(cells, 'pooled_budget_domains', d, 4096, 'hard_top2'):+.1f}% "
                           f"[{pooled.distant_pairs_kept.mean():.2f}], "
                           f"{change(pooled, rows(cells, 'shipped_per_domain', d, 4096, 'hard_top2')):+.2f}% [")
    assert cell.endswith(f"], {margin:+.1f}%")
    hamlet = rows(cells, "pooled_budget_hamlet", "shakespeare", 8192, "hard_top2")
    assert f", {change(hamlet, rows(cells, 'shipped', 'shakespeare', 8192, 'hard_top2')):+.2f}% [" in table_row(text, "*Hamlet* 8192")[4]

    rnd = on_page("tech-budget-top2.md", "tech-budget-top2-random")
    r = "random_top2"
    assert table_row(rnd, d)[1].startswith(
        f"{change(rows(cells, 'tech_budget_domains', d, 4096, r), rows(cells, 'shipped_per_domain', d, 4096, r)):+.2f}% [")

    match = on_page("tech-budget-top2.md", "tech-budget-top2-match")
    t = rows(cells, "tech_budget_match_domains", "python-docs", 4096, "hard_top2")
    assert table_row(match, "python-docs")[2].startswith(
        f"{change(t, rows(cells, 'match_per_domain', 'python-docs', 4096, 'hard_top2')):+.2f}% [")

    # passkey: the pooled budget's hits, and of the keys dense finds on the same cases, those it keeps
    pk = pd.read_parquet(RESULTS / "passkey_cases.parquet")
    mine = pk[pk.table.isin(["pooled_budget_4k", "pooled_budget_4k_seeds6-11"]) & (pk.pattern == "hard_top2")]
    case = ["format", "length", "depth", "seed", "key"]
    dense = pk[pk.table.isin(["every_layer_routed_4k", "every_layer_routed_4k_seeds3-5",
                              "stage2_distill64_4k_budget_top2_seeds6-11"]) & (pk.pattern == "dense")]
    both = mine.merge(dense[case + ["exact_match"]].drop_duplicates(case), on=case, suffixes=("", "_dense"))
    assert len(both) == len(mine) == 60
    row = table_row(on_page("tech-budget-top2.md", "tech-budget-top2-passkey"), "`pooled` budget")
    assert row[1:4] == [f"{int(mine.exact_match.sum())} of 60",
                        f"{int((both.exact_match & both.exact_match_dense).sum())} of {int(both.exact_match_dense.sum())}",
                        f"{mine.key_logprob.mean():.2f}"]


def test_token_match_pairs_cells(cells):
    page = "token-match-pairs.md"
    # the diagnosis: summed NLL over the two windows against dense's on the same windows
    cp = pd.read_parquet(RESULTS / "copy_pairs.parquet")
    g = cp[cp.corpus == "man-pages"]
    dense = g[g.pattern == "dense"].set_index("window")
    for col, extra in ((2, "s0+1"), (3, "random")):
        x = g[(g.pattern == "hard_top2") & (g.extra == extra)].set_index("window")
        pct = 100 * np.expm1((x.nll.sum() - dense.nll[x.index].sum()) / x.tokens.sum())
        assert table_row(on_page(page, "token-match-diagnosis"), "man-pages")[col].startswith(f"{pct:+.2f}% [")

    held = table_row(on_page(page, "token-match-held-out"), "debian-reference")
    d = "debian-reference"
    top2 = rows(cells, "match_per_domain", d, 4096, "hard_top2")
    assert held[2].startswith(f"{over_dense(cells, 'match_per_domain', d, 4096, 'hard_top2'):+.1f}% [")
    assert held[2].endswith(f"[{top2.distant_pairs_kept.mean():.2f}] ({over_dense(cells, 'shipped_per_domain', d, 4096, 'hard_top2'):+.1f}% "
                            f"[{rows(cells, 'shipped_per_domain', d, 4096, 'hard_top2').distant_pairs_kept.mean():.2f}])")
    assert held[5].startswith(f"{change(top2, rows(cells, 'shipped_per_domain', d, 4096, 'hard_top2')):+.2f}% [")

    other = table_row(on_page(page, "token-match-other"), "*Persuasion*, 8192")
    a, b = rows(cells, "match_persuasion", "austen", 8192, "hard_top2"), rows(cells, "shipped", "austen", 8192, "hard_top2")
    assert other[5].startswith(f"{change(a, b):+.2f}% [")
    m1 = 100 * (ppl(rows(cells, "match_persuasion", "austen", 8192, "random_top1"))
                / ppl(rows(cells, "match_persuasion", "austen", 8192, "hard_top1")) - 1)
    assert other[7].startswith(f"{m1:+.1f}% (")
    kernel = table_row(on_page(page, "token-match-other"), "kernel-docs")
    assert kernel[3].startswith(f"{change(rows(cells, 'match_train_domains', 'kernel-docs', 4096, 'hard_top1'), rows(cells, 'shipped_per_domain', 'kernel-docs', 4096, 'hard_top1')):+.2f}% [")

    ks = table_row(on_page(page, "token-match-keyshift"), "man-pages")
    lab = "hard_top2_keyshift"
    assert ks[5].startswith(f"{change(rows(cells, 'keyshift90_match_domains', 'man-pages', 4096, lab), rows(cells, 'keyshift90_domains', 'man-pages', 4096, lab)):+.2f}% [")

    # nearest keys: one window; "all" from the length table's rows of the same window
    cap = pd.read_parquet(RESULTS / "copy_pairs_cap.parquet")
    g = cap[cap.corpus == "man-pages"]
    r4 = g[(g.pattern == "hard_top1") & (g["cap"] == 4)].iloc[0]
    d4 = g[(g.pattern == "dense") & (g["cap"] == 4)].iloc[0]
    near = table_row(on_page(page, "token-match-nearest"), "man-pages")
    w = int(r4.window)
    m = rows(cells, "match_per_domain", "man-pages", 4096, "hard_top1").set_index("window").nll[w]
    dn = rows(cells, "match_per_domain", "man-pages", 4096, "dense").set_index("window").nll[w]
    assert near[1] == "hard_top1" and near[2] == f"{100 * np.expm1((r4.nll - d4.nll) / r4.tokens):+.1f}%"
    assert near[4] == f"{100 * np.expm1(m - dn):+.1f}%"

    # speed: tokens/s straight from the csv
    e2e = pd.read_csv(REPO / "figures" / "bench_attention" / "e2e_match.csv")
    pre = e2e[(e2e.phase == "prefill") & (e2e.tokens == 8192)].set_index("pattern").bare_tokens_per_s
    speed = table_row(on_page(page, "token-match-speed"), "prefill 8192, tokens/s")
    assert speed[1] == f"{pre['dense']:.1f} / {pre['hard_top2']:.1f} / {pre['hard_top2_match']:.1f}"
    assert speed[2] == f"{100 * (1 - pre['hard_top2_match'] / pre['hard_top2']):.0f}%"


def test_secondary_sinks_cells(cells):
    text = on_page("secondary-sinks.md", "secondary-sinks-every-layer")
    t = "every_layer_routed"
    at8 = table_row(text, "*Persuasion*", nth=1)
    assert at8[1] == "8192"
    for col, control, router in ((5, "random_top1", "hard_top1"), (6, "random_top2", "hard_top2")):
        margin = 100 * (ppl(rows(cells, t, "austen", 8192, control)) / ppl(rows(cells, t, "austen", 8192, router)) - 1)
        assert at8[col].startswith(f"{margin:+.1f}% [")
    top2 = rows(cells, t, "shakespeare", 4096, "hard_top2")
    assert table_row(text, "*Hamlet*")[4] == f"{over_dense(cells, t, 'shakespeare', 4096, 'hard_top2'):+.1f}% [{top2.distant_pairs_kept.mean():.2f}]"


def test_retrieval_suite_cells():
    page = "retrieval-suite.md"
    cases = pd.read_parquet(RESULTS / "retrieval_cases_5710775e.parquet")

    def pattern(task: str, L: int, p: str) -> pd.DataFrame:
        g = cases[(cases.task == task) & (cases.length == L) & (cases.pattern == p)].set_index("seed")
        assert len(g), (task, L, p)
        return g

    # the suite's table: score relative to dense (mean over dense's mean on the same cases), log-prob change
    dense, hard = pattern("niah_single_1", 4096, "dense"), pattern("niah_single_1", 4096, "hard_top2")
    s = hard.index.intersection(dense.index)
    row = table_row(on_page(page, "retrieval-suite"), "niah_single_1")
    assert row[2:4] == [str(len(dense)), f"{dense.score.mean():.2f}"]
    assert row[4].startswith(f"{hard.score[s].mean() / dense.score[s].mean():.2f} [")
    dlp = (hard.answer_logprob[s] - dense.answer_logprob[s]).mean()
    assert row[4].endswith(f", {dlp:+.1f} [{hard.distant_pairs_kept.mean():.2f}]")

    # paired differences: the mean over the cases both patterns ran
    def diff(task, L, a, b, col):
        x, y = pattern(task, L, a)[col], pattern(task, L, b)[col]
        common = x.index.intersection(y.index)
        return float((x[common] - y[common]).mean()), len(common)
    # each cell: the score difference / the log-prob difference (cases)
    paired_text = on_page(page, "retrieval-suite-paired")
    d, n = diff("passkey", 4096, "hard_top2", "random_top2", "score")
    cell = table_row(paired_text, "passkey")[2]
    assert cell.startswith(f"{d:+.2f} [") and cell.endswith(f"({n})")
    d_lp, n_lp = diff("passkey", 4096, "hard_top2", "random_top2", "answer_logprob")
    assert n_lp == n and cell.split(" / ")[1].startswith(f"{d_lp:+.1f} [")
    d, n = diff("niah_multikey_3", 4096, "hard_top2", "moba_matched", "answer_logprob")
    assert abs(d) >= 1 and table_row(paired_text, "niah_multikey_3")[5].split(" / ")[1].startswith(f"{d:+.1f} [")
    d, n = diff("passkey", 4096, "hard_top2_match", "random_top2_match", "answer_logprob")
    assert abs(d) < 1 and table_row(paired_text, "passkey")[9].split(" / ")[1].startswith(f"{d:+.2f} [")

    # the hard tasks' dense solves: cases dense scores 1 on among the seven tasks
    seven = ["niah_single_3", "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe"]
    solved = cases[(cases.pattern == "dense") & cases.task.isin(seven) & (cases.score == 1)][["task", "length", "seed"]]
    m = cases[cases.pattern == "hard_top2_match"].merge(solved, on=["task", "length", "seed"])
    assert table_row(on_page(page, "retrieval-suite-hard-cases"), "hard_top2_match")[1:3] == [
        str(len(solved)), str(int((m.score == 1).sum()))]

    # the needle attention kept: sums over the trace's cases, layers and heads
    trace = pd.read_parquet(RESULTS / "retrieval_trace_5710775e.parquet")
    t = trace[(trace.length == 4096) & trace.task.isin(["passkey", "niah_single_1", "niah_single_2", "niah_multikey_1"])
              & (trace.pattern == "random_top2")]
    assert table_row(on_page(page, "retrieval-suite-needle"), "random_top2")[2] == f"{t.mass_kept.sum() / t.dense_mass.sum():.0%}"

    # the failures: the heaviest dropped head of one case by hand
    f = trace[(trace.task == "passkey") & (trace.length == 4096) & (trace.seed == 100) & (trace.pattern == "hard_top2")]
    top = f.assign(dropped=f.dense_mass - f.mass_kept).sort_values("dropped", ascending=False).iloc[0]
    row = table_row(on_page(page, "retrieval-suite-failures"), "passkey, 4096, seed 100")
    assert row[4].startswith(f"L{int(top.layer_idx)}H{int(top['head'])} {top.dropped:.2f} of {top.dense_mass:.2f} (")
