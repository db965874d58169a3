"""restored_drops / group_ablation (focus_lab.recording.restore) on a tiny recorded run, against
independent computations: the run's own loss_delta, a restored edge as an edited mask through
the dense reference, a group cut as query groups that no longer name it."""

import numpy as np
import pandas as pd
import pytest
import torch

import focus_lab
from focus_lab.recording.restore import (GROUP_ABLATION, RESTORED_DROPS, group_ablation_table,
                                         restored_drops_table, write_intervention_table)
from focus_lab.recording.recorder import next_token_nll
from focus_lab.runs import Run
from run_fixtures import make_tiny_run


@pytest.fixture(scope="module", params=["llama", "llama_top1", "gemma3", "gemma3_key_shift"])
def tiny(tmp_path_factory, request):
    # gemma3: 6 layers, 2 and 5 global and routed, the others in a 16-key sliding window that the
    # 96-token window exceeds (the decode step's cache must keep the sliding layers' own window);
    # llama_top1: a group cut where a query has no other group (its slot joins NO_GROUP);
    # gemma3_key_shift: Gemma's shipped rules, each key in its predecessor's group (the decode step
    # carries the group of the token before the query)
    gemma = {"model": "gemma3", "layers": 6, "seq_len": 96}
    kw = {"gemma3": gemma, "gemma3_key_shift": {**gemma, "rules": "+key_shift"},
          "llama_top1": {"top_k": 1}}.get(request.param, {})
    path = make_tiny_run(tmp_path_factory.mktemp("runs") / "tiny", with_eval=False, with_train_log=False, **kw)
    from focus_lab.hf.models import load_model
    run = Run.open(path)
    model, _ = load_model(str(path.parent / f".{path.name}-assets" / "model"), verbose=False)
    focus_lab.load_routers(model, run.manifest["routers"]["path"])
    return run, model


def _nll(model, ids, i, state, hooks=None):
    with torch.no_grad(), focus_lab.hooks(model, hooks or {}):
        logits = model(input_ids=ids[None].long(), use_cache=False, focus=state).logits[0, i]
    return float(-torch.log_softmax(logits.float(), -1)[int(ids[i + 1])])


def test_restored_drops_match_the_runs_losses_and_an_edited_mask(tiny):
    run, model = tiny
    df = restored_drops_table(model, run, top_n=3, progress=False, measure_base=True)
    assert list(df.columns) == list(RESTORED_DROPS) and list(df["query_rank"]) == [1, 2, 3]
    costly = run.table("costly_drops")
    for r in df.itertuples():
        q = costly[costly["query_rank"] == r.query_rank]
        heaviest = q.sort_values("weight", ascending=False, kind="stable").iloc[0]
        assert (r.layer_idx, r.head, r.key_position) == (heaviest["layer_idx"], heaviest["head"], heaviest["key_position"])
        # the prefix forwards give the run's own losses (a causal model)
        assert r.nll_dense == pytest.approx(float(q.nll_dense.iloc[0]), abs=1e-4)
        assert r.nll_hard == pytest.approx(float(q.nll_hard.iloc[0]), abs=1e-4)
        # independent: the whole window, the pair set in the layer's mask (the dense reference path)
        ids = torch.from_numpy(np.array(run.window_token_ids()[r.window]))

        def edit(kept, hook, i=r.query_position, j=r.key_position):
            m = kept.clone()
            m[0, i, j] = True
            return m
        hard = focus_lab.forward_state(model, mode="hard")
        want = _nll(model, ids, r.query_position, hard, {f"layers.{r.layer_idx}.kept": edit})
        assert r.nll_restored == pytest.approx(want, abs=1e-4)
        assert r.recovered == pytest.approx((r.nll_hard - r.nll_restored) / (r.nll_hard - r.nll_dense))
        assert r.edges_of_query == len(q[["layer_idx", "key_position"]].drop_duplicates())


def test_group_ablation_equals_the_mask_without_the_groups_distant_pairs(tiny):
    run, model = tiny
    layer = 1 if model.config.model_type == "llama" else 5  # a routed layer (gemma3: after sliding ones)
    df = group_ablation_table(model, run, layers=[layer], groups=[0, 2], progress=False)
    assert list(df.columns) == list(GROUP_ABLATION) and set(df["group"]) == {0, 2}
    ids = torch.from_numpy(np.array(run.window_token_ids()[0]))
    hard = focus_lab.forward_state(model, mode="hard")
    cfg = hard.config
    pos = run.table("pos")
    pos = pos[pos.window == 0].set_index("position")["pos"].reindex(range(len(ids) - 1)).fillna("").to_numpy()
    base = next_token_nll(model, ids, focus=hard).numpy()
    for g in (0, 2):
        def drop(kept, hook, g=g):  # independent: the layer's mask without the distant pairs to keys of g
            Tq, Tk = kept.shape[-2:]
            i = torch.arange(Tk - Tq, Tk)[:, None]
            j = torch.arange(Tk)[None, :]
            distant = (i - j >= cfg.window) & (j >= cfg.sink_tokens)  # (Tq, Tk)
            return kept & ~(distant[None] & (hook.call.routing.key_group == g)[:, None, :])
        with torch.no_grad(), focus_lab.hooks(model, {f"layers.{layer}.kept": drop}):
            ablated = next_token_nll(model, ids, focus=hard).numpy()
        assert not np.allclose(ablated, base, atol=1e-4)  # the cut changes the losses
        want = pd.DataFrame({"pos": pos, "d": ablated - base}).groupby("pos")["d"].mean()
        got = df[df.group == g].set_index("pos")["delta"]
        assert np.allclose(got.loc[want.index].to_numpy(), want.to_numpy(), atol=1e-4)
        assert int(df[df.group == g]["tokens"].sum()) == len(ids) - 1
    with pytest.raises(ValueError, match=r"layers \[7\] have no router"):
        group_ablation_table(model, run, layers=[7], progress=False)


def test_the_tables_are_written_into_the_run(tiny, tmp_path):
    import shutil
    run, model = tiny
    path = shutil.copytree(run.path, tmp_path / "copy")
    df = restored_drops_table(model, Run.open(path), top_n=1, progress=False)
    write_intervention_table(path, "restored_drops", df, {"top_n": 1})
    again = Run.open(path)
    assert "restored_drops" in again.manifest["tables"] and again.manifest["restored_drops"] == {"top_n": 1}
    pd.testing.assert_frame_equal(again.table("restored_drops"), df)
