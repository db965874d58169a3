"""`focus-lab-figures --quick`: every figure and table is generated from the cached experiments
on a tiny random model, the README lists them, and a second run is served from the cache."""

import json
import re
import os
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from analyses import common as C, figures as F


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    res = CliRunner().invoke(F.cli, ["--quick", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out, res.output


def test_every_output_exists_and_is_listed(quick):
    out, log = quick
    readme = (out / "README.md").read_text()
    # the router file the experiments used, from their caches (quick mode: trained by the run)
    router = pd.read_parquet(out / "data" / "router.parquet")["path"].iloc[0]
    from focus_lab.io import file_sha256
    assert f"Router file of the experiments: sha256 `{file_sha256(router)[:12]}...`." in readme
    png_ok = any((out / f"{o.name}.png").is_file() for o in F.FIGURES)
    for o in F.FIGURES:
        is_table = F.load_output(o.module).__dict__.get("make_table") is not None
        files = [out / f"{o.name}.md"] if is_table else [out / f"{o.name}.html"]
        if png_ok and not is_table:
            files.append(out / f"{o.name}.png")
        for f in files:
            assert f.is_file() and f.stat().st_size > 0, f
            assert f.name in readme, f"{f.name} not listed in README.md"
        assert "no data yet" not in files[0].read_text(errors="ignore")[:100000], f"{o.name} rendered without data"
    assert "failed" not in log
    html = (out / "fig01_pareto.html").read_text()
    assert "Plotly.newPlot" in html and not re.search(r"<script[^>]+src=\"http", html)  # self-contained


def test_experiments_cached_with_settings(quick):
    out, _ = quick
    for e in F.EXPERIMENTS:
        assert (out / "data" / f"{e.name}.parquet").is_file(), e.name
        meta = json.loads((out / "data" / f"{e.name}.json").read_text())
        assert meta["settings"]["name"] == "quick" and meta["seconds"] >= 0
    base = pd.read_parquet(out / "data" / "baselines.parquet")
    assert {"focus", "dense", "window", "window_matched", "random", "kmeans", "online_kmeans", "moba"} <= set(base.method)
    leak = pd.read_parquet(out / "data" / "causal_leak.parquet")
    assert "soft, prefix-causal Sinkhorn" in set(leak.variant)
    rep = (out / "table_reproduction.md").read_text()
    assert rep.count("\n| ") >= 15 and "pending" not in rep


def test_rerun_is_served_from_cache(quick):
    out, _ = quick
    stamp = {p: p.stat().st_mtime for p in (out / "data").glob("*.parquet")}
    fig = F.FIGURES[0].name  # a PNG of an earlier run (made here if kaleido could not)
    if not (out / f"{fig}.png").is_file():
        (out / f"{fig}.png").write_bytes(b"\x89PNG")
    res = F.run_figures(out, quick=True, png=False, log=lambda m: None)
    assert all(v["status"] == "cached" for v in res["status"].values())
    row = next(line for line in (out / "README.md").read_text().splitlines() if f"[{fig}.png]" in line)
    assert "not re-rendered with --no-png" in row  # --no-png keeps the earlier PNG listed
    assert {p: p.stat().st_mtime for p in (out / "data").glob("*.parquet")} == stamp


def test_render_only_redraws_one_output_and_its_readme_row(quick, tmp_path):
    """--render-only NAME: that output is rendered again from its data (no experiment runs),
    its README row is rewritten and every other line is kept; an unknown name is one line, exit 2."""
    import shutil
    out, _ = quick
    folder = tmp_path / "figs"
    shutil.copytree(out, folder)
    readme = folder / "README.md"
    text = readme.read_text()
    row = next(ln for ln in text.split("\n") if "`analyses/fig_speedup_length.py`" in ln)
    readme.write_text(text.replace(row, row.replace("| ok |", "| stale |")) + "\nkept line\n")
    (folder / "fig02_speedup_length.html").unlink()
    res = CliRunner().invoke(F.cli, ["--quick", "--out", str(folder), "--render-only", "fig02_speedup_length",
                                     "--no-png"])
    assert res.exit_code == 0, res.output
    assert (folder / "fig02_speedup_length.html").is_file()
    new = readme.read_text()
    new_row = next(ln for ln in new.split("\n") if "`analyses/fig_speedup_length.py`" in ln)
    assert new_row.endswith("| ok |") and "kept line" in new
    assert [ln for ln in new.split("\n") if ln != new_row] == \
        [ln for ln in (text + "\nkept line\n").split("\n") if ln != row]
    res = CliRunner().invoke(F.cli, ["--quick", "--out", str(folder), "--render-only", "fig99"])
    assert res.exit_code == 2 and "fig99" in res.output and "fig02_speedup_length" in res.output
    # an output whose data are missing keeps its files and its row; one line, exit 2
    (folder / "data" / "baselines.parquet").unlink()
    before = (folder / "fig01_pareto.html").read_bytes(), readme.read_text()
    res = CliRunner().invoke(F.cli, ["--quick", "--out", str(folder), "--render-only", "fig01_pareto", "--no-png"])
    assert res.exit_code == 2 and "fig01_pareto" in res.output and "kept" in res.output
    assert ((folder / "fig01_pareto.html").read_bytes(), readme.read_text()) == before


def test_pareto_front():
    import numpy as np
    x = np.array([1.0, 2.0, 3.0, 4.0])
    y = np.array([5.0, 4.0, 4.5, 3.0])
    assert list(C.pareto_front(x, y, larger_x_better=False)) == [0, 1, 3]
    assert list(C.pareto_front(x, y, larger_x_better=True)) == [3]


def test_experiments_are_modules_of_the_analyses_package():
    """One module per experiment in ``analyses/``, imported as a package module
    (no loading by file path, no ``sys.path`` edits, nothing from tests/)."""
    import importlib
    root = Path(F.__file__).parent
    assert {f"exp_{e.name}.py" for e in F.EXPERIMENTS} == {p.name for p in root.glob("exp_*.py")}
    for e in F.EXPERIMENTS:
        assert callable(importlib.import_module(e.module).make_data), e.module
    for p in root.glob("*.py"):
        text = p.read_text()
        for bad in ("spec_from_file_location", "sys.path.insert", "from tests", "import tests"):
            assert bad not in text, f"{p.name}: {bad}"
    assert not (root.parent / "focus_lab" / "figures.py").exists()


def test_length_cells_reuse_committed_rows_only_for_the_same_routers(tmp_path, monkeypatch):
    """Committed length-table rows (``figures/results/length_cells.parquet``, one ``table`` column)
    are taken for the patterns one table
    holds on exactly the requested windows: dense from any table, hard rows only when made with
    this router file or with one the manifest lists as holding the same tensors under the same
    random layers; the other patterns are evaluated."""
    from dataclasses import dataclass
    import torch
    from conftest import tiny_llama
    from focus_lab import FocusConfig
    from focus_lab.hf import shipped
    from focus_lab.hf.retrofit import attach, save_routers

    @dataclass
    class W:
        input_ids: torch.Tensor
        index: int

    routers = tmp_path / "r.safetensors"
    m = tiny_llama()
    attach(m, FocusConfig(window=8, num_groups=4, top_k=2, sink_tokens=1, random_layers=[1]))
    save_routers(m, routers)
    g = torch.Generator().manual_seed(0)
    ws = [W(torch.randint(3, 97, (32,), generator=g), i) for i in (3, 7)]

    class Ctx:
        quick = False
        data = tmp_path / "data"
        settings = C.Settings("t", cell_patterns="dense,hard_top2,random_top2")
        log = staticmethod(lambda s: None)
        windows = staticmethod(lambda corpus, split, T, n: ws)
        model = staticmethod(tiny_llama)
        routers = staticmethod(lambda: routers)

        def router_id(self):
            return self.sha

    frames = []
    for table, rows in {
            # a: dense on both windows, hard_top2 on one only
            "a": {"label": ["dense", "dense", "hard_top2"], "window": [3, 7, 3], "routers_sha256": ["abc"] * 3,
                  "random_layers": [""] * 3},
            # b: hard_top2 on both windows, made with the 'twin' file under random layers 1
            "b": {"label": ["hard_top2", "hard_top2"], "window": [3, 7], "routers_sha256": ["twin"] * 2,
                  "random_layers": ["1"] * 2}}.items():
        frames.append(pd.DataFrame(rows).assign(table=table, corpus="austen", seq_len=32, nll=9.0, tokens=31))
    # another cell (other length) holding every pattern on both windows: never taken for austen_32
    frames.append(pd.DataFrame({"label": ["hard_top2", "random_top2"] * 2, "window": [3, 3, 7, 7]}).assign(
        table="c", corpus="austen", seq_len=64, routers_sha256="abc", random_layers="", nll=9.0, tokens=31))
    cells = tmp_path / "results" / "length_cells.parquet"
    cells.parent.mkdir()
    pd.concat(frames, ignore_index=True).fillna({"random_layers": ""}).to_parquet(cells)
    monkeypatch.setattr(C, "LENGTH_CELLS", cells)

    ctx = Ctx()
    ctx.sha = "abc"
    monkeypatch.setattr(shipped, "same_tensor_shas", lambda sha: set())
    df = C.length_cells(ctx, "same", [("austen", 32, 2)])
    # dense is committed on both windows: reused; hard_top2 of this file only on window 3: evaluated
    assert set(df[df.reused].label) == {"dense"} and (df[df.reused].nll == 9.0).all()
    assert set(df[~df.reused].label) == {"hard_top2", "random_top2"} and (df[~df.reused].nll < 9.0).all()
    assert len(df) == 6 and set(df.method) == {"dense", "focus", "random"}
    # the manifest says 'twin' holds this file's tensors: its hard_top2 rows (random layers 1) count
    monkeypatch.setattr(shipped, "same_tensor_shas", lambda sha: {"twin"} if sha == "abc" else set())
    df = C.length_cells(ctx, "twin", [("austen", 32, 2)])
    assert set(df[df.reused].label) == {"dense", "hard_top2"} and set(df[~df.reused].label) == {"random_top2"}
    ctx.sha = "other"  # another file: only the router-free dense rows are taken
    df = C.length_cells(ctx, "other", [("austen", 32, 2)])
    assert set(df[df.reused].label) == {"dense"} and (df[~df.reused].nll < 9.0).all()


def test_length_table_reuses_router_free_rows_of_the_same_seed_only():
    """analyses/length_table.reusable_rows: dense and random rows on the asked windows, drawn
    with the run's seed (a missing seed column counts as seed 0; dense needs no seed); hard rows never; random rows
    never under a per-layer k."""
    from analyses.length_table import reusable_rows
    from focus_lab import FocusConfig
    old = pd.DataFrame({"label": ["dense", "random_top1", "hard_top1", "random_top1", "dense"],
                        "window": [0, 0, 0, 1, 5]})
    got = reusable_rows(old, ["dense", "random_top1", "hard_top1"], [0, 1], FocusConfig())
    assert sorted(zip(got.label, got.window)) == [("dense", 0), ("random_top1", 0), ("random_top1", 1)]
    assert reusable_rows(old, ["dense", "random_top1"], [0, 1], FocusConfig(seed=1)).label.tolist() == ["dense"]
    assert len(reusable_rows(old.assign(seed=1), ["dense", "random_top1"], [0, 1], FocusConfig(seed=1))) == 3
    spec = FocusConfig(layer_top_k={3: 0})
    assert reusable_rows(old, ["dense", "random_top1"], [0, 1], spec).label.tolist() == ["dense"]
    # a cell made under a per-layer k: its random rows kept other pairs, so a plain run skips them
    made_with_k = old.assign(layer_top_k="3:0")
    assert reusable_rows(made_with_k, ["dense", "random_top1"], [0, 1], FocusConfig()).label.tolist() == ["dense"]
    assert len(reusable_rows(old.assign(layer_top_k=""), ["dense", "random_top1"], [0, 1], FocusConfig())) == 3


def test_same_router_rows_take_the_same_tensors_under_the_same_random_layers_only():
    """analyses/length_table.same_router_rows, against hand-made cells: rows of this router file
    (its own random layers, '' = as the file says, or the same list), or of a file holding the
    same tensors ('twin') only when its random layers were the same; never another file's, never
    under a per-layer k or another seed."""
    from analyses.length_table import same_router_rows
    from focus_lab import FocusConfig
    cfg = FocusConfig(random_layers=[1, 2, 3])
    old = pd.DataFrame({"label": ["hard_top1"] * 7, "window": [0, 1, 2, 3, 4, 5, 6],
                        "routers_sha256": ["own", "own", "own", "twin", "twin", "other", "own"],
                        "random_layers": ["", "1-3", "1-9", "1-3", "", "1-3", "1-3"],
                        "layer_top_k": ["", "", "", "", "", "", "3:0"]})
    got = same_router_rows(old, ["hard_top1"], list(range(7)), cfg, {"twin"}, "own")
    assert sorted(got.window) == [0, 1, 3]
    assert same_router_rows(old, ["hard_top2"], list(range(7)), cfg, {"twin"}, "own").empty
    assert sorted(same_router_rows(old, ["hard_top1"], [1, 3], cfg, set(), "own").window) == [1]
    assert same_router_rows(old.assign(seed=1), ["hard_top1"], list(range(7)), cfg, {"twin"}, "own").empty
    assert same_router_rows(old, ["hard_top1"], list(range(7)), FocusConfig(random_layers=[1, 2, 3],
                            layer_top_k={4: 0}), {"twin"}, "own").empty
    # a run overriding the file's random layers (file: 1-9, run: none) takes no row made as the file
    # says (''), only rows made under its own override; with the file's own layers it takes them
    none = FocusConfig(random_layers=[])
    got = same_router_rows(old.assign(random_layers=["", "none", "1-9", "", "", "", ""]), ["hard_top1"],
                           list(range(7)), none, set(), "own", file_random_layers=list(range(1, 10)))
    assert sorted(got.window) == [1]
    assert sorted(same_router_rows(old, ["hard_top1"], list(range(7)), cfg, {"twin"}, "own",
                                   file_random_layers=[1, 2, 3]).window) == [0, 1, 3]


def test_length_table_reuses_a_row_for_the_pattern_it_ran_not_its_label():
    """analyses/length_table under a file whose rules hold the key shift (Gemma's shipped file): a
    row records its canonical pattern; ``hard_top2_keyshift`` made with the same tensors under the
    file before the shift is this file's ``hard_top2`` (by_pattern relabels it; same_router_rows
    takes it from the twin), a plain ``random_top2`` row, recorded or not, is not this file's
    ``random_top2`` (random groups with the shift), and dense is reused as before."""
    from analyses.length_table import by_pattern, pattern_in_force, reusable_rows, same_router_rows
    from focus_lab import FocusConfig
    shift, plain = FocusConfig(num_groups=4, key_shift=1), FocusConfig(num_groups=4)
    assert pattern_in_force(shift, "hard_top2") == "hard_top2+key_shift" == pattern_in_force(plain, "hard_top2_keyshift")
    assert pattern_in_force(shift, "random_top2") == "random_top2+key_shift"
    assert pattern_in_force(shift, "hard_top2_nokeyshift") == "hard_top2" == pattern_in_force(plain, "hard_top2")
    old = pd.DataFrame({"label": ["dense", "random_top2", "hard_top2_keyshift", "hard_top2", "random_top2"],
                        "window": [0, 0, 0, 0, 1],
                        "canonical_pattern": ["dense", "random_top2", "hard_top2+key_shift", "hard_top2", ""],
                        "routers_sha256": ["twin"] * 5, "random_layers": [""] * 5})
    labels = ["dense", "random_top2", "hard_top2"]
    moved = by_pattern(old, labels, shift)
    assert moved.label.tolist() == ["dense", "random_top2", "hard_top2", "hard_top2", "random_top2"]
    assert reusable_rows(moved, labels, [0, 1], shift).label.tolist() == ["dense"]
    got = same_router_rows(moved, labels, [0, 1], shift, {"twin"}, "own")
    assert sorted(zip(got.label, got.canonical_pattern)) == [("dense", "dense"), ("hard_top2", "hard_top2+key_shift")]
    # under the file before the shift the same rows are what their labels say
    assert sorted(reusable_rows(by_pattern(old, labels, plain), labels, [0, 1], plain).window) == [0, 0, 1]
    got = same_router_rows(by_pattern(old, labels, plain), labels, [0, 1], plain, {"twin"}, "own")
    assert sorted(zip(got.label, got.canonical_pattern)) == [("dense", "dense"), ("hard_top2", "hard_top2"),
                                                             ("random_top2", "random_top2")]


def test_length_table_follows_the_per_layer_k_in_force_per_pattern():
    """Under a router file's top-2 budget (FocusConfig.top_k_budgets) the length table records
    the spec per pattern (``spec_in_force``: hard/random top-2 get it, top-1 and dense do not) and
    reuses a row only when it ran under that spec: the file before its budget was saved
    ('before', ``budget_only``) gives its top-1 rows and its top-2 rows made with the same
    --layer-top-k, not its uniform top-2 rows; random top-2 rows likewise."""
    from analyses.length_table import reusable_rows, same_router_rows, spec_in_force
    from focus_lab import FocusConfig
    cfg = FocusConfig(top_k_budgets={2: {3: 1, 5: 3}})
    assert [spec_in_force(cfg, lab) for lab in ("hard_top2", "random_top2", "hard_top1", "dense", "window")] == \
        ["3:1;5:3", "3:1;5:3", "", "", ""]
    assert spec_in_force(cfg.replace(layer_top_k={}), "hard_top2") == ""
    old = pd.DataFrame({"label": ["hard_top1", "hard_top2", "hard_top2", "random_top2", "random_top2", "hard_top1"],
                        "window": [0, 1, 2, 3, 4, 5],
                        "routers_sha256": ["before", "before", "before", "x", "x", "other"],
                        "random_layers": [""] * 6,
                        "layer_top_k": ["", "", "5:3;3:1", "", "3:1;5:3", ""]})
    labels = ["hard_top1", "hard_top2", "random_top2"]
    got = same_router_rows(old, labels, list(range(6)), cfg, set(), "own", {"before"})
    assert sorted(got.window) == [0, 2]
    assert same_router_rows(old, labels, list(range(6)), cfg, set(), "own").empty
    assert sorted(reusable_rows(old, labels, list(range(6)), cfg).window) == [4]
    assert sorted(reusable_rows(old, labels, list(range(6)), FocusConfig()).window) == [3]


def test_length_table_report_marks_reused_rows(tmp_path):
    """analyses/length_table.py --report: changes vs dense and the controls come from the
    per-window rows; rows taken with --reuse get their tokens/s starred and a footnote."""
    import math
    from analyses import length_table as LT
    rows = []
    for w in range(4):
        for label, nll, kept in (("dense", 3.0, 1.0), ("hard_top1", 3.1, 0.3), ("shuffled_top1", 3.2, 0.3)):
            rows.append({"label": label, "window": w, "nll": nll + 0.01 * w, "tokens": 100, "seconds": 1.0,
                         "distant_pairs_kept": kept, "max_group_share": 0.3,
                         "reused_from": "old/table" if label == "dense" else ""})
    cell = pd.DataFrame(rows).assign(corpus="austen", seq_len=4096, heldout="persuasion")
    (tmp_path / "cells").mkdir()
    cell.to_parquet(tmp_path / "cells" / "austen_4096.parquet")
    text = LT.report(tmp_path)
    assert f"+{100 * (math.exp(0.1) - 1):.1f}%" in text  # hard_top1 over dense, every window +0.1 nats
    assert "100* / 100 / -" in text and "reused from old/table" in text
    s = pd.read_parquet(tmp_path / "length_table.parquet").set_index("label")
    assert s.loc["shuffled_top1", "control_vs_router_pct"] == pytest.approx(100 * (math.exp(0.1) - 1))
    cell.drop(columns="reused_from").to_parquet(tmp_path / "cells" / "austen_4096.parquet")  # older cells
    assert "reused from" not in LT.report(tmp_path)


def test_length_table_report_pairs_suffixed_patterns(tmp_path):
    """A suffixed control is measured against the router pattern with the same suffix, and each
    suffixed pattern against its unsuffixed base, paired over windows (hand-set NLLs)."""
    import math
    from analyses import length_table as LT
    assert LT.router_of("random_top2_keyshift") == "hard_top2_keyshift" and LT.router_of("hard_top2") is None
    assert LT.base_of("hard_top2_uniform_match") == "hard_top2" and LT.base_of("random_top1") is None
    nll = {"dense": 3.0, "hard_top2": 3.10, "hard_top2_keyshift": 3.05, "random_top2_keyshift": 3.15}
    rows = [{"label": lab, "window": w, "nll": v + 0.01 * w, "tokens": 100, "seconds": 1.0,
             "distant_pairs_kept": 0.5, "max_group_share": 0.3} for w in range(4) for lab, v in nll.items()]
    cell = pd.DataFrame(rows).assign(corpus="austen", seq_len=4096, heldout="persuasion")
    (tmp_path / "cells").mkdir()
    cell.to_parquet(tmp_path / "cells" / "austen_4096.parquet")
    text = LT.report(tmp_path)
    s = pd.read_parquet(tmp_path / "length_table.parquet").set_index("label")
    assert s.loc["random_top2_keyshift", "control_vs_router_pct"] == pytest.approx(100 * (math.exp(0.10) - 1))
    assert "hard_top2_keyshift vs hard_top2" in text
    assert f"{100 * (math.exp(-0.05) - 1):+.2f}%" in text  # every window 0.05 nats better with the suffix


def test_length_table_against_pairs_compares_differently_named_patterns(tmp_path):
    """--against with --against-pairs: this table's hard_top4 against the other table's
    hard_top2 on the windows both have (hand-set NLLs, every window 0.02 nats better), labelled
    "a vs b"; without pairs the differently named patterns are not compared; a bad pair is one
    line."""
    import math
    from analyses import length_table as LT

    def cells(folder, nll):
        rows = [{"label": lab, "window": w, "nll": v + 0.01 * w, "tokens": 100, "seconds": 1.0,
                 "distant_pairs_kept": 0.5, "max_group_share": 0.3, "reused_from": ""}
                for w in range(4) for lab, v in nll.items()]
        (folder / "cells").mkdir(parents=True)
        pd.DataFrame(rows).assign(corpus="man-pages", seq_len=4096, heldout="all").to_parquet(
            folder / "cells" / "man-pages_4096.parquet")
    cells(tmp_path / "k8", {"dense": 3.0, "hard_top4": 3.08})
    cells(tmp_path / "k4", {"dense": 3.0, "hard_top2": 3.10})
    assert LT.against_rows(pd.read_parquet(tmp_path / "k8" / "cells" / "man-pages_4096.parquet"),
                           tmp_path / "k4") == []
    pairs = LT.parse_pairs("hard_top4=hard_top2")
    text = LT.report(tmp_path / "k8", tmp_path / "k4", pairs=pairs)
    assert "hard_top4 vs hard_top2" in text and f"{100 * (math.exp(-0.02) - 1):+.2f}%" in text
    with pytest.raises(SystemExit, match="THIS=OTHER"):
        LT.parse_pairs("hard_top4")


def test_layer_budget_allocates_cheapest_drops_against_largest_raises():
    """analyses/studies/layer_budget.allocate on a hand-made sweep: pairs (cheapest k = 0, largest k = 2
    gain) while the pair's summed change is < 0, a layer used once; the spec string round-trips
    through config.parse_layer_top_k."""
    import pandas as pd
    from analyses.studies.layer_budget import allocate, spec_string
    from focus_lab.method.config import parse_layer_top_k
    k0 = [0.001, 0.05, -0.002, 0.02, 0.03]
    k2 = [-0.01, -0.03, -0.001, -0.004, 0.0]
    sweep = pd.DataFrame([{"layer_idx": i, "top_k": k, "delta_nll": d}
                          for k, ds in ((0, k0), (2, k2)) for i, d in enumerate(ds)])
    spec, pairs = allocate(sweep)
    # by hand: (drop 2, raise 1): -0.032; (drop 0, raise 3; 0 is taken as a drop): -0.003;
    # then drop 4 has no raise left that is not itself or taken -> stop
    assert spec == {2: 0, 1: 2, 0: 0, 3: 2}
    assert pairs.pair_delta.round(6).tolist() == [-0.032, -0.003]
    assert allocate(sweep, max_pairs=1)[0] == {2: 0, 1: 2}
    assert spec_string(spec) == "0,2:0;1,3:2" and parse_layer_top_k(spec_string(spec)) == spec
    assert spec_string({}) == "none"
    around2 = sweep.assign(top_k=sweep.top_k + 1)  # the same sweep around top-2: k = 1 and k = 3
    assert allocate(around2, base_k=2)[0] == {2: 1, 1: 3, 0: 1, 3: 3}
    with pytest.raises(ValueError, match="top_k 0 and 2"):
        allocate(sweep[sweep.top_k == 0])


def test_layer_budget_pools_studies_each_against_its_own_base(tmp_path, monkeypatch):
    """deltas() subtracts each window's own uniform base; commit_study() replaces a study's rows
    and pooled_study() reads them back for --pool, refusing an unknown study or other k's."""
    import pandas as pd
    from analyses.studies import layer_budget as LB
    monkeypatch.setattr(LB, "BUDGET_JSON", tmp_path / "layer_budget.json")
    def sweep(corpus, base, changes):  # changes: {(layer, k): nll}
        return pd.DataFrame([{"corpus": corpus, "window": 0, "layer_idx": -1, "top_k": 2, "nll": base}]
                            + [{"corpus": corpus, "window": 0, "layer_idx": i, "top_k": k, "nll": v}
                               for (i, k), v in changes.items()])
    tech = sweep("code", 2.0, {(0, 1): 2.001, (1, 1): 2.03, (0, 3): 1.99, (1, 3): 1.999})
    prose = sweep("novel", 3.0, {(0, 1): 3.0, (1, 1): 3.002, (0, 3): 3.0, (1, 3): 2.99})
    d = LB.deltas(tech).set_index(["layer_idx", "top_k"]).delta_nll
    assert d[(1, 1)] == pytest.approx(0.03) and d[(0, 3)] == pytest.approx(-0.01)
    LB.commit_study(prose, "lit")
    LB.commit_study(prose.assign(nll=prose.nll + 1), "lit")  # replaced, not appended
    back = LB.pooled_study("lit", base_k=2)
    assert len(back) == len(prose) and back.nll.tolist() == (prose.nll + 1).tolist()
    pooled = pd.concat([LB.deltas(tech), LB.deltas(back)])
    # by hand, means over the two corpora: drop 0 costs 0.0005, drop 1 0.016; raise 0 gains
    # -0.005, raise 1 -0.0055 -> one pair: drop 0, raise 1 (-0.005 total)
    assert LB.allocate(pooled, base_k=2)[0] == {0: 1, 1: 3}
    with pytest.raises(SystemExit, match="no such study"):
        LB.pooled_study("nope", base_k=2)
    with pytest.raises(SystemExit, match="not 0 and 2"):
        LB.pooled_study("lit", base_k=1)


def test_layer_budget_random_sweep_flips_layers_better_on_every_corpus():
    """analyses/studies/layer_budget.choose_random_layers on a hand-made sweep: a layer's assignment is
    flipped (router -> random, or random -> router) only when its flip lowers the NLL on both
    corpora by more than min_gain."""
    import pandas as pd
    from analyses.studies.layer_budget import choose_random_layers
    deltas = {  # layer: (austen, shakespeare) NLL change of the flipped variant
        1: (-0.002, -0.001),  # random now; routing it helps on both -> back to the router
        2: (-0.004, +0.001),  # random now; mixed -> stays random
        5: (-0.003, -0.0005),  # routed; random helps on both -> random
        6: (+0.001, -0.01),  # routed; mixed -> stays routed
        7: (0.0, 0.0),  # no change -> no flip
    }
    sweep = pd.DataFrame([{"corpus": c, "window": w, "layer_idx": i, "delta_nll": d}
                          for i, ds in deltas.items() for c, d in zip(("austen", "shakespeare"), ds)
                          for w in (0, 1)])
    new, table = choose_random_layers(sweep, current=[1, 2, 3])
    assert new == [2, 3, 5]  # 3 had no row: unchanged
    assert table.set_index("layer_idx").flip.to_dict() == {1: True, 2: False, 5: True, 6: False, 7: False}
    assert choose_random_layers(sweep, current=[1, 2, 3], min_gain=0.001)[0] == [1, 2, 3]  # only 1, 5 pass 0; neither passes 0.001 on both
    with pytest.raises(ValueError, match="no rows"):
        choose_random_layers(sweep.iloc[:0], current=[])


def test_passkey_reuses_committed_tables_of_the_shipped_configuration_only(tmp_path, monkeypatch):
    """Figure 12 takes the router's rows from the committed probe tables (``passkey_cases.parquet``
    with a ``table`` column, settings in ``passkey_tables.json``) made with the routers in
    use and no config overrides; dense and random rows (router-free) come from other tables for
    the same cases only, never random rows changed by a per-layer k, never a pattern twice."""
    import json
    from analyses import exp_passkey

    meta, cases = {}, []

    def table(name, sha, rows, **extra):
        meta[name] = {"settings": {"routers": {"sha256": sha}, "prompt_version": 2, "haystack": "h", **extra}}
        cases.append(pd.DataFrame([{"table": name, "format": "chat", "length": 64, "depth": 50.0, "seed": s,
                                    "key": str(s), "pattern": p, "exact_match": True} for p, s in rows]))

    table("plain", "abc", [("hard_top2", 0), ("hard_top2", 1)])
    table("budget", "abc", [("hard_top2", 0), ("dense", 1), ("random_top2", 1)],
          config_overrides={"layer_top_k": {"3": 1}})
    table("older", "def", [(p, s) for p in ("dense", "random_top2", "hard_top2") for s in (0, 1, 2)])
    table("other_prompt", "ghi", [("window", 0)], prompt_version=1)
    (tmp_path / "passkey_tables.json").write_text(json.dumps(meta))
    pd.concat(cases, ignore_index=True).to_parquet(tmp_path / "passkey_cases.parquet")
    monkeypatch.setattr(exp_passkey, "PASSKEY_TABLES", tmp_path)

    class Ctx:
        log = staticmethod(lambda s: None)
        router_id = staticmethod(lambda: "abc")

    from focus_lab import FocusConfig
    from focus_lab.hf import shipped

    def got(ctx, cfg):
        df = pd.concat(exp_passkey._committed(ctx, cfg), ignore_index=True)
        return sorted(zip(df.pattern, df.seed, df.source))

    assert got(Ctx(), FocusConfig()) == [
        ("dense", 0, "older"), ("dense", 1, "budget"), ("hard_top2", 0, "plain"),
        ("hard_top2", 1, "plain"), ("random_top2", 0, "older"), ("random_top2", 1, "older")]
    assert exp_passkey._committed(type("C", (Ctx,), {"router_id": staticmethod(lambda: "zzz")})(), FocusConfig()) == []
    # a file whose top-2 budget is the run's --layer-top-k: that run's top-2 rows are its own,
    # random top-2 rows made without the budget are not
    budget = FocusConfig(top_k_budgets={2: {3: 1}})
    assert got(Ctx(), budget) == [
        ("dense", 0, "older"), ("dense", 1, "budget"), ("hard_top2", 0, "budget"),
        ("hard_top2", 1, "plain"), ("random_top2", 1, "budget")]
    # the file "new" differs from "def" only in that budget: def's rows count where the per-layer
    # k is the same (dense here), not its uniform top-2 rows
    monkeypatch.setattr(shipped, "same_router_shas", lambda sha: {"def"} if sha == "new" else set())
    new = type("C", (Ctx,), {"router_id": staticmethod(lambda: "new")})()
    assert got(new, budget) == [("dense", 0, "older"), ("dense", 1, "older"), ("dense", 2, "older"),
                                ("random_top2", 1, "budget")]


def test_figures_only_takes_comma_lists_and_refuses_unknown_names():
    """``focus-lab-figures --only a,b`` is ``--only a --only b``; a misspelt experiment name is
    refused in one line with the valid names and exit 2, before anything runs (it used to run
    nothing and say nothing)."""
    from analyses.figures import parse_only
    assert parse_only(["baselines,records", "lora"]) == ["baselines", "records", "lora"]
    assert parse_only(None) is None
    res = CliRunner().invoke(F.cli, ["--quick", "--only", "baselines,recrods"])
    assert res.exit_code == 2
    assert "recrods" in res.output and "choose from router, baselines" in res.output


def test_reproduction_setting_names_the_random_layers(tmp_path):
    """The reproduction table's setting text names the router file's random layers (read from its
    saved FocusConfig), so numbers of a mixed file are not read as every layer routed."""
    from analyses.table_reproduction import _Ctx
    from focus_lab import FocusConfig
    row = {"num_groups": 4, "window": 128, "sink_tokens": 64, "steps": 30, "train_seq_len": 4096,
           "model": "smollm2-135m-instruct"}
    for layers, text in (([1, 2, 3, 9], ", balanced random groups in layers 1-3,9)"), (None, "64 sink tokens)")):
        pd.DataFrame([{**row, "focus_config": FocusConfig(random_layers=layers).to_json()}]).to_parquet(
            tmp_path / "router.parquet")
        got = _Ctx(tmp_path).routers
        assert got.endswith(text) and got.startswith("SmolLM2-135M, router-only (last stage 30 steps at 4096")


def test_committed_length_cells_round_trip(tmp_path, monkeypatch):
    """analyses/length_table: ``--commit NAME`` adds a run's cells to the committed tidy file as
    table NAME (a second commit replaces them); ``--reuse NAME`` and ``--against NAME`` read that
    table's rows of the same cell (``table_cell``), nothing of another cell or table."""
    from analyses import length_table as LT
    from focus_lab import FocusConfig
    committed = tmp_path / "results" / "length_cells.parquet"
    run = tmp_path / "run"
    (run / "cells").mkdir(parents=True)
    pd.DataFrame({"label": ["dense", "hard_top2"], "window": [0, 0], "nll": [1.0, 1.1], "routers_sha256": "own"}).assign(
        corpus="austen", seq_len=64).to_parquet(run / "cells" / "austen_64.parquet")
    monkeypatch.setattr(LT, "COMMITTED", committed)
    assert LT.commit_table(run, "mine") == 2 and LT.commit_table(run, "mine") == 2  # replaced, not added twice
    assert len(pd.read_parquet(committed)) == 2
    got = LT.table_cell("mine", "austen_64.parquet")
    assert sorted(got.label) == ["dense", "hard_top2"] and "table" not in got
    assert LT.table_cell("mine", "austen_128.parquet") is None and LT.table_cell("other", "austen_64.parquet") is None
    rows = LT.reused_rows(["mine"], "austen_64.parquet", ["dense", "hard_top2"], [0], FocusConfig(), "own")
    assert sorted(rows.label) == ["dense", "hard_top2"] and set(rows.reused_from) == {"mine"}
    assert LT.split_cell("python-docs_4096.parquet") == ("python-docs", 4096)


def test_length_table_commit_computes_nothing(tmp_path, monkeypatch, capsys):
    """``--out DIR --commit NAME`` without ``--report`` commits the cells already under DIR and
    runs nothing: before, it first computed the default corpora's cells into DIR (a run made with
    other ``--corpora`` then committed a stray cell with it)."""
    from analyses import length_table as LT
    committed = tmp_path / "length_cells.parquet"
    run = tmp_path / "run"
    (run / "cells").mkdir(parents=True)
    pd.DataFrame({"label": ["dense", "hard_top2"], "window": [0, 0], "nll": [1.0, 1.1], "tokens": [63, 63],
                  "routers_sha256": "own"}).assign(corpus="austen", seq_len=64).to_parquet(
        run / "cells" / "austen_64.parquet")
    monkeypatch.setattr(LT, "COMMITTED", committed)
    monkeypatch.setattr(LT, "run_cells", lambda args: (_ for _ in ()).throw(AssertionError("computed")))
    monkeypatch.setattr(LT, "report", lambda *a, **k: "report")
    LT.main(["--out", str(run), "--commit", "mine"])
    assert "committed 2 rows as table 'mine'" in capsys.readouterr().out
    assert sorted(pd.read_parquet(committed).label) == ["dense", "hard_top2"]
    with pytest.raises(SystemExit, match="nothing to commit"):
        LT.main(["--out", str(tmp_path / "empty"), "--commit", "mine"])


def test_committed_results_hold_the_shipped_routers_tables():
    """figures/results/: a length table of the shipped file (both corpora, 512-8192 tokens, every
    pattern but shuffled top-2, made with the file the manifest ships, whatever its name) and its
    passkey tables (60 keys at 4096 tokens, 12 at 8184, hard top-2) are committed, so that
    `focus-lab-figures` reuses them."""
    import json
    from analyses.length_table import COMMITTED, PATTERNS, router_free
    from focus_lab.hf import shipped
    sha = shipped.manifest()["smollm2-135m-instruct"]["sha256"]
    cells = pd.read_parquet(COMMITTED)
    grid = {(c, t) for c in ("austen", "shakespeare") for t in (512, 1024, 2048, 4096, 8192)}
    full = [name for name, g in cells.groupby("table")
            if set(g[~g.label.map(router_free)].routers_sha256) == {sha}
            and set(zip(g.corpus, g.seq_len)) == grid and set(g.label) >= set(PATTERNS.split(",")) - {"shuffled_top2"}]
    assert full, "no committed length table of the shipped file"
    # one row a window and pattern, per draw of the random groups (a table may hold several seeds)
    assert not cells.duplicated(["table", "corpus", "seq_len", "window", "label", "seed"]).any()
    meta = json.loads((COMMITTED.parent / "passkey_tables.json").read_text())
    cases = pd.read_parquet(COMMITTED.parent / "passkey_cases.parquet")
    assert set(cases.table) == set(meta)
    # the probe tables of its top-2 budget: the file itself, or the same tensors before the budget was saved
    shas = {sha} | shipped.same_router_shas(sha)
    mine = cases[cases.table.isin([n for n, m in meta.items() if m["settings"]["routers"]["sha256"] in shas])
                 & (cases.pattern == "hard_top2")].drop_duplicates(["length", "depth", "seed"])
    assert (mine.length == 4096).sum() == 60 and (mine.length == 8184).sum() == 12


def test_length_table_reuses_rows_window_by_window_from_several_tables(tmp_path):
    """analyses/length_table.reused_rows: for each (pattern, window) the first folder holding a
    row it may take (router-free rows from any file; router rows only from this file), so that a
    run with more windows evaluates only the new ones; a folder without the cell is skipped."""
    from analyses.length_table import reused_rows
    from focus_lab import FocusConfig

    def cell(folder, rows):
        (tmp_path / folder / "cells").mkdir(parents=True)
        pd.DataFrame(rows, columns=["label", "window", "nll", "routers_sha256"]).assign(
            corpus="austen", seq_len=64).to_parquet(tmp_path / folder / "cells" / "austen_64.parquet")

    cell("a", [("dense", 0, 1.0, "x"), ("dense", 1, 1.1, "x"), ("hard_top2", 0, 2.0, "other")])
    cell("b", [("dense", 0, 9.0, "own"), ("dense", 2, 1.2, "own"), ("hard_top2", 2, 2.2, "own"),
               ("hard_top2", 5, 2.5, "own")])
    folders = [tmp_path / "a", tmp_path / "missing", tmp_path / "b"]
    got = reused_rows(folders, "austen_64.parquet", ["dense", "hard_top2"], [0, 1, 2, 3], FocusConfig(), "own")
    taken = {(r.label, r.window): (r.nll, r.reused_from) for r in got.itertuples()}
    assert taken == {("dense", 0): (1.0, str(tmp_path / "a")), ("dense", 1): (1.1, str(tmp_path / "a")),
                     ("dense", 2): (1.2, str(tmp_path / "b")), ("hard_top2", 2): (2.2, str(tmp_path / "b"))}
    assert "corpus" not in got and "routers_sha256" not in got
    assert reused_rows(None, "austen_64.parquet", ["dense"], [0], FocusConfig(), "own").empty


def test_a_row_reused_twice_names_the_run_that_measured_it(tmp_path):
    """analyses/length_table.reused_rows: a row that the folder had itself reused keeps the name
    of the run that measured it; a row the folder measured takes the folder's name."""
    from analyses.length_table import reused_rows
    from focus_lab import FocusConfig

    (tmp_path / "t" / "cells").mkdir(parents=True)
    pd.DataFrame([("dense", 0, 1.0, "own", "first_table"), ("dense", 1, 1.1, "own", ""),
                  ("hard_top2", 0, 2.0, "own", None)],
                 columns=["label", "window", "nll", "routers_sha256", "reused_from"]).assign(
        corpus="austen", seq_len=64).to_parquet(tmp_path / "t" / "cells" / "austen_64.parquet")
    got = reused_rows([tmp_path / "t"], "austen_64.parquet", ["dense", "hard_top2"], [0, 1], FocusConfig(), "own")
    assert {(r.label, r.window): r.reused_from for r in got.itertuples()} == {
        ("dense", 0): "first_table", ("dense", 1): str(tmp_path / "t"), ("hard_top2", 0): str(tmp_path / "t")}


def test_cache_made_with_other_routers_is_recomputed(tmp_path, monkeypatch):
    """analyses/figures.run_experiments: a cached experiment that depends on the routers is
    recomputed, its parts and extra cache folders cleared, when the router file in use has another
    sha256 than the one its cache records (e.g. a new shipped file at the same path); an
    experiment that does not depend on them stays cached; the same file stays cached."""
    from types import SimpleNamespace
    from focus_lab.io import file_sha256

    calls = []

    class Fake(F.Experiment):
        def make_data(self, ctx):
            calls.append(self.name)
            if self.name == "router":
                return pd.DataFrame({"path": [str(ctx.default_routers)]})
            (ctx.data / f"{self.name}.parts").mkdir(exist_ok=True)
            (ctx.data / f"{self.name}.parts" / "old.parquet").write_bytes(b"x")
            return pd.DataFrame({"x": [len(calls)]})

    monkeypatch.setattr(F, "EXPERIMENTS", [Fake("router", "r"), Fake("uses", "u", caches=("runs",)),
                                           Fake("free", "f", uses_router=False)])
    routers = tmp_path / "routers.safetensors"
    routers.write_bytes(b"first file")
    data = tmp_path / "data"
    data.mkdir()
    ctx = SimpleNamespace(data=data, default_routers=routers, settings=C.QUICK, log=lambda m: None,
                          router_id=lambda: file_sha256(pd.read_parquet(data / "router.parquet")["path"].iloc[0]))
    F.run_experiments(ctx)
    assert calls == ["router", "uses", "free"]
    assert json.loads((data / "uses.json").read_text())["routers_sha256"] == file_sha256(routers)
    F.run_experiments(ctx)
    assert calls == ["router", "uses", "free"]  # same file: all cached
    (data / "runs").mkdir()
    (data / "runs" / "stale").write_bytes(b"x")
    routers.write_bytes(b"another file, same path")
    status = F.run_experiments(ctx)
    assert calls[3:] == ["router", "uses"] and status["free"]["status"] == "cached"
    assert not (data / "runs").exists() and (data / "uses.parts" / "old.parquet").is_file()
    assert json.loads((data / "uses.json").read_text())["routers_sha256"] == file_sha256(routers)
    # a cache that records no router file (made before this rule) counts as another file's
    meta = json.loads((data / "uses.json").read_text())
    del meta["routers_sha256"]
    (data / "uses.json").write_text(json.dumps(meta))
    F.run_experiments(ctx)
    assert calls[5:] == ["uses"]


def test_copy_classes_by_hand():
    """analyses/studies/copy_loss: bigram repeat distances and classes, counted by hand."""
    from analyses.studies.copy_loss import copy_class, repeat_distance
    #      t: 0  1  2  3  4  5  6  7  8
    ids = [5, 6, 7, 5, 6, 9, 5, 6, 7, 5]
    # bigrams (5,6) at t = 0, 3, 6; (6,7) at 1, 7; (7,5) at 2, 8; (6,9) at 4; (5,6) again; (9,5) at 5
    want = [-1, -1, -1, 3, -1, -1, 3, 6, 6]
    assert repeat_distance(ids).tolist() == want
    assert copy_class(repeat_distance(ids), window=4).tolist() == [0, 0, 0, 1, 0, 0, 1, 2, 2]
    assert repeat_distance([1]).tolist() == []


def test_domain_table_prints_hand_set_cells_and_the_paired_change_over_the_previous_file():
    """analyses/studies/domain_table on hand-set cells: dense perplexity is exp(mean NLL), top-2's
    change over dense is exp(0.02) - 1 on every window (interval collapsed onto it), the router's
    margin over random groups exp(0.05) - 1, and top-2 over the previous file's, whose top-2 NLL is
    0.01 higher on every window, exp(-0.01) - 1; a missing table is a KeyError naming it."""
    import math
    from analyses.studies import domain_table as D

    nll = {"dense": 2.0, "hard_top1": 2.04, "hard_top2": 2.02, "random_top2": 2.07}
    rows = []
    for _name, _kind, tokens, corpus, table, before in D.ROWS:
        for t, shift in ((table, 0.0), (before, 0.01)):
            rows += [{"table": t, "corpus": corpus, "seq_len": tokens, "window": w, "label": lab,
                      "nll": v + 0.1 * w + (shift if lab == "hard_top2" else 0.0), "tokens": 1000, "seconds": 1.0,
                      "distant_pairs_kept": 0.5 if lab != "dense" else 1.0, "max_group_share": 0.3}
                     for w in range(3) for lab, v in nll.items()]
    cells = pd.DataFrame(rows).drop_duplicates(["table", "corpus", "seq_len", "window", "label"])
    text = D.domain_table(cells)
    lines = text.splitlines()
    assert len(lines) == 2 + len(D.ROWS)
    num = lambda x: f"{100 * (math.exp(x) - 1):+.1f}"  # noqa: E731
    first = lines[2].split(" | ")
    dense_ppl = math.exp(2.1)  # mean of 2.0, 2.1, 2.2 over equal tokens
    assert first[3] == f"{dense_ppl:.2f}" and first[2] == "3"
    assert first[5] == f"{num(0.02)}% [{num(0.02)}, {num(0.02)}] [0.50]"
    assert first[7] == f"{num(0.05)}% [{num(0.05)}, {num(0.05)}]"
    prev = f"{100 * (math.exp(-0.01) - 1):+.2f}"
    assert all(line.endswith(f"| {prev}% [{prev}, {prev}] |") for line in lines[2:])
    with pytest.raises(KeyError, match="capacity_heldout_8k"):
        D.domain_table(cells[cells.table != "capacity_heldout_8k"])
    with pytest.raises(KeyError, match="needle_mix_heldout_8k"):
        D.domain_table(cells[cells.table != "needle_mix_heldout_8k"])


def test_length_models_figure_plots_the_pooled_change_of_the_committed_rows():
    """Figure 13 against a by-hand pooling of the committed per-window rows on Persuasion: Gemma's
    hard top-2 at 4096 tokens (4 windows, an interval around it) and SmolLM2's random top-2 at 512
    (perplexity exp(token-weighted mean NLL) of each pattern over the same windows, change over
    dense in %); at 8192 Gemma has 2 windows and no interval, at 16384 and 32768 4 and 3; x runs 512..32768 on
    a log axis."""
    import math
    import numpy as np
    from analyses import fig_length_models as M
    from analyses.doc_blocks import GEMMA_TABLE, LENGTH_CELLS, SHIPPED_TABLE
    cells = pd.read_parquet(C.REPO / LENGTH_CELLS)

    def by_hand(table: str, L: int, label: str) -> float:
        rows = cells[(cells["table"] == table) & (cells["corpus"] == "austen") & (cells["seq_len"] == L)]
        a, d = rows[rows["label"] == label], rows[rows["label"] == "dense"]
        assert sorted(a["window"]) == sorted(d["window"]) and len(a) > 0
        ppl = lambda r: math.exp((r["nll"] * r["tokens"]).sum() / r["tokens"].sum())  # noqa: E731
        return 100 * (ppl(a) / ppl(d) - 1)

    fig = M.make_figure(None)
    panels = {"SmolLM2-135M": "x", "Gemma-3-270M": "x2"}

    def trace(model: str, name: str):
        found = [t for t in fig.data if t.name == name and (t.xaxis or "x") == panels[model]]
        assert len(found) == 1, (model, name)
        t = found[0]
        return np.asarray(t.x, float), np.asarray(t.y, float), t

    x, y, t = trace("Gemma-3-270M", "hard top-2")
    assert x.tolist() == [4096, 8192, 16384, 32768]
    assert y[0] == pytest.approx(by_hand(GEMMA_TABLE, 4096, "hard_top2"), abs=1e-9)
    up, down = np.asarray(t.error_y.array, float), np.asarray(t.error_y.arrayminus, float)
    assert up[0] > 0 and down[0] > 0  # 4 windows: the paired interval holds the point
    assert np.isnan(up[1]) and np.isnan(down[1])  # 2 windows at 8192: no interval
    assert (up[2:] > 0).all() and (down[2:] > 0).all()  # 4 and 3 windows at 16384 and 32768
    assert y[3] == pytest.approx(by_hand(GEMMA_TABLE, 32768, "hard_top2"), abs=1e-9)
    x, y, _ = trace("SmolLM2-135M", "random groups, top-2")
    assert x.tolist() == [512, 1024, 2048, 4096, 8192]
    assert y[0] == pytest.approx(by_hand(SHIPPED_TABLE, 512, "random_top2"), abs=1e-9)
    assert {t.name for t in fig.data} == {"hard top-1", "hard top-2", "random groups, top-2"}
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis2.tickvals) == [2 ** i for i in range(9, 16)]
