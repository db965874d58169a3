"""docs/studies/gemma-routers.md's 32K tables (analyses/blocks/gemma_32k.py): cells recomputed by
hand from the committed benchmark rows, the recorder-memory row and the dashboard timings."""

from __future__ import annotations

import json

import pandas as pd

from analyses import doc_blocks
from analyses.doc_blocks import REPO


_row = doc_blocks.table_row  # the cells of a block's row, by its leading cells


def test_the_32k_forward_ratio_and_peak_from_the_benchmark_rows():
    df = pd.read_csv(REPO / "figures/gemma/bench_forward_32k.csv")
    dense = df[(df["T"] == 32768) & (df.pattern == "focus_dense")].iloc[0]
    top1 = df[(df["T"] == 32768) & (df.pattern == "hard_top1")].iloc[0]
    row = _row(doc_blocks.render("gemma-32k-forward"), "32768", "hard top-1")
    assert row[5] == f"{dense.total_s / top1.total_s:.2f}x"
    assert row[4] == str(round(top1.body_s + top1.head_s)) or abs(float(row[4]) - top1.total_s) <= 0.5
    assert row[7] == f"{top1.peak_rss_gib:.1f}" and float(row[7]) < 12  # the bound on a 32K process
    assert row[6].startswith(f"{round(100 * top1.global_layers_s / top1.body_s)}%")


def test_the_32k_recording_row_and_the_dashboard_pages_by_hand():
    rm = pd.read_parquet(REPO / "figures/results/record_memory.parquet")
    r = rm[rm.label.str.startswith("gemma3-270m: 32768 tokens")].iloc[0]
    row = _row(doc_blocks.render("gemma-32k-record"), r.label)
    assert row[1] == f"{r.seconds:.0f}" and row[2] == f"{r.measured_gib:.2f}" and row[3] == f"{r.estimate_gib:.2f}"
    d = json.loads((REPO / "figures/gemma/dashboard_32k.json").read_text())
    text = doc_blocks.render("gemma-32k-dashboard")
    for page in ("audit", "groups", "retrieval"):
        cells = _row(text, page)
        assert cells[1] == f"{d['pages'][page]['seconds']:.1f}" and cells[3] == "0"
    assert sum(line.startswith("|") for line in text.splitlines()) == 2 + len(d["pages"])  # header, rule, a row a page


def test_the_32k_restored_drops_from_the_tables():
    from by_hand import on_page
    d = "figures/gemma/restored_32k"
    text = on_page("gemma-routers.md", "gemma-32k-restored")
    r = pd.read_parquet(REPO / f"{d}/restored_drops.parquet")
    meta = json.loads((REPO / f"{d}/restored_drops.json").read_text())
    assert meta["seq_len"] == 32768 and len(r) == 50
    for col, what in (("recovered", "the heaviest dropped edge alone"),
                      ("recovered_all", "every recorded dropped edge of the query")):
        x = r[col].to_numpy()
        x = x[~pd.isna(x)]
        q1, med, q3 = pd.Series(x).quantile([0.25, 0.5, 0.75])
        assert _row(text, what)[1:] == [f"{med:.3f}", f"{q1:.3f} to {q3:.3f}", str((x >= 0.5).sum()),
                                        str((x < 0.1).sum()), str((x < 0).sum())]
    half = r[r.recovered >= 0.5]
    copies = sum(k.strip() == n.strip() for k, n in zip(half.key_token, half.next_token))
    assert f"The {len(half)} edges that recover at least half" in text and f"; {copies} of them end on an" in text
    g = pd.read_parquet(REPO / f"{d}/group_ablation.parquet")
    layer = meta["ablated_layers"][0]
    for group, part in g[g.layer_idx == layer].groupby("group"):
        mean = (part.delta * part.tokens).sum() / part.tokens.sum()
        assert _row(text, f"{layer}, {group}")[1:3] == [str(part.tokens.sum()), f"{mean:+.4f}"]
        assert part.tokens.sum() == 32767  # every predicted token of the window


def test_the_retrieval_scores_and_router_against_random_by_hand():
    """The shipped file's rows (dense and its default, hard_top2+key_shift, from their runs) beside
    stage g4's random groups on the same seeds: scores and the router-minus-random difference
    recomputed from the files."""
    from by_hand import on_page
    from focus_lab.hf.shipped import manifest
    text = on_page("gemma-routers.md", "gemma-retrieval")
    new = pd.concat([pd.read_parquet(REPO / f) for f in doc_blocks.GEMMA_RETRIEVAL], ignore_index=True)
    g4 = pd.concat([pd.read_parquet(REPO / f) for f in doc_blocks.GEMMA_G4_RETRIEVAL], ignore_index=True)
    shipped = manifest()["gemma3-270m"]["default_pattern"]
    assert shipped == "hard_top2+key_shift" and set(new.pattern) == {"dense", shipped}
    new = new.assign(pattern=new.pattern.replace({shipped: "default"}))
    for (task, length), c in new.groupby(["task", "length"]):
        seeds = set(c.seed)
        r = g4[(g4.task == task) & (g4.length == length) & (g4.pattern == "random_default") & g4.seed.isin(seeds)]
        assert set(r.seed) == seeds  # random groups on every case the shipped file ran
        by = pd.concat([c, r]).pivot_table(index="seed", columns="pattern", values="score")
        for pattern in ("dense", "default", "random_default"):
            row = [x for x in text.splitlines() if x.startswith(f"| {task} |") and f"| {length} | `{pattern}` |" in x]
            assert len(row) == 1
            cells = [x.strip() for x in row[0].strip("|").split("|")]
            assert cells[4:6] == [str(by[pattern].notna().sum()), f"{by[pattern].mean():.2f}"]
        diff = (by["default"] - by["random_default"]).mean()
        assert f"| score | {task} | {length} | {diff:+.2f} |" in text
    # run on the tensors of the shipped file (g5's file, the same tensors); its random groups, g4's
    assert set(new[new.pattern == "default"].router_name) == {"gemma3-270m/distill64-8k"}
    assert manifest()["gemma3-270m"]["same_tensors_sha256"] == list(set(new.router_sha256))


def test_the_two_files_retrieval_paired_by_hand():
    """docs/studies/gemma-length-gap.md: the same cases' default under both files, the difference of
    their scores recomputed by hand, '-' where only stage g4's file ran."""
    from by_hand import on_page
    text = on_page("gemma-length-gap.md", "gemma-length-gap-retrieval")
    new = pd.concat([pd.read_parquet(REPO / f) for f in doc_blocks.GEMMA_G5_RETRIEVAL], ignore_index=True)
    g4 = pd.concat([pd.read_parquet(REPO / f) for f in doc_blocks.GEMMA_G4_RETRIEVAL], ignore_index=True)
    for (task, length), g in g4.groupby(["task", "length"]):
        row = _row(text, task, doc_blocks.HAYSTACK[task], str(length))
        assert row[4] == f"{g[g.pattern == 'dense'].score.mean():.2f}" and row[5] == f"{g[g.pattern == 'default'].score.mean():.2f}"
        n = new[(new.task == task) & (new.length == length) & (new.pattern == "default")].set_index("seed").score
        if not len(n):
            assert row[6:] == ["-", "-", "-"]
            continue
        old = g[g.pattern == "default"].set_index("seed").score.loc[n.index]
        assert row[6] == f"{n.mean():.2f}" and row[7].startswith(f"{(n - old).mean():+.2f} [")


def test_retrieval_cases_of_two_runs_are_refused_when_their_dense_answers_differ(tmp_path, monkeypatch):
    """Stage g4's random groups stand beside the shipped file's rows only on the very same cases: a
    dense answer log-prob that differs by more than DENSE_AGREEMENT is refused (MissingInput)."""
    import pytest
    row = dict(task="niah_single_2", length=16384, seed=0, score=1.0, answer_logprob=-1.0)
    new = pd.DataFrame([{**row, "pattern": "dense", "canonical_pattern": "dense"},
                        {**row, "pattern": doc_blocks.GEMMA_DEFAULT, "canonical_pattern": doc_blocks.GEMMA_DEFAULT}])
    g4 = pd.DataFrame([{**row, "pattern": p} for p in ("dense", "default", "random_default")])
    new.to_parquet(tmp_path / "new.parquet")
    g4.to_parquet(tmp_path / "g4.parquet")
    monkeypatch.setattr(doc_blocks, "REPO", tmp_path)
    monkeypatch.setattr(doc_blocks, "GEMMA_RETRIEVAL", ("new.parquet",))
    monkeypatch.setattr(doc_blocks, "GEMMA_G4_RETRIEVAL", ("g4.parquet",))
    assert sorted(doc_blocks.gemma_retrieval_cases().pattern) == ["default", "dense", "random_default"]
    g4.loc[g4.pattern == "dense", "answer_logprob"] = -1.0 - 2 * doc_blocks.DENSE_AGREEMENT
    g4.to_parquet(tmp_path / "g4.parquet")
    with pytest.raises(doc_blocks.MissingInput, match="dense answers equal"):
        doc_blocks.gemma_retrieval_cases()
    g4[g4.pattern != "random_default"].to_parquet(tmp_path / "g4.parquet")  # a case without random groups
    with pytest.raises(doc_blocks.MissingInput, match="random_default on every case"):
        doc_blocks.gemma_retrieval_cases()

def test_the_chain_block_adds_stage_g6_to_the_total_by_hand():
    """gemma-chain: stages g1-g4 from chain.json, g5's steps from its train log, g6 (the key shift
    written into g5's file) from its own record, whose result is the file shipped for the model."""
    import json
    from focus_lab.hf.shipped import manifest
    rec = json.loads((REPO / doc_blocks.GEMMA_CHAIN).read_text())
    g6 = json.loads((REPO / doc_blocks.GEMMA_G6).read_text())
    steps = pd.read_parquet(REPO / doc_blocks.GEMMA_G5_LOG).groupby("step").seconds.first().sum()
    assert g6["sha256"] == manifest()["gemma3-270m"]["sha256"] and g6["stage"] == "g6_rules"
    assert "--pattern hard_top2+key_shift" in g6["command"]
    text = doc_blocks.render("gemma-chain")
    assert _row(text, "g6_rules")[2:4] == [f"{g6['seconds']:.0f}", f"{g6['peak_rss_gb']:.2f} GiB"]
    total = rec["total_seconds"] + steps + g6["seconds"]
    assert _row(text, "total")[2].startswith(f"**{total:.0f}** (")


def test_the_key_sliced_speed_ratios_by_hand():
    """gemma-key-sliced: dense over each pattern's key-sliced body at 32768 tokens, the shipped
    file's patterns recorded as they ran (with the key shift) and without it, from the rows."""
    df = pd.read_csv(REPO / doc_blocks.GEMMA_KEY_SLICED)
    k = df[(df.seq_len == 32768) & (df.path == "key_sliced")].set_index("pattern").body_s
    assert {"dense", "hard_top1+key_shift", "hard_top2+key_shift"} <= set(k.index)
    text = doc_blocks.render("gemma-key-sliced")
    for pattern in k.index:
        row = _row(text, "32768", pattern)
        assert row[3] == f"{k[pattern]:.1f}" and row[5] == f"{k['dense'] / k[pattern]:.2f}x"
    assert k["dense"] > k["hard_top1+key_shift"]  # the goal: hard top-1 faster than dense at 32K
