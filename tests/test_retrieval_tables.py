"""Merging retrieval suite outputs (``eval.retrieval_tables.read_suite`` / ``merge_suites``):
hand-made tables, checked row by row."""

import pandas as pd
import pytest

from focus_lab.eval.retrieval_tables import merge_suites, read_suite


def _cases(seeds, pattern="dense", score=1.0, **extra):
    return pd.DataFrame([{"task": "passkey", "length": 4096, "seed": s, "pattern": pattern, "score": score, **extra}
                         for s in seeds])


def test_merge_keeps_the_first_tables_row_and_extra_columns():
    old = _cases([0, 1], score=1.0, device="gpu")
    new = _cases([1, 2], score=0.0)
    m = merge_suites([old, new])
    assert m[["seed", "score"]].values.tolist() == [[0, 1.0], [1, 1.0], [2, 0.0]]  # seed 1: the first table's
    assert m["device"].tolist()[:2] == ["gpu", "gpu"] and pd.isna(m["device"].iloc[2])
    other = _cases([1], pattern="hard_top2", score=0.5)  # same seed, other pattern: a row of its own
    assert len(merge_suites([old, other])) == 3


def test_merge_drops_a_patterns_old_rows():
    """``drop``: the first table's rows of that pattern go, the later tables' take their place;
    other patterns' rows stay the first table's."""
    old = pd.concat([_cases([0, 1], score=1.0), _cases([0, 1], pattern="shuffled_top2", score=0.0)])
    new = pd.concat([_cases([0], score=0.5), _cases([1, 2], pattern="shuffled_top2", score=0.5)])
    m = merge_suites([old, new], drop=["shuffled_top2"])
    got = {(p, s): v for p, s, v in m[["pattern", "seed", "score"]].itertuples(index=False)}
    assert got == {("dense", 0): 1.0, ("dense", 1): 1.0, ("shuffled_top2", 1): 0.5, ("shuffled_top2", 2): 0.5}
    assert len(merge_suites([old, new])) == 5  # without it, seeds 0-1 keep the old rows


def test_merge_trace_keys_on_layer_and_head():
    t = pd.DataFrame([{"task": "passkey", "length": 4096, "seed": 0, "pattern": "dense", "layer_idx": l, "head": h,
                       "dense_mass": 0.1} for l in range(2) for h in range(3)])
    assert len(merge_suites([t, t.assign(dense_mass=0.9)], "trace")) == 6
    assert merge_suites([t, t.assign(dense_mass=0.9)], "trace")["dense_mass"].eq(0.1).all()


def test_read_suite_reads_per_case_files_of_a_stopped_run(tmp_path):
    d = tmp_path / "cases" / "abc123"
    d.mkdir(parents=True)
    _cases([0]).to_parquet(d / "passkey_L4096_s0.cases.parquet")
    _cases([0], layer_idx=0, head=0).to_parquet(d / "passkey_L4096_s0.trace.parquet")
    _cases([1], layer_idx=0, head=0).to_parquet(d / "passkey_L4096_s1.trace.parquet")  # in flight: no cases file
    assert read_suite(tmp_path, "cases")["seed"].tolist() == [0]
    assert read_suite(tmp_path, "trace")["seed"].tolist() == [0]


def test_read_suite_names_the_folder_when_empty(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no retrieval cases table"):
        read_suite(tmp_path, "cases")


def test_cost_summary_hand_checked():
    from focus_lab.eval.retrieval_tables import cost_summary
    c = pd.DataFrame({"pattern": ["dense", "dense", "hard_top2", "hard_top2", "moba_matched"],
                      "seconds": [11.0, 30.0, 12.0, 13.0, 50.0],
                      "bare_forward_seconds": [10.0, 10.0, 10.0, 10.0, float("nan")]})
    s = cost_summary(c).set_index("pattern")
    assert list(s.index) == ["dense", "hard_top2", "all"]  # no bare forward: left out
    assert s.loc["dense", "median"] == pytest.approx(2.05) and s.loc["dense", "within_goal"] == 0.5
    assert s.loc["hard_top2", "median"] == pytest.approx(1.25) and s.loc["hard_top2", "within_goal"] == 1.0
    assert s.loc["all", "cases"] == 4 and s.loc["all", "median"] == pytest.approx(1.25)
    assert s.loc["all", "within_goal"] == 0.75


def test_read_suite_keeps_one_row_per_case_across_fingerprints(tmp_path):
    for fp, score in (("aaa", 1.0), ("bbb", 0.0)):  # the same case under two settings' folders
        d = tmp_path / "cases" / fp
        d.mkdir(parents=True)
        _cases([0], score=score).to_parquet(d / "passkey_L4096_s0.cases.parquet")
    assert read_suite(tmp_path, "cases")[["seed", "score"]].values.tolist() == [[0, 1.0]]


def test_summary_and_paired_difference_ignore_row_order():
    import numpy as np
    from focus_lab.eval.retrieval_tables import paired_difference, summary
    rng = np.random.default_rng(1)
    rows = [{"task": "t", "length": 100, "seed": s, "pattern": p, "score": float(rng.integers(0, 2)),
             "answer_logprob": float(rng.normal()), "distant_pairs_kept": 0.5, "needle_pairs_kept": 0.5,
             "needle_mass_kept": 0.5, "seconds": 1.0, "bare_forward_seconds": 1.0}
            for s in range(12) for p in ("dense", "hard_top2", "random_top2")]
    df = pd.DataFrame(rows)
    shuffled = df.sample(frac=1.0, random_state=3)
    cols = ["relative_lo", "relative_hi", "logprob_change_lo", "logprob_change_hi"]
    pd.testing.assert_frame_equal(summary(df).sort_values("pattern")[cols].reset_index(drop=True),
                                  summary(shuffled).sort_values("pattern")[cols].reset_index(drop=True))
    a = paired_difference(df, "hard_top2", "random_top2", "answer_logprob")
    b = paired_difference(shuffled, "hard_top2", "random_top2", "answer_logprob")
    assert (a.lo.iloc[0], a.hi.iloc[0]) == (b.lo.iloc[0], b.hi.iloc[0])


def test_versus_pairs_another_router_files_cases_with_the_committed_ones():
    """analyses/studies/retrieval_versus: the run's patterns are renamed, its dense stays dense, and
    only committed cases of the run's (task, length, seed) join; the paired difference is counted
    by hand."""
    from analyses.studies.retrieval_versus import versus
    from focus_lab.eval.retrieval_tables import paired_difference
    run = pd.concat([_cases([0, 1], score=1.0), _cases([0, 1], pattern="hard_top2", score=1.0)])
    committed = pd.concat([_cases([0, 1, 2], pattern="hard_top2", score=0.0),
                           _cases([0, 1], pattern="random_top2", score=0.5), _cases([0, 1], score=0.25)])
    both = versus(run, committed, "new", ["hard_top2"])
    got = sorted((p, s, v) for p, s, v in both[["pattern", "seed", "score"]].itertuples(index=False))
    assert got == [("dense", 0, 1.0), ("dense", 1, 1.0), ("hard_top2", 0, 0.0), ("hard_top2", 1, 0.0),
                   ("hard_top2@new", 0, 1.0), ("hard_top2@new", 1, 1.0)]
    d = paired_difference(both, "hard_top2@new", "hard_top2")
    assert d["cases"].tolist() == [2] and d["difference"].tolist() == [1.0]


def test_versus_save_replaces_a_cases_rows_and_keeps_the_others(tmp_path):
    """retrieval_versus.save: a second save of the same routers' case replaces its row; another
    routers' rows and other cases stay (counted by hand)."""
    from analyses.studies.retrieval_versus import save
    f = tmp_path / "cases.parquet"
    save(_cases([0, 1], pattern="hard_top2", score=0.0), "a", f)
    save(_cases([0], pattern="hard_top2", score=0.5), "b", f)
    t = save(_cases([1, 2], pattern="hard_top2", score=1.0), "a", f)
    got = sorted((r, s, v) for r, s, v in pd.read_parquet(f)[["routers", "seed", "score"]].itertuples(index=False))
    assert got == [("a", 0, 0.0), ("a", 1, 1.0), ("a", 2, 1.0), ("b", 0, 0.5)] and len(t) == 4


def test_results_page_retrieval_table_is_the_committed_suites():
    """docs/results.md's retrieval table is what ``retrieval_table --results`` prints from the
    committed suite (figures/results/retrieval_cases.parquet): a merge that changes a number
    without the page changing, or a hand edit, fails here. Rows of tasks dense scores under 50% on
    are left out; a hand-made suite checks that and the column format."""
    from pathlib import Path
    from analyses.studies.retrieval_table import results_markdown
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "results.md").read_text()
    table = results_markdown(pd.read_parquet(root / "figures" / "results" / "retrieval_cases.parquet"))
    assert table in page
    rows = [{"task": t, "length": 4096, "seed": s, "pattern": p, "score": sc, "answer_logprob": lp,
             "distant_pairs_kept": 0.5, "needle_pairs_kept": 1.0, "needle_mass_kept": 1.0, "seconds": 1.0,
             "bare_forward_seconds": 1.0}
            for t, dense in (("passkey", 1.0), ("vt", 0.0)) for s in (0, 1)
            for p, sc, lp in (("dense", dense, -1.0), ("hard_top2", 0.5 * dense, -2.0 - s))]
    got = results_markdown(pd.DataFrame(rows)).splitlines()
    assert len(got) == 3 and got[2].startswith("| passkey | 4096 | 2 | 1.00 | 0.50 [0.50, 0.50], -1.5 |")


def test_replace_results_table_swaps_only_the_table():
    """``--results --write`` replaces the block from the table's header to the next blank line and
    nothing else; a page with no such table, or two, is refused rather than guessed at."""
    import pytest
    from analyses.studies.retrieval_table import RESULTS_HEADER, replace_results_table
    old = RESULTS_HEADER + "hard top-2 |\n|---|\n| passkey | 4096 | 20 | 1.00 | 0.95 |"
    page = "# Results\n\nBefore.\n\n" + old + "\n\nAfter.\n"
    new = RESULTS_HEADER + "hard top-2 |\n|---|\n| passkey | 4096 | 33 | 1.00 | 0.93 |"
    assert replace_results_table(page, new) == "# Results\n\nBefore.\n\n" + new + "\n\nAfter.\n"
    assert replace_results_table("x\n\n" + old, new) == "x\n\n" + new + "\n"  # the table ends the page
    for bad in ("# Results\n\nno table\n", page + "\n" + old + "\n"):
        with pytest.raises(ValueError, match="not one"):
            replace_results_table(bad, new)


def test_rename_patterns_in_order_and_refuses_to_merge_two_patterns():
    """retrieval_tables.rename_patterns: the plain name moves aside before the explicit name takes
    it (the shipped file's capacity); renaming onto a label in use is an error, not a merge."""
    import pandas as pd
    from focus_lab.eval.retrieval_tables import rename_patterns
    t = pd.DataFrame({"task": "passkey", "length": 4096, "seed": 0,
                      "pattern": ["dense", "hard_top2", "hard_top2_evict@13", "hard_top1"], "score": [1, 0.5, 0.9, 0.2]})
    out = rename_patterns(t, [("hard_top2", "hard_top2_nocap"), ("hard_top2_evict@13", "hard_top2")])
    assert dict(zip(out.pattern, out.score)) == {"dense": 1, "hard_top2_nocap": 0.5, "hard_top2": 0.9, "hard_top1": 0.2}
    assert list(t.pattern) == ["dense", "hard_top2", "hard_top2_evict@13", "hard_top1"]  # the input is untouched
    with pytest.raises(ValueError, match="1 rows of the same cases are labelled 'hard_top2'"):
        rename_patterns(t, [("hard_top2_evict@13", "hard_top2")])
    # a later run's rows under the explicit name join the plain name's other cases
    later = pd.concat([out, t[t.pattern == "hard_top2_evict@13"].assign(seed=1)], ignore_index=True)
    again = rename_patterns(later, [("hard_top2_evict@13", "hard_top2")])
    assert sorted(again[again.pattern == "hard_top2"].seed) == [0, 1]


def test_retrieval_table_cli_refused_rename_writes_nothing(tmp_path, monkeypatch):
    """analyses.studies.retrieval_table --add RUN --rename: a rename onto rows of the same cases
    exits with the reason and leaves both tables as they were (the merge is not written either);
    a clean one writes the merged, renamed tables."""
    import sys
    import pandas as pd
    from analyses.studies import retrieval_table
    cases = pd.DataFrame({"task": "passkey", "length": 4096, "seed": [0, 0, 1],
                          "pattern": ["hard_top2", "hard_top2_evict@13", "hard_top2_evict@13"], "score": [1.0, 0.0, 1.0]})
    trace = cases.assign(layer_idx=0, head=0)
    paths = {n: tmp_path / f"{n}.parquet" for n in ("cases", "trace")}
    run = tmp_path / "run"  # a suite output to --add: the explicit name's rows
    run.mkdir()
    explicit = cases.pattern != "hard_top2"
    cases[~explicit].to_parquet(paths["cases"]), trace[~explicit].to_parquet(paths["trace"])
    cases[explicit].to_parquet(run / "cases.parquet"), trace[explicit].to_parquet(run / "trace.parquet")
    argv = ["retrieval_table", "--cases", str(paths["cases"]), "--trace", str(paths["trace"])]
    before = {n: p.read_bytes() for n, p in paths.items()}
    monkeypatch.setattr(sys, "argv", argv + ["--add", str(run), "--device", "cpu",
                                             "--rename", "hard_top2_evict@13=hard_top2"])
    with pytest.raises(SystemExit, match="1 rows of the same cases"):
        retrieval_table.main()
    assert {n: p.read_bytes() for n, p in paths.items()} == before
    monkeypatch.setattr(sys, "argv", argv + ["--add", str(run), "--device", "cpu", "--rename", "hard_top2=hard_top2_nocap",
                                             "--rename", "hard_top2_evict@13=hard_top2", "--results"])
    monkeypatch.setattr(retrieval_table, "results_markdown", lambda cases: "")  # the page's table needs every column
    retrieval_table.main()
    for n, p in paths.items():
        got = pd.read_parquet(p)
        assert sorted(zip(got.seed, got.pattern)) == [(0, "hard_top2"), (0, "hard_top2_nocap"), (1, "hard_top2")], n
