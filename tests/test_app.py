"""Dashboard pages under streamlit's AppTest, on small runs recorded by the real recorder.

Each page is checked for content computed independently from the run's parquet files, not
only for the absence of exceptions. Runs: ``tiny`` (K=4, 2 layers, with pos/eval/train_log and
stand-in coverage/audit tables), ``tiny-k2`` (K=2, for Compare), ``main-job`` (what the main job
leaves: shipped routers, the eval table of its recorded windows), ``bare`` (tokens and
assignments only), ``broken`` (corrupted manifest), ``old`` (schema version 0) and
``badtable`` (a corrupted assignments parquet). Passkey outputs (not runs): ``passkey`` (written
by the probe on the tiny model) and ``probes/passkey-synth`` (chosen values).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import focus_lab.app
from run_fixtures import (corrupt_run, make_main_job_run, make_passkey_dir, make_synthetic_passkey_dir,
                          make_tiny_run, other_schema_run)

#: the dashboard's script, from the installed package focus_lab.app (the repository's app/ folder)
MAIN = Path(focus_lab.app.__file__).parent / "main.py"

st_testing = pytest.importorskip("streamlit.testing.v1")
TIMEOUT = 120
BROKEN = {"broken", "old", "badtable", "odd"}


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    tiny = make_tiny_run(root / "tiny", patterns=((1, 0),))
    make_tiny_run(root / "tiny-k2", num_groups=2, top_k=1, seed=1)
    make_main_job_run(root / "main-job", source=tiny)
    bare = root / "bare"
    shutil.copytree(tiny, bare)
    for t in bare.glob("*.parquet"):
        if t.stem not in ("tokens", "assignments"):
            t.unlink()
    corrupt_run(root / "broken")
    other_schema_run(root / "old", source=tiny, version=0)
    bad = root / "badtable"
    shutil.copytree(tiny, bad)
    (bad / "assignments.parquet").write_bytes(b"PAR1 this is not parquet")
    make_passkey_dir(root / "passkey")  # the probe's own output on the tiny model (not a run)
    make_synthetic_passkey_dir(root / "probes" / "passkey-synth")  # chosen values, one level down
    return root


@pytest.fixture()
def app(runs_root, monkeypatch):
    monkeypatch.setenv("FOCUS_LAB_RUNS", str(runs_root))

    def open_page(page: str = "groups", run: str | None = "tiny", errors_ok: bool | None = None):
        at = st_testing.AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
        if run is not None:
            at.query_params["run"] = run
        at.run()
        if page != "groups":
            at.switch_page(f"app_pages/{page}.py")
            at.run()
        assert not at.exception, [e.value for e in at.exception]
        if not (errors_ok if errors_ok is not None else run in BROKEN):
            assert not at.error, [e.value for e in at.error]
        return at
    return open_page


def figures(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def decode(arr):
    """A plotly JSON array (list or {'dtype', 'bdata', 'shape'}) as numpy."""
    if isinstance(arr, dict) and "bdata" in arr:
        out = np.frombuffer(base64.b64decode(arr["bdata"]), dtype=np.dtype(arr["dtype"]))
        if "shape" in arr:
            out = out.reshape([int(s) for s in str(arr["shape"]).split(",")])
        return out
    return np.asarray(arr)


def title(fig: dict) -> str:
    t = fig.get("layout", {}).get("title", {})
    return t.get("text", "") if isinstance(t, dict) else str(t)


def read(root: Path, run: str, table: str) -> pd.DataFrame:
    return pd.read_parquet(root / run / f"{table}.parquet")


# ----------------------------------------------------------------------------------------- groups

def test_groups_table_has_the_recorded_sizes(app, runs_root):
    asg = read(runs_root, "tiny", "assignments")
    at = app("groups")
    assert at.title[0].value == "Groups"
    for layer in (0, 1):
        if layer:
            at.selectbox(key="groups_layer").set_value(1).run()
            assert not at.exception
        expected = np.bincount(asg.loc[asg.layer_idx == layer, "group"], minlength=4)
        summary = at.dataframe[0].value
        assert summary["group"].tolist() == [0, 1, 2, 3]
        assert summary["size"].tolist() == expected.tolist()
        assert summary["share"].sum() == pytest.approx(1.0)
        assert [t.label for t in at.tabs] == [f"group {g} ({n})" for g, n in enumerate(expected)]
    figs = figures(at)
    pos_fig = next(f for f in figs if title(f).startswith("POS composition"))
    pos = read(runs_root, "tiny", "pos")
    assert {tr["name"] for tr in pos_fig["data"]} <= set(pos["pos"].replace("", "(none)")) | {"(none)"}
    contexts = [m.value for m in at.markdown if "Example contexts" in m.value]
    assert len(contexts) == 4 and all("<mark" in c for c in contexts)


def test_groups_flow_heatmap_counts_every_token(app, runs_root):
    asg = read(runs_root, "tiny", "assignments")
    at = app("groups")
    heat = next(f for f in figures(at) if "layer 0 → layer 1" in title(f))
    counts = decode(heat["data"][0]["text"])
    a = asg[asg.layer_idx == 0].sort_values(["window", "position"])["group"].to_numpy()
    b = asg[asg.layer_idx == 1].sort_values(["window", "position"])["group"].to_numpy()
    expected = np.zeros((4, 4), dtype=int)
    np.add.at(expected, (a, b), 1)
    assert counts.tolist() == expected.tolist()


def test_groups_token_search_shows_every_layer(app, runs_root):
    tok = read(runs_root, "tiny", "tokens")
    asg = read(runs_root, "tiny", "assignments")
    at = app("groups")
    at.text_input(key="groups_query").input("the").run()
    assert not at.exception
    occ = tok[tok.token.str.strip().str.lower() == "the"][["window", "position"]]
    assert len(occ) > 0
    table = at.dataframe[-1].value
    assert table["layer"].tolist() == [0, 1]
    m = asg.merge(occ, on=["window", "position"])
    for layer in (0, 1):
        row = table[table.layer == layer].iloc[0]
        got = [int(row[f"g{g}"]) for g in range(4)]
        assert got == np.bincount(m.loc[m.layer_idx == layer, "group"], minlength=4).tolist()
    at.text_input(key="groups_query").input("zebra").run()
    assert any("does not occur" in w.value for w in at.warning)


def test_context_is_html_escaped():
    from focus_lab.app import lib
    tokens = pd.DataFrame({"window": 0, "position": [0, 1, 2], "token": ["a", "<script>x</script>", "&b"],
                           "char_start": [0, 2, 20], "char_end": [1, 19, 22]})
    out = lib.render_context(tokens, 0, 1)
    assert "<script>" not in out and "&lt;script&gt;" in out and "&amp;b" in out
    assert out.count("<mark") == 1


def test_hard_shares_count_evicted_keys_among_the_tokens():
    """lib.hard_shares: 2 of 8 tokens in group 0, 4 in group 1, 2 evicted by the group capacity
    (group K = 2): shares 0.25 / 0.5, not 1/3 / 2/3 as if the evicted keys did not exist."""
    from focus_lab.app import lib
    asg = pd.DataFrame({"layer_idx": 0, "group": [0, 0, 1, 1, 1, 1, 2, 2]})
    got = lib.hard_shares(asg, 2).set_index("group")["share"]
    assert got.to_dict() == {0: 0.25, 1: 0.5}
    assert lib.group_ids(2, asg.group) == [0, 1, 2] and lib.group_ids(2, [0, 1]) == [0, 1]
    assert [lib.group_label(g, 2) for g in (0, 1, 2)] == ["g0", "g1", "evicted"]


# --------------------------------------------------------------------------------------- overview

def test_overview_shows_manifest_eval_and_training(app, runs_root):
    ev = read(runs_root, "tiny", "eval")
    log = read(runs_root, "tiny", "train_log")
    at = app("overview")
    fields = at.dataframe[-1].value.set_index("field")["value"]
    assert fields["groups K / window w / top-k"] == "4 / 8 / 2"
    assert [m.value for m in at.metric][:4] == ["2", "4", "2", "8"]
    table = at.dataframe[0].value
    assert table["label"].tolist() == ev["label"].tolist()
    assert table["label"].tolist()[:3] == ["dense", "window", "soft"]
    assert np.allclose(table["perplexity"], ev["perplexity"])
    titles = [title(f) for f in figures(at)]
    assert any("perplexity" in t for t in titles) and any("loss" in t for t in titles)
    loss = next(f for f in figures(at) if "loss" in title(f))
    assert decode(loss["data"][0]["y"]) == pytest.approx(log.groupby("step")["loss"].mean().to_numpy())
    assert len(at.get("download_button")) == 1


def test_overview_after_the_main_job_shows_the_eval_of_the_recorded_windows_and_the_shipped_provenance(
        app, runs_root):
    """The run the main job leaves (``focus-lab eval --run`` wrote its eval table; shipped routers,
    no training log): the perplexity table of the quickstart's patterns on every recorded window,
    said in the caption, and the shipped file's provenance from focus_lab/routers/MANIFEST.json
    (read here directly); no info box."""
    from focus_lab.cli import QUICKSTART_PATTERNS
    from focus_lab.hf import shipped
    from focus_lab.hf.shipped import MANIFEST
    ev = read(runs_root, "main-job", "eval")
    windows = read(runs_root, "main-job", "tokens")["window"].nunique()
    at = app("overview", run="main-job")
    assert not at.info, [i.value for i in at.info]
    table = at.dataframe[0].value
    assert table["label"].tolist() == QUICKSTART_PATTERNS.split(",") == ev["label"].tolist()
    assert np.allclose(table["perplexity"], ev["perplexity"])
    assert any(f"On all {windows} recorded windows, 48 tokens each" in c.value for c in at.caption)
    entry = shipped.manifest()["smollm2-135m-instruct"]  # the main job's model (the manifest ships Gemma's file too)
    assert any("shipped with focus-lab" in m.value and entry["sha256"][:12] in m.value for m in at.markdown)
    prov = at.dataframe[1].value.set_index("field")["value"]
    assert prov["command"] == entry["command"]
    assert prov["whole recipe from scratch"] == entry["from_scratch"]["command"]
    assert not any("loss" in title(f) for f in figures(at))  # no training curves: nothing was trained


def test_missing_tables_are_info_messages(app):
    at = app("overview", run="bare")
    infos = " ".join(i.value for i in at.info)
    assert "no **eval** table" in infos and "no **train_log** table" in infos
    at = app("coverage", run="tiny-k2")
    assert any("no **patterns** table" in i.value for i in at.info)
    for page, table in (("coverage", "coverage"), ("audit", "dropped_edges")):
        at = app(page, run="bare")
        assert any(f"no **{table}** table" in i.value for i in at.info), [i.value for i in at.info]
        assert not at.error
    at = app("balance", run="bare")
    assert any("no **balance** table" in i.value for i in at.info)
    assert at.get("plotly_chart")  # shares derived from the assignments still show
    at = app("groups", run="bare")
    assert any("no **pos** table" in i.value for i in at.info)
    assert at.dataframe[0].value["size"].sum() == len(pd.read_parquet(
        Path(os.environ["FOCUS_LAB_RUNS"]) / "bare" / "assignments.parquet").query("layer_idx == 0"))


# ---------------------------------------------------------------------------------------- balance

def test_balance_largest_shares(app, runs_root):
    asg = read(runs_root, "tiny", "assignments")
    bal = read(runs_root, "tiny", "balance")
    at = app("balance")
    from focus_lab.app.lib import BALANCE_METHOD_NAMES as METHOD_NAMES
    summary = at.dataframe[0].value.set_index("layer")
    for layer in (0, 1):
        hard = np.bincount(asg.loc[asg.layer_idx == layer, "group"], minlength=4) / (asg.layer_idx == layer).sum()
        assert summary.loc[layer, f"largest share: {METHOD_NAMES['hard']}"] == pytest.approx(hard.max())
        assert summary.loc[layer, f"largest share: {METHOD_NAMES['softmax']}"] == pytest.approx(
            bal.loc[bal.layer_idx == layer, "softmax_share"].max())
    heat = next(f for f in figures(at) if title(f).startswith("hard (top-1)"))
    assert decode(heat["data"][0]["z"]).shape == (2, 4)
    assert any("over training" in title(f) for f in figures(at))


# --------------------------------------------------------------------------------------- coverage

def test_coverage_heatmap_and_table(app, runs_root):
    cov = read(runs_root, "tiny", "coverage")
    at = app("coverage")
    heat = next(f for f in figures(at) if "layer x head" in title(f))
    z = decode(heat["data"][0]["z"])
    focus = cov[cov.pattern == "focus"].pivot(index="layer_idx", columns="head", values="coverage")
    assert np.allclose(z, focus.to_numpy())
    table = at.dataframe[0].value.set_index("layer")
    assert set(table.columns) >= {"focus", "random", "window"}
    assert np.allclose(table["window"], cov[cov.pattern == "window"].groupby("layer_idx")["coverage"].mean())
    at.selectbox(key="coverage_pattern").set_value("window").run()
    heat = next(f for f in figures(at) if "layer x head" in title(f))
    assert "window mask" in title(heat)
    assert any("distance" in title(f) for f in figures(at))
    crossing = read(runs_root, "tiny", "crossing")
    table = at.dataframe[1].value.set_index("layer")
    assert np.allclose(table["dense_dropped"], crossing.groupby("layer_idx")["dense_dropped"].mean())
    # the recorded full map of layer 1 head 0: dense weights where the recorder kept them
    pat = read(runs_root, "tiny", "patterns")
    sel = pat[(pat.layer_idx == 1) & (pat["head"] == 0) & (pat.window == pat.window.min())]
    dense = next(f for f in figures(at) if title(f) == "dense attention P")
    z = decode(dense["data"][0]["z"])
    r = sel.iloc[len(sel) // 2]
    assert z[int(r.query_position), int(r.key_position)] == pytest.approx(r.dense_weight)
    assert any(title(f) == "dense mass the hard mask drops" for f in figures(at))


# ------------------------------------------------------------------------------------------ audit

def test_audit_filters_narrow_the_table(app, runs_root):
    MAX_ROWS = 2000  # app_pages/audit.py
    edges = read(runs_root, "tiny", "dropped_edges")
    at = app("audit")

    def shown() -> tuple[int, pd.DataFrame]:
        assert not at.exception, [e.value for e in at.exception]
        n = int(at.metric[0].value.replace(",", ""))
        table = at.dataframe[0].value
        assert len(table) == min(n, MAX_ROWS)
        return n, table

    n, table = shown()
    assert n == len(edges) > 0
    assert table["weight"].is_monotonic_decreasing  # heaviest first
    assert any("key ← query" in title(f) for f in figures(at))
    cut = float(np.quantile(edges["weight"], 0.75))
    at.number_input(key="audit_weight").set_value(cut).run()
    n, table = shown()
    assert n == (edges["weight"] >= cut).sum() < len(edges)
    assert table["weight"].min() >= cut
    at.multiselect(key="audit_layers").set_value([1]).run()
    n, table = shown()
    assert set(table["layer"]) == {1}
    assert n == ((edges["weight"] >= cut) & (edges["layer_idx"] == 1)).sum()
    assert at.get("download_button")
    # relations recorded by spaCy are offered as a filter; picking one keeps only it
    rels = at.multiselect(key="audit_relations").options
    assert "(no relation)" in rels
    heavy = edges[(edges["weight"] >= cut) & (edges["relation"].fillna("") != "")]
    if len(heavy):
        rel = heavy["relation"].value_counts().index[0]
        assert rel in rels
        at.multiselect(key="audit_layers").set_value([]).run()
        at.multiselect(key="audit_relations").set_value([rel]).run()
        n, table = shown()
        assert set(table["relation"]) == {rel}
        assert n == (heavy["relation"] == rel).sum()
    at.number_input(key="audit_weight").set_value(1.0).run()
    assert any("No dropped edge matches" in w.value for w in at.warning)


def _costly_block(at) -> str:
    blocks = [m.value for m in at.html if 'class="fl-costly"' in m.value]
    assert len(blocks) == 1, "the costly-drops section shows one table"
    return blocks[0]


def test_audit_costly_drops_lists_the_costliest_queries(app, runs_root):
    import html
    import re
    from focus_lab.app import lib
    drops = read(runs_root, "tiny", "costly_drops")
    loss = read(runs_root, "tiny", "loss_delta")
    at = app("audit")
    block = _costly_block(at)
    rows = block.split("<tr>")[2:]  # after the header row
    # the 20 costliest queries, by delta, computed here from loss_delta and dropped_edges
    edges = read(runs_root, "tiny", "dropped_edges")
    q = loss.merge(edges[["window", "query_position"]].drop_duplicates(), left_on=["window", "position"],
                   right_on=["window", "query_position"]).sort_values(
        ["delta", "window", "position"], ascending=[False, True, True]).head(20)
    assert len(rows) == len(q) == min(20, drops.groupby(["window", "query_position"]).ngroups) > 0
    shown = [float(x) for x in re.findall(r"<b>Δ ([+-]\d+\.\d+)</b>", block)]
    assert shown == pytest.approx(q["delta"].round(3).tolist(), abs=1.5e-3)
    assert shown == sorted(shown, reverse=True)
    # each row: the query's window and position, its token marked in context, its heaviest key first
    tok = read(runs_root, "tiny", "tokens").set_index(["window", "position"])["token"]
    for row, r in zip(rows, q.itertuples(index=False)):
        assert f'title="window {r.window}, position {r.position}"' in row
        marked = re.search(r"<mark[^>]*><b>(.*?)</b></mark>", row).group(1)
        assert marked == html.escape(str(tok[(r.window, r.position)]))
        nxt = re.search(r'→ <b style="[^"]*">(.*?)</b>', row).group(1)
        assert nxt == html.escape(lib.show_token(tok[(r.window, r.position + 1)]))
        mine = edges[(edges.window == r.window) & (edges.query_position == r.position)]
        heaviest = mine.sort_values("weight", ascending=False).iloc[0]
        first_key = row.rsplit("<td", 1)[1].split("</span>")[0]
        assert f'title="key position {int(heaviest.key_position)}"' in first_key
        assert f"−{int(heaviest.distance):,} L{int(heaviest.layer_idx)}/H{int(heaviest['head'])} " \
               f"{float(heaviest.weight):.2f}" in first_key
    assert not any("costly_drops" in i.value for i in at.info)


def test_audit_costly_drops_info_on_a_run_without_it(app, runs_root):
    old = runs_root / "preld"  # a run recorded before loss_delta existed
    if not old.exists():
        shutil.copytree(runs_root / "tiny", old)
        for t in ("loss_delta", "costly_drops"):
            (old / f"{t}.parquet").unlink()
    at = app("audit", run="preld")
    info = [i.value for i in at.info if "costly_drops" in i.value]
    assert len(info) == 1 and "focus-lab record --metrics all" in info[0]
    assert not [m for m in at.html if 'class="fl-costly"' in m.value]
    # the audit itself is unchanged
    assert int(at.metric[0].value.replace(",", "")) == len(read(runs_root, "preld", "dropped_edges"))
    at = app("audit", run="bare")  # neither dropped_edges nor costly_drops: two info lines
    assert any("no **dropped_edges** table" in i.value for i in at.info)
    assert any("no **costly_drops** table" in i.value for i in at.info)


# ---------------------------------------------------------------------------------------- compare

def test_compare_two_runs(app, runs_root):
    at = app("compare", errors_ok=True)  # B defaults to the first other run, maybe a broken one
    assert at.selectbox(key="compare_b").value in ("tiny-k2", "bare", "badtable", "broken", "old")
    at.selectbox(key="compare_b").set_value("tiny-k2").run()
    assert not at.exception and not at.error
    cfg = at.dataframe[0].value
    assert "focus_config.num_groups" in set(cfg["field"])
    ppl = at.dataframe[1].value
    assert set(ppl.columns) == {"label", "A: tiny", "B: tiny-k2"}
    ev_b = read(runs_root, "tiny-k2", "eval")
    assert np.allclose(ppl.set_index("label").loc[ev_b["label"], "B: tiny-k2"], ev_b["perplexity"])
    bal = next(f for f in figures(at) if "largest / smallest" in title(f))
    assert {tr["name"].split(",")[0] for tr in bal["data"]} >= {"A: tiny (K=4)", "B: tiny-k2 (K=2)"}
    at.selectbox(key="compare_b").set_value("broken").run()
    assert any("corrupted" in e.value for e in at.error)


# ------------------------------------------------------------------------------------------ probe

def test_live_probe_routes_a_passage(app):
    at = app("probe")
    assert any("Run probe" in i.value for i in at.info)  # no model loaded before the click
    assert not at.get("plotly_chart")
    at.text_area(key="probe_text").input("The captain smiled at Anne by the gate.").run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    heat = figures(at)[0]
    z = decode(heat["data"][0]["z"])
    assert z.shape[0] == 2 and z.shape[1] > 5  # layers x tokens
    assert set(np.unique(z)) <= {0, 1, 2, 3}
    groups = [m.value for m in at.markdown if m.value.startswith('<div style="margin:4px 0"><b')]
    assert len(groups) == 4


# ------------------------------------------------------------------------------ a Gemma-shaped run

GEMMA = "tiny-k4-gemma3"  # sorts after tiny-k2 (Compare's default B of the other runs is unchanged)


@pytest.fixture(scope="session")
def gemma_routed(runs_root) -> list[int]:
    """A run recorded from a tiny Gemma-3 (6 layers, layers 2 and 5 global) in the runs root;
    returns its global layers, read from the saved model config (the only layers Focus routes)."""
    if not (runs_root / GEMMA).exists():
        make_tiny_run(runs_root / GEMMA, model="gemma3", layers=6)
    types = json.loads((runs_root / f".{GEMMA}-assets" / "model" / "config.json").read_text())["layer_types"]
    return [i for i, t in enumerate(types) if t == "full_attention"]


def test_gemma_run_pages_show_the_routed_layers_only(app, runs_root, gemma_routed):
    """On a run where only some layers are routed (Gemma's global ones), every page's layer
    selectors, tables and per-layer charts hold those layers and no other; the Overview's
    layer count is the model's."""
    routed = gemma_routed
    assert routed == [2, 5]
    names = [str(i) for i in routed]
    asg = read(runs_root, GEMMA, "assignments")
    assert sorted(asg.layer_idx.unique()) == routed

    at = app("groups", run=GEMMA)
    assert at.selectbox(key="groups_layer").options == names
    assert at.selectbox(key="groups_flow_to").options == names[1:]
    at.selectbox(key="groups_layer").set_value(routed[1]).run()
    assert not at.exception
    assert at.dataframe[0].value["size"].tolist() == np.bincount(asg.loc[asg.layer_idx == routed[1], "group"],
                                                                   minlength=4).tolist()
    assert any(title(f).startswith(f"layer {routed[0]} → layer {routed[1]}") for f in figures(at))

    at = app("overview", run=GEMMA)
    assert [m.value for m in at.metric][:2] == ["6", "4"]  # the model's layers, K
    curves = next(f for f in figures(at) if title(f).startswith("largest group share per step"))
    assert sorted(str(tr["name"]) for tr in curves["data"]) == names

    at = app("balance", run=GEMMA)
    assert at.dataframe[0].value["layer"].tolist() == routed
    heat = next(f for f in figures(at) if title(f).startswith("hard (top-1)"))
    assert decode(heat["data"][0]["z"]).shape == (len(routed), 4)

    at = app("coverage", run=GEMMA)
    assert at.dataframe[0].value["layer"].tolist() == routed
    assert at.selectbox(key="coverage_dist_layer").options == ["all", *names]

    at = app("audit", run=GEMMA)
    assert at.multiselect(key="audit_layers").options == names
    edges = read(runs_root, GEMMA, "dropped_edges")
    assert int(at.metric[0].value.replace(",", "")) == len(edges)  # no filter set: every recorded edge

    at = app("probe", run=GEMMA)
    at.text_area(key="probe_text").input("The captain smiled at Anne by the gate.").run()
    at.button(key="probe_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    heat = figures(at)[0]
    assert decode(heat["data"][0]["z"]).shape[0] == len(routed)  # rows: the routed layers of 6
    assert [str(y) for y in heat["data"][0]["y"]] == names


# ---------------------------------------------------------------------------------------- passkey

def open_passkey(app, name: str, fmt: str | None = None):
    at = app("passkey")
    if at.selectbox(key="passkey_dir").value != name:
        at.selectbox(key="passkey_dir").set_value(name).run()
    if fmt is not None:
        at.selectbox(key="passkey_format").set_value(fmt).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    return at


def expected_heatmaps(cases: pd.DataFrame) -> dict:
    """{pattern: (exact-match rate, mean key log-prob text)} per length (rows) x depth (columns)."""
    out = {}
    lengths, depths = sorted(cases.length.unique()), sorted(cases.depth.unique())
    for p, sub in cases.groupby("pattern"):
        g = sub.groupby(["length", "depth"])
        em = g.exact_match.mean().unstack().reindex(index=lengths, columns=depths).to_numpy(float)
        lp = g.key_logprob.mean().unstack().reindex(index=lengths, columns=depths).to_numpy(float)
        out[p] = (em, [[f"{v:.1f}" for v in row] for row in lp])
    return out


def heatmap_traces(at) -> dict:
    fig = next(f for f in figures(at) if title(f).startswith("exact-match rate"))
    return {tr["name"]: (decode(tr["z"]).astype(float), [list(r) for r in tr["text"]]) for tr in fig["data"]}


def test_passkey_folders_are_not_runs(runs_root):
    from focus_lab.app import lib
    from focus_lab.runs import list_runs
    assert lib.passkey_dirs(runs_root) == ["passkey", "probes/passkey-synth"]
    runs = lib.available_runs(runs_root)
    assert "tiny" in runs and not any(r.startswith(("passkey", "probes")) for r in runs)
    assert not any("passkey" in str(p) for p in list_runs(runs_root))


@pytest.mark.parametrize("fmt", ["chat", "plain"])
def test_passkey_heatmaps_and_table_follow_the_parquet(app, runs_root, fmt):
    cases = pd.read_parquet(runs_root / "probes" / "passkey-synth" / "cases.parquet")
    cases = cases[cases.format == fmt]
    at = open_passkey(app, "probes/passkey-synth", fmt)
    assert at.title[0].value == "Passkey"
    got, want = heatmap_traces(at), expected_heatmaps(cases)
    assert list(got) == ["dense", "window", "hard_top2"]  # the table's order
    assert 0 < cases.exact_match.mean() < 1  # the values differ between cells
    for p, (em, text) in want.items():
        assert np.allclose(got[p][0], em, equal_nan=True), p
        assert got[p][1] == text, p
    tab = next(d.value for d in at.dataframe if "hits" in d.value.columns)
    g = cases.groupby(["pattern", "length"])
    for r in tab.itertuples(index=False):
        sub = cases[(cases.pattern == r.pattern) & (cases.length == r.length)]
        assert r.cases == len(sub) and r.hits == int(sub.exact_match.sum())
        assert r.exact_match == pytest.approx(sub.exact_match.mean())
        assert r.key_logprob == pytest.approx(sub.key_logprob.mean())
        assert r.distant_pairs_kept == pytest.approx(sub.distant_pairs_kept.mean())
    assert len(tab) == g.ngroups


def test_passkey_needle_audit_follows_the_selected_case(app, runs_root):
    layers = pd.read_parquet(runs_root / "probes" / "passkey-synth" / "needle_layers.parquet")
    at = open_passkey(app, "probes/passkey-synth")
    at.selectbox(key="passkey_length").set_value(2048).run()
    at.selectbox(key="passkey_depth").set_value(100.0).run()
    at.selectbox(key="passkey_seed").set_value(1).run()
    assert not at.exception and not at.error
    want = layers[(layers.format == "chat") & (layers.length == 2048) & (layers.depth == 100.0)
                  & (layers.seed == 1)].sort_values("layer_idx")
    fig = next(f for f in figures(at) if title(f).startswith("needle audit: length 2048, depth 100%, seed 1"))
    tr = {t["name"]: t for t in fig["data"]}
    assert decode(tr["mass, mean over heads"]["x"]).tolist() == want.layer_idx.tolist()
    assert np.allclose(decode(tr["mass, mean over heads"]["y"]), want.dense_mass_to_needle)
    assert np.allclose(decode(tr["mass, largest head"]["y"]), want.max_head_mass_to_needle)
    assert np.allclose(decode(tr["kept by top-1"]["y"]), want.kept_top1)
    assert np.allclose(decode(tr["kept by top-2"]["y"]), want.kept_top2)
    share = (want.dense_mass_to_needle * want.kept_top1).sum() / want.dense_mass_to_needle.sum()
    assert any(m.label.startswith("top-1 keeps") and m.value == f"{share:.0%}" for m in at.metric)
    case = next(d.value for d in at.dataframe if "continuation" in d.value.columns)
    assert case["pattern"].tolist() == ["dense", "window", "hard_top2"]


def test_passkey_page_reads_the_probes_own_output(app, runs_root):
    """The folder ``run_passkey`` wrote on the tiny model: heatmaps and the audit of its 2 layers."""
    path = runs_root / "passkey"
    cases, layers = pd.read_parquet(path / "cases.parquet"), pd.read_parquet(path / "needle_layers.parquet")
    at = open_passkey(app, "passkey")
    got, want = heatmap_traces(at), expected_heatmaps(cases)
    assert set(got) == {"dense", "hard_top2"}
    for p, (em, text) in want.items():
        assert np.allclose(got[p][0], em) and got[p][1] == text, p
    L, D = at.selectbox(key="passkey_length").value, at.selectbox(key="passkey_depth").value
    want_l = layers[(layers.length == L) & (layers.depth == D) & (layers.seed == 0)].sort_values("layer_idx")
    fig = next(f for f in figures(at) if title(f).startswith("needle audit"))
    tr = {t["name"]: t for t in fig["data"]}
    assert decode(tr["mass, mean over heads"]["x"]).tolist() == [0, 1]
    assert np.allclose(decode(tr["mass, mean over heads"]["y"]), want_l.dense_mass_to_needle)
    assert np.allclose(decode(tr["kept by top-2"]["y"]), want_l.kept_top2)


def test_passkey_page_without_output_names_the_probe_command(tmp_path, monkeypatch):
    monkeypatch.setenv("FOCUS_LAB_RUNS", str(tmp_path))
    at = st_testing.AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    at.run()
    at.switch_page("app_pages/passkey.py")
    at.run()
    assert not at.exception and not at.error
    assert any("focus-lab probe passkey --out runs/passkey" in i.value for i in at.info)
    # in its place the committed tables of the shipped file (tests/test_app_committed.py)
    assert any("Showing the committed results of router file" in i.value for i in at.info)


# ------------------------------------------------------------------------------------- bad runs

def test_corrupted_run_shows_its_message(app):
    at = app("groups", run="broken")
    assert at.error and "corrupted" in at.error[0].value and "record the run again" in at.error[0].value


def test_other_schema_run_shows_its_message(app):
    for page in ("groups", "overview"):
        at = app(page, run="old")
        assert at.error and "schema version 0" in at.error[0].value


def test_unexpected_layout_is_a_message_not_a_traceback(app, runs_root):
    odd = runs_root / "odd"
    if not odd.exists():
        shutil.copytree(runs_root / "tiny", odd)
        mf = json.loads((odd / "manifest.json").read_text())
        mf["model"] = "a string where a mapping belongs"
        (odd / "manifest.json").write_text(json.dumps(mf))
        pd.read_parquet(odd / "assignments.parquet").drop(columns=["group"]).to_parquet(odd / "assignments.parquet")
    for page in ("overview", "groups"):
        at = app(page, run="odd")
        assert at.error and "cannot show run **odd**" in at.error[0].value


def test_corrupted_table_shows_its_message(app):
    at = app("groups", run="badtable")
    assert at.error and "corrupted" in at.error[0].value


def test_runs_outside_the_root_are_refused(app, runs_root, tmp_path):
    from focus_lab.app import lib
    from focus_lab.runs import RunError
    outside = make_outside = tmp_path / "outside"
    shutil.copytree(runs_root / "tiny", outside)
    (runs_root / "escape").symlink_to(make_outside, target_is_directory=True)
    try:
        for name in ("../outside", "/etc", str(outside), "tiny/../../outside", "escape", ""):
            with pytest.raises(RunError):
                lib.safe_run_path(runs_root, name)
        assert "escape" not in lib.available_runs(runs_root)
        assert lib.safe_run_path(runs_root, "tiny") == (runs_root / "tiny").resolve()
        at = app("groups", run="../outside", errors_ok=True)
        assert at.selectbox(key="run_picker").value != "../outside"
        assert any("not a run below the runs root" in w.value for w in at.warning)
    finally:
        (runs_root / "escape").unlink()


def test_runs_root_from_command_line():
    from focus_lab.app import lib
    assert lib.parse_runs_root(["--runs", "/tmp/x"]) == Path("/tmp/x").resolve()
    assert lib.parse_runs_root(["--rootdir=/y"]) != Path("/y")


def test_passkey_caption_names_the_config_overrides():
    """A probe run with --layer-top-k / --random-layers says so in the page's settings line, in
    the spec form the CLI takes (JSON gives the layer keys back as strings)."""
    from focus_lab.app.app_pages.passkey import settings_caption
    info = {"settings": {"keys": 6, "config_overrides": {"layer_top_k": {"3": 1, "1": 3, "2": 3, "5": 1},
                                                         "random_layers": [1, 2]}}}
    cap = settings_caption("p", info)
    assert "per-layer k `3,5:1;1-2:3`" in cap and "random groups in layers `1,2`" in cap
    assert "per-layer" not in settings_caption("p", {"settings": {"keys": 6}})
