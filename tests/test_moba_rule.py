"""The rule ``moba`` (MoBA's block gate at the groups' budget, query by query) against a
brute-force mask built by loops."""

import pytest
import torch

import focus_lab
from focus_lab.hf.retrofit import attention_modules
from focus_lab.hf.tiny import tiny_llama
from focus_lab.method.config import FocusConfig
from focus_lab.method.core import route
from focus_lab.method.metrics import attention_scale
from focus_lab.patterns import Pattern

W, SINKS, T, BLOCK = 8, 2, 64, 4


def brute_moba(query, key, qg, kg, scale, block) -> torch.Tensor:
    """(T, T) bool: local | sinks | for query i, its distant keys ranked by their block's gate
    score (mean over heads of q_i . mean key of the block), ties to the earlier key, the first n
    kept, n the distant keys sharing a group with i."""
    H, Hkv = query.shape[1], key.shape[1]
    k = key[0].repeat_interleave(H // Hkv, 0)  # (H, T, D)
    nb = (T + block - 1) // block
    means = torch.stack([k[:, b * block:(b + 1) * block].mean(1) for b in range(nb)], 1)  # (H, nb, D)
    out = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        gate = [float((query[0, :, i] * means[:, b]).sum(-1).mean() * scale) for b in range(nb)]
        far = [j for j in range(i + 1) if i - j >= W and j >= SINKS]
        n = sum(int(kg[0, j]) in qg[0, i].tolist() for j in far)
        for j in range(i + 1):
            out[i, j] = i - j < W or j < SINKS
        for j in sorted(far, key=lambda j: (-gate[j // block], j))[:n]:
            out[i, j] = True
    return out


@pytest.mark.parametrize("k", [1, 2])
def test_moba_keeps_the_gates_best_blocks_at_the_groups_budget(k):
    m = focus_lab.attach(tiny_llama(layers=2), FocusConfig(num_groups=4, window=W, top_k=k, mode="hard",
                                                           sink_tokens=SINKS))
    ids = torch.randint(3, 90, (1, T), generator=torch.Generator().manual_seed(5))
    plain = focus_lab.forward_state(m, **Pattern.parse(f"hard_top{k}").changes())
    gate = focus_lab.forward_state(m, **Pattern.parse(f"hard_top{k}+moba(block={BLOCK})").changes())
    with torch.no_grad():
        with focus_lab.cache(m, ["router_in", "query", "key", "kept"]) as c:
            m(input_ids=ids, focus=gate)
        for _, mod in attention_modules(m):
            i = mod.focus_router.layer_idx
            r = route(mod.focus_router, c[f"layers.{i}.router_in"], config=plain.config)
            q = c[f"layers.{i}.query"]
            want = brute_moba(q, c[f"layers.{i}.key"], r.query_groups, r.key_group, attention_scale(mod, q.shape[-1]),
                              BLOCK)
            assert torch.equal(c[f"layers.{i}.kept"][0], want), i


def test_moba_spelling_and_bounds():
    p = Pattern.parse("hard_top2+moba(block=64)")
    assert str(p) == "hard_top2+moba(block=64)" and Pattern.parse(str(p)) == p
    assert str(Pattern.parse("random_top2+moba")) == "random_top2+moba"
    with pytest.raises(focus_lab.ConfigError, match="moba.*one block size"):
        Pattern.parse("hard_top2+moba(1,2)")
    m = focus_lab.attach(tiny_llama(layers=1), FocusConfig(num_groups=4, window=W, mode="hard"))
    with pytest.raises(ValueError, match="block=16 exceeds the window"):
        with torch.no_grad():
            m(input_ids=torch.arange(3, 40)[None],
              focus=focus_lab.forward_state(m, **Pattern.parse("hard_top2+moba(block=16)").changes()))
