"""focus_lab.eval.committed: the committed retrieval and passkey results of a router file, read
from figures/results/, checked against counts computed here with plain pandas filters on the same
parquet files (and against the numbers docs/passkey_reference.md quotes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from focus_lab.eval import committed
from focus_lab.eval.committed import (CommittedSource, NoCommittedResults, committed_passkey, committed_retrieval,
                                      passkey_summary, router_file)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "figures" / "results"
MANIFEST = json.loads((REPO / "focus_lab" / "routers" / "MANIFEST.json").read_text())
SHIPPED = MANIFEST["shipped"]["smollm2-135m-instruct"]
SHIPPED_SHA = MANIFEST["files"][SHIPPED]["sha256"]


def test_the_default_router_is_the_shipped_file():
    assert router_file() == (SHIPPED, SHIPPED_SHA)
    assert router_file("smollm2-135m/soup-budget")[1].startswith("5710775e")
    with pytest.raises(NoCommittedResults, match="routers list"):
        router_file("no/such-file")


def test_committed_retrieval_is_the_shipped_files_table_with_hand_checked_cells():
    res = committed_retrieval()
    src = res.source
    assert isinstance(src, CommittedSource) and src.kind == "retrieval"
    assert src.table == "figures/results/retrieval_cases.parquet"  # not the _5710775e one
    assert (src.router_name, src.router_sha256) == (SHIPPED, SHIPPED_SHA)
    assert "focus-lab probe retrieval" in src.command and src.docs.startswith("docs/")
    assert src.commit is None  # the committed table records no commit column
    assert f"`{SHIPPED}`" in src.label() and SHIPPED_SHA[:12] in src.label()

    raw = pd.read_parquet(RESULTS / "retrieval_cases.parquet")
    assert len(res.cases) == (raw["router_name"] == SHIPPED).sum() and (res.cases["router_name"] == SHIPPED).all()
    s = res.summary.set_index(["task", "length", "pattern"])
    for task, L, pat in (("niah_single_1", 4096, "hard_top2"), ("passkey", 8192, "hard_top2"),
                         ("niah_single_2", 4096, "random_top2")):
        at = raw[(raw.task == task) & (raw.length == L)]
        p = at[at.pattern == pat].set_index("seed")["score"]
        d = at[at.pattern == "dense"].set_index("seed")["score"]
        common = p.index.intersection(d.index)
        row = s.loc[(task, L, pat)]
        assert row["cases"] == len(p)
        assert row["score"] == pytest.approx(p.mean())
        assert row["relative"] == pytest.approx(p[common].mean() / d[common].mean())
        assert row["relative_lo"] <= row["relative"] <= row["relative_hi"]
        assert row["canonical_pattern"] == at[at.pattern == pat]["canonical_pattern"].iloc[0]
    # docs/results.md: passkey at 4096, 22 cases, dense 1.00, hard top-2 1.00 of dense's
    assert s.loc[("passkey", 4096, "dense"), "cases"] == 22
    assert s.loc[("passkey", 4096, "hard_top2"), "relative"] == pytest.approx(1.0)
    assert s.loc[("cwe", 4096, "dense"), "dense_below_half"]
    # every (task, length, pattern) of the rows has one summary row
    assert len(res.summary) == len(res.cases.groupby(["task", "length", "pattern"]))


def test_committed_retrieval_of_the_previous_file_reads_its_own_table():
    res = committed_retrieval("smollm2-135m/soup-budget")
    assert res.source.table == "figures/results/retrieval_cases_5710775e.parquet"
    assert res.source.router_sha256.startswith("5710775e")
    assert len(res.cases) == len(pd.read_parquet(RESULTS / "retrieval_cases_5710775e.parquet"))


def test_committed_passkey_is_the_shipped_files_tables_plus_dense_of_the_same_cases():
    res = committed_passkey()
    src = res.source
    raw = pd.read_parquet(RESULTS / "passkey_cases.parquet")
    meta = json.loads((RESULTS / "passkey_tables.json").read_text())
    named = sorted(t for t, e in meta.items() if e["settings"]["routers"]["sha256"] == SHIPPED_SHA)
    # a table of the shipped file's that ran dense alone (the prompt-format comparison) measures no router file
    own = [t for t in named if (raw[raw["table"] == t].pattern != "dense").any()]
    assert "prompt_formats_1k_2k" in named and "prompt_formats_1k_2k" not in own
    assert own == ["capacity_4k", "capacity_4k_seeds6-11", "capacity_8k"] == list(src.tables)
    assert src.kind == "passkey" and src.table == "figures/results/passkey_cases.parquet"
    assert (src.router_name, src.router_sha256, src.commit) == (SHIPPED, SHIPPED_SHA, None)
    assert src.commands[1] == ("focus-lab probe passkey --lengths 4096 --depths 0,25,50,75,100 --keys 6 --seed 6 "
                               "--patterns hard_top2 --out <out>; python -m analyses.exp_passkey --run <out> "
                               "--commit capacity_4k_seeds6-11")
    assert "--lengths 8184 --depths 25,50,75,100 --keys 3" in src.commands[2]
    assert "dense" not in src.tables and set(src.reference_tables) <= set(meta)

    mine = raw[raw["table"].isin(own)]
    s = res.summary.set_index(["format", "length", "pattern"])
    for L in (4096, 8184):
        m = mine[(mine.length == L) & (mine.pattern == "hard_top2")]
        row = s.loc[("chat", L, "hard_top2")]
        assert (row["cases"], row["hits"]) == (len(m), int(m["exact_match"].sum()))
        assert row["key_logprob"] == pytest.approx(m["key_logprob"].mean())
        # dense: the other tables' dense rows of exactly these cases, one per case
        case = ["format", "length", "depth", "seed", "key"]
        d = raw[~raw["table"].isin(own) & (raw.pattern == "dense")].merge(m[case], on=case).drop_duplicates(case)
        assert s.loc[("chat", L, "dense"), "cases"] == len(m) == len(d)
        assert s.loc[("chat", L, "dense"), "hits"] == int(d["exact_match"].sum())
    # docs/passkey_reference.md: 59/60 at 4096 for dense and the shipped file (all 59 of dense's),
    # key log-prob -0.67 / -0.84 nats; 12/12 at 8184 (its 0.527 of the distant pairs is the
    # needle-mix tables'; with the capacity 0.526)
    r4, d4 = s.loc[("chat", 4096, "hard_top2")], s.loc[("chat", 4096, "dense")]
    assert (r4["cases"], r4["hits"], r4["dense_hits"], r4["dense_hits_kept"]) == (60, 59, 59, 59)
    assert (d4["hits"], round(d4["key_logprob"], 2), round(r4["key_logprob"], 2)) == (59, -0.67, -0.84)
    assert r4["distant_pairs_kept"] == pytest.approx(0.527, abs=0.0015)
    assert s.loc[("chat", 8184, "hard_top2"), "hits"] == 12 == s.loc[("chat", 8184, "dense"), "hits"]
    assert list(res.summary["pattern"][:2]) == ["dense", "hard_top2"]  # dense leads


def test_passkey_summary_pairs_the_pattern_with_dense_on_the_same_cases():
    rows = []
    for seed, dense_hit, pat_hit in ((0, True, True), (1, True, False), (2, False, True)):
        for pat, hit in (("dense", dense_hit), ("hard_top2", pat_hit)):
            rows.append({"format": "chat", "length": 1024, "depth": 50.0, "seed": seed, "key": f"k{seed}",
                         "pattern": pat, "exact_match": hit, "key_logprob": -1.0 * seed,
                         "distant_pairs_kept": 1.0 if pat == "dense" else 0.5, "needle_edges_kept": 1.0})
    s = passkey_summary(pd.DataFrame(rows)).set_index("pattern")
    assert (s.loc["hard_top2", "hits"], s.loc["hard_top2", "dense_hits"], s.loc["hard_top2", "dense_hits_kept"]) \
        == (2, 2, 1)
    assert s.loc["hard_top2", "exact_match"] == pytest.approx(2 / 3)
    assert s.loc["hard_top2", "key_logprob"] == pytest.approx(-1.0)
    by_depth = passkey_summary(pd.DataFrame(rows), by=("depth",))
    assert list(by_depth.columns[:4]) == ["format", "length", "depth", "pattern"]
    # without dense rows the paired counts are missing, not zero
    alone = passkey_summary(pd.DataFrame(rows[1::2]))
    assert alone["dense_hits"].isna().all() and alone["dense_hits_kept"].isna().all()


def test_no_results_folder_or_rows_is_a_clear_error(tmp_path):
    with pytest.raises(NoCommittedResults, match="not a folder"):
        committed_retrieval(results=tmp_path / "figures" / "results")
    with pytest.raises(NoCommittedResults, match="not a folder"):
        committed_passkey(results=tmp_path / "nowhere")
    assert issubclass(NoCommittedResults, FileNotFoundError)  # one line from the CLI's known errors
    with pytest.raises(NoCommittedResults, match="no retrieval_cases"):
        committed_retrieval(results=tmp_path)
    with pytest.raises(NoCommittedResults, match="passkey_tables.json is missing"):
        committed_passkey(results=tmp_path)
    # a file with no committed rows: the message names the router files the tables hold
    shutil.copy(RESULTS / "retrieval_cases_5710775e.parquet", tmp_path / "retrieval_cases_5710775e.parquet")
    with pytest.raises(NoCommittedResults, match="soup-budget"):
        committed_retrieval(results=tmp_path)
    with pytest.raises(NoCommittedResults, match="no committed passkey table of router file"):
        committed_passkey("smollm2-135m/needle-mix")


def test_the_module_needs_neither_torch_nor_streamlit():
    import subprocess
    import sys
    code = ("import sys; from focus_lab.eval.committed import committed_passkey; committed_passkey(); "
            "print('torch' in sys.modules, 'streamlit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
    assert committed.RESULTS == RESULTS


def test_the_sources_name_pages_and_headings_that_exist():
    for docs in (committed.RETRIEVAL_DOCS, committed.PASSKEY_DOCS):
        page, anchor = docs.split("#")
        headings = [line.lstrip("#").strip().lower().replace(" ", "-")
                    for line in (REPO / page).read_text().splitlines() if line.startswith("#")]
        assert anchor in headings, docs


def test_committed_results_default_to_the_embedded_models_file():
    """With files shipped for two models (SmolLM2-135M, Gemma-3-270M) the committed results of no
    named model are the embedded model's; reading them imports no torch."""
    import subprocess
    import sys
    from focus_lab.eval import committed
    from focus_lab.hf.models import EMBEDDED
    from focus_lab.hf.shipped import registry
    code = "import sys, focus_lab.eval.committed as c; c.router_file(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
    assert committed.router_file() == (registry()["shipped"][EMBEDDED], registry()["files"][registry()["shipped"][EMBEDDED]]["sha256"])
    assert committed.router_file(model="gemma3-270m")[0] == registry()["shipped"]["gemma3-270m"]
