"""FocusConfig.key_shift: each key lives in the top-1 group of the token before it (docs/method.md §1.7).

Every check is against an independent computation: the groups by brute force from
``h @ W @ C.T``, the mask by brute force from them, the soft gate from the Sinkhorn
probabilities shifted by hand, the KV-cache decode and the two-call decomposition against the
full forward through the masked reference."""

import pytest
import torch

import focus_lab
from focus_lab import FocusConfig
from focus_lab.patterns.legacy import legacy_changes as pattern_changes  # the committed tables' labels
from focus_lab.method.config import ConfigError
from focus_lab.method.core import rms_normalize, sinkhorn
from conftest import cached_logits, random_ids, soft_forward_layers, soft_gate_reference, tiny_llama

T = 40  # tokens
W = 4  # window
_ids = random_ids


def _model(seed=0, **changes):
    model = tiny_llama(layers=2)
    cfg = FocusConfig(**{"mode": "hard", "window": W, "num_groups": 3, "top_k": 1, "key_shift": 1, **changes})
    focus_lab.attach(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for r in focus_lab.routers(model).values():
            r.group_bias.copy_(torch.randn(3, generator=g))
    return model


@pytest.mark.parametrize("top_k,sinks", [(1, 0), (2, 3)])
@torch.no_grad()
def test_a_key_takes_its_predecessors_group_and_the_mask_follows(top_k, sinks):
    model = _model(top_k=top_k, sink_tokens=sinks)
    cfg = focus_lab.focus_config(model)
    ids = _ids()
    with focus_lab.cache(model, ["router_in", "query_groups", "key_group", "kept"]) as c:
        model(input_ids=ids, use_cache=False)
    for i, r in focus_lab.routers(model).items():
        h = rms_normalize(c[f"layers.{i}.router_in"])  # (B, T, d)
        a = (h @ r.proj @ r.centroids.T) / cfg.tau + r.group_bias  # (B, T, K)
        own = a.argmax(-1)  # (B, T)
        qg, kg = c[f"layers.{i}.query_groups"], c[f"layers.{i}.key_group"]
        assert torch.equal(qg, a.topk(top_k, -1).indices)
        assert torch.equal(kg[:, 1:], own[:, :-1]) and torch.equal(kg[:, 0], own[:, 0])
        kept = c[f"layers.{i}.kept"]
        for b in range(2):
            for q in range(T):
                for j in range(T):
                    g_key = int(own[b, max(j - 1, 0)])
                    want = j <= q and (q - j < W or j < sinks or g_key in qg[b, q].tolist())
                    assert bool(kept[b, q, j]) == want, (i, b, q, j)


@pytest.mark.parametrize("top_k", [1, 2])
@torch.no_grad()
def test_two_call_path_and_kv_cache_decode_equal_the_masked_reference(top_k):
    model = _model(top_k=top_k, sink_tokens=2)
    ids = _ids(4, batch=1, T=48)
    ref = model(ids, focus=focus_lab.forward_state(model, backend="dense")).logits
    assert (model(ids).logits - ref).abs().max().item() <= 1e-5
    # without the shift the outputs differ: the test sees the rule
    assert (model(ids, focus=focus_lab.forward_state(model, key_shift=0)).logits - ref).abs().max().item() > 1e-3
    assert (cached_logits(model, ids, [30, 37]) - ref).abs().max().item() <= 1e-5


@torch.no_grad()
def test_soft_gate_pairs_a_query_with_its_keys_predecessor():
    cfg, layers = soft_forward_layers(_model(), _ids(3, batch=1))
    for r, h, kept in layers:
        p = sinkhorn(h @ r.proj @ r.centroids.T, cfg.tau, cfg.sinkhorn_iters)[0].exp()  # (1, T, K)
        p_k = torch.cat([p[:, :1], p[:, :-1]], 1)  # key j: token j - 1's probabilities
        assert torch.allclose(kept, soft_gate_reference(p, p_k, W, cfg.eps, cfg.sink_tokens), atol=1e-5)


def test_bad_key_shift_and_the_pattern_suffix():
    with pytest.raises(ConfigError, match="key_shift"):
        FocusConfig(key_shift=2)
    with pytest.raises(ConfigError, match="key_shift"):
        FocusConfig(key_shift=True)
    assert pattern_changes("hard_top2_keyshift", 4) == {"mode": "hard", "top_k": 2, "assignment": "router", "key_shift": 1}
    assert pattern_changes("random_top1_uniform_match_nokeyshift", 4)["key_shift"] == 0
    assert pattern_changes("hard_top1_match_keyshift", 4)["match_shifts"] == [0, 1]
    with pytest.raises(ConfigError, match="keyshift"):
        pattern_changes("hard_keyshift", 4)


def test_slot_one_under_key_shift_runs_as_causal_squares():
    """The keys of a group are the successors of its queries, so each segment is a causal
    square once its first query (which sees no key of its group) is dropped: the fast path."""
    from focus_lab.method.decomposition import plan_segments
    own = torch.randint(0, 4, (1, 200), generator=torch.Generator().manual_seed(7))  # (1, T)
    kg = torch.cat([own[:, :1], own[:, :-1]], 1)  # key j in token j - 1's group
    segs = plan_segments(own[..., None], kg)
    assert len(segs) == 4 and all(s.kind == "causal" for s in segs)
    got = {(int(qi), int(kj)) for s in segs for m, qi in enumerate(s.q_idx) for kj in s.k_idx[:m + 1]}
    want = {(i, j) for i in range(200) for j in range(i + 1) if kg[0, j] == own[0, i]}
    assert got == want
