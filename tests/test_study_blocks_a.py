"""The study pages' generated blocks (analyses/blocks/: broad-mix, calibrated-bias, chain-variants,
copies-by-layer, copy-weighted-distillation, dense-layers-budget, eight-groups, group-capacity):
each page holds its block, and cells of each block agree with a computation by hand from the
committed rows (perplexity = exp of the token-weighted mean NLL over the windows; a paired change
over the windows both patterns have), independent of ``analyses.length_table.summarize``."""

from __future__ import annotations

import pandas as pd
from by_hand import change, on_page, ppl, rows, table_row

from analyses import doc_blocks
from analyses.doc_blocks import REPO


def test_every_page_is_in_the_prose_check():
    pages = set(doc_blocks.prose_pages())
    for stem in ("calibrated-bias", "copy-weighted-distillation", "eight-groups", "dense-layers-budget",
                 "copies-by-layer", "broad-mix", "chain-variants", "group-capacity"):
        assert f"docs/studies/{stem}.md" in pages


def test_calibrated_bias_cells(cells):
    text = on_page("calibrated-bias.md", "calibrated-bias")
    d = "man-pages"
    shipped = rows(cells, "shipped_per_domain", d, 4096, "hard_top2")
    refit = rows(cells, f"calibrated_{d}", d, 4096, "hard_top2")
    dense = rows(cells, f"calibrated_{d}", d, 4096, "dense")
    row = table_row(text, "man pages")
    assert row[2] == f"{100 * (ppl(refit) / ppl(dense) - 1):+.1f}% [{refit.distant_pairs_kept.mean():.2f}]"
    assert row[3].startswith(f"{change(refit, shipped):+.2f}% [")
    top1 = change(rows(cells, f"calibrated_{d}", d, 4096, "hard_top1"), rows(cells, "shipped_per_domain", d, 4096, "hard_top1"))
    assert row[4].endswith(f"({top1:+.2f}%)")


def test_copy_weighted_distillation_cells(cells):
    text = on_page("copy-weighted-distillation.md", "copy-weighted-distillation")
    d = "python-docs"
    top2 = rows(cells, "copy_share_domains", d, 4096, "hard_top2_keyshift")
    dense = rows(cells, "copy_share_domains", d, 4096, "dense")
    uniform1 = rows(cells, "keyshift_tech_top1_domains", d, 4096, "hard_top1_keyshift")
    top1 = rows(cells, "copy_share_domains", d, 4096, "hard_top1_keyshift")
    rnd = rows(cells, "copy_share_domains", d, 4096, "random_top2_keyshift")
    row = table_row(text, d)
    assert row[1].startswith(f"{100 * (ppl(top2) / ppl(dense) - 1):+.1f}% [")
    assert row[1].endswith(f"[{top2.distant_pairs_kept.mean():.2f}]")
    assert row[2].startswith(f"{change(top2, rows(cells, 'keyshift_budgets_domains', d, 4096, 'hard_top2_keyshift')):+.2f}% [")
    assert row[4].startswith(f"{change(top1, uniform1):+.2f}% [")
    assert row[5].startswith(f"{100 * (ppl(rnd) / ppl(top2) - 1):+.1f}% [")


def test_eight_groups_cells(cells):
    text = on_page("eight-groups.md", "eight-groups")
    d = "man-pages"
    top4 = rows(cells, "k8_split_domains", d, 4096, "hard_top4_keyshift")
    dense = rows(cells, "k8_split_domains", d, 4096, "dense")
    four = rows(cells, "keyshift_budgets_domains", d, 4096, "hard_top2_keyshift")
    rnd8 = rows(cells, "k8_split_domains", d, 4096, "random_top4_keyshift")
    rnd4 = rows(cells, "keyshift_budgets_domains", d, 4096, "random_top2_keyshift")
    row = table_row(text, d)
    assert row[1] == str(dense.window.nunique())
    assert row[4] == f"{100 * (ppl(top4) / ppl(dense) - 1):+.1f}% [{top4.distant_pairs_kept.mean():.2f}]"
    assert row[5].startswith(f"{change(top4, four):+.2f}% [")
    assert row[7].startswith(f"{change(rnd8, rnd4):+.2f}% [")


def test_dense_layers_budget_cells(cells):
    text = on_page("dense-layers-budget.md", "dense-layers-budget")
    d = "man-pages"
    dense8 = rows(cells, "budget_dense8_domains", d, 4096, "hard_top2")
    shipped = rows(cells, "shipped_per_domain", d, 4096, "hard_top2")
    dense = rows(cells, "budget_dense8_domains", d, 4096, "dense")
    row = table_row(text, "man pages (4 windows)")
    assert row[3].startswith(f"{100 * (ppl(dense8) / ppl(dense) - 1):+.2f}% [{dense8.distant_pairs_kept.mean():.2f}], "
                             f"{change(dense8, shipped):+.2f}% [")
    e2e = pd.read_csv(REPO / "figures/bench_attention/e2e_dense8.csv").set_index(["phase", "tokens", "pattern"])
    speed = e2e.loc[("prefill", 8192, "hard_top2"), "bare_tokens_per_s"] / e2e.loc[("prefill", 8192, "dense"), "bare_tokens_per_s"]
    assert table_row(text, "prefill 8192, bare, vs dense in the same run")[3] == f"{speed:.2f}x"
    kernel = pd.read_csv(REPO / "figures/bench_attention/kernel_k123_4096.csv")
    k3 = kernel[(kernel.n == 4096) & (kernel.K == 4) & (kernel.k == 3)].iloc[0]
    assert table_row(on_page("dense-layers-budget.md", "dense-layers-kernel"), "3")[3] == f"{k3.focus_s / k3.dense_s:.2f}x"


def test_copies_by_layer_cells():
    # independent reference: a layer at k = 0 keeps no distant pair, so the routed layers are those
    # outside the random layers 1-9 with any pair kept
    layers = pd.read_parquet(REPO / "figures/results/copy_pairs_layers.parquet")
    e = layers[layers.routers_sha256.str.startswith("adea43ed") & (layers.pattern == "hard_top1")
               & (layers.corpus == "python-docs")]
    routed = e[~e.layer_idx.between(1, 9) & (e.pairs_kept > 0)]
    assert 0 < len(routed) < 21
    c, a = routed.copies_kept.mean(), routed.pairs_kept.mean()
    row = table_row(on_page("copies-by-layer.md", "copies-by-layer"), "`E`, with the shift | top-1")
    assert row[5] == f"{c:.2f} / {a:.2f} ({c / a:.1f}x)"
    shipped0 = layers[layers.routers_sha256.str.startswith("5710775e") & (layers.pattern == "hard_top1")
                      & (layers.layer_idx == 0)].copies_kept
    row = table_row(on_page("copies-by-layer.md", "copies-by-layer-layers"), "0")
    assert row[1] == f"{shipped0.min():.2f}-{shipped0.max():.2f}"
    assert table_row(doc_blocks.render("copies-by-layer-layers"), "12")[3] == "k = 0"


def test_broad_mix_cells(cells):
    text = on_page("broad-mix.md", "broad-mix")
    d = "debian-reference"
    top2 = rows(cells, "broad_mix_domains", d, 4096, "hard_top2")
    dense = rows(cells, "broad_mix_domains", d, 4096, "dense")
    shipped2 = rows(cells, "shipped_domains", d, 4096, "hard_top2")
    shipped_dense = rows(cells, "shipped_domains", d, 4096, "dense")
    row = table_row(text, d)
    assert row[4].startswith(f"{100 * (ppl(top2) / ppl(dense) - 1):+.1f}% [")
    assert row[4].endswith(f"[{top2.distant_pairs_kept.mean():.2f}] ({100 * (ppl(shipped2) / ppl(shipped_dense) - 1):+.1f}%)")
    top1 = change(rows(cells, "broad_mix_domains", d, 4096, "hard_top1"), rows(cells, "shipped_domains", d, 4096, "hard_top1"))
    assert row[6].startswith(f"{change(top2, shipped2):+.2f}% [") and row[6].endswith(f"/ {top1:+.2f}%")
    hamlet = table_row(text, "*Hamlet* 4096")
    a = rows(cells, "broad_mix_train_domains", "shakespeare", 4096, "hard_top2")
    b = rows(cells, "shipped_uniform", "shakespeare", 4096, "hard_top2")
    assert hamlet[2] == str(a.window.nunique()) and hamlet[6].startswith(f"{change(a, b):+.2f}% [")


def test_chain_variants_cells(cells):
    text = on_page("chain-variants.md", "chain-variants")
    p2 = rows(cells, "shipped_8k_all_persuasion", "austen", 8192, "hard_top2")
    pd_ = rows(cells, "shipped_8k_all_persuasion", "austen", 8192, "dense")
    h1 = rows(cells, "shipped_8k_all_hamlet", "shakespeare", 8192, "hard_top1")
    hr = rows(cells, "shipped_8k_all_hamlet", "shakespeare", 8192, "random_top1")
    hd = rows(cells, "shipped_8k_all_hamlet", "shakespeare", 8192, "dense")
    row = table_row(text, "shipped (average of stages 2 and 3)")
    assert row[2] == f"{p2.window.nunique()} / {h1.window.nunique()}" == "14 / 6"
    assert row[3] == f"{ppl(pd_):.2f} / {ppl(hd):.2f}"
    assert row[4].startswith(f"{100 * (ppl(p2) / ppl(pd_) - 1):+.2f}% [")
    assert row[6].startswith(f"{100 * (ppl(hr) / ppl(h1) - 1):+.1f}% [")
    paired = on_page("chain-variants.md", "chain-variants-paired")
    merge = change(rows(cells, "merge5_top2", "austen", 8192, "hard_top2"),
                   rows(cells, "stage2_distill64", "austen", 8192, "hard_top2"))
    assert table_row(paired, "the 5-layer merge against stage 2, *Persuasion* top-2, 8192")[3].startswith(f"{merge:+.2f}% [")
    four = on_page("chain-variants.md", "chain-variants-4k")
    t1, d = rows(cells, "distill4k_topk", "austen", 4096, "hard_top1"), rows(cells, "distill4k_topk", "austen", 4096, "dense")
    assert table_row(four, "+ 30 steps of `distill64_topk`")[4].startswith(f"{100 * (ppl(t1) / ppl(d) - 1):+.1f}% [")


def test_group_capacity_cells(cells):
    # perplexity: the cap's paired change over hard top-2 on the man pages (table capacity), and E7's
    # on the Debian Reference (table capacity_evict7), by hand
    text = on_page("group-capacity.md", "group-capacity-perplexity")
    a = rows(cells, "capacity", "man-pages", 4096, "hard_top2_cap")
    b = rows(cells, "capacity", "man-pages", 4096, "hard_top2")
    d = rows(cells, "capacity", "man-pages", 4096, "dense")
    row = table_row(text, "man pages")
    assert row[3] == f"{100 * (ppl(b) / ppl(d) - 1):+.2f}" and row[4] == f"{100 * (ppl(a) / ppl(d) - 1):+.2f}"
    assert row[5].startswith(f"{change(a, b):+.2f} [")
    assert row[6] == f"{b.distant_pairs_kept.mean():.2f} / {a.distant_pairs_kept.mean():.2f}"
    e7 = on_page("group-capacity-layers.md", "group-capacity-e7")
    x = rows(cells, "capacity_evict7", "debian-reference", 4096, "hard_top2_evict@13+15-16+21+25+28-29")
    h = rows(cells, "capacity_evict7", "debian-reference", 4096, "hard_top2")
    assert table_row(e7, "Debian Reference")[6].startswith(f"{change(x, h):+.2f}% [")
    sweep = on_page("group-capacity.md", "group-capacity-sweep")
    c80 = rows(cells, "capacity_sweep", "man-pages", 4096, "hard_top2_cap80")
    h = rows(cells, "capacity_sweep", "man-pages", 4096, "hard_top2")
    assert table_row(sweep, "0.8")[2].startswith(f"{change(c80, h):+.2f} [")


def test_group_capacity_retrieval_cells():
    # retrieval: mean scores and pairs by hand from the committed cases (the study's hard top-2 is
    # hard_top2_nocap there, E7 hard_top2); S's case maximum of the pairs; a lost needle's row
    cases = pd.read_parquet(REPO / "figures/results/retrieval_cases.parquet")
    n1 = cases[(cases.task == "niah_single_1") & (cases.length == 8192)]
    s = n1[n1.pattern == "hard_top2_cap@0+13+15-16+21+24-25+28-29"].set_index("seed")
    hard = n1[n1.pattern == "hard_top2_nocap"].set_index("seed").loc[s.index]
    dense = n1[n1.pattern == "dense"].set_index("seed").loc[s.index]
    row = table_row(on_page("group-capacity-layers.md", "group-capacity-s"), "niah_single_1 | 8192")
    assert row[2] == str(len(s)) == "33"
    assert row[4].startswith(f"{s.score.mean() / dense.score.mean():.2f} [")
    assert row[5] == (f"{hard.distant_pairs_kept.mean():.3f} / {s.distant_pairs_kept.mean():.3f} "
                      f"[{s.distant_pairs_kept.max():.4f}]")
    diff = (s.answer_logprob - hard.answer_logprob).mean()
    assert row[6].startswith(f"{diff:+.2f} [")
    needles = on_page("group-capacity-layers.md", "group-capacity-layers-needles")
    lost = [r for r in needles.splitlines() if r.startswith("| S | niah_single_1 | 8192 |")]
    lost_by_hand = s.index[(s.score < hard.score)]
    assert [int(r.split("|")[4]) for r in lost if "| 1 / 1 / 0 |" in r] == sorted(lost_by_hand.tolist())
    other = on_page("group-capacity-layers.md", "group-capacity-other-tasks")
    v = cases[(cases.task == "vt") & (cases.length == 4096)]
    e7, nocap = v[v.pattern == "hard_top2"].set_index("seed"), v[v.pattern == "hard_top2_nocap"].set_index("seed")
    assert table_row(other, "vt | 4096")[7].startswith(f"{(e7.answer_logprob - nocap.answer_logprob.loc[e7.index]).mean():+.2f} [")
