"""The study pages' generated blocks (analyses/blocks/: key router, key shift, key shift trained,
top-k per layer, LM objective, needle mix, oracle gap, recipes at 512 tokens, restored drops,
restored rows): each page holds its block, and cells of each block agree with a computation
straight from the committed rows (an independent reference: per-window rows pooled by hand,
perplexity = exp of the token-weighted mean NLL; passkey and retrieval cases counted by hand).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from by_hand import kept, on_page, over_dense, paired, ppl, recipe_ppl, rows, table_row

from analyses import doc_blocks
from analyses.doc_blocks import REPO


def passkey_hits(tables, pattern: str) -> tuple[int, int, int, float]:
    """(hits, cases, hits among the cases dense retrieves, mean key log-prob) at 4096 tokens, dense
    from the tables that hold dense rows of the same cases."""
    p = pd.read_parquet(REPO / doc_blocks.PASSKEY_CASES)
    mine = p[p.table.isin(tables) & (p.pattern == pattern) & (p.length == 4096)]
    case = ["format", "length", "depth", "seed", "key"]
    dense = p[(p.pattern == "dense") & (p.length == 4096)].drop_duplicates(case)
    both = mine.merge(dense[case + ["exact_match"]], on=case, suffixes=("", "_dense"))
    assert len(both) == len(mine)
    return (int(mine.exact_match.sum()), len(mine), int((both.exact_match & both.exact_match_dense).sum()),
            float(mine.key_logprob.mean()))


# --------------------------------------------------------------------------------------------
# key shift

def test_key_shift_cells(cells):
    text = on_page("key-shift.md", "key-shift")
    r = table_row(text, "man-pages")
    assert r[4].startswith(f"{over_dense(cells, 'keyshift_domains', 'man-pages', 4096, 'hard_top2_keyshift'):+.1f}% [")
    assert r[4].endswith(f"[{kept(cells, 'keyshift_domains', 'man-pages', 4096, 'hard_top2_keyshift'):.2f}]")
    shift = paired(cells, ("keyshift_domains", "hard_top2_keyshift"), ("keyshift_domains", "hard_top2"), "man-pages")
    assert r[5].startswith(f"{shift:+.2f}% [")
    # the router's margin: random groups over the router, both shifted
    lead = 100 * (ppl(rows(cells, "keyshift_domains", "man-pages", 4096, "random_top2_keyshift"))
                  / ppl(rows(cells, "keyshift_domains", "man-pages", 4096, "hard_top2_keyshift")) - 1)
    assert r[6].startswith(f"{lead:+.1f}% (")
    r = table_row(text, "*Persuasion* 8192")
    top1 = over_dense(cells, "keyshift_persuasion", "austen", 8192, "hard_top1_keyshift")
    assert r[1] == "4" and r[2].startswith(f"{top1:+.1f}% [")
    pooled = table_row(text, "python-docs", 1)
    budget = paired(cells, ("keyshift_pooled_budget_domains", "hard_top2_keyshift"), ("keyshift_domains", "hard_top2_keyshift"),
                    "python-docs")
    assert pooled[2].startswith(f"{budget:+.2f}% [")
    hits, cases, of_dense, lp = passkey_hits(("keyshift_4k", "keyshift_4k_seeds6-11"), "hard_top2_keyshift")
    assert table_row(text, "hard top-2, keyshift")[2].startswith(f"{hits}/{cases} ({of_dense} of dense's 59), {lp:.2f} [")


# --------------------------------------------------------------------------------------------
# key shift, trained

def test_key_shift_trained_cells(cells):
    text = on_page("key-shift-trained.md", "key-shift-trained")
    # the first table: T under the shipped budget, paired against the shipped file with the shift
    r = table_row(text, "man-pages", 0)
    assert r[2].startswith(f"{over_dense(cells, 'keyshift_trained_domains', 'man-pages', 4096, 'hard_top1_keyshift'):+.1f}% [")
    t1 = paired(cells, ("keyshift_trained_domains", "hard_top1_keyshift"), ("keyshift_domains", "hard_top1_keyshift"), "man-pages")
    assert r[3].startswith(f"{t1:+.2f}% [")
    # the second: both budgets, on Persuasion at 8192, paired against T
    r = table_row(text, "*Persuasion* 8192", 1)
    assert r[4].endswith(f"[{kept(cells, 'keyshift_budgets_persuasion', 'austen', 8192, 'hard_top2_keyshift'):.2f}]")
    t2 = paired(cells, ("keyshift_budgets_persuasion", "hard_top1_keyshift"), ("keyshift_trained_persuasion", "hard_top1_keyshift"),
                "austen", 8192)
    assert r[3].startswith(f"{t2:+.2f}% [")
    # the third: the second training run's top-2 is the first run's, window by window
    a = rows(cells, "keyshift_top1_budget_domains", "python-docs", 4096, "hard_top2_keyshift").set_index("window")
    b = rows(cells, "keyshift_trained_domains", "python-docs", 4096, "hard_top2_keyshift").set_index("window")
    assert np.allclose(a.nll.sort_index(), b.nll.sort_index(), rtol=0, atol=1e-9)
    assert table_row(text, "python-docs", 2)[5].startswith("+0.00%")
    hits, cases, of_dense, lp = passkey_hits(("keyshift_budgets_4k", "keyshift_budgets_4k_seeds6-11"), "hard_top2")
    assert table_row(text, "`T`, both budgets")[2].startswith(f"{hits}/{cases} ({of_dense} of dense's 59), {lp:.2f} [")


# --------------------------------------------------------------------------------------------
# key router

def test_key_router_cells(cells):
    text = on_page("key-router.md", "key-router")
    r = table_row(text, "stage 5 with `--key-router`")
    t1, t2 = (over_dense(cells, "key_router_domains", "man-pages", 4096, k) for k in ("hard_top1", "hard_top2"))
    assert r[3] == f"{t1:+.1f}% / {t2:+.1f}% [{kept(cells, 'key_router_domains', 'man-pages', 4096, 'hard_top2'):.2f}]"
    assert table_row(text, "shipped + fitted `key_proj`")[2] == "-"  # the fit ran on man pages only
    top2 = paired(cells, ("key_router_domains", "hard_top2"), ("broad_unsouped_domains", "hard_top2"), "python-docs")
    assert table_row(text, "top-2")[1].startswith(f"{top2:+.2f}% [")


# --------------------------------------------------------------------------------------------
# the LM objective

def test_lm_objective_cells(cells):
    text = on_page("lm-objective.md", "lm-objective")
    r = table_row(text, "debian-reference")
    assert r[4].startswith(f"{over_dense(cells, 'lm_objective_domains', 'debian-reference', 4096, 'hard_top2_keyshift'):+.1f}% [")
    t2 = paired(cells, ("lm_objective_domains", "hard_top2_keyshift"), ("keyshift90_domains", "hard_top2_keyshift"),
                "debian-reference")
    assert r[5].startswith(f"{t2:+.2f}% [")
    lead = 100 * (ppl(rows(cells, "lm_objective_domains", "debian-reference", 4096, "random_top2_keyshift"))
                  / ppl(rows(cells, "lm_objective_domains", "debian-reference", 4096, "hard_top2_keyshift")) - 1)
    assert r[6].startswith(f"{lead:+.1f}% [")
    # the verdict's bound: every paired change within 0.16 points
    worst = max(abs(paired(cells, ("lm_objective_domains", k), ("keyshift90_domains", k), d))
                for k in ("hard_top1_keyshift", "hard_top2_keyshift") for d in ("python-docs", "man-pages", "debian-reference"))
    assert f"{worst:.2f}" == "0.16"


# --------------------------------------------------------------------------------------------
# top-k per layer

def test_layer_top_k_cells(cells):
    text = on_page("layer-top-k.md", "layer-top-k")
    r = table_row(text, "*Hamlet* 8192")
    assert r[2] == f"{over_dense(cells, 'shipped', 'shakespeare', 8192, 'hard_top1'):+.1f}%"
    b = paired(cells, ("shipped_budget_top1_hamlet", "hard_top1"), ("shipped", "hard_top1"), "shakespeare", 8192)
    assert r[4].startswith(f"{b:+.2f}% [")
    rnd = paired(cells, ("shipped_budget_top1_hamlet", "random_top1"), ("shipped", "random_top1"), "shakespeare", 8192)
    assert r[5].startswith(f"{rnd:+.2f}% [")
    r = table_row(text, "man-pages", 1)  # the top-2 table
    assert r[2] == (f"{over_dense(cells, 'shipped_domains', 'man-pages', 4096, 'hard_top2'):+.1f}% "
                    f"[{kept(cells, 'shipped_domains', 'man-pages', 4096, 'hard_top2'):.2f}]")
    lead = 100 * (ppl(rows(cells, "shipped_budget_top2_domains", "man-pages", 4096, "random_top2"))
                  / ppl(rows(cells, "shipped_budget_top2_domains", "man-pages", 4096, "hard_top2")) - 1)
    assert r[6].startswith(f"{lead:+.1f}% [")
    hits, cases, of_dense, lp = passkey_hits(("shipped_4k", "shipped_4k_seeds6-11"), "hard_top2")
    assert table_row(text, "uniform top-2")[2].startswith(f"{hits}/{cases} ({of_dense} of dense's 59), {lp:.2f} [")


# --------------------------------------------------------------------------------------------
# recipes at 512 tokens

def test_recipes_sweep_cells():
    text = on_page("recipes-sweep.md", "recipes-sweep")
    r = pd.read_parquet(REPO / "figures/results/recipes.parquet")
    s = r[r.sweep == "30 steps"].set_index(["recipe", "label"])
    dense = recipe_ppl(r, "30 steps", "controls", "dense")
    assert table_row(text, "dense")[1] == f"{dense:.2f}"
    paper = table_row(text, "`paper` (no sinks, argmax of raw scores)")
    top2 = recipe_ppl(r, "30 steps", "paper", "hard_top2")
    assert paper[3] == f"{100 * (top2 / dense - 1):+.1f}%" and paper[4].endswith(f"/ {top2:.2f}")
    assert paper[7] == f"{s.loc[('paper', 'hard_top1')].train_seconds:.0f}"
    long = recipe_ppl(r, "sinks64, 120 steps", "sinks64", "hard_top1")
    assert table_row(text, "`sinks64`, 120 steps")[2] == f"{100 * (long / dense - 1):+.1f}%"


# --------------------------------------------------------------------------------------------
# the oracle gap

def test_oracle_gap_cells():
    text = on_page("oracle-gap.md", "oracle-gap")
    res = pd.read_parquet(REPO / "figures/oracle/oracle_gap.parquet")
    by = {lab: g.set_index("window") for lab, g in res.groupby("label")}

    def change(a, b):
        x, y = by[a], by[b]
        return 100 * (np.exp(((x.nll * x.tokens).sum() - (y.nll * y.tokens).sum()) / x.tokens.sum()) - 1)

    moba = [r for r in text.splitlines() if r.startswith("| `default+moba` | `default` |")]
    assert len(moba) == 1 and f"| {change('default+moba', 'default'):+.2f}% |" in moba[0]
    rnd, mine, orc = (change(x, "dense") for x in ("random_default", "default", "default+oracle"))
    assert f"the routers cover {100 * (rnd - mine) / (rnd - orc):.0f}% of the range" in text
    last = sorted(res.window.unique())[-2:]
    sec = res[res.window.isin(last)].groupby("label").seconds.mean()
    assert table_row(text, "`default+oracle`", 1)[1:] == [f"{sec['default+oracle']:.1f}",
                                                 f"{sec['default+oracle'] / sec['dense']:.1f}x"]


# --------------------------------------------------------------------------------------------
# restored rows

def test_restored_rows_cells():
    text = on_page("restored-rows.md", "restored-rows")
    r = pd.read_parquet(REPO / "figures/results/restored_rows.parquet").set_index(["seed", "restored"]).answer_logprob
    dense, hard = r[(3, "dense")], r[(3, "hard_top2")]
    got = r[(3, "hard_top2 + question rows -> needle sentence, layers 1-9")]
    cells = table_row(text, "question rows to the needle sentence's keys only, layers 1-9")
    assert cells[1:4] == [f"{got:.2f}", f"{got - dense:+.2f}", f"{100 * (got - hard) / (dense - hard):.0f}%"]
    suite = pd.read_parquet(REPO / "figures/results/retrieval_cases.parquet")
    m = suite[(suite.task == "passkey") & (suite.length == 8192) & (suite.seed == 3)
              & (suite.pattern == "hard_top2_match_nocap")].answer_logprob
    assert len(m) == 1
    match = table_row(text, "hard top-2 with token-match pairs (no restoring; the suite's cases)")
    assert match[3] == f"{100 * (m.iloc[0] - hard) / (dense - hard):.0f}%" and match[4:] == ["-", "-", "-"]
    nm = pd.read_parquet(REPO / "figures/results/needle_mix_cases.parquet")
    nm = nm[(nm.task == "passkey") & (nm.length == 8192)].pivot_table(index="seed", columns="pattern", values="score")
    found, kept_ = int(nm.dense.sum()), int((nm.dense * nm.hard_top2).sum())
    assert f"dense finds {found}, hard top-2 {kept_} of them ({kept_ / found:.2f})" in text


# --------------------------------------------------------------------------------------------
# restored drops

def test_restored_drops_cells():
    text = on_page("restored-drops.md", "restored-drops")
    r = pd.read_parquet(REPO / "figures/results/restored_drops.parquet")
    one = r.recovered.to_numpy()
    q1, med, q3 = np.percentile(one, [25, 50, 75])
    assert table_row(text, "the heaviest dropped edge alone")[1:] == [
        f"{med:.3f}", f"{q1:.3f} to {q3:.3f}", str((one >= 0.5).sum()), str((one < 0.1).sum()), str((one < 0).sum())]
    the = r[r.key_token == " the"]
    assert table_row(text, '`" the"`')[1] == str(len(the)) and table_row(text, '`" the"`')[5] == str((the.recovered > 0.1).sum())
    g = pd.read_parquet(REPO / "figures/results/group_ablation.parquet")
    g0 = g[(g.layer_idx == 17) & (g.group == 0)]
    mean = (g0.delta * g0.tokens).sum() / g0.tokens.sum()
    pn = g0[g0.pos == "PROPN"].iloc[0]
    assert table_row(text, "17, 0")[1:4] == [str(g0.tokens.sum()), f"{mean:+.4f}",
                                       f"{pn.tokens_in_group} / {pn.tokens}, {pn.delta:+.3f}"]


# --------------------------------------------------------------------------------------------
# distillation with needles recalled far back

def test_needle_mix_retrieval_cells():
    page = "needle-mix-distillation.md"
    text = on_page(page, "needle-mix-retrieval")
    run = pd.read_parquet(REPO / "figures/results/needle_mix_cases.parquet")
    run = run[(run.routers == "needle_mix") & (run.task == "niah_single_2") & (run.length == 8192)].set_index(
        ["pattern", "seed"])
    dense, hard = run.loc["dense"], run.loc["hard_top2"]
    cells = table_row(text, "niah_single_2", 1)  # the 8192 row
    assert cells[3] == f"{dense.score.mean():.2f}"
    assert cells[5].startswith(f"{hard.score.mean() / dense.score.mean():.2f} [")
    assert f", {(hard.answer_logprob - dense.answer_logprob).mean():+.1f} [{hard.distant_pairs_kept.mean():.2f}]" in cells[5]
    # needle attention in the routed layers, pooled over the 54 cases by hand
    trace = pd.read_parquet(REPO / "figures/results/retrieval_trace.parquet")
    t = trace[(trace.pattern == "hard_top2_nocap") & (trace.length == 4096) & (trace.seed < 18)
              & trace.task.isin(["passkey", "niah_single_1", "niah_single_2"]) & (trace.layer_idx >= 10)]
    assert t[["task", "seed"]].drop_duplicates().shape[0] == 54
    assert table_row(text, "routed layers 10-29")[1] == f"{t.mass_kept.sum() / t.dense_mass.sum():.3f}"


def test_needle_mix_perplexity_and_shipping_cells(cells):
    page = "needle-mix-distillation.md"
    text = on_page(page, "needle-mix-perplexity")
    r = table_row(text, "man-pages")
    assert r[3].startswith(f"{over_dense(cells, 'needle_mix_domains', 'man-pages', 4096, 'hard_top2'):+.1f}% [")
    shipped = paired(cells, ("needle_mix_domains", "hard_top2"), ("shipped_per_domain", "hard_top2"), "man-pages")
    assert r[4].startswith(f"{shipped:+.2f}% [")
    text = on_page(page, "needle-mix-length")
    r = [c for c in (table_row(text, "*Persuasion*", i) for i in range(5)) if c[1] == "1024"][0]
    assert r[3].startswith(f"{paired(cells, ('needle_mix_length', 'hard_top1'), ('shipped', 'hard_top1'), 'austen', 1024):+.2f}% [")
    text = on_page(page, "needle-mix-shipping")
    hits, cases, of_dense, lp = passkey_hits(("needle_mix_4k", "needle_mix_4k_seeds6-11"), "hard_top2")
    assert table_row(text, "needle mix, hard top-2")[2].startswith(f"{hits}/{cases} ({of_dense} of dense's 59), {lp:.2f} [")
    one = table_row(text, "python-docs")  # 8192: one window, no interval
    at8 = paired(cells, ("needle_mix_heldout_8k", "hard_top2"), ("shipped_heldout_8k", "hard_top2"), "python-docs", 8192)
    assert one[2] == "1" and one[3] == f"{at8:+.2f}%"


def test_needle_mix_suite_cells():
    text = on_page("retrieval-suite.md", "needle-mix-suite")  # beside the suite of the file it started from
    s = pd.read_parquet(REPO / "figures/results/retrieval_cases.parquet")
    s = s[(s.task == "passkey") & (s.length == 8192)].set_index(["pattern", "seed"]).score
    hard, dense = s.loc["hard_top2_nocap"], s.loc["dense"]
    common = hard.index.intersection(dense.index)
    assert len(common) == 93
    cells = table_row(text, "passkey", 1)  # the 8192 row of the first table
    assert cells[2].startswith(f"{hard[common].mean() / dense[common].mean():.2f} [")
    assert cells[2].endswith("(93)")
