"""The oracle rule (``focus_lab.patterns.rules.oracle``) against a brute-force reference: each
query keeps its window, its sinks and, among its distant keys, as many as its top-k groups keep,
the ones dense attention (mean over heads) weighs most."""

import pytest
import torch

import focus_lab
from focus_lab.hf.retrofit import attention_modules
from focus_lab.hf.tiny import tiny_gpt2, tiny_llama
from focus_lab.method.config import FocusConfig
from focus_lab.method.core import masked_attention, route
from focus_lab.method.metrics import attention_scale
from focus_lab.patterns import Pattern

W, SINKS, T = 8, 2, 64


def _model(family: str, layers: int = 2):
    m = tiny_llama(layers=layers) if family == "llama" else tiny_gpt2(layers=layers)
    return focus_lab.attach(m, FocusConfig(num_groups=4, window=W, top_k=2, mode="hard", sink_tokens=SINKS))


def brute_oracle(query, key, qg, kg, scale) -> torch.Tensor:
    """(T, T) bool by loops over queries: local | sinks | the n heaviest distant keys, n the
    number of distant keys sharing a group with the query; batch row 0."""
    H, Hkv = query.shape[1], key.shape[1]
    k = key[0].repeat_interleave(H // Hkv, 0)  # (H, T, D)
    out = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        probs = torch.softmax((query[0, :, i, None] @ k[:, : i + 1].transpose(-1, -2))[:, 0] * scale, -1).mean(0)  # (i+1,)
        far = [j for j in range(i + 1) if i - j >= W and j >= SINKS]
        n = sum(int(kg[0, j]) in qg[0, i].tolist() for j in far)
        for j in range(i + 1):
            out[i, j] = i - j < W or j < SINKS
        for j in sorted(far, key=lambda j: (-float(probs[j]), j))[:n]:
            out[i, j] = True
    return out


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_oracle_keeps_the_heaviest_distant_keys_at_the_groups_budget(family):
    m = _model(family)
    ids = torch.randint(3, 90, (1, T), generator=torch.Generator().manual_seed(1))
    top2 = focus_lab.forward_state(m, **Pattern.parse("hard_top2").changes())
    oracle = focus_lab.forward_state(m, **Pattern.parse("hard_top2+oracle").changes())
    with torch.no_grad():
        plain = m(input_ids=ids, focus=top2).logits
        with focus_lab.cache(m, ["router_in", "query", "key", "kept"]) as c:
            got = m(input_ids=ids, focus=oracle).logits
        masks = {}
        for _, mod in attention_modules(m):
            i = mod.focus_router.layer_idx
            r = route(mod.focus_router, c[f"layers.{i}.router_in"], config=top2.config)  # the groups set the budget
            q = c[f"layers.{i}.query"]
            masks[i] = brute_oracle(q, c[f"layers.{i}.key"], r.query_groups, r.key_group, attention_scale(mod, q.shape[-1]))
            assert torch.equal(c[f"layers.{i}.kept"][0], masks[i])  # the mask the layer attended with

        def patch(out, hook):  # every layer recomputed under the brute-force mask
            h = hook.call
            return masked_attention(h.query, h.key, h.value, masks[hook.layer_idx][None],
                                    attention_scale(h.module, h.query.shape[-1]))
        with focus_lab.hooks(m, {"attn_out": patch}):
            want = m(input_ids=ids, focus=focus_lab.forward_state(m, mode="dense")).logits
    assert (got - want).abs().max().item() <= 1e-4
    assert (got - plain).abs().max().item() > 1e-3  # other distant keys than the groups'


def test_oracle_keeps_as_many_distant_pairs_as_the_groups():
    """One layer: its groups, hence each query's budget, are those of the pattern without the
    oracle (in deeper layers the inputs, so the groups, differ from the first changed layer on)."""
    from focus_lab.eval.evaluate import evaluate
    m = _model("llama", layers=1)
    ids = torch.randint(3, 90, (1, T), generator=torch.Generator().manual_seed(2))

    class Window:
        input_ids, index = ids[0], 0
    pats = [(s, Pattern.parse(s).changes()) for s in ("hard_top1", "hard_top1+oracle", "hard_top2", "hard_top2+oracle")]
    df = evaluate(m, [Window()], pats, progress=False).set_index("label")
    for k in (1, 2):
        assert df.loc[f"hard_top{k}+oracle", "distant_pairs_kept"] == pytest.approx(df.loc[f"hard_top{k}", "distant_pairs_kept"])
        assert df.loc[f"hard_top{k}+oracle", "canonical_pattern"] == f"hard_top{k}+oracle"
    assert df.loc["hard_top1", "distant_pairs_kept"] < df.loc["hard_top2", "distant_pairs_kept"]


def test_oracle_through_a_kv_cache_equals_the_full_forward():
    from transformers import DynamicCache
    m = _model("llama")
    ids = torch.randint(3, 90, (1, 40), generator=torch.Generator().manual_seed(3))
    changes = Pattern.parse("hard_top2+oracle").changes()
    with torch.no_grad():
        full = m(input_ids=ids, focus=focus_lab.forward_state(m, **changes)).logits
        st = focus_lab.forward_state(m, cache=True, **changes)
        cache = DynamicCache(config=m.config)
        parts = [m(input_ids=ids[:, :30], past_key_values=cache, use_cache=True, focus=st).logits]
        for t in range(30, 40):
            parts.append(m(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True, focus=st).logits)
    assert (torch.cat(parts, 1) - full).abs().max().item() <= 1e-4


def test_oracle_spelling_and_bounds():
    p = Pattern.parse("hard_top2+oracle")
    assert str(p) == "hard_top2+oracle" and Pattern.parse(str(p)) == p
    assert p.changes()["rules"] == ("oracle",)
    cfg = FocusConfig(num_groups=4).replace(**p.changes())
    assert Pattern.from_config(cfg) == p  # the config holds the rule by its spelling
    assert FocusConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(focus_lab.ConfigError, match="oracle.*does not apply in soft mode"):
        Pattern.parse("soft+oracle")
    with pytest.raises(focus_lab.ConfigError, match="takes no arguments"):
        Pattern.parse("hard_top2+oracle(3)")


def test_a_router_file_can_carry_a_rule_without_fields():
    """``routers set-rules``: a rule that owns no field is saved in the file's FocusConfig.rules and
    comes back in its named patterns (for every k) and through the saved JSON."""
    from focus_lab.hf.router_files import rules_config
    cfg = rules_config(FocusConfig(num_groups=4), Pattern.parse("hard_top2+oracle+capacity(0.5)"))
    assert cfg.rules == ("oracle",) and cfg.to_dict()["rules"] == ["oracle"]
    back = FocusConfig.from_json(cfg.to_json())
    assert str(Pattern.parse("default", back)) == "hard_top2+capacity(0.5)+oracle"
    assert str(Pattern.parse("default_top1", back)) == "hard_top1+oracle"
    assert str(Pattern.parse("hard_top2", back)) == "hard_top2"  # a bare name: the paper's rule, whatever the file
