"""The recorder: hooks, exactness, per-layer reductions against brute force, run directories."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

import focus_lab
from focus_lab import FocusConfig
from focus_lab.method import core
from focus_lab.method import metrics as M
from focus_lab.recording.recorder import ALL_METRICS, DEFAULT_METRICS, assignments_for_window, record, record_run
from focus_lab.hf.retrofit import attention_modules
from focus_lab.runs import SCHEMA, Run, RunError
from conftest import ALL_FAMILIES, tiny_gemma2, tiny_gpt2, tiny_llama, tiny_mistral

T = 40


@pytest.fixture(params=["llama", "gpt2"])
def small_model(request):
    """GQA + RoPE (llama) and MHA + Conv1D + its own scaling (gpt2): enough for the recorder's
    own logic; every family is covered by test_recorded_logits_are_identical."""
    return {"llama": tiny_llama, "gpt2": tiny_gpt2}[request.param]()


def _ids(seed=0, batch=2, T=T):
    return torch.randint(3, 97, (batch, T), generator=torch.Generator().manual_seed(seed))


def _hook_state(model):
    return [(len(m._forward_pre_hooks), len(m._forward_hooks), len(m.__dict__.get("_focus_hooks", [])))
            for _, m in attention_modules(model)] + [(len(model._forward_pre_hooks), len(model._forward_hooks), 0)]


@torch.no_grad()
@pytest.mark.parametrize("family,mode", [(f, "hard") for f in sorted(ALL_FAMILIES)]
                         + [(f, m) for f in ("llama", "gpt2") for m in ("soft", "dense")])
def test_recorded_logits_are_identical(family, mode):
    model = ALL_FAMILIES[family]()
    focus_lab.attach(model, FocusConfig(mode=mode, window=6, num_groups=4, top_k=2))
    ids = _ids()
    ref = model(ids, use_cache=False).logits
    routed = sorted(focus_lab.routers(model))
    with focus_lab.record(model, patterns=[(routed[-1], 0)]) as rec:
        inside = model(ids, use_cache=False).logits
    after = model(ids, use_cache=False).logits
    assert torch.equal(inside, ref) and torch.equal(after, ref)
    t = rec.tables()
    assert rec.num_windows == 2 and set(t) >= {"assignments", "coverage", "crossing", "patterns"}
    assert set(t["coverage"]["layer_idx"]) == set(routed)


@torch.no_grad()
def test_hooks_are_removed_on_exit_and_on_exception(small_model, monkeypatch):
    focus_lab.attach(small_model, FocusConfig(mode="hard", window=6))
    before = _hook_state(small_model)
    with focus_lab.record(small_model) as rec:
        assert _hook_state(small_model) != before
        small_model(_ids(), use_cache=False)
    assert _hook_state(small_model) == before
    with pytest.raises(KeyError):
        with focus_lab.record(small_model):
            small_model(_ids(), use_cache=False)
            raise KeyError("boom")
    assert _hook_state(small_model) == before
    # an exception raised by the recorder itself, mid-forward, also leaves nothing behind
    def boom(*a, **k):
        raise RuntimeError("metric failed")
    monkeypatch.setattr(M, "attention_metrics", boom)
    with pytest.raises(RuntimeError, match="metric failed"):
        with focus_lab.record(small_model):
            small_model(_ids(), use_cache=False)
    assert _hook_state(small_model) == before
    focus_lab.detach(small_model)


def test_record_requires_focus_and_checks_its_arguments(small_model):
    with pytest.raises(ValueError, match="not attached"):
        with focus_lab.record(small_model):
            pass
    focus_lab.attach(small_model, FocusConfig(layers=[1]))
    with pytest.raises(ValueError, match="no router"):
        with focus_lab.record(small_model, layers=[0]):
            pass
    with pytest.raises(ValueError, match="unknown metrics"):
        with focus_lab.record(small_model, metrics=["nope"]):
            pass
    with pytest.raises(ValueError, match="heads"):
        with focus_lab.record(small_model, heads=[99]):
            pass
    with pytest.raises(ValueError, match="pattern"):
        with focus_lab.record(small_model, patterns=[(0, 0)]):
            pass


@pytest.mark.parametrize("changes", [{}, {"group_capacity": 0.4, "capacity_overflow": "evict"}])
@torch.no_grad()
def test_recorder_matches_brute_force_on_the_model(small_model, changes):
    """Per-query coverage / dropped mass of the recorder against dense attention computed
    here from the captured queries and keys, one pair at a time; with keys the group capacity
    evicts (group K = 3, in no group) too, whose assignment rows have no probability."""
    w = 5
    focus_lab.attach(small_model, FocusConfig(mode="hard", window=w, num_groups=3, top_k=1, **changes))
    ids = _ids(batch=1, T=24)
    seen = {}

    def grab(out, hook):
        c = hook.call
        seen[hook.layer_idx] = (c.module, c.query.clone(), c.key.clone(), c.routing)

    with focus_lab.hooks(small_model, {"attn_out": grab}), \
            focus_lab.record(small_model, heads=[0, 3], metrics=["coverage", "crossing", "balance", "assignments"]) as rec:
        small_model(ids, use_cache=False)
    tabs = rec.tables()
    cq = tabs["coverage_query"]
    cr = tabs["crossing_query"]
    H = small_model.config.num_attention_heads
    for layer, (module, q, k, routing) in seen.items():
        kk = k.repeat_interleave(H // k.shape[1], dim=1)
        scale = module.scaling if getattr(module, "scaling", None) is not None else q.shape[-1] ** -0.5
        qg, kg = routing.query_groups[0], routing.key_group[0]
        for h in (0, 3):
            for i in range(24):
                logits = torch.tensor([float(q[0, h, i] @ kk[0, h, j]) * scale for j in range(i + 1)],
                                      dtype=torch.float64)
                p = torch.softmax(logits, 0)
                keep = [(i - j < w) or int(kg[j]) in qg[i].tolist() for j in range(i + 1)]
                cov = float(sum(p[j] for j in range(i + 1) if keep[j]))
                row = cq[(cq.layer_idx == layer) & (cq["head"] == h) & (cq.position == i) & (cq.pattern == "focus")]
                assert float(row.coverage.iloc[0]) == pytest.approx(cov, abs=1e-5)
                drop = cr[(cr.layer_idx == layer) & (cr["head"] == h) & (cr.position == i)].dense_dropped.iloc[0]
                assert float(drop) == pytest.approx(1 - cov, abs=1e-5)
    assert set(tabs["coverage"]["head"]) == {0, 3}
    if changes:  # the evicted keys: the test sees some, recorded as group 3 without a probability
        a = tabs["assignments"]
        assert (a.group == 3).any() and a[a.group == 3].prob.isna().all() and a[a.group < 3].prob.notna().all()
        return
    # balance: the causal hard shares are the key groups the mask used
    bal = tabs["balance"]
    for layer, (_, _, _, routing) in seen.items():
        counts = np.bincount(routing.key_group[0].numpy(), minlength=3) / 24
        got = bal[bal.layer_idx == layer].sort_values("group").hard_share.to_numpy()
        assert np.allclose(got, counts)


@torch.no_grad()
def test_window_covering_everything_and_one_group(small_model):
    focus_lab.attach(small_model, FocusConfig(mode="hard", window=T, num_groups=4, top_k=1))
    with focus_lab.record(small_model, metrics=["coverage", "dropped_edges"], edge_threshold=0.0) as rec:
        small_model(_ids(), use_cache=False)
    t = rec.tables()
    assert np.allclose(t["coverage_query"]["coverage"], 1, atol=1e-5)
    assert len(t["dropped_edges"]) == 0
    focus_lab.detach(small_model)
    focus_lab.attach(small_model, FocusConfig(mode="hard", window=3, num_groups=1, top_k=1))
    with focus_lab.record(small_model, metrics=["crossing"]) as rec:
        small_model(_ids(), use_cache=False)
    c = rec.tables()["crossing_query"]
    assert np.allclose(c["soft_crossing"], 0) and np.allclose(c["soft_crossing_expected"], 0, atol=1e-6)
    assert np.allclose(c["dense_dropped"], 0, atol=1e-6) and c["soft_distant"].max() > 0


@torch.no_grad()
def test_patterns_and_layer_selection(small_model):
    focus_lab.attach(small_model, FocusConfig(mode="hard", window=4))
    with focus_lab.record(small_model, layers=[1], patterns=[(1, 2)]) as rec:
        small_model(_ids(batch=1), use_cache=False)
    t = rec.tables()
    assert set(t["assignments"]["layer_idx"]) == {1} and set(t["coverage"]["layer_idx"]) == {1}
    pat = t["patterns"]
    assert set(zip(pat.layer_idx, pat["head"])) == {(1, 2)} and len(pat) == T * (T + 1) // 2
    rows = pat.groupby("query_position").dense_weight.sum()
    assert np.allclose(rows, 1, atol=1e-5)
    kept = pat[pat.kept].groupby("query_position").dense_weight.sum().reindex(range(T), fill_value=0)
    cq = t["coverage_query"]
    cov = cq[(cq["head"] == 2) & (cq.pattern == "focus")].sort_values("position").coverage.to_numpy()
    assert np.allclose(kept.to_numpy(), cov, atol=1e-5)


@torch.no_grad()
def test_assignments_for_window_keeps_its_columns(small_model):
    focus_lab.attach(small_model, FocusConfig(mode="hard", window=4))
    a = assignments_for_window(small_model, _ids(batch=1)[0])
    assert list(a.columns) == ["position", "layer_idx", "group", "top_k_groups", "prob", "margin", "scores"]
    assert len(a) == 2 * T


# ------------------------------------------------------------------ run directories

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from run_fixtures import make_tiny_run
    path = tmp_path_factory.mktemp("runs") / "tiny"
    return make_tiny_run(path, standins=False, with_eval=False)


def test_run_has_every_documented_table_and_column(tiny_run):
    run = Run.open(tiny_run)
    mf = run.manifest
    assert mf["recorder"]["metrics"] == list(DEFAULT_METRICS)  # output_error is opt-in (tests/test_output_error.py)
    with_pos = run.has("pos")
    for name, cols in SCHEMA.items():
        optional = name in ("eval", "train_log", "patterns", "output_error", "restored_drops", "group_ablation") or (
            not with_pos and name in ("pos", "pos_contingency", "linguistic_scores", "group_labels"))
        if not run.has(name):
            assert optional, f"table {name} missing"
            continue
        if cols:  # eval / train_log are other modules' tables
            assert list(run.table(name).columns) == list(cols), name
    for name in run.tables:
        assert name in SCHEMA, f"undocumented table {name}"


def test_run_tables_are_consistent(tiny_run):
    run = Run.open(tiny_run)
    cov = run.coverage
    assert set(cov.pattern) == set(M.COVERAGE_PATTERNS)
    assert (cov.coverage <= 1 + 1e-5).all() and (cov.min_coverage >= 0).all()
    cq = run.coverage_query
    cr = run.crossing_query
    f = cq[cq.pattern == "focus"].merge(cr, on=["window", "layer_idx", "head", "position"])
    assert np.allclose(f.coverage + f.dense_dropped, 1, atol=1e-5)
    # the distance buckets add up to the per-query masses
    cd = run.coverage_distance
    tot = cd[cd.pattern == "focus"].groupby(["layer_idx", "head"]).mass.sum()
    assert np.allclose(tot, 1, atol=1e-4)
    kept = cd[cd.pattern == "focus"].groupby(["layer_idx", "head"]).kept_mass.sum()
    mean_cov = cov[cov.pattern == "focus"].set_index(["layer_idx", "head"]).coverage
    assert np.allclose(kept.sort_index(), mean_cov.sort_index(), atol=1e-4)
    # window-matched masks keep about as many pairs as Focus
    dens = cov.groupby(["layer_idx", "pattern"]).density.first().unstack()
    assert np.allclose(dens["window_matched"], dens["focus"], atol=0.05)
    # dropped edges: dropped by the hard mask, beyond the window, tokens filled
    e = run.dropped_edges
    asg = run.assignments
    w = run.config["window"]
    assert len(e) and (e.distance >= w).all() and (e.weight > 0).all()
    g = asg.set_index(["window", "layer_idx", "position"])
    top = g["top_k_groups"].reindex(pd.MultiIndex.from_arrays([e.window, e.layer_idx, e.query_position]))
    kg = g["group"].reindex(pd.MultiIndex.from_arrays([e.window, e.layer_idx, e.key_position])).to_numpy()
    assert all(int(k) not in list(t) for k, t in zip(kg, top))
    assert (e.key_group.to_numpy() == kg).all()
    tok = run.tokens.set_index(["window", "position"]).token
    assert (e.key_token.to_numpy() == tok.reindex(pd.MultiIndex.from_arrays([e.window, e.key_position])).to_numpy()).all()
    bl = run.balance_layer
    assert set(bl.assignment) == set(M.ASSIGNMENT_KINDS)
    assert (bl[bl.assignment == "sinkhorn"].marginal_error < 0.5).all()


def test_linguistics_tables(tiny_run):
    run = Run.open(tiny_run)
    if not run.has("pos"):
        pytest.skip("spaCy pipeline not installed")
    s = run.linguistic_scores
    assert set(s.assignment) == {"focus", "kmeans", "random"} and set(s.labels) == {"pos", "dep"}
    assert s[["nmi", "homogeneity", "completeness"]].apply(lambda c: c.between(0, 1)).all().all()
    ct = run.pos_contingency
    pos = run.pos
    aligned = int((pos.pos != "").sum())
    sums = ct.groupby(["layer_idx", "assignment"]).tokens.sum()
    assert (sums == aligned).all()
    # NMI recomputed from the tables themselves
    asg = run.assignments.merge(pos, on=["window", "position"])
    a0 = asg[(asg.layer_idx == 0) & (asg.pos != "")]
    want = M.cluster_scores(a0.group.to_numpy(), a0.pos.to_numpy())["nmi"]
    got = s[(s.layer_idx == 0) & (s.assignment == "focus") & (s.labels == "pos")].nmi.iloc[0]
    assert got == pytest.approx(want, abs=1e-5)
    gl = run.group_labels
    assert len(gl) == run.config["num_groups"] * 3 * run.num_layers
    e = run.dropped_edges
    assert e.relation.map(lambda r: isinstance(r, str)).all()


def test_open_checks_the_schema_version(tiny_run, tmp_path):
    import shutil
    other = tmp_path / "old"
    shutil.copytree(tiny_run, other)
    mf = json.loads((other / "manifest.json").read_text())
    mf["schema_version"] = 0
    (other / "manifest.json").write_text(json.dumps(mf))
    with pytest.raises(RunError, match="schema version 0"):
        Run.open(other)


@torch.no_grad()
@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_dense_reference_follows_the_models_own_mask_and_softcap(family):
    """Mistral's own sliding window (8 < T) and Gemma-2's logit soft-capping reach the dense
    reference: the recorded dense map equals the model's own attention (eager, brute force)."""
    model = tiny_mistral(sliding_window=8) if family == "mistral" else tiny_gemma2()
    focus_lab.attach(model, FocusConfig(mode="dense", window=4, num_groups=2, top_k=1))
    layer = sorted(focus_lab.routers(model))[-1]
    seen = {}

    def grab(out, hook):
        c = hook.call
        if getattr(c.module, "focus_router", None) is not None:
            seen[hook.layer_idx] = (c.module, c.query.clone(), c.key.clone(), c.kept.clone())

    with focus_lab.hooks(model, {"attn_out": grab}), \
            focus_lab.record(model, metrics=["coverage"], patterns=[(layer, 1)]) as rec:
        model(_ids(batch=1, T=24), use_cache=False)
    module, q, k, keep = seen[layer]
    kk = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    logits = (q[0, 1] @ kk[0, 1].T) * module.scaling
    cap = getattr(module, "attn_logit_softcapping", None)
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    want = torch.softmax(logits.masked_fill(~keep[0], float("-inf")), -1)
    if family == "mistral":
        assert not bool(keep[0].tril().all())  # the model's window hides old keys
    pat = rec.tables()["patterns"]
    got = torch.zeros(24, 24)
    qi, kj = (torch.from_numpy(np.array(pat[c], dtype=np.int64)) for c in ("query_position", "key_position"))
    got[qi, kj] = torch.from_numpy(np.array(pat.dense_weight, dtype=np.float32))
    assert torch.allclose(got, want, atol=1e-5)


def test_cli_record_flags(tiny_run, tmp_path):
    """``focus-lab record`` with layer / head / metric / threshold / pattern flags."""
    from typer.testing import CliRunner
    from focus_lab.cli import app
    from run_fixtures import TEXT
    assets = tiny_run.parent / f".{tiny_run.name}-assets"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((TEXT + "\n") * 12)
    out = tmp_path / "run"
    args = ["record", "--model", str(assets / "model"), "--routers", str(assets / "routers.safetensors"),
            "--corpus", str(corpus), "--out", str(out), "--seq-len", "48", "--max-windows", "2",
            "--layers", "1", "--heads", "0-2", "--pattern", "1:2", "--metrics", "coverage,dropped_edges",
            "--edge-threshold", "0.2", "--edge-top-n", "0", "--no-per-query", "--no-pos"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    run = Run.open(out)
    assert set(run.tables) == {"tokens", "coverage", "coverage_distance", "dropped_edges", "patterns"}
    assert set(run.coverage.layer_idx) == {1} and set(run.coverage["head"]) == {0, 1, 2}
    assert run.manifest["recorder"]["mode"] == "dense" and run.manifest["recorder"]["edge_threshold"] == 0.2
    assert (run.dropped_edges.weight > 0.2).all()
    bad = CliRunner().invoke(app, args[:-1] + ["--layers", "9"])
    assert bad.exit_code == 2 and "no router" in bad.output


# ------------------------------------------------------------------ memory estimate and refusal

from focus_lab.recording.recorder import (GiB, ModelShape, RecordMemoryError, estimate_memory,  # noqa: E402
                              memory_parts)

TINY_SHAPE = ModelShape(num_heads=4, head_dim=16, hidden_size=64, intermediate_size=128, vocab_size=97,
                        param_bytes=1_000_000)


def test_memory_estimate_is_the_documented_formula():
    """T = 64, W = 2, L = 2, Hs = 4, K = 4, k = 2, one pattern, every metric, by hand from the
    docstring of ``estimate_memory``."""
    T, W, L, Hs, K, k, d, f, V, D, P = 64, 2, 2, 4, 4, 2, 64, 128, 97, 16, 1
    N, Nq, e = W * T * L, W * T * L * Hs, 0.5
    recorded = (N * (16 * K + 8 * k + 32 + 2 * d) + Nq * (36 + 12) + 33 * e * Nq + 9 * P * W * T * T
                + L * T * T + 8 * T * T)
    E = min(1 << 23, Hs * T * T)
    slack = 4 * T * (3 * f + 6 * d) + 60 * E // Hs
    record_ = max(4 * T * V, 1 * T * T + 12 * E + 16 * Hs * T * D + 2 * T * T)
    tabs = [260 * N, 128 * Nq, 40 * Nq, 66 * e * Nq, 25 * P * W * T * (T + 1) // 2]
    kept = sum(tabs)
    tables = kept + max(Nq * (58 + 256), Nq * (82 + 40), 41 * P * W * T * (T + 1) // 2, 8 * W * T * d, 260 * N)
    loss = 2 * kept + 4 * T * V + 4 * min(T, 1024) * V
    write = 2 * kept + max(tabs)
    spacy = 18_000 * T  # the parse of one window
    want = int(0.60 * GiB) + int(0.07 * GiB) + 1_000_000 + recorded + slack + max(record_, spacy, tables, loss, write)
    got = estimate_memory(TINY_SHAPE, T, W, L, Hs, patterns=P)
    assert got == pytest.approx(want, abs=8)  # int rounding of the terms
    parts = memory_parts(TINY_SHAPE, T, W, L, Hs, patterns=P)
    assert parts["recorded"] == pytest.approx(recorded, abs=2) and parts["tables"] == pytest.approx(tables, abs=2)
    assert parts["spacy"] == spacy and memory_parts(TINY_SHAPE, T, W, L, Hs, with_pos=False)["spacy"] == 0
    assert parts["peak"] == got


def test_memory_estimate_grows_with_length_layers_heads_and_options():
    base = dict(seq_len=512, windows=2, layers=4, heads=4)
    est = lambda **kw: estimate_memory(TINY_SHAPE, **{**base, **kw})  # noqa: E731
    for key, bigger in (("seq_len", 1024), ("windows", 4), ("layers", 8), ("heads", 8)):
        assert est(**{key: bigger}) > est(), key
    # per recorded layer (T > 1024: no cached masks): the routing and per-query terms, linear in L
    rec = [memory_parts(TINY_SHAPE, 2048, 1, L, 4)["recorded"] for L in (1, 2, 3)]
    per_layer = 2048 * (16 * 4 + 8 * 2 + 32 + 2 * 64) + 2048 * 4 * (48 + 33 * 0.5)
    assert rec[1] - rec[0] == pytest.approx(per_layer, abs=2) and rec[2] - rec[1] == pytest.approx(per_layer, abs=2)
    # a T x T map per pattern and window; fewer tables without per-query; fewer metrics, less memory
    one, two = (memory_parts(TINY_SHAPE, 2048, 1, 2, 4, patterns=p)["recorded"] for p in (1, 2))
    assert two - one == 9 * 2048 ** 2
    assert est(metrics=("assignments", "balance"), with_pos=False) < est(metrics=("assignments", "balance")) < est()
    # many windows: the tables dominate, and --no-per-query lowers the peak
    smol = ModelShape(9, 64, 576, 1536, 49152, 538_060_288)
    no_ld = tuple(m for m in ALL_METRICS if m != "loss_delta")
    many = memory_parts(smol, 1024, 8, 30, 9, metrics=no_ld)
    assert max(("record", "tables", "loss_delta", "write"), key=many.get) in ("tables", "write")
    assert estimate_memory(smol, 1024, 8, 30, 9, metrics=no_ld, per_query=False) < many["peak"]
    # the real model at 4096 tokens, every metric, one window: the NLL never holds the (T, V)
    # logits (recorder.next_token_nll: the head on 512 positions at a time, beside the (T, d)
    # hidden states), so the tables' write dominates; four windows: the tables (measured 5.23 GB,
    # analyses/studies/record_memory.py)
    p = memory_parts(smol, 4096, 1, 30, 9)
    assert p["record"] == p["loss_delta"] == 8 * 512 * 49152 + 4 * 4096 * 576
    assert max(("record", "tables", "loss_delta", "write"), key=p.get) in ("tables", "write")
    assert 2.2e9 < p["peak"] < 2.6e9
    # Gemma-3-270M at 32K tokens (vocabulary 262,144): the head's slices are 1 GiB, where the
    # (T, V) logits were 34 GB
    gemma = ModelShape(4, 256, 640, 2048, 262144, 536_000_000)
    assert memory_parts(gemma, 32768, 1, 3, 4, metrics=("assignments", "loss_delta"))["record"] < 1.2e9
    # and spaCy's parse of the window's 138K characters (0.55 GiB measured) is one of the phases
    assert memory_parts(gemma, 32768, 1, 3, 4)["spacy"] == pytest.approx(0.55 * GiB, rel=0.05)
    p4 = memory_parts(smol, 4096, 4, 30, 9)
    assert max(("record", "tables", "loss_delta", "write"), key=p4.get) in ("tables", "write")
    assert 4.7e9 < p4["peak"] < 5.8e9


def _record_args(tiny_run, tmp_path, out):
    from run_fixtures import TEXT
    assets = tiny_run.parent / f".{tiny_run.name}-assets"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((TEXT + "\n") * 12)
    return assets, ["record", "--model", str(assets / "model"), "--routers", str(assets / "routers.safetensors"),
                    "--corpus", str(corpus), "--out", str(out), "--seq-len", "48", "--max-windows", "2",
                    "--no-pos"]


def _assert_refusal(res, out):
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("error: recording ") and "needs an estimated" in line and "GiB" in line, line
    for flag in ("--layers", "--heads", "--seq-len", "--max-windows", "--no-per-query", "--pattern", "--memory-limit",
                 "available"):
        assert flag in line, flag
    assert "Traceback" not in res.output
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    return line


def test_cli_refuses_a_recording_that_would_not_fit_before_loading(tiny_run, tmp_path, monkeypatch):
    """--memory-limit below the estimate: exit 2, one line with the estimate and the flags, the
    model never loaded, no run directory (not even a temporary one)."""
    from typer.testing import CliRunner
    from focus_lab.hf import models
    from focus_lab.cli import app
    out = tmp_path / "runs" / "big"
    out.parent.mkdir()
    assets, args = _record_args(tiny_run, tmp_path, out)

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the memory check")
    monkeypatch.setattr(models, "load_model", no_load)
    res = CliRunner().invoke(app, args + ["--pattern", "1:0", "--memory-limit", "0.001"])
    line = _assert_refusal(res, out)
    config, n = models.peek_model(str(assets / "model"))
    est = estimate_memory(ModelShape.from_config(config, n), 48, 2, 2, 4, patterns=1, with_pos=False, num_groups=4,
                          top_k=2)
    assert f"needs an estimated {est / GiB:.2f} GiB" in line and "more than 0.00 GiB" in line
    assert "2 windows x 48 tokens, 2 layers x 4 heads" in line
    # fewer layers and heads lower the estimate the message names
    res = CliRunner().invoke(app, args + ["--layers", "1", "--heads", "0", "--memory-limit", "0.001"])
    small = _assert_refusal(res, out)
    assert float(small.split("needs an estimated ")[1].split()[0]) <= est / GiB


def test_record_run_refuses_after_loading_when_the_cli_cannot_peek(tiny_run, tmp_path, monkeypatch):
    """Without a config to read before loading (peek_model: None), record_run's own check
    refuses: a RecordMemoryError (a MemoryError) mapped to exit 2, nothing written."""
    from typer.testing import CliRunner
    from focus_lab.hf import models
    from focus_lab.cli import app
    out = tmp_path / "big"
    _, args = _record_args(tiny_run, tmp_path, out)
    monkeypatch.setattr(models, "peek_model", lambda *a, **k: None)
    _assert_refusal(CliRunner().invoke(app, args + ["--memory-limit", "0.001"]), out)
    # and the library alone
    from run_fixtures import make_tokenizer, make_windows
    model = tiny_llama()
    focus_lab.attach(model, FocusConfig(window=8))
    tok = make_tokenizer()
    with pytest.raises(RecordMemoryError, match="needs an estimated") as err:
        record_run(model, tok, make_windows(tok)[:2], {}, out, with_pos=False, progress=False, memory_limit=1e6)
    assert isinstance(err.value, MemoryError) and err.value.limit == 1_000_000 and err.value.estimate > 1e6
    assert not out.exists()


# ------------------------------------------------------------------ relation direction (property)

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_WORDS = ["Anne", "Elliot", "walked", "to", "the", "house", "letter", "she", "wrote", "a", "long", "and",
          "captain", "Mr.", "smiled", ",", ".", ";", "!", "n't", "'s", "\u00e9t\u00e9", "caf\u00e9", "\u00a0",
          "  ", "\n", "Lady Russell", "Kellynch", "walks", "walking"]


@pytest.fixture(scope="module")
def nlp():
    try:
        from focus_lab.recording.linguistics import load_spacy
        return load_spacy()
    except Exception:
        pytest.skip("spaCy pipeline not installed")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(_WORDS), min_size=2, max_size=25), data=st.data())
def test_dropped_edge_relations_read_both_ways(nlp, words, data):
    """The audit's relation of key j to query i mirrors that of i to j: ``head:d`` one way is
    ``child:d`` the other; same_word / same_entity / same_lemma are symmetric."""
    from focus_lab.recording.linguistics import pos_table, relations_for_pairs
    text = " ".join(words)
    # model-like tokens: every 1-4 characters, leading spaces attached (byte-level BPE style)
    cuts, i = [0], 0
    while i < len(text):
        i = min(len(text), i + data.draw(st.integers(1, 4)))
        cuts.append(i)
    offsets = np.array(list(zip(cuts, cuts[1:])), dtype=np.int64)
    pos = pos_table(text, offsets, nlp=nlp)
    n = len(pos)
    qi = np.repeat(np.arange(n), n)
    kj = np.tile(np.arange(n), n)
    fwd = relations_for_pairs(pos, qi, kj)
    back = relations_for_pairs(pos, kj, qi)
    flip = {"head": "child", "child": "head"}
    for f, b in zip(fwd, back):
        assert (f is None) == (b is None)
        if f is None:
            continue
        kind, _, dep = f.partition(":")
        assert b == (f"{flip[kind]}:{dep}" if kind in flip else f)
