"""The recorder's output error (metric ``output_error``, table ``output_error``): each mask's
``||O - O^X|| / ||O||`` per layer and head, against dense attention and the softmax over the kept keys
computed here by hand from the layer's own queries, keys, values and mask."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

import focus_lab
from focus_lab import FocusConfig
from focus_lab.method.metrics import attention_scale, expand_kv


@torch.no_grad()
@pytest.mark.parametrize("chunk", [1 << 23, 512])  # one chunk, and many query chunks
def test_output_error_equals_hand_computation(chunk):
    model = tiny_llama(layers=2)
    focus_lab.attach(model, FocusConfig(mode="hard", window=6, num_groups=4, top_k=1, sink_tokens=2))
    ids = torch.randint(3, 97, (2, 48), generator=torch.Generator().manual_seed(3))
    with focus_lab.record(model, metrics=["coverage", "output_error"], chunk_elements=chunk) as rec, \
            focus_lab.cache(model, ["query", "key", "value", "kept"]) as c:
        model(ids, use_cache=False)
    t = rec.tables()["output_error"]
    assert set(t["pattern"]) == {"focus", "window", "window_matched", "random"}
    assert (t["queries"] == 2 * 48).all()
    focus = t[t["pattern"] == "focus"].set_index(["layer_idx", "head"])["output_error"]
    window = t[t["pattern"] == "window"].set_index(["layer_idx", "head"])["output_error"]
    modules = dict(focus_lab.hf.retrofit.attention_modules(model))
    T = ids.shape[1]
    pos = torch.arange(T)
    for layer in focus_lab.routers(model):
        q, k, v = (c[f"layers.{layer}.{n}"].float() for n in ("query", "key", "value"))
        H = q.shape[1]
        k, v = expand_kv(k, H), expand_kv(v, H)
        logits = q @ k.transpose(-1, -2) * attention_scale(modules[layer], q.shape[-1])  # (B, H, T, T)
        causal = pos[None, :] <= pos[:, None]
        P = torch.softmax(logits.masked_fill(~causal, float("-inf")), -1)
        O = P @ v
        local = causal & ((pos[:, None] - pos[None, :] < 6) | (pos[None, :] < 2))
        for mask, got in ((c[f"layers.{layer}.kept"][:, None], focus), (local, window)):
            OX = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ v
            want = ((O - OX).pow(2).sum((0, 2, 3)) / O.pow(2).sum((0, 2, 3))).sqrt()  # (H,)
            for h in range(H):
                assert got[(layer, h)] == pytest.approx(float(want[h]), rel=1e-4, abs=1e-6)
    assert 0 < focus.mean() < window.mean()  # groups keep more than the window alone: the check can fail


def test_output_error_is_opt_in():
    from focus_lab.recording.options import ALL_METRICS, DEFAULT_METRICS, RecordOptions
    assert "output_error" in ALL_METRICS and "output_error" not in DEFAULT_METRICS
    assert RecordOptions().metrics == DEFAULT_METRICS
