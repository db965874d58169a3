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


def test_results_table_from_hand_made_heads(tmp_path):
    """analyses.output_error_table: per mask the mean recall, the error's median and quartiles,
    the worst head and the correlation over heads, on four hand-made heads; a run without the
    tables stops with one line naming the option."""
    import pandas as pd
    from analyses.output_error_table import head_rows, mask_rows
    errs = {"focus": [0.1, 0.2, 0.3, 0.9], "window": [1.0, 1.0, 2.0, 3.0]}
    covs = {"focus": [0.9, 0.8, 0.7, 0.2], "window": [0.5, 0.6, 0.4, 0.1]}
    rows = [{"layer_idx": i // 2, "head": i % 2, "pattern": p, "output_error": errs[p][i], "queries": 10,
             "coverage": covs[p][i]} for p in errs for i in range(4)]
    import json
    from focus_lab.runs import MANIFEST, SCHEMA_VERSION
    (tmp_path / MANIFEST).write_text(json.dumps({"schema_version": SCHEMA_VERSION}))
    pd.DataFrame(rows).drop(columns="coverage").to_parquet(tmp_path / "output_error.parquet")
    with pytest.raises(SystemExit, match="no coverage table"):
        head_rows(tmp_path)
    pd.DataFrame(rows).drop(columns=["output_error"]).to_parquet(tmp_path / "coverage.parquet")
    t = mask_rows(head_rows(tmp_path)).set_index("mask")
    assert list(t.index) == ["Focus hard top-k", "window + sinks"]  # MASKS order, only those recorded
    f = t.loc["Focus hard top-k"]
    assert f.recall == pytest.approx(0.65) and f.error == "0.250 [0.175, 0.450]" and f["worst head"] == "0.90 (L1H1)"
    assert f.correlation == pytest.approx(pd.Series(covs["focus"]).corr(pd.Series(errs["focus"])))
    assert t.loc["window + sinks", "worst head"] == "3.00 (L1H1)"
