"""Patchable hook points (focus_lab.hooks): forced groups, edited masks, added / removed pairs,
router logits and the attention pattern, each against an independent reference (brute-force
masks, dense attention restricted to the mask, softmax over the kept keys), in full forwards
and in generate's decode steps; bad patches; cache() options; the frozen FocusConfig; no import
circle in focus_lab."""

import ast
import dataclasses
import warnings
from pathlib import Path

import pytest
import torch

import focus_lab
from focus_lab import FocusConfig
from focus_lab.hf.hooks import HookError, HookWarning, Pairs
from focus_lab.hf.retrofit import attention_modules, forward_state
from focus_lab.method.core import NO_GROUP, distant_kept_counts, hard_groups
from conftest import tiny_gpt2, tiny_llama

T, W, G = 24, 4, 3


def _ids(seed=0, batch=2, T=T):
    return torch.randint(3, 97, (batch, T), generator=torch.Generator().manual_seed(seed))


def _registered(model):
    return sum(len(m.__dict__.get("_focus_hooks", [])) for _, m in attention_modules(model))


def _model(mode="hard", top_k=1, layers=2, **kw):
    model = tiny_llama(layers=layers)
    focus_lab.attach(model, FocusConfig(window=W, mode=mode, num_groups=G, top_k=top_k, **kw))
    return model


def _hard_rule(qg, kg, Tq, Tk, sinks=0):
    """Brute force: (B, Tq, Tk) bool, query a (position Tk - Tq + a) keeps key j when j <= its
    position and (within the window, a sink, or key j's group among the query's)."""
    B = qg.shape[0]
    out = torch.zeros(B, Tq, Tk, dtype=torch.bool)
    for b in range(B):
        for a in range(Tq):
            i = Tk - Tq + a
            for j in range(i + 1):
                out[b, a, j] = i - j < W or j < sinks or int(kg[b, j]) in qg[b, a].tolist()
    return out


def _reference(q, k, v, mask, scale):
    """Dense attention restricted to ``mask`` (B, Tq, Tk) bool: softmax over the kept keys."""
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    logits = (q @ kk.transpose(-1, -2)) * scale
    return torch.softmax(logits.masked_fill(~mask[:, None], float("-inf")), -1) @ vv


def _scale(model, i):
    return model.model.layers[i].self_attn.scaling


def _forced(kg, hook):
    """Every key into group (position * 2) % G (positions: the call's Tk keys)."""
    pos = torch.arange(kg.shape[1])
    return ((pos * 2 + torch.arange(kg.shape[0])[:, None]) % G).to(kg.dtype).expand_as(kg).contiguous()


POINTS_SEEN = ["query", "key", "value", "query_groups", "key_group", "kept", "attn_out", "pattern"]


@torch.no_grad()
@pytest.mark.parametrize("backend", ["auto", "dense"])
def test_a_forced_key_group_equals_attention_under_the_brute_force_mask_of_those_groups(backend):
    model = _model(backend=backend)
    ids = _ids()
    with focus_lab.hooks(model, {"key_group": _forced}), focus_lab.cache(model, POINTS_SEEN) as c:
        logits = model(input_ids=ids, use_cache=False).logits
    for i in (0, 1):
        kg, qg = c[f"layers.{i}.key_group"], c[f"layers.{i}.query_groups"]
        assert torch.equal(kg, _forced(torch.zeros(2, T, dtype=torch.long), None))
        mask = _hard_rule(qg, kg, T, T)
        assert torch.equal(c[f"layers.{i}.kept"], mask)
        ref = _reference(c[f"layers.{i}.query"], c[f"layers.{i}.key"], c[f"layers.{i}.value"], mask, _scale(model, i))
        assert torch.allclose(c[f"layers.{i}.attn_out"], ref, atol=1e-5)
    plain = model(input_ids=ids, use_cache=False).logits
    assert not torch.allclose(plain, logits)  # the patch changed the forward ...
    assert _registered(model) == 0  # ... and is gone


@torch.no_grad()
def test_forced_groups_hold_in_decode_steps_and_the_cache_keeps_the_patched_groups():
    """generate with key_group forced at every call: each step's incoming key_group already
    holds the patched groups of the earlier tokens (written into the FocusCache), and each
    step's output equals dense attention under the brute-force mask of the step's groups."""
    model = _model()
    ids = _ids(batch=1, T=12)
    incoming = []

    def force(kg, hook):
        if hook.layer_idx == 0:
            incoming.append(kg.clone())
        return _forced(kg, hook)
    with focus_lab.hooks(model, {"key_group": force}), \
            focus_lab.cache(model, ["layers.0.*"], every_call=True) as c:
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == 16 and len(c["layers.0.attn_out"]) == 4
    for step in range(1, 4):
        Tk = 12 + step
        assert torch.equal(incoming[step][:, :Tk - 1], _forced(torch.zeros(1, Tk - 1, dtype=torch.long), None))
        q, k, v = (c[f"layers.0.{p}"][step] for p in ("query", "key", "value"))
        qg, kg = c["layers.0.query_groups"][step], c["layers.0.key_group"][step]
        assert q.shape[2] == 1 and k.shape[2] == Tk
        mask = _hard_rule(qg, kg, 1, Tk)
        assert torch.allclose(c["layers.0.attn_out"][step], _reference(q, k, v, mask, _scale(model, 0)), atol=1e-5)
    # the same generation through full forwards with the same patch: the same tokens
    with focus_lab.hooks(model, {"key_group": _forced}):
        full = model(input_ids=out[:, :15], use_cache=False).logits
    assert torch.equal(full[0, 11:].argmax(-1), out[0, 12:16])


def _no_group(qg, hook):
    """Slot 0 of the queries at positions 0, 3, 6, ..., and every slot of the queries at
    positions 13 and 20, join no group (positions: the call's Tq queries end at its Tk keys)."""
    Tq, Tk = qg.shape[1], hook.call.key.shape[2]
    pos = torch.arange(Tk - Tq, Tk)  # (Tq,)
    out = qg.clone()
    out[:, pos % 3 == 0, 0] = NO_GROUP
    out[:, (pos == 13) | (pos == 20)] = NO_GROUP
    return out


@torch.no_grad()
@pytest.mark.parametrize("backend, top_k", [("auto", 1), ("auto", 2), ("dense", 2)])
def test_a_query_slot_that_joins_no_group_keeps_no_distant_key(backend, top_k):
    """NO_GROUP (-1) in a query slot: the layer attends as dense attention under the brute-force
    mask of the remaining slots, in a full forward and in decode steps; the kept share counts
    only the remaining slots (a brute-force count)."""
    model = _model(backend=backend, top_k=top_k)
    ids = _ids()
    with focus_lab.hooks(model, {"query_groups": _no_group}), focus_lab.cache(model, POINTS_SEEN) as c:
        model(input_ids=ids, use_cache=False)
    for i in (0, 1):
        qg, kg = c[f"layers.{i}.query_groups"], c[f"layers.{i}.key_group"]
        assert (qg[:, 20] == NO_GROUP).all() and (qg[:, ::3, 0] == NO_GROUP).all()
        mask = _hard_rule(qg, kg, T, T)
        assert not mask[:, 20, :20 - W + 1].any()  # query 20: no distant key at all
        assert torch.equal(c[f"layers.{i}.kept"], mask)
        ref = _reference(c[f"layers.{i}.query"], c[f"layers.{i}.key"], c[f"layers.{i}.value"], mask, _scale(model, i))
        assert torch.allclose(c[f"layers.{i}.attn_out"], ref, atol=1e-5)
        distant = torch.ones(T, T).tril(-W).bool()  # (T, T) i - j >= W
        kept, n = distant_kept_counts(qg, kg, W)
        assert n == int(distant.sum()) and torch.equal(kept, (mask & distant).sum((1, 2)))
    ids1 = _ids(batch=1, T=12)  # decode steps: the patch at every call, the group store skips the slot
    with focus_lab.hooks(model, {"query_groups": _no_group}), \
            focus_lab.cache(model, ["layers.0.*"], every_call=True) as c:
        model.generate(ids1, max_new_tokens=4, do_sample=False)
    for step in range(1, 4):  # call 0 is the prompt; steps 1-3 are positions 12-14
        q, k, v = (c[f"layers.0.{p}"][step] for p in ("query", "key", "value"))
        mask = _hard_rule(c["layers.0.query_groups"][step], c["layers.0.key_group"][step], 1, k.shape[2])
        assert (step == 2) <= bool((c["layers.0.query_groups"][step] == NO_GROUP).all())  # 13: no group
        assert torch.allclose(c["layers.0.attn_out"][step], _reference(q, k, v, mask, _scale(model, 0)), atol=1e-5)


@torch.no_grad()
def test_query_groups_and_router_logits_patches_decide_the_groups():
    model = _model(top_k=2)
    ids = _ids()
    # a query_groups patch: every query joins groups (0, 1); the mask follows
    fixed = lambda qg, hook: torch.stack([torch.zeros_like(qg[..., 0]), torch.ones_like(qg[..., 0])], -1)
    with focus_lab.hooks(model, {"query_groups": fixed}), focus_lab.cache(model, POINTS_SEEN) as c:
        model(input_ids=ids, use_cache=False)
    for i in (0, 1):
        mask = _hard_rule(c[f"layers.{i}.query_groups"], c[f"layers.{i}.key_group"], T, T)
        assert (c[f"layers.{i}.query_groups"] == torch.tensor([0, 1])).all()
        assert torch.allclose(c[f"layers.{i}.attn_out"], _reference(c[f"layers.{i}.query"], c[f"layers.{i}.key"],
                              c[f"layers.{i}.value"], mask, _scale(model, i)), atol=1e-5)
    # a router_logits patch: the groups are drawn from the patched logits (hard_groups, independent)
    flip = lambda s, hook: -s
    with focus_lab.hooks(model, {"router_logits": flip}), \
            focus_lab.cache(model, ["router_logits", "query_groups", "key_group"]) as c:
        model(input_ids=ids, use_cache=False)
    cfg = forward_state(model).config
    for i, r in focus_lab.routers(model).items():
        qg, kg = hard_groups(c[f"layers.{i}.router_logits"], cfg, i, r.group_bias)
        assert torch.equal(qg, c[f"layers.{i}.query_groups"]) and torch.equal(kg, c[f"layers.{i}.key_group"])
    with focus_lab.cache(model, ["router_logits"]) as plain:
        model(input_ids=ids, use_cache=False)
    assert torch.allclose(c["layers.0.router_logits"], -plain["layers.0.router_logits"])


@torch.no_grad()
@pytest.mark.parametrize("how", ["pairs", "mask"])
def test_an_added_kept_pair_equals_the_dense_reference_restricted_to_the_new_mask(how):
    """Add one distant pair per row the mask drops (as Pairs, which keeps the decomposition,
    or as an edited mask, which takes the masked reference) and remove one kept distant pair."""
    model = _model()
    ids = _ids()
    with focus_lab.cache(model, ["layers.1.kept"]) as base:
        model(input_ids=ids, use_cache=False)
    kept0 = base["layers.1.kept"]
    dropped = (~kept0 & torch.ones(T, T, dtype=torch.bool).tril()).nonzero()  # (b, i, j) the mask drops
    add = dropped[[0, len(dropped) // 2, -1]]
    distant_kept = (kept0 & torch.ones(T, T, dtype=torch.bool).tril(-W)).nonzero()
    remove = distant_kept[:1] if how == "mask" else None

    def patch(kept, hook):
        if how == "pairs":
            return Pairs(add=add)
        m = kept.clone()
        m[add[:, 0], add[:, 1], add[:, 2]] = True
        m[remove[:, 0], remove[:, 1], remove[:, 2]] = False
        return m
    with focus_lab.hooks(model, {"layers.1.kept": patch}), focus_lab.cache(model, ["layers.1.*"]) as c:
        model(input_ids=ids, use_cache=False)
    want = kept0.clone()
    want[add[:, 0], add[:, 1], add[:, 2]] = True
    if remove is not None:
        want[remove[:, 0], remove[:, 1], remove[:, 2]] = False
    assert torch.equal(c["layers.1.kept"], want)
    ref = _reference(c["layers.1.query"], c["layers.1.key"], c["layers.1.value"], want, _scale(model, 1))
    assert torch.allclose(c["layers.1.attn_out"], ref, atol=1e-5)
    # a pair beyond causality stays hidden (the model's own mask applies)
    future = torch.tensor([[0, 2, 10]])
    with focus_lab.hooks(model, {"layers.1.kept": lambda k, h: Pairs(add=future)}), \
            focus_lab.cache(model, ["layers.1.kept"]) as c2:
        model(input_ids=ids, use_cache=False)
    assert torch.equal(c2["layers.1.kept"], kept0)


@torch.no_grad()
def test_pairs_added_in_decode_steps_equal_the_dense_reference():
    model = _model()
    ids = _ids(batch=1, T=12)

    def add_first(kept, hook):  # each step: keep key 1 (distant, a dropped pair when its group differs)
        return Pairs(add=torch.tensor([[0, kept.shape[1] - 1, 1]]))
    with focus_lab.hooks(model, {"layers.0.kept": add_first}), \
            focus_lab.cache(model, ["layers.0.*"], every_call=True) as c:
        model.generate(ids, max_new_tokens=3, do_sample=False)
    for step in range(1, 3):
        q, k, v = (c[f"layers.0.{p}"][step] for p in ("query", "key", "value"))
        mask = _hard_rule(c["layers.0.query_groups"][step], c["layers.0.key_group"][step], 1, k.shape[2])
        mask[0, 0, 1] = True
        assert torch.equal(c["layers.0.kept"][step], mask)
        assert torch.allclose(c["layers.0.attn_out"][step], _reference(q, k, v, mask, _scale(model, 0)), atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("mode", ["hard", "soft", "dense"])
def test_pattern_is_the_softmax_over_the_kept_keys(mode):
    model = _model(mode=mode, top_k=2)
    ids = _ids()
    with focus_lab.cache(model, ["pattern", "kept", "query", "key", "value", "attn_out"]) as c:
        model(input_ids=ids, use_cache=False)
    for i in (0, 1):
        q, k, kept = c[f"layers.{i}.query"], c[f"layers.{i}.key"], c[f"layers.{i}.kept"]
        p = c[f"layers.{i}.pattern"]
        assert p.shape == (2, 4, T, T) and p.dtype == torch.float32
        kk = k.repeat_interleave(2, 1)
        logits = (q @ kk.transpose(-1, -2)) * _scale(model, i)
        logits = logits.masked_fill(~kept[:, None], float("-inf")) if kept.dtype == torch.bool \
            else logits + kept[:, None]
        assert torch.allclose(p, torch.softmax(logits, -1), atol=1e-6)
        assert torch.allclose(p @ c[f"layers.{i}.value"].repeat_interleave(2, 1), c[f"layers.{i}.attn_out"], atol=1e-5)
    # in decode steps too: one row over every cached key
    if mode == "hard":
        with focus_lab.cache(model, ["layers.1.pattern", "layers.1.kept"], every_call=True) as c:
            model.generate(_ids(batch=1, T=10), max_new_tokens=2, do_sample=False)
        p, kept = c["layers.1.pattern"][1], c["layers.1.kept"][1]
        assert p.shape == (1, 4, 1, 11) and torch.equal(p[0, 0] > 0, kept[0])
        assert torch.allclose(p.sum(-1), torch.ones(1, 4, 1))


def test_attention_pattern_in_query_chunks_equals_one_chunk():
    from focus_lab.hf.attention import attention_pattern
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 40, 8, generator=g), torch.randn(1, 2, 40, 8, generator=g)
    kept = torch.rand(1, 40, 40, generator=g) > 0.5
    kept[0, 3] = False  # a row with no kept key keeps its diagonal
    one = attention_pattern(q, k, kept, 0.3)
    chunked = attention_pattern(q, k, kept, 0.3, chunk_elements=4 * 40 * 3)
    assert torch.allclose(one, chunked, atol=1e-6) and one[0, :, 3, 3].eq(1).all()


@torch.no_grad()
def test_an_unrouted_layer_and_gpt2_take_patches_too():
    model = tiny_gpt2()
    focus_lab.attach(model, FocusConfig(window=W, mode="hard", num_groups=G, top_k=1))
    ids = _ids()
    with focus_lab.hooks(model, {"key_group": _forced}), \
            focus_lab.cache(model, ["query", "key", "value", "query_groups", "key_group", "attn_out"]) as c:
        model(input_ids=ids, use_cache=False)
    for i in (0, 1):
        mask = _hard_rule(c[f"layers.{i}.query_groups"], c[f"layers.{i}.key_group"], T, T)
        ref = _reference(c[f"layers.{i}.query"], c[f"layers.{i}.key"], c[f"layers.{i}.value"], mask,
                         model.transformer.h[i].attn.scaling)
        assert torch.allclose(c[f"layers.{i}.attn_out"], ref, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("point, patch, pattern", [
    ("key_group", lambda x, h: x[:, :-1], r"layers\.1\.key_group \(layer 1\) returned \(2, 23\) torch\.int64, "
                                          r"expected a tensor of shape \(2, 24\) and dtype torch\.int64"),
    ("key_group", lambda x, h: x.int(), r"layers\.1\.key_group .*returned \(2, 24\) torch\.int32, expected"),
    ("key_group", lambda x, h: x + G, r"returned groups in 3\.\.5, expected groups in 0\.\.2"),
    ("key_group", lambda x, h: x - x - 1, r"returned groups in -1\.\.-1, expected groups in 0\.\.2 \(num_groups=3\)"),
    ("query_groups", lambda x, h: x - 2, r"returned groups in -2\.\.0, expected groups in -1\.\.2 \(num_groups=3; -1"),
    ("query_groups", lambda x, h: x.float(), r"layers\.1\.query_groups .*torch\.float32, expected .*\(2, 24, 1\)"),
    ("router_logits", lambda x, h: x[..., :2], r"layers\.1\.router_logits .*\(2, 24, 2\).*expected .*\(2, 24, 3\)"),
    ("kept", lambda x, h: x.float(), r"layers\.1\.kept .*torch\.float32, expected .*torch\.bool \(or "),
    ("kept", lambda x, h: Pairs(add=torch.tensor([[0, 1]])), r"Pairs\.add \(1, 2\) torch\.int64, expected a \(P, 3\)"),
    ("kept", lambda x, h: Pairs(add=torch.tensor([[0, 1, 99]])), r"Pairs\.add outside the call's"),
    ("attn_out", lambda x, h: x[:, :2], r"layers\.1\.attn_out .*expected a tensor of shape \(2, 4, 24, 16\)"),
    ("pattern", lambda x, h: x, r"layers\.1\.pattern \(layer 1\) returned a value, but pattern is read-only"),
])
def test_a_bad_patch_is_one_line_naming_point_layer_expected_and_given_and_every_hook_is_removed(point, patch, pattern):
    model = _model()
    with pytest.raises(HookError, match=pattern) as e:
        with focus_lab.hooks(model, {f"layers.1.{point}": patch, "attn_out": lambda x, h: None}):
            model(input_ids=_ids(), use_cache=False)
    assert "\n" not in str(e.value)
    assert _registered(model) == 0
    model(input_ids=_ids(), use_cache=False)  # the model runs on, unhooked


@torch.no_grad()
def test_a_group_patch_in_soft_mode_says_which_mode_can_take_it():
    model = _model(mode="soft")
    with pytest.raises(HookError, match=r"layers\.0\.key_group \(layer 0\): key_group can be patched in hard mode "
                                        r"only \(soft mode attends through the Sinkhorn probabilities"):
        with focus_lab.hooks(model, {"layers.0.key_group": lambda x, h: x}):
            model(input_ids=_ids(), use_cache=False)
    assert _registered(model) == 0
    # soft mode takes a kept patch: the float bias
    with focus_lab.hooks(model, {"layers.0.kept": lambda x, h: torch.zeros_like(x)}), \
            focus_lab.cache(model, ["layers.0.kept", "layers.0.pattern"]) as c:
        model(input_ids=_ids(), use_cache=False)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.equal(torch.isfinite(c["layers.0.kept"][0]), causal)  # 0 on every causal pair, -inf beyond
    dense = _model(mode="dense")
    with focus_lab.cache(dense, ["layers.0.pattern"]) as d:
        dense(input_ids=_ids(), use_cache=False)
    assert torch.allclose(c["layers.0.pattern"], d["layers.0.pattern"], atol=1e-6)


@torch.no_grad()
def test_a_routing_point_that_never_fires_warns_once_and_scores_is_a_warned_alias():
    model = _model(mode="dense")
    with pytest.warns(HookWarning, match="hook point router_logits never fired: the forwards ran in dense mode"):
        with focus_lab.hooks(model, {"router_logits": lambda x, h: None}):
            model(input_ids=_ids(), use_cache=False)
            model(input_ids=_ids(), use_cache=False)
    with warnings.catch_warnings():  # a block whose point fired in another forward does not warn
        warnings.simplefilter("error", HookWarning)
        with focus_lab.hooks(model, {"key_group": lambda x, h: None}):
            model(input_ids=_ids(), use_cache=False)
            model(input_ids=_ids(), use_cache=False, focus=forward_state(model, mode="hard"))
    import focus_lab.hf.hooks as H
    H._ALIAS_WARNED.discard("scores")
    hard = _model()
    with pytest.warns(DeprecationWarning, match="'scores' is now 'router_logits'"):
        with focus_lab.cache(hard, ["layers.*.scores"]) as c:
            hard(input_ids=_ids(), use_cache=False)
    assert torch.equal(c["layers.0.scores"], c["layers.0.router_logits"])


@torch.no_grad()
def test_cache_takes_a_callable_a_device_heads_and_stacks_over_layers():
    model = _model(layers=3)
    ids = _ids()
    with focus_lab.cache(model, lambda n: n.endswith((".query", ".key", ".attn_out", ".pattern")) and ".2." not in n,
                         device="cpu", heads=[1, 3]) as c:
        model(input_ids=ids, use_cache=False)
    with focus_lab.cache(model, ["query", "key", "attn_out", "pattern", "key_group"]) as full:
        model(input_ids=ids, use_cache=False)
    assert sorted(c) == [f"layers.{i}.{p}" for i in (0, 1) for p in ("attn_out", "key", "pattern", "query")]
    assert c.layers("query") == [0, 1]
    assert torch.equal(c["layers.0.query"], full["layers.0.query"][:, [1, 3]])
    assert torch.equal(c["layers.1.pattern"], full["layers.1.pattern"][:, [1, 3]])
    assert torch.equal(c["layers.1.key"], full["layers.1.key"][:, [0, 1]])  # GQA: heads 1, 3 read kv heads 0, 1
    assert c.stack("attn_out").shape == (2, 2, 2, T, 16)
    assert torch.equal(full.stack("key_group"), torch.stack([full[f"layers.{i}.key_group"] for i in range(3)]))
    with pytest.raises(KeyError, match="nothing cached at point 'kept'"):
        c.stack("kept")
    with focus_lab.cache(model, ["layers.0.query_groups", "query_groups"], every_call=True) as twice:
        model(input_ids=ids, use_cache=False)
    assert len(twice["layers.0.query_groups"]) == 1  # a point named twice is cached once
    assert twice.stack("query_groups", call=-1).shape == (3, 2, T, 1)
    assert _registered(model) == 0


def test_focus_config_is_frozen_and_each_router_reads_its_own_copy():
    cfg = FocusConfig(num_groups=3, top_k=1, layers=[0, 1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.top_k = 2
    new = dataclasses.replace(cfg, top_k=2)
    assert (new.top_k, cfg.top_k) == (2, 1) and new.layers == cfg.layers and new.layers is not cfg.layers
    model = tiny_llama()
    focus_lab.attach(model, cfg)
    rs = focus_lab.routers(model)
    assert all(r.config == cfg and r.config is not cfg and r.config.layers is not cfg.layers for r in rs.values())
    focus_lab.set_config(model, mode="hard")
    assert all(r.config.mode == "soft" for r in rs.values()) and cfg.mode == "soft"


def _module_imports(path: Path, pkg: Path) -> set[str]:
    """The focus_lab modules ``path`` imports (any depth in the file), as dotted names."""
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("focus_lab"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                mods.add(full if (pkg.parent / (full.replace(".", "/") + ".py")).is_file() else node.module)
        elif isinstance(node, ast.Import):
            mods |= {a.name for a in node.names if a.name.startswith("focus_lab")}
    return mods


def test_no_import_circle_in_focus_lab():
    """No module of focus_lab imports, directly or through others, a module that imports it
    (a cycle among files; package __init__ files aside)."""
    pkg = Path(focus_lab.__file__).resolve().parent
    graph = {}
    for path in pkg.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        name = ".".join(path.relative_to(pkg.parent).with_suffix("").parts)
        graph[name] = {m for m in _module_imports(path, pkg) if m != name and not m.endswith("__init__")}
    graph = {n: {m for m in deps if m in graph} for n, deps in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(n, stack):
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m, stack + [m])
        state[n] = 2
    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert cycles == [], cycles  # none, inside functions included (train/loop and train/distill: layerwise)
    assert "focus_lab.hf.retrofit" not in graph["focus_lab.hf.hooks"]


def test_every_row_of_the_transformerlens_table_names_a_test_that_exists():
    """docs/api.md "Against TransformerLens": each row names the test that checks it."""
    import re
    root = Path(__file__).resolve().parent
    text = (root.parent / "docs" / "api.md").read_text()
    section = text.split("### Against TransformerLens", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", section)
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(named) == len(rows) >= 10
    for file, test in named:
        assert re.search(rf"^def {test}\(", (root / file).read_text(), re.M), f"{file}::{test}"


@torch.no_grad()
def test_an_observer_can_turn_the_unfired_warning_off():
    model = _model(mode="dense")
    with warnings.catch_warnings():
        warnings.simplefilter("error", HookWarning)
        with focus_lab.hooks(model, {"key_group": lambda x, h: None}, warn_unfired=False):
            model(input_ids=_ids(), use_cache=False)


@torch.no_grad()
def test_a_recording_counts_a_no_group_slot_in_no_groups_query_share():
    """The balance table's query share of each group under a query_groups patch that empties
    slot 1 of every query: by hand, the count of slot 0's groups over the tokens (the shares sum
    to 1, not top_k = 2)."""
    model = _model(top_k=2)
    ids = _ids()

    def first_only(qg, hook):
        out = qg.clone()
        out[..., 1] = NO_GROUP
        return out
    with focus_lab.hooks(model, {"query_groups": first_only}), focus_lab.cache(model, ["query_groups"]) as c, \
            focus_lab.record(model, metrics=["balance"]) as rec:
        model(input_ids=ids, use_cache=False)
    bal = rec.tables()["balance"]
    for i in (0, 1):
        qg = c[f"layers.{i}.query_groups"]  # (B, T, 2), slot 1 all NO_GROUP
        want = torch.bincount(qg[..., 0].reshape(-1), minlength=G).double() / qg.shape[0] / qg.shape[1]
        got = bal[bal.layer_idx == i].sort_values("group")["query_share"].to_numpy()
        assert (qg[..., 1] == NO_GROUP).all() and got.sum() == pytest.approx(1.0)
        assert got == pytest.approx(want.numpy())
