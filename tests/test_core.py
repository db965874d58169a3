"""Focus core against independent references: brute-force masks, dense attention, Sinkhorn marginals."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from focus_lab import ConfigError, FocusConfig
from focus_lab.method.core import (hard_assign, hard_mask, masked_attention, sinkhorn, soft_gate_bias,
                            distant_pairs_kept)


def brute_force_hard_mask(query_groups, key_group, window):
    """M(i,j) = [j<=i] and (g(j) in topk(i) or i-j < w), from the definition (docs/method.md §2)."""
    B, T, _ = query_groups.shape
    m = torch.zeros(B, T, T, dtype=torch.bool)
    for b, i, j in itertools.product(range(B), range(T), range(T)):
        if j <= i and (int(key_group[b, j]) in query_groups[b, i].tolist() or i - j < window):
            m[b, i, j] = True
    return m


@pytest.mark.parametrize("K,k,w,T", [(4, 1, 3, 17), (4, 2, 5, 23), (8, 3, 1, 19), (1, 1, 4, 9), (3, 3, 2, 12)])
def test_hard_mask_matches_brute_force(K, k, w, T):
    torch.manual_seed(K * 100 + T)
    scores = torch.randn(2, T, K)
    qg, kg = hard_assign(scores, tau=0.1, top_k=k)
    pos = torch.arange(T)
    assert torch.equal(hard_mask(qg, kg, w, pos, pos), brute_force_hard_mask(qg, kg, w))
    # the key's group is the query's best group (top-1), and top-k is sorted best first
    assert torch.equal(kg, scores.argmax(-1))
    assert torch.equal(qg, scores.topk(k, -1).indices)


def test_distant_pairs_kept_hand_count():
    # T=4, w=1: distant causal pairs are (1,0),(2,0),(2,1),(3,0),(3,1),(3,2) = 6
    kg = torch.tensor([[0, 1, 0, 1]])
    qg = kg[..., None]
    # same-group distant pairs: (2,0), (3,1) -> 2 of 6
    assert distant_pairs_kept(qg, kg, window=1) == pytest.approx(2 / 6)


def test_sinkhorn_marginals_converge():
    torch.manual_seed(0)
    T, K = 256, 4
    scores = 0.1 * torch.randn(3, T, K)  # logits S / tau ~ N(0, 1)
    log_p, _ = sinkhorn(scores, tau=0.1, iters=10)
    P = log_p.exp()
    assert (P.sum(-1) - 1).abs().max() < 1e-3  # each token's row sums to 1
    assert (P.sum(1) - T / K).abs().max() / (T / K) < 1e-3  # each group carries T/K


def test_sinkhorn_finite_with_extreme_scores():
    scores = torch.tensor([[[50.0, -50.0, 0.0, 50.0]] * 7 + [[-50.0, 50.0, -50.0, 0.0]] * 5])
    log_p, v = sinkhorn(scores, tau=0.1, iters=10)
    assert torch.isfinite(log_p).all() and torch.isfinite(v).all()
    # naive exp(S / tau) overflows fp32 here: the log domain is what keeps this finite
    assert not torch.isfinite(torch.exp(scores / 0.1)).all()


def test_sinkhorn_balances_where_softmax_collapses():
    torch.manual_seed(1)
    T, K = 512, 8
    # every token prefers group 0 a little: softmax puts almost all tokens there
    scores = 0.1 * torch.randn(1, T, K)
    scores[..., 0] += 0.3
    soft_share = torch.softmax(scores / 0.1, -1).argmax(-1).eq(0).float().mean()
    log_p, _ = sinkhorn(scores, 0.1, 10)
    sk_share = log_p.argmax(-1).eq(0).float().mean()
    assert soft_share > 0.9
    assert sk_share < 0.3


def test_sinkhorn_token_mask_excludes_padding():
    torch.manual_seed(2)
    scores = 0.1 * torch.randn(1, 12, 2)
    mask = torch.tensor([[True] * 8 + [False] * 4])
    log_p, _ = sinkhorn(scores, 0.1, 50, token_mask=mask)
    P = log_p.exp()[0, :8]
    assert torch.allclose(P.sum(0), torch.full((2,), 4.0), atol=1e-3)
    assert torch.isfinite(log_p).all()
    assert torch.allclose(log_p[:, :8], sinkhorn(scores[:, :8], 0.1, 50)[0], atol=1e-5)


def test_soft_gate_bias_definition():
    torch.manual_seed(3)
    T, K, w = 9, 3, 2
    log_p, _ = sinkhorn(torch.randn(1, T, K), 0.5, 5)
    pos = torch.arange(T)
    bias = soft_gate_bias(log_p, log_p, w, pos, pos, eps=1e-6)
    P = log_p.exp()[0]
    for i, j in itertools.product(range(T), range(T)):
        if j > i:
            assert bias[0, i, j] == float("-inf")
        elif i - j < w:
            assert bias[0, i, j] == 0
        else:
            assert bias[0, i, j] == pytest.approx(math.log(max(float(P[i] @ P[j]), 1e-6)), abs=1e-5)


@pytest.mark.parametrize("off_host", [False, True])
def test_masked_attention_equals_manual_softmax_with_gqa(off_host, monkeypatch):
    """Masked attention with GQA equals the manual softmax, an empty row keeping its diagonal;
    ``off_host``: as off the ``core.HOST_DEVICES`` (a GPU), where that guard runs unconditionally
    (no host sync), with the same result; float bias alike."""
    from focus_lab.method import core
    if off_host:
        monkeypatch.setattr(core, "HOST_DEVICES", ())
    torch.manual_seed(4)
    B, H, Hkv, T, D = 2, 4, 2, 7, 8
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, Hkv, T, D), torch.randn(B, Hkv, T, D)
    mask = torch.rand(B, T, T) > 0.4
    mask[1, 3] = False  # an empty row
    out = masked_attention(q, k, v, mask)
    bias = torch.zeros(B, T, T).masked_fill(~mask, float("-inf"))
    assert torch.allclose(masked_attention(q, k, v, bias), out, atol=1e-6)
    kk, vv = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    logits = (q @ kk.transpose(-1, -2)) / math.sqrt(D)
    full = mask | torch.eye(T, dtype=torch.bool)  # empty rows keep their diagonal
    m = torch.where(mask.any(-1, keepdim=True), mask, full)
    ref = torch.softmax(logits.masked_fill(~m[:, None], float("-inf")), -1) @ vv
    assert torch.allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("field,value", [("num_groups", 0), ("top_k", 5), ("window", 0), ("tau", 0.0),
                                         ("router_dim", 0), ("sinkhorn_iters", 0), ("mode", "fast")])
def test_invalid_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        FocusConfig(**{field: value})


@pytest.mark.parametrize("K,k,w,s,T", [(4, 1, 3, 0, 30), (4, 2, 5, 2, 41), (8, 3, 1, 4, 25), (2, 2, 7, 7, 20)])
def test_distant_pairs_kept_equals_counting_the_mask(K, k, w, s, T):
    torch.manual_seed(T)
    qg, kg = hard_assign(torch.randn(2, T, K), 0.1, k)
    pos = torch.arange(T)
    distant = (pos[:, None] - pos[None, :]) >= w
    m = hard_mask(qg, kg, w, pos, pos, sinks=s)
    want = (m & distant).sum() / (distant.sum() * 2)
    assert distant_pairs_kept(qg, kg, w, s) == pytest.approx(float(want))


def test_shared_small_concepts_against_hand_values():
    from focus_lab.method.core import hard_group_shares, layer_seed, rms_normalize
    # group shares: hand-counted
    kg = torch.tensor([[0, 0, 2, 3], [3, 3, 3, 0]])
    assert hard_group_shares(kg, 4).tolist() == [3 / 8, 0.0, 1 / 8, 4 / 8]
    # RMS normalization: every row has unit root-mean-square, direction unchanged
    h = torch.tensor([[3.0, 4.0], [0.1, -0.1]], dtype=torch.float64)
    n = rms_normalize(h)
    assert n.dtype == torch.float32
    assert torch.allclose(n.pow(2).mean(-1), torch.ones(2), atol=1e-4)
    assert torch.allclose(n[0], torch.tensor([3.0, 4.0]) / (12.5 ** 0.5), atol=1e-5)
    # per-layer seeds: distinct across layers and seeds
    seeds = {layer_seed(s, i) for s in range(3) for i in range(30)}
    assert len(seeds) == 90


@pytest.mark.parametrize("band", [None, 5, 23])
def test_masked_attention_in_key_sliced_chunks_equals_the_manual_softmax(band, monkeypatch):
    """Above ``SDPA_QUERY_CHUNK`` queries on the host, ``masked_attention`` under a bool mask runs
    chunk by chunk on each chunk's span of kept keys: under a causal mask, a sliding window of
    ``band`` keys (Gemma-3's local layers) and a random mask with an empty row, with GQA, it equals
    the manual softmax over the whole (T, T) mask; the chunks did cut the keys (a sliding window
    leaves a chunk far fewer keys than T)."""
    from focus_lab.method import core
    monkeypatch.setattr(core, "SDPA_QUERY_CHUNK", 8)
    torch.manual_seed(5)
    B, H, Hkv, T, D = 2, 4, 1, 61, 8
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, Hkv, T, D), torch.randn(B, Hkv, T, D)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    mask = (j <= i) if band is None else (j <= i) & (j > i - band)
    mask = mask.expand(B, T, T).clone()
    if band == 23:  # and a random mask inside the band, one row empty
        mask &= torch.rand(B, T, T) > 0.3
        mask[1, 40] = False
    spans = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(core.F, "scaled_dot_product_attention",
                        lambda *a, **kw: spans.append(a[1].shape[2]) or real(*a, **kw))
    out = masked_attention(q, k, v, mask)
    assert len(spans) == -(-T // 8)  # one call per chunk of 8 queries
    if band == 5:
        assert max(spans) <= 5 + 8 - 1
    kk, vv = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    logits = (q @ kk.transpose(-1, -2)) / math.sqrt(D)
    m = torch.where(mask.any(-1, keepdim=True), mask, mask | torch.eye(T, dtype=torch.bool))
    ref = torch.softmax(logits.masked_fill(~m[:, None], float("-inf")), -1) @ vv
    assert torch.allclose(out, ref, atol=1e-5)
