"""The recorder's ``loss_delta`` metric and the ``costly_drops`` join (docs/run_schema.md,
docs/method.md §6): per-token NLL dense vs hard against brute-force forwards, the position
convention, the config restored, the join against a brute-force merge, old runs without them."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import focus_lab
from focus_lab import FocusConfig
from focus_lab.recording.recorder import RecordOptions, loss_delta_table, next_token_nll, record_run
from focus_lab.recording.tables import costly_drops_table
from focus_lab.hf.retrofit import focus_config, set_config
from focus_lab.runs import SCHEMA, Run, RunError
from conftest import tiny_llama, tiny_mistral

T = 40


def _windows(n=2, T=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [SimpleNamespace(input_ids=torch.randint(3, 97, (T,), generator=g)) for _ in range(n)]


def _tokens(windows) -> pd.DataFrame:
    """A tokens table whose text is the token id, so that the token columns can be checked."""
    return pd.DataFrame([{"window": w, "position": p, "token": f"<{int(i)}>"}
                         for w, win in enumerate(windows) for p, i in enumerate(win.input_ids)])


@torch.no_grad()
def _brute_nll(model, ids, mode):
    set_config(model, mode=mode)
    logits = model(input_ids=ids[None], use_cache=False).logits[0]
    return F.cross_entropy(logits[:-1].double(), ids[1:], reduction="none").numpy()


@torch.no_grad()
def test_nll_dense_and_hard_equal_brute_force_cross_entropy():
    model = tiny_llama()
    cfg = FocusConfig(mode="soft", window=5, num_groups=4, top_k=2, sink_tokens=2)
    focus_lab.attach(model, cfg)
    wins = _windows()
    df = loss_delta_table(model, wins, tokens=_tokens(wins), chunk=7)  # chunks do not divide T - 1
    assert focus_config(model) == cfg  # the soft config in force before is back
    assert list(df.columns) == list(SCHEMA["loss_delta"])
    assert len(df) == len(wins) * (T - 1)
    for w, win in enumerate(wins):
        ids = win.input_ids
        got = df[df.window == w].sort_values("position")
        assert got.position.tolist() == list(range(T - 1))
        dense, hard = _brute_nll(model, ids, "dense"), _brute_nll(model, ids, "hard")
        assert np.allclose(got.nll_dense, dense, atol=1e-5, rtol=0)
        assert np.allclose(got.nll_hard, hard, atol=1e-5, rtol=0)
        # position t: the token at t predicts the token at t + 1 (dropped_edges.query_position)
        assert got.token.tolist() == [f"<{int(i)}>" for i in ids[:-1]]
        assert got.next_token.tolist() == [f"<{int(i)}>" for i in ids[1:]]
        # queries inside the window and sinks drop nothing in any layer: no loss change there
        assert np.abs(got.delta.to_numpy()[:cfg.window]).max() < 1e-5
    assert (df.delta.to_numpy() == (df.nll_hard - df.nll_dense).to_numpy()).all()
    assert df.delta.abs().max() > 1e-3  # the hard mask does change the loss beyond the window
    assert df.nll_dense.dtype == np.float32 and df.delta.dtype == np.float32
    # next_token_nll runs the mode in force: dense, then hard
    set_config(model, mode="dense")
    assert np.allclose(next_token_nll(model, wins[0].input_ids), df[df.window == 0].nll_dense, atol=1e-6)
    set_config(model, mode="hard")
    assert np.allclose(next_token_nll(model, wins[0].input_ids), df[df.window == 0].nll_hard, atol=1e-6)


@torch.no_grad()
def test_delta_is_zero_when_the_window_covers_every_token():
    ids = _windows(n=1)
    # tiny Llama: dense runs the causal flash kernel, hard the decomposition: equal up to round-off
    for window, zero in ((T, True), (4, False)):
        model = tiny_llama()
        focus_lab.attach(model, FocusConfig(mode="dense", window=window, num_groups=4, top_k=1))
        d = loss_delta_table(model, ids).delta.abs().max()
        assert (d < 1e-5) if zero else (d > 1e-3), (window, d)
    # where both modes take the same kernel (Mistral's own sliding window sends both through the
    # masked reference), a mask that drops nothing gives exactly 0
    model = tiny_mistral(sliding_window=8)
    focus_lab.attach(model, FocusConfig(mode="hard", window=T, num_groups=4, top_k=1))
    df = loss_delta_table(model, ids)
    assert (df.delta == 0).all() and (df.nll_dense > 0).all()


def test_config_is_unchanged_when_a_forward_fails():
    model = tiny_llama()
    cfg = FocusConfig(mode="window", window=5, num_groups=4, top_k=3)
    focus_lab.attach(model, cfg)
    bad = [SimpleNamespace(input_ids=torch.tensor([5, 6, 10_000, 7]))]  # outside the vocabulary
    with pytest.raises((IndexError, RuntimeError)):
        loss_delta_table(model, bad)
    assert focus_config(model) == cfg
    with pytest.raises(ValueError, match="at least 2"):
        loss_delta_table(model, [SimpleNamespace(input_ids=torch.tensor([5]))])
    assert focus_config(model) == cfg
    with pytest.raises(ValueError, match="costly_top_n"):
        RecordOptions(costly_top_n=-1).validate()


# ------------------------------------------------------------------ the recorded run

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from run_fixtures import make_tiny_run
    return make_tiny_run(tmp_path_factory.mktemp("runs") / "tiny", with_eval=False, with_train_log=False)


def _brute_costly(loss: pd.DataFrame, edges: pd.DataFrame, n: int) -> pd.DataFrame:
    """costly_drops by hand: a plain pandas merge, the queries ranked in Python."""
    m = pd.merge(edges, loss.rename(columns={"position": "query_position"})[
        ["window", "query_position", "next_token", "nll_dense", "nll_hard", "delta"]],
        on=["window", "query_position"], how="inner")
    queries = {(int(w), int(q)): float(d) for w, q, d in zip(m.window, m.query_position, m.delta)}
    ranked = sorted(queries, key=lambda wq: (-queries[wq], wq[0], wq[1]))[:n]
    rank = {wq: r + 1 for r, wq in enumerate(ranked)}
    m["query_rank"] = [rank.get((int(w), int(q)), 0) for w, q in zip(m.window, m.query_position)]
    m = m[m.query_rank > 0]
    m = m.assign(_d=-m.delta, _w=-m.weight).sort_values(
        ["_d", "query_rank", "_w", "layer_idx", "head", "key_position"])
    return m[list(SCHEMA["costly_drops"])].reset_index(drop=True)


def test_recorded_run_has_loss_delta_and_costly_drops(tiny_run):
    run = Run.open(tiny_run)
    assert run.has("loss_delta") and run.has("costly_drops")
    assert "loss_delta" in run.manifest["recorder"]["metrics"] and run.manifest["recorder"]["costly_top_n"] == 200
    loss, edges, costly = run.loss_delta, run.dropped_edges, run.costly_drops
    assert list(loss.columns) == list(SCHEMA["loss_delta"]) and list(costly.columns) == list(SCHEMA["costly_drops"])
    T_ = run.manifest["seq_len"]
    assert len(loss) == run.manifest["windows"] * (T_ - 1)
    # the written join is the brute-force merge (every query fits in 200 here) ...
    want = _brute_costly(loss, edges, 200)
    pd.testing.assert_frame_equal(costly.reset_index(drop=True), want, check_dtype=False)
    # ... and with few queries kept, the top of the ranking
    for n in (1, 5):
        got = costly_drops_table(loss, edges, n)
        pd.testing.assert_frame_equal(got, _brute_costly(loss, edges, n), check_dtype=False)
        assert got.groupby(["window", "query_position"]).ngroups == n
        with_edges = loss.merge(edges[["window", "query_position"]].drop_duplicates(),
                                left_on=["window", "position"], right_on=["window", "query_position"])
        assert got.delta.min() >= with_edges.delta.nlargest(n).min()
        assert len(got) == len(edges.merge(got[["window", "query_position"]].drop_duplicates()))
    assert costly.delta.is_monotonic_decreasing
    assert costly_drops_table(loss, edges, 0).empty and list(costly_drops_table(loss, edges, 0).columns) == list(
        SCHEMA["costly_drops"])
    # token texts follow the convention: query at t, the predicted token at t + 1
    tok = run.tokens.set_index(["window", "position"]).token
    assert (costly.query_token.to_numpy() == tok.reindex(pd.MultiIndex.from_arrays(
        [costly.window, costly.query_position])).to_numpy()).all()
    assert (costly.next_token.to_numpy() == tok.reindex(pd.MultiIndex.from_arrays(
        [costly.window, costly.query_position + 1])).to_numpy()).all()


@torch.no_grad()
def test_recorded_loss_delta_matches_a_fresh_forward_of_the_saved_model(tiny_run):
    """record_run's extra forwards: the saved tiny model with the run's router file, dense and
    hard at the run's config, reproduce the recorded NLLs of window 0."""
    from focus_lab.hf.models import load_model
    from focus_lab.hf.retrofit import load_routers
    run = Run.open(tiny_run)
    model, _ = load_model(str(tiny_run.parent / f".{tiny_run.name}-assets" / "model"), verbose=False)
    load_routers(model, run.manifest["routers"]["path"])
    assert focus_config(model).top_k == run.config["top_k"] == 2
    tok = run.tokens
    ids = torch.tensor(tok[tok.window == 0].sort_values("position").token_id.to_numpy())
    loss = run.loss_delta
    got = loss[loss.window == 0].sort_values("position")
    assert np.allclose(got.nll_dense, _brute_nll(model, ids, "dense"), atol=1e-5, rtol=0)
    assert np.allclose(got.nll_hard, _brute_nll(model, ids, "hard"), atol=1e-5, rtol=0)


def test_old_run_without_the_tables_still_opens(tiny_run, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(tiny_run, old)
    (old / "loss_delta.parquet").unlink()
    (old / "costly_drops.parquet").unlink()
    run = Run.open(old)
    assert not run.has("loss_delta") and not run.has("costly_drops") and run.has("dropped_edges")
    with pytest.raises(RunError, match="no table 'costly_drops'"):
        run.table("costly_drops")


@torch.no_grad()
def test_costly_drops_needs_dropped_edges(tmp_path):
    from run_fixtures import DOC, TEXT, make_tokenizer, make_windows
    tok = make_tokenizer()
    model = tiny_llama()
    focus_lab.attach(model, FocusConfig(mode="hard", window=8, num_groups=4, top_k=1))
    wins = make_windows(tok)[:1]
    only = record_run(model, tok, wins, {DOC: TEXT}, tmp_path / "a", with_pos=False, progress=False,
                      metrics=["loss_delta"])
    assert set(Run.open(only).tables) == {"tokens", "loss_delta"}
    both = record_run(model, tok, wins, {DOC: TEXT}, tmp_path / "b", with_pos=False, progress=False,
                      metrics=["dropped_edges", "loss_delta"], costly_top_n=3)
    run = Run.open(both)
    assert set(run.tables) == {"tokens", "loss_delta", "dropped_edges", "costly_drops"}
    assert run.costly_drops.query_rank.max() == 3
    assert np.allclose(run.loss_delta.delta, Run.open(only).loss_delta.delta, atol=0)


@torch.no_grad()
@pytest.mark.parametrize("mode", ["dense", "hard", "soft"])
def test_recorded_forward_nll_equals_separate_forwards(tmp_path, mode):
    """record_run reads the NLL of its recorded forward's mode (dense or hard) off that forward's
    logits and runs only the other mode (soft: both); the table equals two plain forwards per
    window (loss_delta_table), and the config in force is unchanged."""
    from run_fixtures import DOC, TEXT, make_tokenizer, make_windows
    tok = make_tokenizer()
    model = tiny_llama()
    cfg = FocusConfig(mode=mode, window=6, num_groups=4, top_k=1, sink_tokens=2)
    focus_lab.attach(model, cfg)
    wins = make_windows(tok)[:2]
    out = record_run(model, tok, wins, {DOC: TEXT}, tmp_path / mode, with_pos=False, progress=False,
                     metrics=["dropped_edges", "loss_delta"])
    assert focus_config(model) == cfg
    got = Run.open(out).loss_delta
    want = loss_delta_table(model, wins)
    assert len(got) == sum(len(w.input_ids) - 1 for w in wins)
    assert np.allclose(got.nll_dense, want.nll_dense, atol=1e-6, rtol=0)
    assert np.allclose(got.nll_hard, want.nll_hard, atol=1e-6, rtol=0)
    assert (got.delta.abs() > 1e-4).any()  # the hard mask drops something here: the columns differ


def test_quickstart_reports_recorded_perplexity(tiny_run, capsys):
    """The main job's last line of numbers: dense and hard perplexity over every recorded window,
    exp of the mean NLL of the run's loss_delta table (computed here by hand)."""
    import math
    from focus_lab.cli import _report_recorded_perplexity
    _report_recorded_perplexity(tiny_run)
    out = capsys.readouterr().out
    rows = []
    for w in range(Run.open(tiny_run).manifest["windows"]):
        rows += [r for r in Run.open(tiny_run).loss_delta.itertuples() if r.window == w]
    dense = math.exp(sum(r.nll_dense for r in rows) / len(rows))
    hard = math.exp(sum(r.nll_hard for r in rows) / len(rows))
    assert f"({len(rows)} predicted tokens)" in out
    assert f"dense {dense:.3f}, hard top-2 {hard:.3f}" in out


def test_a_recording_releases_freed_memory_between_body_and_head_and_after_each_window(monkeypatch, tmp_path):
    """The recorder's bound on its peak (method.cpu.release_freed_memory): a window's own-mode NLL
    releases after the body and before the output head, every window releases once it is done,
    and the other mode's forwards release between body and head as well."""
    import focus_lab.method.cpu as cpu
    import focus_lab.recording.recorder as R
    model = tiny_llama()
    focus_lab.attach(model, FocusConfig(mode="dense", window=5, num_groups=4, top_k=2, sink_tokens=2))
    events = []
    model.get_output_embeddings().register_forward_pre_hook(lambda m, a: events.append("head"))
    model.base_model.register_forward_pre_hook(lambda m, a, k=None: events.append("body"))
    monkeypatch.setattr(cpu, "release_freed_memory", lambda: events.append("release") or True)
    monkeypatch.setattr(R, "release_freed_memory", lambda: events.append("release") or True)
    wins = [SimpleNamespace(input_ids=w.input_ids, offsets=[(i, i + 1) for i in range(T)], doc="d")
            for w in _windows(3)]
    tok = SimpleNamespace(decode=lambda ids: f"<{ids[0]}>")
    record_run(model, tok, wins, {"d": "x" * T}, tmp_path / "run", with_pos=False, progress=False,
               metrics=["assignments", "loss_delta"], memory_limit=float("inf"))
    recorded, other = events[:4 * 3], events[4 * 3:]
    # each recorded window: body, release, head (chunks), release
    assert [e for e in recorded if e != "head"] == ["body", "release", "release"] * 3
    assert recorded.index("head") == 2
    # the hard forwards of loss_delta: body, release, head per window
    assert [e for e in other if e != "head"] == ["body", "release"] * 3
