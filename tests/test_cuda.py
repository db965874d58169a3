"""The CUDA path (skipped where torch sees no CUDA device): ``hard_focus_attention`` on a GPU,
through torch's memory-efficient attention kernel (``decomposition._cuda_attn_lse``), against the
dense masked reference computed on the CPU, and the retrofitted models in hard mode on a GPU
against their own dense reference path, prefill and KV-cache decode.

Tolerance: CUDA_TOL (1e-4) on fp32 outputs, the GPU kernel's fp32 accumulation order differing
from the CPU reference's; the CPU path is held to 1e-5 in tests/test_decomposition.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from focus_lab.method.core import hard_mask
from focus_lab.method.decomposition import DecompositionOptions, hard_focus_attention, reference_hard_attention
from test_decomposition import _attached, cases, make_groups, rand_qkv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA_TOL = 1e-4
_worst = {"err": 0.0, "cases": 0}


def _on_cuda(*xs):
    return [x.cuda() for x in xs]


def _check(out, q, k, v, qg, kg, window, sinks, what=""):
    """``out`` (computed on CUDA) against the CPU reference of the same inputs."""
    ref = reference_hard_attention(q, k, v, qg, kg, window, sinks=sinks)
    assert out.device.type == "cuda" and out.shape == ref.shape and out.dtype == ref.dtype
    err = (out.cpu() - ref).abs().max().item()
    _worst["err"] = max(_worst["err"], err)
    _worst["cases"] += 1
    assert err <= CUDA_TOL, f"max abs error {err:.2e} > {CUDA_TOL}{what}"


def _ref_lse(q, k, qg, kg, window, sinks):
    """logsumexp of the kept scaled logits, brute force on the CPU: (B, H, Tq)."""
    T, Tq, H, Hkv, D = k.shape[2], q.shape[2], q.shape[1], k.shape[1], q.shape[3]
    mask = hard_mask(qg, kg, window, torch.arange(T - Tq, T), torch.arange(T), sinks)  # (B, Tq, T)
    s = q @ k.repeat_interleave(H // Hkv, 1).transpose(-1, -2) / math.sqrt(D)
    return s.masked_fill(~mask[:, None], float("-inf")).logsumexp(-1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=cases(), chunk=st.sampled_from([None, 3, 32]))
def test_cuda_equals_dense_reference(c, chunk):
    """The exactness sweep of tests/test_decomposition.py on CUDA (KV-cache steps, sinks, every
    group pattern), with small stair chunks forced in some cases; out and lse."""
    gen = torch.Generator().manual_seed(c["seed"])
    qg, kg = make_groups(gen, c["B"], c["T"], c["K"], c["k"], c["pattern"])
    q, k, v = rand_qkv(gen, c["B"], c["H"], c["Hkv"], c["Tq"], c["T"], c["D"])
    qg = qg[:, c["T"] - c["Tq"]:]
    out, lse = hard_focus_attention(*_on_cuda(q, k, v, qg, kg), c["window"], sinks=c["sinks"], return_lse=True,
                                    options=DecompositionOptions(stair_chunk=chunk))
    _check(out, q, k, v, qg, kg, c["window"], c["sinks"], f" for {c}")
    assert (lse.cpu() - _ref_lse(q, k, qg, kg, c["window"], c["sinks"])).abs().max().item() <= CUDA_TOL


@pytest.mark.parametrize("Tq", [1, 3, 16, 700])
def test_cuda_model_shapes_and_kv_cache_steps(Tq):
    """SmolLM2-135M's heads (9 query, 3 KV, head_dim 64), K = 4, k = 2, w = 128, 64 sinks, 2000
    tokens: the prefill (Tq = 700: the decomposition) and decode steps (Tq = 1: one attention
    call under the step's mask row, ``_one_query``; 3 and 16: the kept keys gathered), with NaN
    values on the keys the mask drops, which must not leak; the one-token step reads every cached
    value (weight exactly 0 where dropped, as in dense attention), so there they are large and
    finite instead of NaN."""
    gen = torch.Generator().manual_seed(Tq)
    B, H, Hkv, T, D, K, k, w, sinks = 2, 9, 3, 2000, 64, 4, 2, 128, 64
    qg, kg = make_groups(gen, B, T, K, k, "router")
    qg = qg[:, T - Tq:]
    q, key, v = rand_qkv(gen, B, H, Hkv, Tq, T, D)
    out = hard_focus_attention(*_on_cuda(q, key, v, qg, kg), w, sinks=sinks)
    _check(out, q, key, v, qg, kg, w, sinks, f" (Tq={Tq})")
    if Tq > 16:
        return
    qg01 = torch.tensor([0, 1]).expand(B, Tq, 2)  # the step's queries in groups 0 and 1 only
    out01 = hard_focus_attention(*_on_cuda(q, key, v, qg01, kg), w, sinks=sinks)
    _check(out01, q, key, v, qg01, kg, w, sinks, f" (Tq={Tq}, groups 0 and 1)")
    dropped = ~hard_mask(qg01, kg, w, torch.arange(T - Tq, T), torch.arange(T), sinks).any(1)  # (B, T)
    assert dropped.sum() > T // 4
    v2 = v.masked_fill(dropped[:, None, :, None], 1e4 if Tq == 1 else float("nan"))
    out2 = hard_focus_attention(*_on_cuda(q, key, v2, qg01, kg), w, sinks=sinks)
    assert torch.equal(out2, out01)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_half_precision_is_as_close_as_dense(dtype):
    """In bf16/fp16 the decomposition's error to the fp32 reference is of the order of the
    error dense attention itself makes in that dtype (torch SDPA on the same GPU, all pairs
    kept: one group)."""
    gen = torch.Generator().manual_seed(3)
    B, H, Hkv, T, D, w = 1, 9, 3, 1500, 64, 128
    q, k, v = rand_qkv(gen, B, H, Hkv, T, T, D)
    one = torch.zeros(B, T, dtype=torch.long)  # one group: the mask is plain causal
    out = hard_focus_attention(*[x.to("cuda", dtype) for x in (q, k, v)], one[..., None].cuda(), one.cuda(), w)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    dense = torch.nn.functional.scaled_dot_product_attention(
        *[x.to("cuda", dtype) for x in (q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1))], is_causal=True)
    err, err_dense = ((x.float().cpu() - ref).abs().max().item() for x in (out, dense))
    assert out.dtype == dtype
    assert err <= 4 * err_dense + 1e-3, f"{dtype}: {err:.2e} vs dense's {err_dense:.2e}"
    qg, kg = make_groups(gen, B, T, 4, 2, "router")  # and with groups, against the fp32 reference
    out = hard_focus_attention(*[x.to("cuda", dtype) for x in (q, k, v)], qg.cuda(), kg.cuda(), w)
    ref = reference_hard_attention(q, k, v, qg, kg, w)
    assert (out.float().cpu() - ref).abs().max().item() <= 4 * err_dense + 1e-3


@pytest.mark.parametrize("family,key_shift", [("llama", 0), ("gpt2", 0), ("llama", 1)])
def test_cuda_hard_mode_model_equals_reference_and_decodes(family, key_shift):
    """A retrofitted model on the GPU in hard mode: the decomposition's logits equal the dense
    masked reference path's (backend "dense"), and prefill + chunk + single-token steps through
    the KV cache equal the full forward; greedy ``generate`` agrees with the forward's argmax."""
    from transformers import DynamicCache

    from focus_lab.hf.retrofit import set_config
    m = _attached(family, sink_tokens=2, key_shift=key_shift).cuda()
    ids = torch.randint(3, 97, (2, 90), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        full = m(ids).logits
        cache = DynamicCache(config=m.config)
        parts = [m(ids[:, :60], past_key_values=cache, use_cache=True).logits,
                 m(ids[:, 60:80], past_key_values=cache, use_cache=True).logits]
        parts += [m(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(80, 90)]
        gen = m.generate(ids[:1, :30], max_new_tokens=5, do_sample=False)
        again = m(gen).logits[0, 29:-1].argmax(-1)
        set_config(m, backend="dense")
        dense = m(ids).logits
    assert full.device.type == "cuda"
    assert (full - dense).abs().max().item() <= CUDA_TOL
    assert (torch.cat(parts, 1) - full).abs().max().item() <= CUDA_TOL
    assert torch.equal(again, gen[0, 30:])


@pytest.mark.parametrize("changes", [{}, {"random_layers": [0]}, {"group_capacity": 0.5, "key_shift": 1},
                                     {"group_capacity": 0.5, "capacity_overflow": "evict"}])
def test_cuda_hard_decode_step_waits_no_more_than_dense(changes):
    """A hard-mode one-token decode step on the GPU (``decomposition._one_query``, no check of
    the router scores) makes the host wait for the device no more often than a dense step does:
    torch's sync debug mode warns once per wait (docs/decomposition.md, KV cache)."""
    import warnings

    from transformers import DynamicCache

    from focus_lab.hf.retrofit import forward_state
    m = _attached("llama", sink_tokens=2, **changes).cuda()
    ids = torch.randint(3, 97, (1, 60), generator=torch.Generator().manual_seed(0)).cuda()
    waits = {}
    for mode in ("dense", "hard"):
        state = forward_state(m, cache=True, mode=mode)
        cache = DynamicCache(config=m.config)
        with torch.no_grad():
            m(ids[:, :50], past_key_values=cache, use_cache=True, focus=state)
            m(ids[:, 50:51], past_key_values=cache, use_cache=True, focus=state)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    m(ids[:, 51:52], past_key_values=cache, use_cache=True, focus=state)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        waits[mode] = [str(w.message)[:80] for w in caught]
    assert len(waits["hard"]) <= len(waits["dense"]), waits


def test_cuda_report_worst_error():
    """Prints the CUDA sweep's size and worst error (run with -s); runs after the sweep."""
    print(f"\nCUDA exactness: {_worst['cases']} cases, worst max abs error {_worst['err']:.2e}")
    assert _worst["err"] <= CUDA_TOL


HALF_TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=cases())
def test_cuda_flash_backend_in_half_precision(dtype, c):
    """backend "flash" (part A's causal and bottom-right segments packed into one varlen flash
    call: flash-attn's, or torch's bundled copy) against the fp32 CPU reference, within the
    dtype's rounding, and against the "torch" backend in the same dtype; KV-cache steps included."""
    from focus_lab.method.decomposition import flash_attn_available
    assert flash_attn_available()
    gen = torch.Generator().manual_seed(c["seed"])
    qg, kg = make_groups(gen, c["B"], c["T"], c["K"], c["k"], c["pattern"])
    q, k, v = rand_qkv(gen, c["B"], c["H"], c["Hkv"], c["Tq"], c["T"], c["D"])
    qg = qg[:, c["T"] - c["Tq"]:]
    half = [x.to("cuda", dtype) for x in (q, k, v)]
    out, lse = hard_focus_attention(*half, qg.cuda(), kg.cuda(), c["window"], sinks=c["sinks"], backend="flash",
                                    return_lse=True)
    out_t, lse_t = hard_focus_attention(*half, qg.cuda(), kg.cuda(), c["window"], sinks=c["sinks"],
                                        backend="torch", return_lse=True)
    ref = reference_hard_attention(*[x.to(dtype).float() for x in (q, k, v)], qg, kg, c["window"], sinks=c["sinks"])
    assert out.dtype == dtype
    assert (out.float().cpu() - ref).abs().max().item() <= HALF_TOL[dtype], c
    assert (out.float() - out_t.float()).abs().max().item() <= HALF_TOL[dtype], c
    assert (lse - lse_t).abs().max().item() <= 1e-3, c


def test_cuda_train_cli_matches_cpu_training(tmp_path):
    """``focus-lab train --device cuda`` on a tiny saved model: it finishes, writes a router file,
    and its routers after 5 steps are those of the same run on the CPU (same seed, same windows),
    up to floating-point differences."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from conftest import tiny_llama
    from focus_lab.cli import app
    from run_fixtures import TEXT, make_tokenizer
    model_dir, corpus = tmp_path / "model", tmp_path / "corpus.txt"
    tiny_llama().save_pretrained(model_dir)
    make_tokenizer().save_pretrained(model_dir)
    corpus.write_text("\n\n".join([TEXT] * 30))
    runs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        r = CliRunner().invoke(app, ["train", "--model", str(model_dir), "--corpus", str(corpus), "--out", str(out),
                                     "--steps", "5", "--seq-len", "32", "--batch-size", "2", "--window", "4",
                                     "--lr", "0.01", "--device", device])
        assert r.exit_code == 0, r.output
        runs[device] = load_file(str(out / "routers.safetensors"))
    assert runs["cpu"].keys() == runs["cuda"].keys()
    diff = max((runs["cpu"][n].float() - runs["cuda"][n].float()).abs().max().item() for n in runs["cpu"])
    assert diff <= 1e-3, diff


def test_cuda_evaluate_equals_cpu():
    """``evaluate`` (what ``focus-lab eval --device cuda`` runs) with the model on the GPU gives
    the CPU's perplexities and pairs kept for every kind of pattern, the random control included
    (its groups depend on positions only, not on the device)."""
    import types

    import focus_lab
    from conftest import tiny_llama
    from focus_lab.eval.evaluate import evaluate, parse_patterns
    m = focus_lab.attach(tiny_llama(), focus_lab.FocusConfig(num_groups=4, window=8, sink_tokens=2))
    gen = torch.Generator().manual_seed(0)
    windows = [types.SimpleNamespace(input_ids=torch.randint(3, 97, (160,), generator=gen)) for _ in range(3)]
    pats = parse_patterns("dense,window,soft,hard_top1,hard_top2,random_top2", 4)
    cpu = evaluate(m, windows, pats).set_index("label")
    gpu = evaluate(m.cuda(), windows, pats).set_index("label")
    assert list(gpu.index) == list(cpu.index)
    assert ((gpu.perplexity - cpu.perplexity).abs() / cpu.perplexity).max() <= 1e-4
    assert (gpu.distant_pairs_kept - cpu.distant_pairs_kept).abs().max() <= 1e-6  # fp32 sums, another order


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,Tq,T,K,k,w,sinks", [(1, 2000, 2000, 4, 2, 128, 64), (2, 700, 1500, 4, 1, 128, 0),
                                                 (1, 1000, 1000, 8, 3, 64, 4)])
def test_cuda_flex_backend(dtype, B, Tq, T, K, k, w, sinks):
    """backend "flex" (part A as one compiled block-sparse FlexAttention call, planned on the
    GPU) against the fp32 CPU reference: CUDA_TOL in fp32, the dtype's rounding in bf16;
    SmolLM2's heads, a KV-cache chunk (Tq < T), k up to 3."""
    gen = torch.Generator().manual_seed(T + k)
    H, Hkv, D = 9, 3, 64
    qg, kg = make_groups(gen, B, T, K, k, "router")
    qg = qg[:, T - Tq:]
    q, key, v = rand_qkv(gen, B, H, Hkv, Tq, T, D)
    out = hard_focus_attention(*[x.to("cuda", dtype) for x in (q, key, v)], qg.cuda(), kg.cuda(), w, sinks=sinks,
                               backend="flex")
    if dtype == torch.float32:
        _check(out, q, key, v, qg, kg, w, sinks, " (flex)")
    else:
        ref = reference_hard_attention(*[x.to(dtype).float() for x in (q, key, v)], qg, kg, w, sinks=sinks)
        assert (out.float().cpu() - ref).abs().max().item() <= HALF_TOL[dtype]


def _count_flex_calls(monkeypatch) -> dict:
    """Counts the calls of the flex backend's part A (``{"n": calls}``) for the test's duration."""
    from focus_lab.method import decomposition as dec
    calls = {"n": 0}
    real = dec._part_a_flex

    def counted(*a, **kw):
        calls["n"] += 1
        return real(*a, **kw)
    monkeypatch.setattr(dec, "_part_a_flex", counted)
    return calls


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_cuda_bf16_model_takes_flex_and_matches_dense_reference(family, monkeypatch):
    """A retrofitted model in bf16 on the GPU, hard top-2: "auto" runs part A through the flex
    backend (counted), its logits agree with the dense masked reference path's within bf16
    rounding (that path's own distance to the fp32 model bounds it), and KV-cache chunks equal
    the full forward within the same bound."""
    from transformers import DynamicCache

    from focus_lab.hf.retrofit import set_config
    calls = _count_flex_calls(monkeypatch)
    m = _attached(family, sink_tokens=2).cuda()
    ids = torch.randint(3, 97, (2, 300), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        set_config(m, backend="dense")
        ref32 = m(ids).logits.float()
        m = m.to(torch.bfloat16)
        dense16 = m(ids).logits.float()
        set_config(m, backend="auto")
        full = m(ids).logits.float()
        assert calls["n"] > 0
        cache = DynamicCache(config=m.config)
        parts = [m(ids[:, :200], past_key_values=cache, use_cache=True).logits,
                 m(ids[:, 200:], past_key_values=cache, use_cache=True).logits]
    bound = 2 * (dense16 - ref32).abs().max().item() + 1e-2
    assert (full - dense16).abs().max().item() <= bound
    assert (torch.cat(parts, 1).float() - full).abs().max().item() <= bound


def test_cuda_eval_cli_in_bf16_takes_flex(tmp_path, monkeypatch):
    """``focus-lab eval --device cuda --dtype bf16`` on a tiny saved model: it runs, hard top-2
    goes through the flex backend (counted), and its perplexities are within 2% of the same
    command's fp32 run on the CPU."""
    import pandas as pd
    from typer.testing import CliRunner

    import focus_lab
    from conftest import tiny_llama
    from focus_lab.cli import app
    from run_fixtures import TEXT, make_tokenizer
    calls = _count_flex_calls(monkeypatch)
    model_dir, corpus, routers = tmp_path / "model", tmp_path / "corpus.txt", tmp_path / "r.safetensors"
    tiny_llama().save_pretrained(model_dir)
    make_tokenizer().save_pretrained(model_dir)
    corpus.write_text("\n\n".join([TEXT] * 30))
    focus_lab.save_routers(focus_lab.attach(tiny_llama(), focus_lab.FocusConfig(window=8, sink_tokens=2)), routers)
    tables = {}
    for device, dt in (("cpu", "fp32"), ("cuda", "bf16")):
        r = CliRunner().invoke(app, ["eval", "--model", str(model_dir), "--corpus", str(corpus), "--seq-len", "256",
                                     "--max-windows", "2", "--routers", str(routers), "--patterns",
                                     "dense,hard_top1,hard_top2", "--device", device, "--dtype", dt,
                                     "--out", str(tmp_path / f"{dt}.parquet")])
        assert r.exit_code == 0, r.output
        tables[dt] = pd.read_parquet(tmp_path / f"{dt}.parquet").set_index("label")
    assert calls["n"] > 0
    assert ((tables["bf16"].perplexity / tables["fp32"].perplexity - 1).abs() <= 0.02).all()
