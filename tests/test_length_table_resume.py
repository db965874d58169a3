"""analyses.length_table on a tiny model and a local text file: the cell lands inside --out (named
by the file's stem), and a stopped run's finished windows (the ``.partial`` cell) are not
evaluated again."""

from __future__ import annotations

import pandas as pd
import pytest

from run_fixtures import TEXT, make_tiny_run


def test_a_local_corpus_cell_and_a_resumed_run(tmp_path, capsys):
    from analyses import length_table
    run = make_tiny_run(tmp_path / "runs" / "tiny", with_eval=False, with_train_log=False)
    assets = run.parent / f".{run.name}-assets"
    corpus = tmp_path / "my_text.txt"
    corpus.write_text((TEXT + "\n") * 40)
    out = tmp_path / "lt"
    args = ["--model", str(assets / "model"), "--routers", str(assets / "routers.safetensors"), "--corpora",
            str(corpus), "--lengths", "32", "--windows", "32:3", "--patterns", "dense,hard_top2", "--out", str(out),
            "--threads", "1"]
    length_table.main(args)
    cell = out / "cells" / "my_text_32.parquet"
    whole = pd.read_parquet(cell)
    assert sorted(whole.window.unique()) == sorted(set(whole.window)) and whole.window.nunique() == 3
    last = int(whole.window.max())
    # a run stopped after two windows: its partial cell, and no finished cell
    whole[whole.window != last].to_parquet(out / "cells" / "my_text_32.partial.parquet")
    cell.unlink()
    capsys.readouterr()
    length_table.main(args)
    printed = capsys.readouterr().out
    assert "2 windows finished before" in printed
    assert [line for line in printed.splitlines() if " window " in line and ": dense" in line] == [
        line for line in printed.splitlines() if f"32 window {last}:" in line]  # only the missing window ran
    again = pd.read_parquet(cell)
    assert len(again) == len(whole) and not (out / "cells" / "my_text_32.partial.parquet").exists()
    merged = again.merge(whole, on=["label", "window"], suffixes=("", "_first"))
    assert (merged.perplexity - merged.perplexity_first).abs().max() < 1e-4


def test_summarize_pools_only_the_windows_every_pattern_ran_on():
    """A stopped run's cell: window 2 has dense only. The summary counts windows 0 and 1, and
    dense's perplexity is the token-weighted mean of those two windows (by hand)."""
    import math

    from analyses.length_table import summarize
    rows = [("dense", 0, 3.0), ("dense", 1, 3.2), ("dense", 2, 9.0),
            ("hard_top2", 0, 3.1), ("hard_top2", 1, 3.3)]
    df = pd.DataFrame([{"corpus": "austen", "seq_len": 64, "label": lab, "window": w, "nll": nll,
                        "tokens": 63, "seconds": 1.0, "distant_pairs_kept": 0.5, "max_group_share": 0.3}
                       for lab, w, nll in rows])
    s = summarize(df).set_index("label")
    assert s.loc["dense", "windows"] == 2 and s.loc["hard_top2", "windows"] == 2
    assert s.loc["dense", "perplexity"] == pytest.approx(math.exp(3.1))
    assert s.loc["hard_top2", "perplexity"] == pytest.approx(math.exp(3.2))


def test_the_block_interval_of_a_control_only_where_rows_hold_block_losses(tmp_path):
    """summarize's control_block_ci_* is paired_change over runs of INTERVAL_BLOCK tokens (here 4
    blocks of 2048 per window, the random rows worse by hand-set amounts) where both patterns hold
    block losses, NaN at the cell whose rows do not; the report shows "blocks [" only there."""
    import math

    import numpy as np

    from analyses import length_table as LT
    from focus_lab.eval.evaluate import BLOCK_TOKENS, paired_change
    per_window = 4 * LT.INTERVAL_BLOCK // BLOCK_TOKENS
    rows = []
    for L, blocks in ((8192, True), (4096, False)):
        for w in range(3):
            for lab, extra in (("hard_top2", 0.0), ("random_top2", 0.002 * (1 + w))):
                bn = [BLOCK_TOKENS * (3.0 + 0.01 * ((i * 7 + w) % 5) + extra) for i in range(per_window)]
                r = {"corpus": "austen", "seq_len": L, "heldout": "persuasion", "label": lab, "window": w,
                     "tokens": BLOCK_TOKENS * per_window, "nll": sum(bn) / (BLOCK_TOKENS * per_window),
                     "seconds": 1.0, "distant_pairs_kept": 0.5, "max_group_share": 0.3}
                if blocks:
                    r |= {"block_nll": bn, "block_tokens": [BLOCK_TOKENS] * per_window}
                rows.append(r)
    df = pd.DataFrame(rows)
    s = LT.summarize(df).set_index(["seq_len", "label"])
    got = s.loc[(8192, "random_top2"), ["control_vs_router_pct", "control_block_ci_lo", "control_block_ci_hi"]]
    at = df[df.seq_len == 8192]
    ref = paired_change(at[at.label == "random_top2"], at[at.label == "hard_top2"], block=LT.INTERVAL_BLOCK)
    assert tuple(got) == pytest.approx(ref)
    assert ref[0] == pytest.approx(100 * (math.exp(0.004) - 1))  # the mean of 0.002, 0.004, 0.006 nats
    assert 100 * (math.exp(0.002) - 1) <= ref[1] < ref[0] < ref[2] <= 100 * (math.exp(0.006) - 1)
    assert np.isnan(s.loc[(4096, "random_top2"), "control_block_ci_lo"])
    (tmp_path / "cells").mkdir()
    for L, g in df.groupby("seq_len"):
        g.to_parquet(tmp_path / "cells" / f"austen_{L}.parquet")
    rows_of = {ln.split(" | ")[0]: ln for ln in LT.report_text(tmp_path).splitlines() if ln.startswith("| ")}
    assert "(blocks [" in rows_of["| 8192"] and "(blocks [" not in rows_of["| 4096"]


def test_another_seed_draws_other_random_groups_and_keeps_the_router(tmp_path):
    """--seed: the hard rows are the file's router (the same losses as without it), the random
    rows another draw (other losses), and each cell records the seed it ran with."""
    from analyses import length_table
    run = make_tiny_run(tmp_path / "runs" / "tiny", with_eval=False, with_train_log=False)
    assets = run.parent / f".{run.name}-assets"
    corpus = tmp_path / "my_text.txt"
    corpus.write_text((TEXT + "\n") * 40)
    cells = {}
    for seed in (None, 7):
        out = tmp_path / f"lt{seed}"
        length_table.main(["--model", str(assets / "model"), "--routers", str(assets / "routers.safetensors"),
                           "--corpora", str(corpus), "--lengths", "32", "--windows", "32:2", "--patterns",
                           "hard_top1,random_top1", "--out", str(out), "--threads", "1"]
                          + ([] if seed is None else ["--seed", str(seed)]))
        cells[seed] = pd.read_parquet(out / "cells" / "my_text_32.parquet").set_index(["label", "window"])
    assert set(cells[7].seed) == {7} and set(cells[None].seed) != {7}
    assert (cells[7].loc["hard_top1"].nll == cells[None].loc["hard_top1"].nll).all()
    assert (cells[7].loc["random_top1"].nll != cells[None].loc["random_top1"].nll).any()
