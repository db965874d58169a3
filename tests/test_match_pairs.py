"""Token-match pairs (FocusConfig.match_shifts, docs/method.md §2.8), against brute force."""

import pytest
import torch

import focus_lab
from focus_lab.hf.tiny import tiny_gpt2, tiny_llama
from focus_lab.method.config import ConfigError, FocusConfig, parse_match_shifts
from focus_lab.method.core import masked_attention
from focus_lab.patterns.rules.match import match_mask, match_pairs

W, SINKS = 8, 2


def brute_match(ids: list[int], shifts, window: int, sinks: int, q_offset: int = 0, latest: int = 0) -> torch.Tensor:
    """(Tq, T) by loops: query at absolute position q_offset + a, key j; with ``latest``, only
    the ``latest`` matching keys nearest each query."""
    T = len(ids)
    out = torch.zeros(T - q_offset, T, dtype=torch.bool)
    for a in range(T - q_offset):
        i = q_offset + a
        hits = [j for j in range(T) if j <= i and i - j >= window and j >= sinks
                and any(j - s >= 0 and ids[j - s] == ids[i] for s in shifts)]
        for j in (hits[-latest:] if latest else hits):
            out[a, j] = True
    return out


def _ids(T: int, seed: int = 0, lo: int = 3, hi: int = 12) -> torch.Tensor:
    return torch.randint(lo, hi, (1, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shifts", [[1], [0, 1], [0, 2, 3]])
def test_match_mask_equals_loops(shifts):
    ids = _ids(40, seed=len(shifts))
    pos = torch.arange(40)
    got = match_mask(ids, ids, shifts, pos, pos, W, SINKS)[0]
    assert torch.equal(got, brute_match(ids[0].tolist(), shifts, W, SINKS))
    assert got.any()  # the small vocabulary repeats tokens: the test sees pairs
    # the last 5 queries against every key (a chunk after a prefill)
    part = match_mask(ids[:, 35:], ids, shifts, pos[35:], pos, W, SINKS)[0]
    assert torch.equal(part, brute_match(ids[0].tolist(), shifts, W, SINKS, q_offset=35))
    for latest in (1, 3):
        capped = match_mask(ids, ids, shifts, pos, pos, W, SINKS, latest)[0]
        assert torch.equal(capped, brute_match(ids[0].tolist(), shifts, W, SINKS, latest=latest))
        assert capped.sum() < got.sum()
    pairs = match_pairs(ids, ids, shifts, pos, pos, W, SINKS)
    assert torch.equal(pairs, got.nonzero().new_zeros(0, 1).new_tensor(
        [[0, i, j] for i, j in got.nonzero().tolist()]))  # the list, sorted by (b, i, j)


def _model(family: str = "llama", **cfg):
    m = tiny_llama(layers=2) if family == "llama" else tiny_gpt2(layers=2)
    focus_lab.attach(m, FocusConfig(num_groups=4, window=W, top_k=1, mode="hard", sink_tokens=SINKS,
                                    match_shifts=[0, 1], **cfg))
    return m


@pytest.mark.parametrize("family,latest", [("llama", 0), ("gpt2", 0), ("llama", 2)])
def test_forward_equals_group_mask_plus_brute_force_pairs(family, latest):
    """The model with match_shifts (and match_latest) equals the model without, each layer's
    attention recomputed under its group mask OR the loop-built token-match pairs."""
    m = _model(family, match_latest=latest)
    ids = _ids(64)
    brute = brute_match(ids[0].tolist(), [0, 1], W, SINKS, latest=latest)  # (T, T)
    from focus_lab.method.metrics import attention_scale

    def patch(out, hook):
        c = hook.call
        return masked_attention(c.query, c.key, c.value, c.kept | brute[None],
                                attention_scale(c.module, c.query.shape[-1]))

    with torch.no_grad():
        got = m(input_ids=ids).logits
        plain = focus_lab.forward_state(m, match_shifts=None)
        with focus_lab.hooks(m, {"attn_out": patch}):
            want = m(input_ids=ids, focus=plain).logits
        without = m(input_ids=ids, focus=plain).logits
    assert (got - want).abs().max().item() <= 1e-5
    assert (got - without).abs().max().item() > 1e-3  # the pairs change the output


def test_no_repeated_token_no_change():
    m = _model()
    ids = torch.arange(3, 67)[None]  # 64 distinct tokens: no pair matches
    with torch.no_grad():
        a = m(input_ids=ids).logits
        b = m(input_ids=ids, focus=focus_lab.forward_state(m, match_shifts=None)).logits
    assert (a - b).abs().max().item() <= 1e-5


def test_soft_gate_gives_the_pairs_bias_zero():
    """Soft mode (training): a token-match pair gets the local pairs' bias 0. With one token
    repeated, every distant pair matches at shift 0, so the soft forward equals dense attention;
    without the shifts it does not (GPT-2: its position embeddings make the positions differ)."""
    m = _model("gpt2")
    ids = torch.full((1, 48), 5)
    with torch.no_grad():
        dense = m(input_ids=ids, focus=focus_lab.forward_state(m, mode="dense")).logits
        soft = m(input_ids=ids, focus=focus_lab.forward_state(m, mode="soft")).logits
        plain = m(input_ids=ids, focus=focus_lab.forward_state(m, mode="soft", match_shifts=None)).logits
    assert (soft - dense).abs().max().item() <= 1e-5
    assert (plain - dense).abs().max().item() > 1e-3


def test_kv_cache_steps_equal_full_forward():
    from transformers import DynamicCache
    m = _model()
    ids = _ids(48, seed=3)
    with torch.no_grad():
        full = m(input_ids=ids).logits
        cache = DynamicCache(config=m.config)
        parts = [m(input_ids=ids[:, :30], past_key_values=cache, use_cache=True).logits,
                 m(input_ids=ids[:, 30:45], past_key_values=cache, use_cache=True).logits]
        for t in range(45, 48):
            parts.append(m(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits)
    assert (torch.cat(parts, 1) - full).abs().max().item() <= 1e-5


def test_pairs_kept_counts_the_pairs():
    """evaluate's distant_pairs_kept with match_shifts equals a loop count over the layer masks."""
    from focus_lab.eval.evaluate import evaluate
    m = _model()
    ids = _ids(64, seed=4)
    masks = []
    with torch.no_grad(), focus_lab.hooks(m, {"kept": lambda t, h: masks.append(t[0].clone())}):
        m(input_ids=ids)

    class Window:
        input_ids, index = ids[0], 0
    df = evaluate(m, [Window()], [("hard_top1", {"mode": "hard", "top_k": 1})], progress=False)
    T = 64
    far = [(i, j) for i in range(T) for j in range(T) if i - j >= W]
    want = sum(sum(bool(k[i, j]) for i, j in far) for k in masks) / (len(masks) * len(far))
    assert df.distant_pairs_kept.iloc[0] == pytest.approx(want, abs=1e-9)
    brute = brute_match(ids[0].tolist(), [0, 1], W, SINKS)
    assert all(bool((k | ~brute).all()) for k in masks)  # every mask holds every pair


def test_inputs_embeds_is_refused_with_the_fix():
    m = _model()
    emb = m.get_input_embeddings()(_ids(20))
    with pytest.raises(RuntimeError, match="input_ids"):
        with torch.no_grad():
            m(inputs_embeds=emb)


def test_config_validates_and_round_trips():
    c = FocusConfig(window=8, match_shifts=[1, 0, 1])
    assert c.match_shifts == [0, 1]
    assert FocusConfig.from_json(c.to_json()) == c
    for bad in ([-1], [8], ["1"], 1):
        with pytest.raises(ConfigError, match="match_shifts"):
            FocusConfig(window=8, match_shifts=bad)
    assert parse_match_shifts("none") is None and parse_match_shifts("0,1") == [0, 1]
    with pytest.raises(ValueError, match="integers"):
        parse_match_shifts("a")


def test_length_table_reuses_rows_only_under_the_same_match_shifts():
    """analyses/length_table: rows record the shifts per pattern (dense and window none); a run
    with match_shifts takes no hard or random row made without them (a cell from before the
    column counts as none), and a plain run takes none made with them; dense rows always."""
    import pandas as pd

    from analyses.length_table import match_in_force, reusable_rows, same_router_rows
    cfg = FocusConfig(match_shifts=[0, 1])
    assert [match_in_force(cfg, lab) for lab in ("hard_top2", "random_top2", "dense", "window")] == \
        ["0-1", "0-1", "", ""]
    old = pd.DataFrame({"label": ["dense", "hard_top2", "random_top2", "hard_top2", "random_top2"],
                        "window": [0, 0, 0, 1, 1], "routers_sha256": ["own"] * 5, "random_layers": [""] * 5,
                        "match_shifts": ["", "", "", "0-1", "0-1"]})
    labels = ["dense", "hard_top2", "random_top2"]
    assert sorted(zip(reusable_rows(old, labels, [0, 1], cfg).label, reusable_rows(old, labels, [0, 1], cfg).window)) \
        == [("dense", 0), ("random_top2", 1)]
    assert sorted(same_router_rows(old, labels, [0, 1], cfg, set(), "own").window) == [0, 1, 1]  # dense, 2 x 0-1
    plain = FocusConfig()
    assert sorted(same_router_rows(old, labels, [0, 1], plain, set(), "own").window) == [0, 0, 0]
    assert sorted(same_router_rows(old.drop(columns="match_shifts"), labels, [0, 1], plain, set(), "own").window) \
        == [0, 0, 0, 1, 1]


def test_cli_bad_match_shifts_exits_2_with_one_line():
    from typer.testing import CliRunner

    from focus_lab.cli import app
    res = CliRunner().invoke(app, ["eval", "--match-shifts", "0,x", "--max-windows", "1"])
    assert res.exit_code == 2, res.output
    assert "--match-shifts: cannot read '0,x'" in res.output


@pytest.mark.parametrize("Tq,k,B", [(70, 1, 2), (70, 2, 2), (12, 2, 2), (1, 2, 2), (1, 2, 1)])
def test_decomposition_with_extra_pairs_equals_the_masked_reference(Tq, k, B):
    """hard_focus_attention(extra_pairs=...) (part D) equals dense attention under the group
    mask OR the loop-built pairs, for a prefill, a chunk after a cache and a one-token step."""
    from focus_lab.method.core import hard_mask
    from focus_lab.method.decomposition import hard_focus_attention
    g = torch.Generator().manual_seed(Tq + k)
    H, Hkv, Tk, D = 4, 2, 70, 16
    q = torch.randn(B, H, Tq, D, generator=g)
    key, value = torch.randn(B, Hkv, Tk, D, generator=g), torch.randn(B, Hkv, Tk, D, generator=g)
    qg = torch.stack([torch.randperm(4, generator=g)[:k] for _ in range(B * Tq)]).view(B, Tq, k)
    kg = torch.randint(0, 4, (B, Tk), generator=g)
    ids = torch.randint(3, 9, (B, Tk), generator=g)
    brute = torch.stack([brute_match(ids[b].tolist(), [0, 1], W, SINKS, q_offset=Tk - Tq) for b in range(B)])
    pos = torch.arange(Tk)
    want = masked_attention(q, key, value, hard_mask(qg, kg, W, pos[Tk - Tq:], pos, SINKS) | brute)
    got = hard_focus_attention(q, key, value, qg, kg, W, sinks=SINKS, extra_pairs=brute.nonzero())
    assert brute.sum() > 0
    assert (got - want).abs().max().item() <= 1e-5
    none = hard_focus_attention(q, key, value, qg, kg, W, sinks=SINKS)
    assert (none - want).abs().max().item() > 1e-4  # the pairs matter here


def test_pattern_suffixes_set_the_shifts():
    from analyses.length_table import match_in_force
    from focus_lab.patterns.legacy import legacy_changes as pattern_changes  # the committed tables' labels
    assert pattern_changes("hard_top2_match", 4)["match_shifts"] == [0, 1]
    assert pattern_changes("random_top1_uniform_match", 4) == {
        "mode": "hard", "top_k": 1, "assignment": "random", "layer_top_k": {}, "match_shifts": [0, 1]}
    assert pattern_changes("hard_top2_nomatch", 4)["match_shifts"] is None
    assert "match_shifts" not in pattern_changes("hard_top2", 4)
    for bad in ("hard_top2_match_uniform", "dense_match", "hard_top2_match_match"):
        with pytest.raises(ConfigError, match="_match"):
            pattern_changes(bad, 4)
    on = FocusConfig(match_shifts=[0, 1])
    assert [match_in_force(on, lab) for lab in ("hard_top2", "hard_top2_nomatch", "soft", "window")] == \
        ["0-1", "", "", ""]
    assert match_in_force(FocusConfig(), "random_top2_match") == "0-1"
    assert match_in_force(FocusConfig(match_shifts=[0, 1], match_latest=16), "hard_top2") == "0-1@16"


def test_base_model_alone_gets_the_ids():
    """Calling the decoder without its head (model.base_model) passes the ids too: its hidden
    states equal those of the whole model's forward."""
    m = _model()
    ids = _ids(64, seed=5)
    with torch.no_grad():
        whole = m(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        alone = m.base_model(input_ids=ids).last_hidden_state
    assert (whole - alone).abs().max().item() <= 1e-6


def test_copy_pairs_study_extras_and_random_control():
    """analyses/studies/copy_pairs: extras parse to shifts; its pairs are core's; the random
    control draws only dropped candidates, about as many per row as the pairs it matches."""
    from analyses.studies.copy_pairs import window_match_mask as study_pairs
    from analyses.studies.copy_pairs import parse_extra, random_like
    assert parse_extra("none") == () and parse_extra("random") is None and parse_extra("s1+0") == (0, 1)
    for bad in ("s-1+0", "x", "s"):
        with pytest.raises(SystemExit):
            parse_extra(bad)
    ids = _ids(40, seed=7)[0]
    assert torch.equal(study_pairs(ids, W, SINKS, (0, 1)), brute_match(ids.tolist(), [0, 1], W, SINKS))
    g = torch.Generator().manual_seed(0)
    extra = torch.rand(400, 400, generator=g) < 0.05
    cand = torch.rand(400, 400, generator=g) < 0.5
    got = random_like(extra, cand, torch.Generator().manual_seed(1))
    assert not (got & ~cand).any()
    assert abs(got.sum().item() / extra.sum().item() - 1) < 0.1


def test_copy_pairs_hook_counts_the_induction_pairs_each_layer_keeps():
    """analyses/studies/copy_pairs._hook with no extra: per routed layer, the share of distant
    pairs and of the induction pairs (``copies``) that the layer's own mask kept, against the
    same shares counted by hand from the ``kept`` hook point of the same forward."""
    from analyses.studies.copy_pairs import _hook, window_match_mask
    from focus_lab.method.core import distant_mask
    m = _model()
    cfg = focus_lab.focus_config(m)
    ids = _ids(96, seed=3)
    pos = torch.arange(96)
    distant = distant_mask(pos, pos, cfg.window, cfg.sink_tokens)
    copies = window_match_mask(ids[0], cfg.window, cfg.sink_tokens, (1,))
    assert copies.any()
    stats, kept = [], {}
    fn = _hook(torch.zeros_like(distant), None, distant, stats, seed=0, copies=copies)
    with torch.no_grad(), focus_lab.hooks(m, {"kept": [fn, lambda t, h: kept.__setitem__(h.layer_idx, t[0])]}):
        m(input_ids=ids, use_cache=False, focus=focus_lab.forward_state(m, mode="hard", top_k=1, match_shifts=None))
    assert [s[2] for s in stats] == sorted(kept)
    assert any(0 < own < 1 for *_, own in stats)  # the groups keep some copies, not all
    for pairs, extra, layer, own in stats:
        k = kept[layer]
        assert extra == 0 and pairs == pytest.approx((k & distant).sum().item() / distant.sum().item())
        assert own == pytest.approx((k & copies).sum().item() / copies.sum().item())


def test_copy_queries_and_their_share_of_the_distill_sample():
    """train/distill.copy_queries: positions i with a distant induction key j (brute force:
    ids[j-1] == ids[i], i - j >= window, j >= sinks) that holds their next token (ids[j] ==
    ids[i+1]), in any batch row; sample_queries draws round(share * n) of its queries from
    them (fewer when fewer are marked, more when too few unmarked are left), sorted, distinct,
    past the window; share 0 is the plain uniform draw."""
    from focus_lab.train.distill import copy_queries, sample_queries
    ids = torch.cat([_ids(80, seed=5), _ids(80, seed=6)])  # (2, 80)
    want = torch.zeros(80, dtype=torch.bool)
    for row in ids.tolist():
        pairs = brute_match(row, [1], W, SINKS)
        for i in range(79):
            want[i] |= any(pairs[i, j] and row[j] == row[i + 1] for j in range(80))
    got = copy_queries(ids, W, SINKS)
    assert torch.equal(got, want) and 0 < want.sum() < 80 - W
    prefer = torch.zeros(60, dtype=torch.bool)
    prefer[[12, 20, 31, 40, 41, 50]] = True
    for n, share, marked in ((10, 0.5, 5), (10, 1.0, 6), (50, 0.0, None), (52, 0.1, 6)):
        q = sample_queries(60, 8, n, torch.Generator().manual_seed(0), prefer, share)
        assert q.tolist() == sorted(set(q.tolist())) and q.min() >= 8 and len(q) == min(n, 52)
        if marked is not None:  # (52, 0.1): 46 unmarked positions, so all 6 marked ones fill the 52
            assert int(prefer[q].sum()) == marked
    plain = sample_queries(60, 8, 10, torch.Generator().manual_seed(0))
    assert torch.equal(plain, sample_queries(60, 8, 10, torch.Generator().manual_seed(0), prefer, 0.0))
    from focus_lab.method.config import ConfigError, TrainConfig
    with pytest.raises(ConfigError, match="distill_copy_share"):
        TrainConfig(distill_copy_share=1.5)


def test_recording_refuses_token_match_pairs_with_the_fix():
    m = _model()
    with pytest.raises(RuntimeError, match="match_shifts=None"):
        with torch.no_grad(), focus_lab.record(m, metrics=("assignments",)):
            m(input_ids=_ids(32), use_cache=False)
    with pytest.raises(RuntimeError, match="match_shifts=None"):  # a soft forward too
        with torch.no_grad(), focus_lab.record(m, metrics=("assignments",)):
            m(input_ids=_ids(32), use_cache=False, focus=focus_lab.forward_state(m, mode="soft"))
    with torch.no_grad(), focus_lab.record(m, metrics=("assignments",)) as rec:  # the fix named works
        m(input_ids=_ids(32), use_cache=False, focus=focus_lab.forward_state(m, match_shifts=None))
    assert rec.num_windows == 1
