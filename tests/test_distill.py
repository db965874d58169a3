"""The distill objective (focus_lab.train.distill) against a brute-force soft-gated attention."""

import math

import pytest
import torch

from conftest import tiny_gpt2, tiny_llama
from focus_lab.method.config import FocusConfig, TrainConfig
from focus_lab.method.core import sinkhorn, soft_top_k_membership
from focus_lab.train.distill import distill_step, layer_distill_loss, output_projection, sample_queries
import focus_lab
from focus_lab.hf.retrofit import attach, attention_modules, focus_config, forward_state, routers


def _capture_layer(model, ids, layer=0):
    """q, k, v, dense out and router input of one layer from a dense forward."""
    got = {}
    i, mod = [(i, m) for i, m in attention_modules(model) if hasattr(m, "focus_router")][layer]
    # the router input from a forward pre-hook of the module itself (independent of the hook points)
    hook = mod.register_forward_pre_hook(
        lambda m, a, kw: got.__setitem__("h", kw.get("hidden_states", a[0] if a else None)),
        with_kwargs=True)
    with torch.no_grad(), focus_lab.cache(model, [f"layers.{i}.{p}" for p in ("query", "key", "value", "attn_out")]) as c:
        model(input_ids=ids, use_cache=False, focus=forward_state(model, mode="dense"))
    hook.remove()
    return mod, got["h"], tuple(c[f"layers.{i}.{p}"] for p in ("query", "key", "value", "attn_out"))


def _brute_force(q, k, v, log_p, q_pos, cfg, scale, q_side=None, ids=None):
    """o_i = sum_j w_ij v_j / sum_j w_ij, w_ij = exp(q_i.k_j * scale) * (1 if local else Q_i.P_j),
    Q = ``q_side`` (B, T, K) or P itself; with ``ids`` (B, T), 1 also for the token-match pairs
    of ``cfg.match_shifts`` (ids[j - s] == ids[i])."""
    B, H, T, D = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    p = log_p.exp()
    qp = p if q_side is None else q_side.to(p.dtype)
    out = torch.zeros(B, H, len(q_pos), D, dtype=torch.float64)
    for b in range(B):
        for n, i in enumerate(q_pos.tolist()):
            for h in range(H):
                num, den = torch.zeros(D, dtype=torch.float64), 0.0
                for j in range(i + 1):
                    local = i - j < cfg.window or j < cfg.sink_tokens
                    if ids is not None:
                        local = local or any(j >= s and ids[b, j - s] == ids[b, i] for s in cfg.match_shifts)
                    g = 1.0 if local else max(float(qp[b, i] @ p[b, j]), cfg.eps)
                    w = math.exp(float(q[b, h, i] @ k[b, h, j]) * scale) * g
                    num += w * v[b, h, j].double()
                    den += w
                out[b, h, n] = num / den
    return out


def _layer_case():
    """One layer of a tiny Llama with Focus (window 8, 2 sinks): its module, router input, q/k/v,
    dense output, 6 sampled queries, logit scale and the Sinkhorn log-probabilities."""
    model = tiny_llama()
    cfg = FocusConfig(window=8, sink_tokens=2)
    attach(model, cfg)
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    mod, h, qkvo = _capture_layer(model, ids)
    q_pos = sample_queries(40, cfg.window, 6, torch.Generator().manual_seed(1))
    log_p, _ = sinkhorn(mod.focus_router(h), cfg.tau, cfg.sinkhorn_iters)
    return cfg, mod, h, qkvo, q_pos, mod.scaling, log_p.detach()


def _reference_loss(mod, qkvo, q_pos, cfg, scale, log_p, q_side=None, ids=None) -> float:
    """Relative squared error after W_o of the brute-force gated output against the dense one."""
    q, k, v, o = qkvo
    out = _brute_force(q, k, v, log_p, q_pos, cfg, scale, q_side, ids)
    W = mod.o_proj.weight.double()  # (d, H*D)
    B, H, n, D = out.shape
    flat = lambda x: x.transpose(1, 2).reshape(B, n, H * D) @ W.T  # noqa: E731
    ref = o[:, :, q_pos].double()
    return float(flat(out - ref).pow(2).sum() / flat(ref).pow(2).sum())


def test_layer_loss_matches_brute_force():
    cfg, mod, h, qkvo, q_pos, scale, log_p = _layer_case()
    loss, col, _ = layer_distill_loss(mod, mod.focus_router, h, *qkvo, q_pos, cfg, scale)
    expected = _reference_loss(mod, qkvo, q_pos, cfg, scale, log_p)
    assert expected > 1e-6  # the gate does drop something here
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-3)
    assert col.shape == (1, cfg.num_groups)


def test_layer_loss_with_token_match_pairs_matches_brute_force():
    """The gate keeps the sampled queries' token-match pairs (bias 0): the loss equals the
    brute-force one with those pairs kept, and differs from the loss without them."""
    from focus_lab.patterns.rules.match import match_mask
    model = tiny_llama()
    cfg = FocusConfig(window=8, sink_tokens=2, match_shifts=[0, 1])
    attach(model, cfg)
    ids = torch.randint(3, 9, (1, 40), generator=torch.Generator().manual_seed(0))  # 6 tokens: many matches
    mod, h, qkvo = _capture_layer(model, ids)
    q_pos = sample_queries(40, cfg.window, 6, torch.Generator().manual_seed(1))
    log_p = sinkhorn(mod.focus_router(h), cfg.tau, cfg.sinkhorn_iters)[0].detach()
    match = match_mask(ids[:, q_pos], ids, cfg.match_shifts, q_pos, torch.arange(40), cfg.window,
                       cfg.sink_tokens)  # (1, 6, 40)
    assert match.any()
    loss, _, _ = layer_distill_loss(mod, mod.focus_router, h, *qkvo, q_pos, cfg, mod.scaling, match=match)
    expected = _reference_loss(mod, qkvo, q_pos, cfg, mod.scaling, log_p, ids=ids)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-3)
    plain, _, _ = layer_distill_loss(mod, mod.focus_router, h, *qkvo, q_pos, cfg, mod.scaling)
    assert abs(float(loss.detach()) - float(plain.detach())) > 1e-3  # the pairs change the gate


def test_loss_is_zero_when_every_pair_is_local():
    model = tiny_gpt2()
    attach(model, FocusConfig(window=64))
    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    mod, h, (q, k, v, o) = _capture_layer(model, ids)
    assert output_projection(mod) is mod.c_proj
    loss, _, _ = layer_distill_loss(mod, mod.focus_router, h, q, k, v, o, torch.arange(40, 48),
                                    FocusConfig(window=64), 1 / math.sqrt(q.shape[-1]))
    assert loss.item() < 1e-10


def test_distill_step_moves_only_routers_and_restores_config():
    model = tiny_llama()
    attach(model, FocusConfig(window=4, mode="soft"))
    for r in routers(model).values():
        r.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    cfg = FocusConfig(window=4)
    shares = {}
    loss = distill_step(model, ids, cfg, step=0, num_queries=8, shares=shares)
    assert float(loss) > 0 and sorted(shares) == sorted(routers(model))
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and all("focus_router" in n for n in grads)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # no optimizer step here
    assert focus_config(model).mode == "soft"  # the model's default config is untouched


def test_distill_step_with_match_shifts_keeps_every_matching_pair():
    """One token repeated: every distant pair of a sampled query is a token-match pair (shift 0),
    so the gate keeps everything and each layer's output is the dense one (loss 0); without the
    shifts the same step has a loss (GPT-2: its position embeddings make the positions differ)."""
    model = tiny_gpt2()
    attach(model, FocusConfig(window=4, mode="soft"))
    ids = torch.full((1, 32), 7)
    with_pairs = distill_step(model, ids, FocusConfig(window=4, match_shifts=[0]), step=0, num_queries=8)
    without = distill_step(model, ids, FocusConfig(window=4), step=0, num_queries=8)
    assert float(with_pairs.detach()) < 1e-10 < 1e-4 < float(without.detach())


def test_sample_queries_and_config_errors():
    g = torch.Generator().manual_seed(0)
    q = sample_queries(100, 10, 500, g)
    assert q.tolist() == list(range(10, 100))
    with pytest.raises(ValueError, match="no distant pairs"):
        sample_queries(10, 10, 4, g)
    from focus_lab.method.config import ConfigError
    with pytest.raises(ConfigError, match="objective"):
        TrainConfig(objective="nope")
    with pytest.raises(ConfigError, match="distill_queries"):
        TrainConfig(distill_queries=0)


def _top_k_reference(log_p, top_k, temperature=1.0):
    """Per token, by sorting in Python: sigmoid((l_g - midpoint of the k-th and (k+1)-th) / t)."""
    out = torch.empty(log_p.shape, dtype=torch.float64)
    for idx in range(log_p.shape[0] * log_p.shape[1]):
        b, t = divmod(idx, log_p.shape[1])
        row = [float(x) for x in log_p[b, t]]
        s = sorted(row, reverse=True)
        mid = (s[top_k - 1] + s[top_k]) / 2 if top_k < len(row) else -math.inf
        for g, x in enumerate(row):
            out[b, t, g] = 1 / (1 + math.exp(-(x - mid) / temperature)) if top_k < len(row) else 1.0
    return out


def test_soft_top_k_membership_against_sorting():
    log_p = torch.randn(2, 7, 4, generator=torch.Generator().manual_seed(0)) * 3
    for k in (1, 2, 3, 4):
        got = soft_top_k_membership(log_p, k, temperature=0.7).exp().double()
        assert torch.allclose(got, _top_k_reference(log_p, k, 0.7), atol=1e-6)
    g = torch.Generator().manual_seed(1)  # logits 20 apart: far from the threshold, the hard top-2
    ranks = torch.stack([torch.randperm(4, generator=g) for _ in range(14)]).reshape(2, 7, 4)
    sharp = soft_top_k_membership(-20.0 * ranks, 2).exp()
    hard = (ranks < 2).float()
    assert torch.allclose(sharp, hard, atol=1e-4)
    assert float(sharp.sum(-1).mean()) == pytest.approx(2.0, abs=1e-3)
    with pytest.raises(ValueError, match="top_k"):
        soft_top_k_membership(log_p, 5)
    with pytest.raises(ValueError, match="temperature"):
        soft_top_k_membership(log_p, 1, temperature=0.0)


def test_top_k_aware_loss_matches_brute_force():
    cfg, mod, h, qkvo, q_pos, scale, log_p = _layer_case()
    loss, _, _ = layer_distill_loss(mod, mod.focus_router, h, *qkvo, q_pos, cfg, scale, (1, 2))
    losses = [_reference_loss(mod, qkvo, q_pos, cfg, scale, log_p, _top_k_reference(log_p, top_k))
              for top_k in (1, 2)]
    assert losses[1] < losses[0]  # the top-2 mask keeps more, so its output is closer to dense
    assert float(loss.detach()) == pytest.approx(sum(losses) / 2, rel=1e-3)
    # every group kept (top-k = K): the gate keeps every pair, the output is the dense one
    full, _, _ = layer_distill_loss(mod, mod.focus_router, h, *qkvo, q_pos, cfg, scale, (cfg.num_groups,))
    assert float(full.detach()) < 1e-10
    with pytest.raises(Exception, match="distill_top_k"):
        TrainConfig(distill_top_k=(0,))
    assert TrainConfig(distill_top_k=[1, 2]).distill_top_k == (1, 2)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3_text"])
@pytest.mark.parametrize("objective", ["distill", "distill_match", "coverage"])
def test_layerwise_steps_run_the_body_alone_with_the_full_forwards_losses_and_gradients(family, objective,
                                                                                       monkeypatch):
    """``layerwise_step`` (distill, distill with token-match pairs, coverage) runs the model's body
    without its output head (no logits: 4.3 GB at 4K tokens for Gemma-3) and gives exactly the
    loss, router gradients, group biases and shares of the same step through the whole causal LM
    (``base_model`` made the model itself, as the step ran before)."""
    from conftest import FAMILIES
    from focus_lab.train.layerwise import coverage_step
    cfg = FocusConfig(window=4)
    if objective == "distill_match":  # the token-match rule's fields, as a pattern gives them
        cfg = cfg.replace(match_shifts=[0, 1])
    ids = torch.randint(3, 97, (2, 40), generator=torch.Generator().manual_seed(5))
    ids[:, 20:30] = ids[:, 5:15]  # repeats: token-match pairs to keep

    def step(whole: bool):
        model = FAMILIES[family]()
        attach(model, FocusConfig(window=4, mode="soft"))
        for r in routers(model).values():
            r.train()
        heads = []
        model.get_output_embeddings().register_forward_hook(lambda *a: heads.append(1))
        shares = {}
        with monkeypatch.context() as mp:
            if whole:
                mp.setattr(type(model), "base_model", property(lambda self: self))
            if objective == "coverage":
                loss = coverage_step(model, ids, cfg, shares)
            else:
                loss = distill_step(model, ids, cfg, step=3, num_queries=8, shares=shares)
        rs = routers(model)
        grads = {f"{i}.{n}": p.grad for i, r in rs.items() for n, p in r.named_parameters()}
        return loss, grads, {i: r.group_bias.clone() for i, r in rs.items()}, shares, len(heads)

    loss, grads, bias, shares, heads = step(whole=False)
    ref_loss, ref_grads, ref_bias, ref_shares, ref_heads = step(whole=True)
    assert heads == 0 and ref_heads == 1  # the head ran only in the whole forward
    assert torch.allclose(loss, ref_loss, atol=1e-7, rtol=0) and float(loss) > 0
    assert grads.keys() == ref_grads.keys() and any(g is not None for g in grads.values())
    for k, g in grads.items():
        assert (g is None) == (ref_grads[k] is None)
        assert g is None or torch.allclose(g, ref_grads[k], atol=1e-7, rtol=0), k
    for i in bias:
        assert torch.allclose(bias[i], ref_bias[i], atol=1e-7) and torch.allclose(shares[i], ref_shares[i])
