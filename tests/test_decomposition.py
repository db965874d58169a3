"""Exactness of hard Focus as two attention calls + LSE merge (focus_lab.method.decomposition, docs/method.md §4).

The reference is the ONE definition of the mask: ``core.masked_attention(q, k, v,
core.hard_mask(...))``. Every backend present on this machine is checked (``available_backends``:
the CPU flash kernel here; flash-attn only with a GPU).
"""

from __future__ import annotations

import contextlib
import functools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from focus_lab.method.core import hard_mask
from focus_lab.method.decomposition import (GroupedKV, available_backends, hard_focus_attention,
                                            plan_segments, reference_hard_attention)

BACKENDS = available_backends("cpu")
TOL = 1e-5
PATTERNS = ("router", "all_same", "empty_groups", "single_token", "arbitrary")

_worst = {"err": 0.0, "cases": 0}


def _check_against_reference(out, q, k, v, qg, kg, c, what=""):
    """Assert ``out`` equals the dense masked reference within TOL; record the sweep's worst error."""
    ref = reference_hard_attention(q, k, v, qg, kg, c["window"], sinks=c["sinks"])
    err = (out - ref).abs().max().item()
    _worst["err"] = max(_worst["err"], err)
    _worst["cases"] += 1
    assert err <= TOL, f"max abs error {err:.2e} > {TOL} for {c}{what}"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny problems: one thread avoids OpenMP barrier stalls on a shared 2-core machine
    (the sweep runs ~3x faster); restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_groups(gen: torch.Generator, B: int, T: int, K: int, k: int, pattern: str):
    """(query_groups (B, T, k), key_group (B, T)) for one group pattern.

    router: top-k of random scores (hard_assign's shape: distinct, key = top-1); all_same: every
    key in group 0; empty_groups: only even groups have keys; single_token: groups >= 1 hold one
    key each, the rest in group 0; arbitrary: independent random query groups, repeats allowed
    and key_group unrelated to the top-1 (the mask only needs ``g(j) in G(i)``).
    """
    if pattern == "arbitrary":
        return (torch.randint(0, K, (B, T, k), generator=gen), torch.randint(0, K, (B, T), generator=gen))
    scores = torch.randn(B, T, K, generator=gen)
    if pattern == "all_same":
        kg = torch.zeros(B, T, dtype=torch.long)
    elif pattern == "empty_groups":
        kg = 2 * torch.randint(0, (K + 1) // 2, (B, T), generator=gen)
    elif pattern == "single_token":
        kg = torch.zeros(B, T, dtype=torch.long)
        for b in range(B):
            pos = torch.randperm(T, generator=gen)[:K - 1]
            kg[b, pos] = torch.arange(1, len(pos) + 1)
    else:
        kg = None
    if kg is not None:  # force the key group to be each query's top-1
        scores.scatter_(2, kg[..., None], 1e4)
    qg = scores.topk(k, dim=-1).indices
    return qg, qg[..., 0]


def rand_qkv(gen, B, H, Hkv, Tq, Tk, D, dtype=torch.float32):
    q = torch.randn(B, H, Tq, D, generator=gen, dtype=dtype)
    k = torch.randn(B, Hkv, Tk, D, generator=gen, dtype=dtype)
    v = torch.randn(B, Hkv, Tk, D, generator=gen, dtype=dtype)
    return q, k, v


@st.composite
def cases(draw):
    B = draw(st.integers(1, 2))
    H, Hkv = draw(st.sampled_from([(2, 2), (4, 2)]))
    T = draw(st.integers(1, 200))
    D = draw(st.sampled_from([8, 16]))
    K = draw(st.integers(1, 8))
    k = draw(st.integers(1, K))
    window = draw(st.integers(1, 64))
    pattern = draw(st.sampled_from(PATTERNS))
    # a third of the cases are KV-cache steps: only the last Tq tokens query
    Tq = draw(st.one_of(st.just(T), st.integers(1, T)))
    sinks = draw(st.sampled_from([0, 0, 0, 1, 4]))
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(B=B, H=H, Hkv=Hkv, T=T, Tq=Tq, D=D, K=K, k=k, window=window, pattern=pattern,
                sinks=sinks, seed=seed)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=cases())
def test_equals_dense_reference(backend, c):
    gen = torch.Generator().manual_seed(c["seed"])
    qg, kg = make_groups(gen, c["B"], c["T"], c["K"], c["k"], c["pattern"])
    q, k, v = rand_qkv(gen, c["B"], c["H"], c["Hkv"], c["Tq"], c["T"], c["D"])
    qg = qg[:, c["T"] - c["Tq"]:]
    out, lse = hard_focus_attention(q, k, v, qg, kg, c["window"], backend=backend, return_lse=True,
                                    sinks=c["sinks"])
    ref = reference_hard_attention(q, k, v, qg, kg, c["window"], sinks=c["sinks"])
    err = (out - ref).abs().max().item()
    _worst["err"] = max(_worst["err"], err)
    _worst["cases"] += 1
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert err <= TOL, f"max abs error {err:.2e} > {TOL} for {c}"
    # the returned lse is the logsumexp of the kept scaled logits
    q_pos = torch.arange(c["T"] - c["Tq"], c["T"])
    mask = hard_mask(qg, kg, c["window"], q_pos, torch.arange(c["T"]), c["sinks"])  # (B, Tq, Tk)
    g = c["H"] // c["Hkv"]
    s = q @ k.repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(c["D"])
    ref_lse = s.masked_fill(~mask[:, None], float("-inf")).logsumexp(-1)
    assert (lse - ref_lse).abs().max().item() <= 1e-4


@pytest.mark.parametrize("Tq,gpu_path", [(1, False), (3, False), (16, False), (1, True)])
def test_kv_cache_step_equals_reference_and_ignores_dropped_keys(Tq, gpu_path, monkeypatch):
    """A decode step against a long cache (Tq <= FEW_QUERIES < Tk, gathered kept keys; with
    ``gpu_path`` the one-token step a GPU takes, one call under the mask row, ``_one_query``)
    equals the dense masked reference, batch rows with different groups; and changing the keys
    and values the mask drops (other groups, far, not sinks) does not change it: NaN values
    where the keys are gathered, large finite ones where the step reads the whole cache."""
    if gpu_path:
        from focus_lab.method import core
        monkeypatch.setattr(core, "HOST_DEVICES", ())
    gen = torch.Generator().manual_seed(Tq)
    B, H, Hkv, T, D, K, k, w, sinks = 2, 4, 2, 700, 16, 4, 2, 128, 64
    qg, kg = make_groups(gen, B, T, K, k, "router")
    qg = qg[:, T - Tq:]
    q, key, v = rand_qkv(gen, B, H, Hkv, Tq, T, D)
    out, lse = hard_focus_attention(q, key, v, qg, kg, w, sinks=sinks, return_lse=True)
    c = {"window": w, "sinks": sinks}
    _check_against_reference(out, q, key, v, qg, kg, c, " (KV-cache step)")
    mask = hard_mask(qg, kg, w, torch.arange(T - Tq, T), torch.arange(T), sinks)  # (B, Tq, T)
    s = q @ key.repeat_interleave(H // Hkv, 1).transpose(-1, -2) / math.sqrt(D)
    assert (lse - s.masked_fill(~mask[:, None], float("-inf")).logsumexp(-1)).abs().max() <= 1e-4
    # every query of the step in groups 0 and 1: keys of groups 2, 3 outside window and sinks are dropped
    qg01 = torch.tensor([0, 1]).expand(B, Tq, 2)
    out01 = hard_focus_attention(q, key, v, qg01, kg, w, sinks=sinks)
    _check_against_reference(out01, q, key, v, qg01, kg, c, " (KV-cache step, groups 0 and 1)")
    dropped = ~hard_mask(qg01, kg, w, torch.arange(T - Tq, T), torch.arange(T), sinks).any(1)  # (B, T)
    assert dropped.sum() > T // 4
    key2, v2 = key.clone(), v.clone()
    key2.masked_fill_(dropped[:, None, :, None], 1e3)
    v2.masked_fill_(dropped[:, None, :, None], 1e4 if gpu_path else float("nan"))
    assert torch.equal(hard_focus_attention(q, key2, v2, qg01, kg, w, sinks=sinks), out01)


@pytest.mark.parametrize("B,k,w,sinks", [(1, 1, 8, 0), (1, 2, 8, 4), (2, 2, 5, 3), (1, 3, 6, 40), (2, 1, 1, 0)])
def test_grouped_decode_steps_equal_reference(B, k, w, sinks):
    """Token-by-token decode through a GroupedKV store (slices of group-ordered keys, merged by
    LSE) equals the dense masked reference at every step: from the first step (built from the
    cache) through appends, groups seen for the first time mid-decode, repeated query groups,
    sinks that overlap the window (sinks=40 > early positions), and a KV cache replaced
    mid-decode (the store notices the changed keys and rebuilds)."""
    gen = torch.Generator().manual_seed(100 * B + 10 * k + w)
    H, Hkv, T, D, K, t0 = 6, 3, 90, 16, 5, 12
    q, key, v = rand_qkv(gen, B, H, Hkv, T, T, D)
    kg = torch.randint(0, K, (B, T), generator=gen)
    kg[:, :t0 + 20] = kg[:, :t0 + 20].clamp(max=K - 2)  # group K - 1 first appears mid-decode
    qg = torch.randint(0, K, (B, T, k), generator=gen)
    qg[:, 50, -1] = qg[:, 50, 0]  # a repeated group counts once
    ref, ref_lse = reference_hard_attention(q, key, v, qg, kg, w, sinks=sinks), None
    store, worst = GroupedKV(), 0.0
    for t in range(t0, T):
        if t == 60:  # another sequence's cache from here on: the store must rebuild, not append
            key = key.clone()
            key[:, :, :t] += 0.5
            ref = reference_hard_attention(q, key, v, qg, kg, w, sinks=sinks)
        out, lse = hard_focus_attention(q[:, :, t:t + 1], key[:, :, :t + 1], v[:, :, :t + 1], qg[:, t:t + 1],
                                        kg[:, :t + 1], w, sinks=sinks, return_lse=True, grouped=store)
        worst = max(worst, (out - ref[:, :, t:t + 1]).abs().max().item())
        mask = hard_mask(qg[:, t:t + 1], kg[:, :t + 1], w, torch.tensor([t]), torch.arange(t + 1), sinks)
        s = q[:, :, t:t + 1] @ key[:, :, :t + 1].repeat_interleave(H // Hkv, 1).transpose(-1, -2) / math.sqrt(D)
        assert (lse - s.masked_fill(~mask[:, None], float("-inf")).logsumexp(-1)).abs().max() <= 1e-4
        assert store.seen == t + 1
    assert worst <= TOL, f"max abs error {worst:.2e}"
    held = sum(len(e[2]) for row in store.rows for e in row.values())
    assert held == B * T  # every token in exactly one group's buffer


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30, deadline=None)
@given(c=cases(), cut=st.floats(0.0, 1.0))
def test_causal(backend, c, cut):
    """Changing the q/k/v and groups of tokens at positions >= t0 never changes earlier outputs."""
    if c["Tq"] != c["T"]:
        c["Tq"] = c["T"]
    T = c["T"]
    t0 = int(cut * T)
    gen = torch.Generator().manual_seed(c["seed"])
    qg, kg = make_groups(gen, c["B"], T, c["K"], c["k"], c["pattern"])
    q, k, v = rand_qkv(gen, c["B"], c["H"], c["Hkv"], T, T, c["D"])
    out = hard_focus_attention(q, k, v, qg, kg, c["window"], backend=backend, sinks=c["sinks"])
    qg2, kg2 = make_groups(gen, c["B"], T, c["K"], c["k"], c["pattern"])
    q2, k2, v2 = rand_qkv(gen, c["B"], c["H"], c["Hkv"], T, T, c["D"])
    qg2[:, :t0], kg2[:, :t0] = qg[:, :t0], kg[:, :t0]
    q2[:, :, :t0], k2[:, :, :t0], v2[:, :, :t0] = q[:, :, :t0], k[:, :, :t0], v[:, :, :t0]
    out2 = hard_focus_attention(q2, k2, v2, qg2, kg2, c["window"], backend=backend, sinks=c["sinks"])
    assert torch.allclose(out[:, :, :t0], out2[:, :, :t0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=cases(), chunk=st.sampled_from([1, 3, 8, 32]))
def test_stair_segments_in_many_chunks_equal_reference(backend, c, chunk):
    """Stair segments (top-k > 1 slots, KV-cache steps) go per segment in query chunks: an
    unmasked call on the chunk's common key prefix + a masked one on the rest, merged by LSE.
    The sweep's sizes fit one chunk of the default size, so small chunks are forced here."""
    import focus_lab.method.decomposition as dm

    c["k"] = max(c["k"], min(2, c["K"]))  # slot 2 exists whenever K >= 2
    gen = torch.Generator().manual_seed(c["seed"])
    qg, kg = make_groups(gen, c["B"], c["T"], c["K"], c["k"], c["pattern"])
    q, k, v = rand_qkv(gen, c["B"], c["H"], c["Hkv"], c["Tq"], c["T"], c["D"])
    qg = qg[:, c["T"] - c["Tq"]:]
    out = hard_focus_attention(q, k, v, qg, kg, c["window"], backend=backend, sinks=c["sinks"],
                               options=dm.DecompositionOptions(stair_chunk=chunk))
    _check_against_reference(out, q, k, v, qg, kg, c, f", chunk {chunk}")


@settings(max_examples=40, deadline=None)
@given(c=cases())
def test_math_path_equals_reference(c):
    """The device-generic math primitive (the "torch" backend off CPU, e.g. a GPU without
    flash-attn) through the whole decomposition, with tiny score chunks."""
    import focus_lab.method.decomposition as dm

    gen = torch.Generator().manual_seed(c["seed"])
    qg, kg = make_groups(gen, c["B"], c["T"], c["K"], c["k"], c["pattern"])
    q, k, v = rand_qkv(gen, c["B"], c["H"], c["Hkv"], c["Tq"], c["T"], c["D"])
    qg = qg[:, c["T"] - c["Tq"]:]
    orig = dm._attn_lse
    dm._attn_lse = lambda q, k, v, scale, causal=False, allowed=None, call=None: dm._math_attn_lse(
        q, k, v, allowed, scale, causal, max_scores=4096)
    try:
        out = dm.hard_focus_attention(q, k, v, qg, kg, c["window"], sinks=c["sinks"])
    finally:
        dm._attn_lse = orig
    _check_against_reference(out, q, k, v, qg, kg, c)


def test_report_worst_error():
    """Prints the sweep's size and worst error (run with -s); runs after the sweep in file order."""
    print(f"\nexactness sweep: {_worst['cases']} cases, worst max abs error {_worst['err']:.2e}")
    assert _worst["err"] <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_shapes_one_long_case(backend):
    """SmolLM2-135M's heads (9 query, 3 kv, head_dim 64), K = 8, k = 2, w = 128, 1000 tokens."""
    gen = torch.Generator().manual_seed(1)
    qg, kg = make_groups(gen, 1, 1000, 8, 2, "router")
    q, k, v = rand_qkv(gen, 1, 9, 3, 1000, 1000, 64)
    out = hard_focus_attention(q, k, v, qg, kg, 128, backend=backend)
    ref = reference_hard_attention(q, k, v, qg, kg, 128)
    assert (out - ref).abs().max().item() <= TOL


def test_transformers_layout_and_scaling():
    """(B, T, H, D)-memory inputs (what transformers passes) and an explicit scale."""
    gen = torch.Generator().manual_seed(2)
    qg, kg = make_groups(gen, 2, 77, 4, 1, "router")
    q = torch.randn(2, 77, 4, 16, generator=gen).transpose(1, 2)
    k = torch.randn(2, 77, 2, 16, generator=gen).transpose(1, 2)
    v = torch.randn(2, 77, 2, 16, generator=gen).transpose(1, 2)
    out = hard_focus_attention(q, k, v, qg, kg, 8, scaling=0.3)
    ref = reference_hard_attention(q, k, v, qg, kg, 8, scaling=0.3)
    assert (out - ref).abs().max().item() <= TOL


def test_bfloat16_runs_and_is_close():
    gen = torch.Generator().manual_seed(3)
    qg, kg = make_groups(gen, 1, 150, 4, 2, "router")
    q, k, v = rand_qkv(gen, 1, 4, 2, 150, 150, 16)
    out = hard_focus_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), qg, kg, 16)
    ref = reference_hard_attention(q, k, v, qg, kg, 16)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max().item() < 3e-2


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_model_cast_to_bfloat16_after_attach_runs_hard_mode(family):
    """A model cast to bf16 after ``attach`` (its routers too) routes in fp32 and runs hard
    mode: the decomposition's logits agree with the dense masked reference path's in bf16
    (same routers, same rounding of the model's weights)."""
    from focus_lab.hf.retrofit import set_config
    m = _attached(family, sink_tokens=2).to(torch.bfloat16)
    ids = torch.randint(3, 97, (2, 120), generator=torch.Generator().manual_seed(1))
    router = next(mod for mod in m.modules() if type(mod).__name__ == "Router")
    assert router.proj.dtype == torch.bfloat16
    h = torch.randn(1, 5, router.proj.shape[0], dtype=torch.bfloat16)
    assert router(h).dtype == torch.float32
    with torch.no_grad():
        fast = m(ids).logits.float()
        set_config(m, backend="dense")
        dense = m(ids).logits.float()
    assert torch.isfinite(fast).all()
    assert (fast - dense).abs().max().item() <= 0.05


def test_plan_counts_each_pair_once():
    """Part A's segments hold exactly the same-group causal pairs, each once."""
    gen = torch.Generator().manual_seed(4)
    qg, kg = make_groups(gen, 2, 60, 5, 3, "router")
    pairs = torch.zeros(2, 60, 60, dtype=torch.long)
    for sg in plan_segments(qg, kg):
        for m, qi in enumerate(sg.q_idx.tolist()):
            n = m + 1 if sg.counts is None else int(sg.counts[m])
            pairs[sg.b, qi, sg.k_idx[:n]] += 1
    pos = torch.arange(60)
    same = (qg[:, :, :, None] == kg[:, None, None, :]).any(2) & (pos[None, :] <= pos[:, None])
    assert torch.equal(pairs, same.long())


def test_errors():
    q, k, v = torch.randn(1, 4, 10, 8), torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    g = torch.zeros(1, 10, dtype=torch.long)
    with pytest.raises(ValueError, match="backend"):
        hard_focus_attention(q, k, v, g[..., None], g, 4, backend="nope")
    with pytest.raises(ValueError, match="flash"):
        hard_focus_attention(q, k, v, g[..., None], g, 4, backend="flash")  # no GPU / fp32
    with pytest.raises(ValueError, match="window"):
        hard_focus_attention(q, k, v, g[..., None], g, 0)
    with pytest.raises(ValueError, match=">= 0"):  # -1 (NO_GROUP) is a query slot's only negative
        hard_focus_attention(q, k, v, g[..., None] - 2, g, 4)
    with pytest.raises(ValueError, match=">= 0"):  # a key always lives in a group
        hard_focus_attention(q, k, v, g[..., None], g - 1, 4)
    with pytest.raises(ValueError, match="query_groups"):
        hard_focus_attention(q, k, v, g[:, :5, None], g, 4)
    with pytest.raises(ValueError, match="incompatible"):
        hard_focus_attention(q, torch.randn(1, 3, 10, 8), torch.randn(1, 3, 10, 8), g[..., None], g, 4)
    with pytest.raises(ValueError, match="long"):
        hard_focus_attention(q, k, v, g[..., None].int(), g, 4)


# --------------------------------------------------------------------------------------------
# the retrofit uses it (mode="hard"), and generation with a KV cache works in hard mode

def _attached(family: str, **cfg):
    import focus_lab
    from conftest import FAMILIES
    m = FAMILIES[family]()
    focus_lab.attach(m, focus_lab.FocusConfig(**{"num_groups": 4, "top_k": 2, "window": 8,
                                                 "mode": "hard", **cfg}))
    return m


@contextlib.contextmanager
def _counting_decomposition():
    """Count the retrofit's calls of ``hard_focus_attention`` (yields the list of calls); the
    original function is always put back."""
    import focus_lab.hf.attention as rf  # where the attention function calls it
    calls, orig = [], rf.hard_focus_attention
    rf.hard_focus_attention = lambda *a, **k: calls.append(1) or orig(*a, **k)
    try:
        yield calls
    finally:
        rf.hard_focus_attention = orig


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_retrofit_fast_path_equals_dense(family):
    from focus_lab.hf.retrofit import set_config
    m = _attached(family, sink_tokens=2)
    ids = torch.randint(3, 97, (2, 70), generator=torch.Generator().manual_seed(0))
    with _counting_decomposition() as calls, torch.no_grad():
        fast = m(ids).logits
        set_config(m, backend="dense")
        dense = m(ids).logits
    assert calls, "hard mode did not use the decomposition"
    assert (fast - dense).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_window_mode_fast_path_equals_brute_force_window_mask(family):
    """Window mode runs through the decomposition (queries and keys in disjoint groups: only
    the window and the sinks) and equals the dense reference path and a brute-force eager
    forward with the window + sinks mask built here (no library mask code), also through a KV cache."""
    from transformers import DynamicCache
    from focus_lab.hf.retrofit import set_config
    m = _attached(family, sink_tokens=3, mode="window")
    ids = torch.randint(3, 97, (2, 70), generator=torch.Generator().manual_seed(4))
    with _counting_decomposition() as calls, torch.no_grad():
        fast = m(ids).logits
        cache = DynamicCache(config=m.config)
        steps = torch.cat([m(ids[:, :50], past_key_values=cache, use_cache=True).logits,
                           *[m(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
                             for t in range(50, 70)]], 1)
        set_config(m, backend="dense")
        dense = m(ids).logits
    assert calls, "window mode did not use the decomposition"
    assert (fast - dense).abs().max().item() <= 1e-5
    assert (steps - fast).abs().max().item() <= 1e-5
    # brute force: the plain model with the mask i - j < 8 or j < 3 (and j <= i) as an eager bias
    import focus_lab
    plain = focus_lab.detach(m) or m
    i, j = torch.arange(70)[:, None], torch.arange(70)[None]
    allowed = (j <= i) & ((i - j < 8) | (j < 3))
    bias = torch.zeros(70, 70).masked_fill(~allowed, float("-inf"))[None, None].expand(2, 1, 70, 70)
    with torch.no_grad():
        brute = plain(ids, attention_mask=bias).logits
    assert (brute - fast).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family,backend", [("llama", "auto"), ("gpt2", "auto"), ("llama", "dense")])
def test_hard_mode_kv_cache_equals_full_forward(family, backend):
    """Prefill + chunk + single-token steps through the cache give the full forward's logits."""
    from transformers import DynamicCache
    m = _attached(family, backend=backend)
    ids = torch.randint(3, 97, (1, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(ids).logits
        cache = DynamicCache(config=m.config)
        parts = [m(ids[:, :30], past_key_values=cache, use_cache=True).logits,
                 m(ids[:, 30:45], past_key_values=cache, use_cache=True).logits]
        for t in range(45, 48):
            parts.append(m(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits)
        assert (torch.cat(parts, 1) - full).abs().max().item() <= 1e-5
        gen = m.generate(ids[:, :20], max_new_tokens=4, do_sample=False)
        again = m(gen).logits[0, 19:-1].argmax(-1)
    assert torch.equal(again, gen[0, 20:])


def test_padding_falls_back_to_dense():
    from focus_lab.hf.retrofit import set_config
    m = _attached("llama")
    ids = torch.randint(3, 97, (2, 40), generator=torch.Generator().manual_seed(2))
    am = torch.ones(2, 40, dtype=torch.long)
    am[1, :5] = 0
    with torch.no_grad():
        a = m(ids, attention_mask=am).logits
        set_config(m, backend="dense")
        b = m(ids, attention_mask=am).logits
    assert torch.equal(a, b)


def test_options_change_the_speed_knobs_not_the_result(monkeypatch):
    """DecompositionOptions (serial bookkeeping, no workspace, small stair chunks) give the same
    output as the defaults; serial bookkeeping runs the bookkeeping on one thread and the
    kernels on the caller's count, restored afterwards; the library never reads the load."""
    import inspect
    import focus_lab.method.decomposition as dm

    assert "getloadavg" not in inspect.getsource(dm)
    gen = torch.Generator().manual_seed(3)
    q, k, v = rand_qkv(gen, 1, 4, 2, 96, 96, 8)
    qg, kg = make_groups(gen, 1, 96, 4, 2, "router")
    base = hard_focus_attention(q, k, v, qg, kg, 8, sinks=2)
    seen = []
    real = dm._cpu_flash
    monkeypatch.setattr(dm, "_cpu_flash", lambda *a, **kw: (seen.append(torch.get_num_threads()), real(*a, **kw))[1])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        opts = dm.DecompositionOptions(workspace=False, stair_chunk=16, serial_bookkeeping=True)
        out = hard_focus_attention(q, k, v, qg, kg, 8, sinks=2, options=opts)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {2}, seen  # kernels on the caller's threads
    assert (out - base).abs().max() <= 1e-6
    assert not dm._is_scratch(out)


def test_plain_causal_check_is_cached_per_mask_and_sees_in_place_changes():
    """The fast path needs a mask that is plain causality; the check runs once per mask object
    per forward state (every layer of a forward gets the same one) and again when the mask
    changes in place."""
    from focus_lab.method.config import FocusConfig
    from focus_lab.hf.retrofit import FocusForward

    T = 12
    state = FocusForward(FocusConfig())
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None].repeat(2, 1, 1, 1)  # (B, 1, T, T)
    keep = causal[:, 0]
    assert state.is_plain_causal(causal, keep)
    assert state._plain._entry is not None and state._plain._entry[2] is True
    assert state.is_plain_causal(causal, keep)  # cached
    causal[1, 0, :, :3] = False  # padding on the left of row 1, in place
    assert not state.is_plain_causal(causal, causal[:, 0])
    band = torch.ones(T, T, dtype=torch.bool).tril() & torch.ones(T, T, dtype=torch.bool).triu(-4)
    assert not state.is_plain_causal(band[None, None], band[None])  # a sliding window
    step = torch.ones(1, 1, 3, T, dtype=torch.bool)  # last 3 queries of a cache step see all keys
    step[0, 0, 0, -2:] = False
    step[0, 0, 1, -1:] = False
    assert state.is_plain_causal(step, step[:, 0])
    assert state.is_plain_causal(None, None)


def test_cache_step_without_prefill_history_raises():
    from transformers import DynamicCache
    from focus_lab.hf.retrofit import FocusCache, FocusForward, focus_config
    m = _attached("llama")
    ids = torch.randint(3, 97, (1, 20))
    cfg = focus_config(m)
    with torch.no_grad():
        cache = DynamicCache(config=m.config)
        m(ids, past_key_values=cache, use_cache=True, focus=FocusForward(cfg, FocusCache()))
        with pytest.raises(RuntimeError, match="key groups"):  # a cache that saw no prefill
            m(ids[:, :1], past_key_values=cache, use_cache=True, focus=FocusForward(cfg, FocusCache()))
        with pytest.raises(RuntimeError, match="no FocusCache"):  # a state without a cache
            m(ids[:, :1], past_key_values=cache, use_cache=True, focus=FocusForward(cfg))


def test_explicit_forward_state_cache_equals_full_forward_and_leaves_default_alone():
    """Hard-mode decoding with an explicit FocusForward(cache=...) gives the logits of the full
    forward, and neither the model's default config nor its default cache changes."""
    from transformers import DynamicCache
    from focus_lab.hf.retrofit import focus_config, forward_state
    m = _attached("llama", mode="soft")
    ids = torch.randint(3, 97, (1, 40))
    default = focus_config(m)
    state = forward_state(m, cache=True, mode="hard", top_k=1)
    with torch.no_grad():
        full = m(ids, use_cache=False, focus=forward_state(m, mode="hard", top_k=1)).logits  # (1, T, V)
        cache = DynamicCache(config=m.config)
        m(ids[:, :30], past_key_values=cache, use_cache=True, focus=state)
        steps = [m(ids[:, t:t + 1], past_key_values=cache, use_cache=True, focus=state).logits[:, -1]
                 for t in range(30, 40)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 30:40], atol=1e-4, rtol=1e-4)
    assert focus_config(m) == default and default.mode != "hard"
    assert m._focus_state.default.cache.key_groups == {}
    assert all(v.shape == (1, 40) for v in state.cache.key_groups.values())


def test_config_backend_field():
    from focus_lab import ConfigError, FocusConfig
    assert FocusConfig().backend == "auto"
    for b in ("auto", "dense", "torch", "flash", "flex"):
        assert FocusConfig(backend=b).backend == b
    with pytest.raises(ConfigError, match="backend"):
        FocusConfig(backend="cuda")


def test_workspace_reuse_never_aliases_returned_outputs():
    """Scratch buffers are reused between calls (decomposition.WORKSPACE): an output returned
    earlier must not change when later calls of other shapes reuse the buffers, and every call
    must still equal the dense reference."""
    from focus_lab.method import decomposition as dec
    gen = torch.Generator().manual_seed(5)
    outs = []
    for B, T, H, Hkv, K, k, w in [(1, 96, 4, 2, 4, 1, 8), (2, 64, 4, 1, 3, 2, 5), (1, 96, 4, 2, 4, 1, 8),
                                  (1, 160, 2, 2, 2, 1, 16)]:
        q = torch.randn(B, H, T, 8, generator=gen)
        kk = torch.randn(B, Hkv, T, 8, generator=gen)
        v = torch.randn(B, Hkv, T, 8, generator=gen)
        qg, kg = make_groups(gen, B, T, K, k, "router")
        out = hard_focus_attention(q, kk, v, qg, kg, w)
        ref = reference_hard_attention(q, kk, v, qg, kg, w)
        assert (out - ref).abs().max() <= TOL
        assert not dec._is_scratch(out)
        outs.append((out, out.clone()))
    assert dec._workspace, "the CPU path should keep scratch buffers between calls"
    for out, copy in outs:
        assert torch.equal(out, copy)
    dec.clear_workspace()
    assert not dec._workspace


def _fake_flash_attn_module():
    """A CPU stand-in for flash-attn's ``flash_attn_varlen_func`` (packed varlen sequences,
    GQA, bottom-right causal, LSE of shape (H, total_q) as in flash-attn >= 2.4), written from
    its documented semantics, so the decomposition's packing and unpacking around it can be
    checked without a GPU. The real kernel remains untested here."""
    import types

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None,
                               causal=False, return_attn_probs=False):
        H, Hkv = q.shape[1], k.shape[1]
        out = torch.empty(q.shape, dtype=torch.float32)
        lse = torch.empty(H, q.shape[0])
        for i in range(len(cu_q) - 1):
            a, b, c, d = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
            qs = q[a:b].float()  # (Lq, H, D)
            ks = k[c:d].float().repeat_interleave(H // Hkv, dim=1)  # (Lk, H, D)
            vs = v[c:d].float().repeat_interleave(H // Hkv, dim=1)
            s = torch.einsum("qhd,khd->hqk", qs, ks) * softmax_scale  # (H, Lq, Lk)
            if causal:  # bottom-right aligned: query m sees keys <= m + Lk - Lq
                Lq, Lk = b - a, d - c
                keep = torch.arange(Lk)[None, :] <= torch.arange(Lq)[:, None] + (Lk - Lq)
                s = s.masked_fill(~keep, float("-inf"))
            lse[:, a:b] = torch.logsumexp(s, -1)
            out[a:b] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vs)
        return out, lse, None

    return types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)


@pytest.mark.parametrize("B,T,Tq,H,Hkv,K,k,w,pattern", [(1, 64, 64, 4, 2, 4, 1, 8, "router"),
                                                       (2, 50, 50, 4, 1, 3, 2, 5, "arbitrary"),
                                                       (1, 40, 40, 2, 2, 5, 2, 3, "empty_groups"),
                                                       (1, 60, 12, 4, 2, 3, 1, 4, "router"),
                                                       (2, 48, 1, 4, 2, 2, 1, 4, "all_same")])
def test_flash_backend_glue_matches_reference_with_a_stand_in_kernel(monkeypatch, B, T, Tq, H, Hkv, K, k, w,
                                                                    pattern):
    """The "flash" path (segments packed into one varlen call, LSE unpacked, staircase segments
    by the math path; Tq < T is a KV-cache step) equals the dense reference and the "torch"
    backend when flash-attn is replaced by a CPU stand-in."""
    import sys
    from focus_lab.method import decomposition as dec
    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash_attn_module())
    # a fresh cache of the optional import for this test, the original put back after it
    monkeypatch.setattr(dec, "_flash_attn_package", functools.lru_cache(dec._flash_attn_package.__wrapped__))
    monkeypatch.setattr(dec, "resolve_backend", lambda backend, device, dtype=None, top_k=1: "flash")
    gen = torch.Generator().manual_seed(T + K + Tq)
    q = torch.randn(B, H, Tq, 8, generator=gen)
    kk = torch.randn(B, Hkv, T, 8, generator=gen)
    v = torch.randn(B, Hkv, T, 8, generator=gen)
    qg, kg = make_groups(gen, B, T, K, k, pattern)
    qg = qg[:, T - Tq:]
    out, lse = hard_focus_attention(q, kk, v, qg, kg, w, backend="flash", return_lse=True)
    ref = reference_hard_attention(q, kk, v, qg, kg, w)
    assert (out - ref).abs().max() <= TOL
    monkeypatch.setattr(dec, "resolve_backend", lambda backend, device, dtype=None, top_k=1: "torch")
    out_t, lse_t = hard_focus_attention(q, kk, v, qg, kg, w, backend="torch", return_lse=True)
    assert (lse - lse_t).abs().max() <= TOL


def test_random_scores_depend_on_absolute_position_only():
    """Any length and any start agree on shared positions (a KV-cache step sees the groups a
    full forward gives), and lengths that are multiples of 64 keep the values of one plain draw."""
    from focus_lab.method import core
    from focus_lab.method.core import random_scores
    core._RANDOM_TABLES.clear()
    full = random_scores(1, 300, 4, seed=7)[0]  # (300, 4)
    for start, T in ((0, 7), (5, 1), (63, 2), (128, 100), (299, 1), (300, 200), (600, 33)):
        cached = random_scores(1, T, 4, seed=7, start=start)[0]  # served by (or grown from) the cache
        core._RANDOM_TABLES.clear()
        fresh = random_scores(1, T, 4, seed=7, start=start)[0]  # a draw of its own length
        torch.testing.assert_close(cached, fresh)
        if start + T <= 300:
            torch.testing.assert_close(fresh, full[start:start + T])
    core._RANDOM_TABLES.clear()
    g = torch.Generator().manual_seed(7)
    torch.testing.assert_close(random_scores(2, 512, 4, seed=7)[1], torch.randn(512, 4, generator=g))
    random_scores(1, 512, 4, seed=7).float().add_(1.0)  # a caller's copy: the cache is untouched
    torch.testing.assert_close(random_scores(1, 512, 4, seed=7)[0], torch.randn(512, 4, generator=g.manual_seed(7)))


@pytest.mark.parametrize("assignment", ["random", "router", "mixed", "layer_top_k"])
def test_hard_kv_cache_decode_equals_full_forward(assignment):
    """Greedy decoding through the KV cache, random groups included (everywhere, or in layer 0
    only: ``random_layers``), and a per-layer k (``layer_top_k``: window and sinks only in layer
    0, top-2 in layer 1): the logits of each step equal the full forward's at that position."""
    from transformers import DynamicCache
    from focus_lab.hf.retrofit import forward_state
    m = _attached("llama", mode="soft", sink_tokens=1)
    ids = torch.randint(3, 97, (1, 37))
    changes = {"assignment": "router", "random_layers": [0]} if assignment == "mixed" else {"assignment": assignment}
    if assignment == "layer_top_k":
        changes = {"assignment": "router", "top_k": 1, "layer_top_k": {0: 0, 1: 2}}
    with torch.no_grad():
        full = m(ids, use_cache=False, focus=forward_state(m, mode="hard", **changes)).logits
        state = forward_state(m, cache=True, mode="hard", **changes)
        cache = DynamicCache(config=m.config)
        m(ids[:, :21], past_key_values=cache, use_cache=True, focus=state)
        steps = [m(ids[:, t:t + 1], past_key_values=cache, use_cache=True, focus=state).logits[:, -1]
                 for t in range(21, 37)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 21:37], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("changes", [{"assignment": "router"}, {"assignment": "router", "random_layers": [0]},
                                     {"assignment": "router", "match_shifts": [0, 1]},
                                     {"assignment": "router", "group_capacity": 0.5, "key_shift": 1},
                                     {"assignment": "router", "group_capacity": 0.5, "capacity_overflow": "evict"}])
def test_gpu_decode_step_equals_full_forward_without_host_syncs(changes, monkeypatch):
    """The one-token decode step a GPU runs (``core.HOST_DEVICES`` emptied, so the CPU takes it:
    ``decomposition._one_query``, one attention call under the step's mask row, and no check of
    the router scores) gives the full forward's logits at every step: random-group layers, the
    token-match pairs (its LSE merged with their part) and the group capacity with the key shift
    included. Without the pairs, a step makes no host sync in focus_lab's code but the one
    dense makes too (``ModelMask.plain_causal``, counted by ``analyses.kernel_counts``); the CPU's path,
    counted the same way, makes some (so the count sees them)."""
    from transformers import DynamicCache
    from analyses.kernel_counts import count_step
    from focus_lab.hf.retrofit import forward_state
    from focus_lab.method import core
    m = _attached("llama", mode="soft", sink_tokens=1)
    ids = torch.randint(3, 97, (1, 40))

    def decode(host_devices):
        monkeypatch.setattr(core, "HOST_DEVICES", host_devices)
        state = forward_state(m, cache=True, mode="hard", **changes)
        cache = DynamicCache(config=m.config)
        with torch.no_grad():
            m(ids[:, :21], past_key_values=cache, use_cache=True, focus=state)
            steps = [m(ids[:, t:t + 1], past_key_values=cache, use_cache=True, focus=state).logits[:, -1]
                     for t in range(21, 39)]
        return torch.stack(steps, 1), count_step(m, state, cache, ids[:, 39:40]).syncs

    with torch.no_grad():
        full = m(ids, use_cache=False, focus=forward_state(m, mode="hard", **changes)).logits
    gpu, gpu_syncs = decode(())
    torch.testing.assert_close(gpu, full[:, 21:39], atol=1e-4, rtol=1e-4)
    cpu, cpu_syncs = decode(("cpu",))
    torch.testing.assert_close(gpu, cpu, atol=1e-5, rtol=1e-5)
    if "match_shifts" not in changes:
        assert set(gpu_syncs) == {"hf/model_mask.py:plain_causal (_local_scalar_dense)"}, gpu_syncs
        assert sum(cpu_syncs.values()) > sum(gpu_syncs.values()), cpu_syncs


def test_top_k_budgets_apply_to_their_top_k_only():
    """FocusConfig.top_k_budgets {top_k: {layer_idx: k}}: asking for that top_k gives the same
    logits as the explicit layer_top_k of that map; another top_k, or layer_top_k = {} ('none'),
    gives uniform top-k's logits; the budget survives a JSON round trip (keys as strings)."""
    from focus_lab import FocusConfig
    from focus_lab.hf.retrofit import forward_state
    m = _attached("llama", mode="soft", sink_tokens=1)
    ids = torch.randint(3, 97, (1, 40))
    budget = {2: {0: 1, 1: 3}}

    def logits(**changes):
        with torch.no_grad():
            return m(ids, use_cache=False, focus=forward_state(m, mode="hard", window=4, **changes)).logits

    assert not torch.allclose(logits(top_k=2, layer_top_k={0: 1, 1: 3}), logits(top_k=2))  # the map matters
    torch.testing.assert_close(logits(top_k=2, top_k_budgets=budget), logits(top_k=2, layer_top_k={0: 1, 1: 3}))
    torch.testing.assert_close(logits(top_k=1, top_k_budgets=budget), logits(top_k=1))
    torch.testing.assert_close(logits(top_k=2, top_k_budgets=budget, layer_top_k={}), logits(top_k=2))
    cfg = FocusConfig.from_json(FocusConfig(top_k_budgets=budget).to_json())
    assert cfg.top_k_budgets == budget and [cfg.top_k_at(i) for i in range(3)] == [1, 3, 2]
    assert [cfg.replace(top_k=1).top_k_at(i) for i in range(3)] == [1, 1, 1]
    with pytest.raises(ValueError, match="top_k_budgets"):
        FocusConfig(top_k_budgets={2: {0: 9}})
    with pytest.raises(ValueError, match="top_k_budgets"):
        FocusConfig(top_k_budgets={2: [1, 3]})


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_layer_joining_every_group_takes_dense_kernel_and_equals_reference(family):
    """A layer whose k is num_groups keeps every causal pair: it skips the decomposition (one
    call fewer per such layer, counted) and its logits equal the dense masked reference path
    (``backend="dense"``) with the same per-layer k, in a full forward and in KV-cache steps;
    every layer at k = num_groups equals plain dense attention."""
    from transformers import DynamicCache
    from focus_lab.hf.retrofit import forward_state
    m = _attached(family, sink_tokens=1)
    ids = torch.randint(3, 97, (1, 41))
    spec = {0: 4, 1: 1}  # layer 0 joins all 4 groups, layer 1 one

    def run(**changes):
        with torch.no_grad():
            return m(ids, use_cache=False, focus=forward_state(m, mode="hard", window=4, **changes)).logits

    with _counting_decomposition() as calls:
        fast = run(layer_top_k=spec)
    assert len(calls) == 1  # layer 1 only
    torch.testing.assert_close(fast, run(layer_top_k=spec, backend="dense"), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(fast, run(layer_top_k={0: 1, 1: 1}), atol=1e-3)  # layer 0's k matters
    with torch.no_grad():
        dense = m(ids, use_cache=False, focus=forward_state(m, mode="dense")).logits
        state = forward_state(m, cache=True, mode="hard", window=4, layer_top_k=spec)
        cache = DynamicCache(config=m.config)
        m(ids[:, :30], past_key_values=cache, use_cache=True, focus=state)
        steps = [m(ids[:, t:t + 1], past_key_values=cache, use_cache=True, focus=state).logits[:, -1]
                 for t in range(30, 41)]
    torch.testing.assert_close(torch.stack(steps, 1), fast[:, 30:41], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(run(layer_top_k={0: 4, 1: 4}), dense, atol=1e-5, rtol=1e-5)


def test_focus_keyword_takes_a_forward_state_only():
    """A bare FocusConfig as focus= is refused with the fix named (one state serves all layers)."""
    from focus_lab.hf.retrofit import focus_config
    m = _attached("llama")
    with pytest.raises(TypeError, match="forward_state"):
        m(torch.randint(3, 97, (1, 12)), use_cache=False, focus=focus_config(m))


def _fake_efficient_attention(q, k, v, bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    """A CPU stand-in for ``aten._scaled_dot_product_efficient_attention`` written from its
    contract: equal query and KV heads, bias rows aligned to 16 elements, top-left causal, LSE
    padded to a multiple of 32 queries (the padding NaN here), NaN output on fully masked rows."""
    N, H, L, D = q.shape
    S = k.shape[2]
    assert k.shape[1] == H and v.shape[1] == H, "the kernel takes no GQA"
    assert compute_log_sumexp and dropout_p == 0.0
    assert all(x.stride(-1) == 1 for x in (q, k, v))
    s = (q.float() @ k.float().transpose(-1, -2)) * scale  # (N, H, L, S)
    if bias is not None:
        assert bias.shape == (N, H, L, S) and (L == 1 or bias.stride(-2) % 16 == 0), "misaligned bias"
        s = s + bias.float()
    if is_causal:
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.full((N, H, -(-L // 32) * 32), float("nan"))
    lse[..., :L] = s.logsumexp(-1)
    out = torch.softmax(s, -1) @ v.float()  # NaN where a row is fully masked
    return out.to(q.dtype), lse, torch.empty(()), torch.empty(())


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(c=cases())
def test_cuda_glue_matches_reference_with_a_stand_in_kernel(monkeypatch, c):
    """The CUDA path's glue (``_cuda_attn_lse``: KV heads repeated, mask as an aligned additive
    bias, padded LSE cut back, fully masked rows set to out 0 / lse -inf) through the whole
    decomposition, with torch's memory-efficient kernel replaced by a CPU stand-in. The real
    kernel runs in tests/test_cuda.py where a GPU exists."""
    from focus_lab.method import decomposition as dec
    monkeypatch.setattr(dec, "_cuda_efficient", _fake_efficient_attention)
    monkeypatch.setattr(dec, "_attn_lse", lambda q, k, v, scale, *, causal=False, allowed=None, call=None:
                        dec._cuda_attn_lse(q, k, v, scale, causal, allowed))
    gen = torch.Generator().manual_seed(c["seed"])
    qg, kg = make_groups(gen, c["B"], c["T"], c["K"], c["k"], c["pattern"])
    q, k, v = rand_qkv(gen, c["B"], c["H"], c["Hkv"], c["Tq"], c["T"], c["D"])
    qg = qg[:, c["T"] - c["Tq"]:]
    out, lse = dec.hard_focus_attention(q, k, v, qg, kg, c["window"], sinks=c["sinks"], return_lse=True)
    _check_against_reference(out, q, k, v, qg, kg, c, " (CUDA glue)")
    q_pos = torch.arange(c["T"] - c["Tq"], c["T"])
    mask = hard_mask(qg, kg, c["window"], q_pos, torch.arange(c["T"]), c["sinks"])  # (B, Tq, Tk)
    s = q @ k.repeat_interleave(c["H"] // c["Hkv"], 1).transpose(-1, -2) / math.sqrt(c["D"])
    assert (lse - s.masked_fill(~mask[:, None], float("-inf")).logsumexp(-1)).abs().max().item() <= 1e-4


def _fake_efficient_varlen(q, k, v, bias, cu_q, cu_k, max_q, max_k, dropout_p, mask_type, compute_lse, *,
                           scale, seqlen_k=None):
    """A CPU stand-in for the varlen form of ``aten._efficient_attention_forward`` written from
    xformers' padded-keys contract: sequence i's queries are rows ``cu_q[i]:cu_q[i+1]``, its keys
    the ``seqlen_k[i]`` rows from ``cu_k[i]`` (starts nondecreasing; sequences may share keys),
    equal query and KV heads, LSE (nseq, H, max_q padded to 32) with NaN padding."""
    assert bias is None and mask_type == 0 and compute_lse and dropout_p == 0.0
    _, M, H, D = q.shape
    assert k.shape[2] == H and v.shape[2] == H, "the kernel takes no GQA"
    assert cu_q.dtype == cu_k.dtype == seqlen_k.dtype == torch.int32
    assert bool((cu_k[1:] >= cu_k[:-1]).all()), "key starts must not decrease"
    n = cu_q.numel() - 1
    out = torch.zeros(1, M, H, v.shape[-1])
    lse = torch.full((n, H, -(-max_q // 32) * 32), float("nan"))
    for i in range(n):
        a, e, s0, L = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(seqlen_k[i])
        assert 0 < e - a <= max_q and 0 < L <= max_k and s0 + L <= k.shape[1]
        s = torch.einsum("qhd,khd->hqk", q[0, a:e].float(), k[0, s0:s0 + L].float()) * scale
        lse[i, :, :e - a] = s.logsumexp(-1)
        out[0, a:e] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v[0, s0:s0 + L].float())
    return out.to(q.dtype), lse, torch.empty(()), torch.empty(())


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(c=cases(), chunk=st.sampled_from([1, 3, 8]))
def test_packed_rectangles_match_reference_with_a_stand_in_kernel(monkeypatch, c, chunk):
    """The CUDA path packs every staircase rectangle into one varlen call
    (``_rectangles_varlen``: rows packed, each segment's keys gathered once and shared by its
    pieces through per-piece key starts and lengths, the padded LSE unpacked). With the kernel
    replaced by a CPU stand-in and small stair chunks (many pieces per segment), the whole
    decomposition equals the dense reference."""
    from focus_lab.method import decomposition as dec
    monkeypatch.setattr(dec, "_pack_rectangles", lambda qrows: True)
    monkeypatch.setattr(dec, "_cuda_efficient_varlen", _fake_efficient_varlen)
    c["k"] = max(c["k"], min(2, c["K"]))  # slot 2 (stairs) whenever K >= 2
    gen = torch.Generator().manual_seed(c["seed"])
    qg, kg = make_groups(gen, c["B"], c["T"], c["K"], c["k"], c["pattern"])
    q, k, v = rand_qkv(gen, c["B"], c["H"], c["Hkv"], c["Tq"], c["T"], c["D"])
    qg = qg[:, c["T"] - c["Tq"]:]
    out = dec.hard_focus_attention(q, k, v, qg, kg, c["window"], sinks=c["sinks"],
                                   options=dec.DecompositionOptions(stair_chunk=chunk))
    _check_against_reference(out, q, k, v, qg, kg, c, f" (packed rectangles, chunk {chunk})")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=cases())
def test_flex_backend_equals_dense_reference(c):
    """backend "flex" (part A as one block-sparse FlexAttention call over the packed layout; on
    the CPU eager FlexAttention, the same mask and LSE the compiled CUDA kernel gets) against the
    dense masked reference, out and lse."""
    gen = torch.Generator().manual_seed(c["seed"])
    qg, kg = make_groups(gen, c["B"], c["T"], c["K"], c["k"], c["pattern"])
    q, k, v = rand_qkv(gen, c["B"], c["H"], c["Hkv"], c["Tq"], c["T"], c["D"])
    qg = qg[:, c["T"] - c["Tq"]:]
    out, lse = hard_focus_attention(q, k, v, qg, kg, c["window"], backend="flex", return_lse=True,
                                    sinks=c["sinks"])
    _check_against_reference(out, q, k, v, qg, kg, c, " (flex)")
    ref_lse = hard_focus_attention(q, k, v, qg, kg, c["window"], backend="torch", return_lse=True,
                                   sinks=c["sinks"])[1]
    assert (lse - ref_lse).abs().max().item() <= 1e-4


@pytest.mark.parametrize("B,T,Tq,K,k,pattern", [(1, 100, 100, 3, 1, "router"), (2, 90, 90, 4, 2, "router"),
                                                 (2, 120, 50, 3, 3, "random"), (1, 64, 64, 1, 1, "router")])
def test_flex_layout_is_part_a_and_its_tiles_cover_it(B, T, Tq, K, k, pattern):
    """``flex_layout`` brute force, with 8-token tiles: the packed pairs (same id, key position <=
    query position) are exactly part A's pairs (key group among the query's groups, j <= i), each
    once; every such pair lies in a needed tile; a full tile holds only such pairs; and some
    tiles are skipped and some are full (the layout is sparse, not dense)."""
    from focus_lab.method.decomposition import flex_layout
    gen = torch.Generator().manual_seed(T + k)
    qg, kg = make_groups(gen, B, T, K, k, pattern)
    qg = qg[:, T - Tq:]
    lay = flex_layout(qg, kg, block=8)
    pair = (lay["q_id"][:, None] == lay["k_id"][None, :]) & (lay["k_pos"][None, :] <= lay["q_pos"][:, None])
    qi, ki = pair.nonzero(as_tuple=True)
    row, j = lay["q_src"][qi], lay["k_src"][ki]
    got = sorted(zip((row // Tq).tolist(), (row % Tq).tolist(), (j % T).tolist()))
    assert len(got) == len(set(got))  # each pair once
    want = [(b, i, jj) for b in range(B) for i in range(Tq) for jj in range(T - Tq + i + 1)
            if int(kg[b, jj]) in set(qg[b, i].tolist())]
    assert got == sorted(want)
    assert (row // Tq == j // T).all()  # within a batch row
    tiles = pair.view(pair.shape[0] // 8, 8, pair.shape[1] // 8, 8).any(3).any(1)
    assert not (tiles & ~lay["needed"]).any()
    full_pairs = pair.view(pair.shape[0] // 8, 8, pair.shape[1] // 8, 8).all(3).all(1)
    assert not (lay["full"] & ~full_pairs).any()
    assert (~lay["needed"]).any() and lay["full"].any()
    # every packed query row writes its own output row (padding and repeated slots: the dummy row)
    real = lay["q_id"] >= 0
    assert lay["dst"][real].unique().numel() == int(real.sum())
    assert (lay["dst"][~real] == B * Tq).all()


@pytest.mark.parametrize("argv,words", [(["--patterns", "dense,hard_top9"], "unknown pattern 'hard_top9'"),
                                        (["--length", "8190"], "the model's 8192 positions"),
                                        (["--device", "tpu"], "use cpu, cuda or cuda:N")])
def test_kernel_counts_bad_options_exit_2_with_one_line(argv, words, capsys):
    """``analyses.kernel_counts`` (the embedded model): an unknown pattern or a context past the
    model's positions is one line on stderr (after the loader's progress) and exit code 2."""
    from analyses.kernel_counts import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the loader's progress bar
    assert e.value.code == 2 and last.startswith("error: ") and words in last, last
