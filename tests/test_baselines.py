"""Baselines on tiny random models: the Router.assign extension point, softmax and
prefix-causal Sinkhorn, k-means / online k-means / MoBA routers, matched windows, LoRA budget,
and the one harness that evaluates them all."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import focus_lab
from focus_lab import FocusConfig, TrainConfig
from focus_lab.eval import baselines as BL
from focus_lab.method.core import Router, hard_assign, route, sinkhorn
from focus_lab.method.metrics import window_pairs
from focus_lab.hf.retrofit import routers, set_config
from conftest import tiny_llama

T = 32


@dataclass
class W:
    input_ids: torch.Tensor


def _windows(n=2, T=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [W(torch.randint(3, 97, (T,), generator=g)) for _ in range(n)]


# ---------------------------------------------------------------- the extension point

def test_default_assign_is_sinkhorn_and_hard_assign():
    cfg = FocusConfig(num_groups=4, top_k=2, mode="soft")
    r = Router(16, cfg, 0).eval()
    r.group_bias.copy_(torch.tensor([0.3, -0.1, 0.0, -0.2]))
    h = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(1))
    out = route(r, h)
    lp, col = sinkhorn(out.scores, cfg.tau, cfg.sinkhorn_iters)
    qg, kg = hard_assign(out.scores, cfg.tau, cfg.top_k, r.group_bias)
    assert torch.equal(out.log_p, lp) and torch.equal(out.col_potential, col)
    assert torch.equal(out.query_groups, qg) and torch.equal(out.key_group, kg)
    hard = route(r, h, config=cfg.replace(mode="hard"))
    assert hard.log_p is None and torch.equal(hard.query_groups, qg)


class _OneGroup(Router):
    def assign(self, scores, config, token_mask=None, start=0):
        B, T, _ = scores.shape
        z = torch.zeros(B, T, dtype=torch.long)
        return None, None, z[..., None].expand(B, T, config.top_k), z


@torch.no_grad()
def test_overridden_assign_reaches_the_attention_path():
    model = tiny_llama()
    ids = _windows(1)[0].input_ids[None]
    ref = model(ids).logits
    focus_lab.attach(model, FocusConfig(mode="hard", window=2, num_groups=4, top_k=1))
    assert not torch.allclose(model(ids, use_cache=False).logits, ref, atol=1e-4)
    BL.swap_routers(model, lambda r, m: _OneGroup(r.proj.shape[0], r.config, r.layer_idx))
    for backend in ("auto", "dense"):  # every token in group 0: nothing is masked
        set_config(model, backend=backend)
        assert torch.allclose(model(ids, use_cache=False).logits, ref, atol=1e-5)


# ---------------------------------------------------------------- softmax, prefix-causal

def test_softmax_router_is_plain_softmax():
    cfg = FocusConfig(num_groups=4, mode="soft")
    r = BL.SoftmaxRouter(16, cfg, 0)
    h = torch.randn(1, 7, 16)
    out = route(r, h)
    assert torch.allclose(out.log_p, torch.log_softmax(out.scores / cfg.tau, -1))
    assert out.col_potential is None


def test_prefix_sinkhorn_rows_equal_sinkhorn_over_the_prefix():
    g = torch.Generator().manual_seed(3)
    s = 0.2 * torch.randn(2, 11, 4, generator=g)
    lp = BL.prefix_sinkhorn(s, 0.1, 5, chunk=4)
    for i in range(11):
        ref, _ = sinkhorn(s[:, : i + 1], 0.1, 5)
        assert torch.allclose(lp[:, i], ref[:, i], atol=1e-5)
    s2 = s.clone()
    s2[:, 6:] = torch.randn(2, 5, 4, generator=g)  # later tokens never change earlier rows
    assert torch.allclose(BL.prefix_sinkhorn(s2, 0.1, 5)[:, :6], lp[:, :6], atol=1e-6)


# ---------------------------------------------------------------- k-means, online k-means

def test_kmeans_router_scores_nearest_centroid():
    cfg = FocusConfig(num_groups=3, top_k=2, normalize_input=False)
    mu = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    r = BL.KMeansRouter(8, cfg, 0, mu)
    h = torch.randn(1, 20, 8)
    s = r(h)
    d = torch.cdist(h[0], mu) ** 2
    assert torch.allclose(-s[0], d, atol=1e-4)
    qg, kg = hard_assign(s, cfg.tau, 2)
    assert torch.equal(kg[0], d.argmin(-1)) and torch.equal(qg[0], d.topk(2, largest=False).indices)


@torch.no_grad()
def test_fit_kmeans_routers_match_sklearn_on_captured_inputs():
    from sklearn.cluster import KMeans
    model = tiny_llama()
    focus_lab.attach(model, FocusConfig(mode="hard", window=4, num_groups=3, top_k=1))
    win = _windows(2)
    x = BL.capture_router_inputs(model, win)
    assert set(x) == {0, 1} and x[0].shape == (2 * T, 64)
    BL.fit_kmeans_routers(model, win, seed=0)
    r = routers(model)[0]
    assert isinstance(r, BL.KMeansRouter)
    lab = KMeans(3, n_init=4, random_state=0).fit(x[0]).predict(x[0])
    ours = r(torch.from_numpy(x[0])[None]).argmax(-1)[0].numpy()  # input already normalized: RMS 1
    assert np.array_equal(ours, lab)


def test_online_kmeans_ema_update():
    cfg = FocusConfig(num_groups=2, normalize_input=False)
    r = BL.OnlineKMeansRouter(2, cfg, 0, decay=0.5)
    r.means.copy_(torch.tensor([[0.0, 0.0], [10.0, 10.0]]))
    r.initialized.fill_(True)
    r.learning = True
    r(torch.tensor([[[1.0, 1.0], [3.0, 1.0], [9.0, 9.0]]]))
    assert torch.allclose(r.means, torch.tensor([[1.0, 0.5], [9.5, 9.5]]))
    r.learning = False
    before = r.means.clone()
    r(torch.randn(1, 5, 2))
    assert torch.equal(r.means, before)


# ---------------------------------------------------------------- MoBA

@torch.no_grad()
def test_moba_blocks_are_causal_and_exact():
    model = tiny_llama()
    cfg = BL.use_moba(model, FocusConfig(window=8, num_groups=4, top_k=1, sink_tokens=0), seq_len=T)
    assert cfg.num_groups == 4 and routers(model)[0].block_size == 8
    ids = _windows(1)[0].input_ids[None]
    seen = {}
    def grab(kg, hook):
        seen.setdefault(hook.layer_idx, hook.call.routing)
    with focus_lab.hooks(model, {"key_group": grab}):
        out = model(ids, use_cache=False).logits
    rt = seen[0]
    pos = torch.arange(T)
    assert torch.equal(rt.key_group[0], pos // 8)
    blk = pos // 8
    has_past = blk >= 1
    assert (rt.query_groups[0, has_past, 0] < blk[has_past]).all()  # a strictly past block
    set_config(model, backend="dense")
    assert torch.allclose(model(ids, use_cache=False).logits, out, atol=1e-5)
    ids2 = ids.clone()
    ids2[0, 20:] = 5  # later tokens never change earlier outputs
    out2 = model(ids2, use_cache=False).logits
    assert torch.allclose(out2[:, :20], out[:, :20], atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@torch.no_grad()
def test_moba_kv_cache_decode_equals_full_forward(family):
    """Decoding through the KV cache with the MoBA gate (llama: the layer's q/k projections; GPT-2:
    the normalized router inputs): every step's logits equal the full forward's at that position,
    across block boundaries, and again when the decode restarts from a copy of the prefill's cache
    after other tokens went through (the gate forgets what followed the restart position)."""
    import copy
    from transformers import DynamicCache
    from focus_lab.hf.retrofit import forward_state
    from conftest import tiny_gpt2
    model = tiny_llama() if family == "llama" else tiny_gpt2()
    BL.use_moba(model, FocusConfig(window=8, num_groups=4, top_k=1, sink_tokens=1), seq_len=48)
    ids = torch.randint(3, 97, (1, 48), generator=torch.Generator().manual_seed(3))
    full = model(ids, use_cache=False, focus=forward_state(model)).logits  # (1, 48, V)
    state = forward_state(model, cache=True)
    cache = DynamicCache(config=model.config)
    model(ids[:, :13], past_key_values=cache, use_cache=True, focus=state)
    snapshot = copy.deepcopy((cache, state.cache))
    other = torch.randint(3, 97, (1, 20), generator=torch.Generator().manual_seed(4))
    model(other, past_key_values=cache, use_cache=True, focus=state)  # 20 tokens the restart must forget
    cache, fcache = snapshot
    state = focus_lab.FocusForward(state.config, fcache)
    steps = [model(ids[:, t:t + 1], past_key_values=cache, use_cache=True, focus=state).logits[:, -1]
             for t in range(13, 48)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 13:48], atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match="start with a forward from position 0"):
        routers(model)[0](torch.randn(2, 1, model.config.hidden_size), start=5)


@torch.no_grad()
def test_moba_distant_kept_against_brute_force_masks():
    """The expected MoBA sparsity against masks built from MoBARouter.assign with random block
    scores, counted pair by pair; and the matched top-k picks the nearest."""
    from focus_lab.method.core import hard_mask
    Tn, bs, w, sinks = 96, 8, 8, 4
    pos = torch.arange(Tn)
    distant = (pos[:, None] - pos[None, :]) >= w  # (T, T)
    for k in (1, 3, 12):
        cfg = FocusConfig(window=w, num_groups=12, top_k=k, mode="hard", sink_tokens=sinks)
        r = BL.MoBARouter(16, cfg, 0, block_size=bs).eval()
        scores = torch.randn(300, Tn, 12, generator=torch.Generator().manual_seed(k))
        _, _, qg, kg = r.assign(scores, cfg)
        m = hard_mask(qg, kg, w, pos, pos, sinks)  # (B, T, T)
        measured = float((m & distant).sum() / (distant.sum() * m.shape[0]))
        expected = BL.moba_distant_kept(Tn, bs, k, w, sinks)
        assert measured == pytest.approx(expected, abs=0.01 if k < 12 else 1e-9)
    assert BL.moba_distant_kept(Tn, bs, 12, w, sinks) == pytest.approx(1.0)
    kept = {k: BL.moba_distant_kept(Tn, bs, k, w, sinks) for k in range(1, 13)}
    target = (kept[4] + 0.4 * (kept[5] - kept[4]))  # nearer to k = 4
    assert BL.moba_matched_top_k(target, Tn, bs, w, sinks) == 4
    assert kept[4] > 4 / 12  # early queries keep every past block: k / blocks underestimates


def test_moba_rejects_soft_mode_and_large_blocks():
    with pytest.raises(ValueError, match="block_size"):
        BL.MoBARouter(16, FocusConfig(window=4), 0, block_size=8)
    r = BL.MoBARouter(16, FocusConfig(window=8, mode="soft"), 0, block_size=8)
    with pytest.raises(ValueError, match="hard"):
        route(r, torch.randn(1, 16, 16))


# ---------------------------------------------------------------- matched sparsity, LoRA

@pytest.mark.parametrize("frac", [0.0, 0.25, 0.5, 1.0])
def test_matched_window_size_has_the_same_pair_count(frac):
    n, w = 64, 8
    distant = sum(max(0, i - w + 1) for i in range(n))
    target = window_pairs(n, w) + frac * distant
    wm = BL.matched_window_size(frac, n, w)
    best = min(range(1, n + 1), key=lambda x: (abs(window_pairs(n, x) - target), x))
    assert wm == best
    if frac == 0.0:
        assert wm == w
    if frac == 1.0:
        assert wm == n


def test_window_distant_kept_brute_force():
    from focus_lab.method.core import local_mask
    n, w, s = 40, 6, 2
    pos = torch.arange(n)
    d = pos[:, None] - pos[None, :]
    distant = d >= w
    for wider in (6, 9, 17, 40):
        keep = local_mask(pos, pos, wider, s) & distant
        assert BL.window_distant_kept(n, w, wider, s) == pytest.approx(float(keep.sum() / distant.sum()))
    frac = BL.window_distant_kept(n, w, 17)
    assert BL.matched_window_size(frac, n, w) == 17


def test_lora_budget_and_training():
    model = tiny_llama()
    budget = BL.router_parameter_count(model, FocusConfig(num_groups=4, router_dim=16))
    assert budget == 2 * (64 * 16 + 4 * 16)
    r = BL.lora_rank_for_budget(model, budget)
    per = BL.lora_param_count(model, 1)
    assert per == 2 * ((64 + 64) + (64 + 32))  # q_proj 64->64, v_proj 64->32 (GQA), 2 layers
    assert abs(BL.lora_param_count(model, r) - budget) <= per / 2
    ids = _windows(1)[0].input_ids[None]
    with torch.no_grad():
        ref = model(ids).logits
    merged, log = BL.train_lora(model, _windows(4), TrainConfig(steps=2, seq_len=T, batch_size=1, lr=1e-2,
                                                                warmup=1), rank=r)
    assert len(log) == 2 and int(log["lora_parameters"].iloc[0]) == BL.lora_param_count(tiny_llama(), r)
    assert type(merged).__name__ == "LlamaForCausalLM"
    assert not any(p.requires_grad for p in merged.parameters())
    with torch.no_grad():
        assert not torch.allclose(merged(ids).logits, ref, atol=1e-4)


# ---------------------------------------------------------------- the harness

def test_evaluate_baselines_one_table(tmp_path):
    model = tiny_llama()
    cfg = FocusConfig(window=8, num_groups=4, top_k=2, sink_tokens=1)
    df = BL.evaluate_baselines(model, None, _windows(2, seed=1), _windows(2, seed=2), config=cfg)
    assert set(df["method"]) == {"dense", "window", "focus", "window_matched", "random", "kmeans",
                                 "online_kmeans", "moba"}
    assert not focus_lab.hf.retrofit.is_attached(model)
    hard = df[df["mode"] == "hard"]
    assert hard["distant_pairs_kept"].between(0, 1).all()
    for m in ("focus", "random", "kmeans", "online_kmeans", "moba"):
        assert set(hard[hard.method == m]["top_k"]) == {1, 2, 3, 4}
    # every method sees the same windows; dense equals the plain model
    with torch.no_grad():
        nll = sum(torch.nn.functional.cross_entropy(model(w.input_ids[None]).logits[0, :-1], w.input_ids[1:],
                                                    reduction="sum") for w in _windows(2, seed=2))
    assert df.loc[df.method == "dense", "nll"].iloc[0] == pytest.approx(float(nll) / (2 * (T - 1)), rel=1e-5)
    wm = df[df.method == "window_matched"]
    assert (wm["window_size"] >= 8).all() and wm["window_size"].is_monotonic_increasing
    focus_kept = hard[hard.method == "focus"].set_index("top_k")["distant_pairs_kept"]
    assert np.allclose(wm["distant_pairs_kept"].to_numpy(), focus_kept.sort_index().to_numpy(), atol=0.05)


def test_per_window_rows_pool_to_the_pooled_evaluation():
    """evaluate(per_window=True) gives one row per (window, pattern); pool_windows gives back the
    pooled evaluation's perplexity exactly (token-weighted), and paired_change matches a
    hand computation."""
    import math
    from focus_lab.eval.evaluate import evaluate, paired_change, pool_windows
    model = tiny_llama()
    focus_lab.hf.retrofit.attach(model, FocusConfig(window=8, num_groups=4, top_k=2, sink_tokens=1))
    ws = _windows(3, seed=5)
    pats = [("dense", {"mode": "dense"}), ("hard_top1", {"mode": "hard", "top_k": 1})]
    pooled = evaluate(model, ws, pats, progress=False).set_index("label")
    rows = evaluate(model, ws, pats, progress=False, per_window=True)
    assert len(rows) == 6 and list(rows["window"]) == [i for i in range(3) for _ in pats]
    back = pool_windows(rows).set_index("label")
    assert back.loc["dense", "windows"] == 3 and back.loc["dense", "tokens"] == pooled.loc["dense", "tokens"]
    for lab in ("dense", "hard_top1"):
        assert back.loc[lab, "perplexity"] == pytest.approx(pooled.loc[lab, "perplexity"], rel=1e-6)
    a, b = rows[rows.label == "hard_top1"], rows[rows.label == "dense"]
    expect = 100 * (math.exp(((a.nll * a.tokens).sum() - (b.nll * b.tokens).sum()) / a.tokens.sum()) - 1)
    ch, lo, hi = paired_change(a, b, reps=500)
    assert ch == pytest.approx(expect, rel=1e-9)
    per = 100 * (np.exp(a.nll.to_numpy() - b.nll.to_numpy()) - 1)   # equal tokens per window
    assert per.min() - 1e-9 <= lo <= ch <= hi <= per.max() + 1e-9
    # windows the two patterns do not share are left out
    assert np.isnan(paired_change(a.assign(window=a.window + 100), b)[0])


def test_evaluate_baselines_top_ks_and_per_window():
    model = tiny_llama()
    cfg = FocusConfig(window=8, num_groups=4, top_k=2, sink_tokens=1)
    df = BL.evaluate_baselines(model, None, _windows(2, seed=1), _windows(2, seed=2), config=cfg,
                               methods=("focus", "window_matched", "random", "moba"), top_ks=(1, 2),
                               focus_top_ks=(1, 2, 3), soft=False, per_window=True)
    assert "soft" not in set(df["label"])
    assert set(df[df.method == "focus"]["top_k"].dropna()) == {1, 2, 3}
    assert set(df[df.method == "random"]["top_k"]) == {1, 2}
    assert df.groupby(["method", "label"])["window"].nunique().eq(2).all()
    wm = df[df.method == "window_matched"]
    assert wm.groupby("label")["window_size"].nunique().eq(1).all()
    # MoBA: at T=32 with w=8 it has 4 blocks (<= K), so top_ks still rule
    assert set(df[df.method == "moba"]["top_k"]) <= {1, 2, 3, 4}
    # per window, speedup is the row's tokens/s over that window's dense row
    for wi, part in df.groupby("window"):
        dense_tps = float(part.loc[part.method == "dense", "tokens_per_second"].iloc[0])
        assert np.allclose(part["speedup"], part["tokens_per_second"] / dense_tps)


def test_add_speedup_per_group_by_hand():
    import pandas as pd
    from focus_lab.eval.evaluate import add_speedup
    df = pd.DataFrame({"corpus": ["a", "a", "b", "b", "b"],
                       "method": ["dense", "focus", "focus", "dense", "dense"],
                       "label": ["dense", "hard_top2", "hard_top2", "dense", "dense"],
                       "tokens_per_second": [100.0, 50.0, 30.0, 40.0, 80.0]})
    got = add_speedup(df, by=("corpus", "seq_len"))  # seq_len absent: ignored
    assert np.allclose(got["speedup"], [1.0, 0.5, 0.5, 40 / 60, 80 / 60])
    assert np.allclose(add_speedup(df)["speedup"], [x * 3 / 220 for x in (100, 50, 30, 40, 80)])
    assert add_speedup(df.drop(columns="method"), by=("corpus",))["speedup"].iloc[1] == 0.5
    assert np.isnan(add_speedup(df[df.method == "focus"])["speedup"]).all()


@torch.no_grad()
def test_random_layers_route_like_random_groups_there_only():
    """FocusConfig.random_layers: the named layers route exactly like assignment="random" (no
    group bias), the others like the router, in every assignment; shuffled leaves them random."""
    from focus_lab.method.config import ConfigError, format_int_list, parse_int_list, parse_random_layers
    assert parse_int_list("1-3, 7") == [1, 2, 3, 7]
    assert format_int_list([9, 1, 2, 3, 7, 10]) == "1-3,7,9-10" and format_int_list([]) == ""
    assert parse_int_list(format_int_list([0, 4, 5, 6, 29])) == [0, 4, 5, 6, 29]
    assert parse_random_layers(" None ") == [] and parse_random_layers("1-2") == [1, 2]
    with pytest.raises(ValueError, match="0,3,5-7"):
        parse_int_list("a-b")
    with pytest.raises(ConfigError, match="random_layers"):
        FocusConfig(random_layers=[-1])
    model = tiny_llama()
    cfg = FocusConfig(window=8, num_groups=4, top_k=2, mode="hard")
    focus_lab.hf.retrofit.attach(model, cfg)
    for r in routers(model).values():
        r.group_bias.copy_(torch.tensor([2.0, 0.0, -1.0, 0.5]))  # the bias must not reach random layers
    h = torch.randn(1, 40, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    rs = routers(model)
    assert len(rs) >= 2
    mixed = cfg.replace(random_layers=[0])
    for assignment in ("router", "shuffled"):
        for i, r in rs.items():
            got = route(r, h, config=mixed.replace(assignment=assignment))
            want = route(r, h, config=cfg.replace(assignment="random" if i == 0 else assignment))
            assert torch.equal(got.query_groups, want.query_groups) and torch.equal(got.key_group, want.key_group)
    assert not torch.equal(route(rs[0], h, config=cfg).key_group, route(rs[0], h, config=mixed).key_group)
    assert FocusConfig.from_json(mixed.to_json()) == mixed  # saved with router files
    assert mixed.assignment_at(0) == "random" and mixed.replace(random_layers=[]).assignment_at(0) == "router"


def test_layer_top_k_sets_k_per_layer_and_zero_keeps_only_window_and_sinks():
    """FocusConfig.layer_top_k: k = 0 in every layer gives exactly the window + sinks pattern
    (checked against window mode on the dense reference, ``core.local_mask``); k = 2 in every
    layer over top_k = 1 gives uniform top-2; a mixed spec routes each layer with its own k; the
    spec parser, validation and the JSON round trip of router files."""
    from focus_lab.method.config import ConfigError, parse_layer_top_k
    from focus_lab.method.core import focus_bias, local_mask
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.hf.retrofit import forward_state
    assert parse_layer_top_k("1-3:0; 5,7:2") == {1: 0, 2: 0, 3: 0, 5: 2, 7: 2}
    assert parse_layer_top_k(" none ") == {}
    from focus_lab.method.config import format_layer_top_k  # the inverse, for captions and reports
    assert format_layer_top_k({1: 0, 2: 0, 3: 0, 5: 2, 7: 2, 6: 2}) == "1-3:0;5-7:2"
    assert format_layer_top_k({"9": 1, "0": 3, "1": 3}) == "9:1;0-1:3" and format_layer_top_k({}) == "none"
    spec = "0,5,6,9,12,13,14,15,16,25,27,28:1;1,2,3,4,7,8,10,11,18,19,21,24:3"
    assert parse_layer_top_k(format_layer_top_k(parse_layer_top_k(spec))) == parse_layer_top_k(spec)
    for bad in ("1-3", "1-3:x", ":2"):
        with pytest.raises(ValueError, match="LAYERS:K"):
            parse_layer_top_k(bad)
    with pytest.raises(ConfigError, match="layer_top_k"):
        FocusConfig(num_groups=4, layer_top_k={0: 5})
    with pytest.raises(ConfigError, match="layer_top_k"):
        FocusConfig(layer_top_k=[0, 1])
    cfg = FocusConfig(window=6, num_groups=4, top_k=1, mode="hard", sink_tokens=2)
    mixed = cfg.replace(layer_top_k={0: 2, 1: 0})
    assert FocusConfig.from_json(mixed.to_json()) == mixed  # int keys survive the JSON round trip
    assert [mixed.top_k_at(i) for i in (0, 1, 2)] == [2, 0, 1] and cfg.top_k_at(0) == 1

    model = tiny_llama()
    focus_lab.hf.retrofit.attach(model, cfg)
    rs = routers(model)
    layers = sorted(rs)
    ids = torch.randint(3, 97, (1, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        def logits(**changes):
            return model(ids, use_cache=False, focus=forward_state(model, **changes)).logits
        none = logits(layer_top_k={i: 0 for i in layers})
        torch.testing.assert_close(none, logits(mode="window", backend="dense"), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(none, logits(), atol=1e-3)  # top-1 keeps distant pairs: a real change
        torch.testing.assert_close(logits(layer_top_k={i: 2 for i in layers}), logits(top_k=2), atol=1e-6, rtol=0)
        torch.testing.assert_close(logits(layer_top_k={0: 2, 1: 0}),
                                   logits(layer_top_k={0: 2, 1: 0}, backend="dense"), atol=1e-5, rtol=1e-5)
    h = torch.randn(1, 40, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    got0, want0 = route(rs[0], h, config=mixed), route(rs[0], h, config=cfg.replace(top_k=2))
    assert got0.query_groups.shape == (1, 40, 2) and torch.equal(got0.query_groups, want0.query_groups)
    got1 = route(rs[1], h, config=mixed)
    pos = torch.arange(40)
    assert torch.equal(focus_bias(mixed, got1, pos, pos, 1)[0], local_mask(pos, pos, 6, 2))
    # every router takes its hard groups from core.hard_groups: a baseline's, the recorder's random groups
    from focus_lab.method.metrics import random_groups
    qg, kg = random_groups(1, 40, mixed, 1)
    assert (qg == 1).all() and qg.shape == (1, 40, 1) and not kg.any()
    assert random_groups(1, 40, mixed, 0)[0].shape == (1, 40, 2)
    _, _, qg, kg = BL.SoftmaxRouter(model.config.hidden_size, cfg, 1).assign(torch.randn(1, 40, 4), mixed)
    assert (qg == 1).all() and not kg.any()
    moba = {i: BL.MoBARouter(model.config.hidden_size, cfg, i, block_size=6).eval() for i in (0, 1)}
    _, _, qg, kg = moba[1].assign(torch.randn(1, 24, 4), mixed)
    assert (qg == 1).all() and not kg.any()
    _, _, qg, kg = moba[0].assign(torch.randn(1, 24, 4), mixed)  # k = 2 past blocks; a key's block
    assert qg.shape == (1, 24, 2) and torch.equal(kg[0], torch.arange(24) // 6)
    # the kept share of a window-only layer is the sinks' pairs only, as window mode reports it
    windows = [type("W", (), {"input_ids": ids[0]})()]
    df = evaluate(model, windows, [("all0", {"mode": "hard", "layer_top_k": {i: 0 for i in layers}}),
                                   ("window", {"mode": "window"})], progress=False)
    assert df.distant_pairs_kept[0] == pytest.approx(df.distant_pairs_kept[1]) and 0 < df.distant_pairs_kept[0] < 0.2
