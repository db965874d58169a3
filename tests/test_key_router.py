"""FocusConfig.key_router: the key role scores with its own projection (docs/method.md §1.6).

Every check is against an independent computation from the router's tensors: the groups by
brute force from ``h @ W @ C.T``, the mask by brute force from the groups, the soft gate from
both roles' Sinkhorn probabilities, and the KV-cache decode against the full forward."""

import types

import pytest
import torch

import focus_lab
from focus_lab import FocusConfig, RouterMismatchError
from focus_lab.method.core import rms_normalize, sinkhorn
from conftest import cached_logits, soft_forward_layers, soft_gate_reference, tiny_llama

T = 40
W = 4


def _ids(seed=0, batch=2, T=T):
    return torch.randint(3, 97, (batch, T), generator=torch.Generator().manual_seed(seed))


def _key_router_model(seed=0, **changes):
    """A tiny Llama with key routers whose key projections differ from the query ones."""
    model = tiny_llama(layers=2)
    cfg = FocusConfig(**{"mode": "hard", "window": W, "num_groups": 3, "top_k": 1, "key_router": True, **changes})
    focus_lab.attach(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for r in focus_lab.routers(model).values():
            r.key_proj.copy_(torch.randn(r.key_proj.shape, generator=g) / r.key_proj.shape[0] ** 0.5)
            r.group_bias.copy_(torch.randn(3, generator=g))
    return model


@torch.no_grad()
def test_groups_come_from_each_roles_projection_and_the_mask_follows_them():
    model = _key_router_model(top_k=2)
    cfg = focus_lab.focus_config(model)
    ids = _ids()
    with focus_lab.cache(model, ["router_in", "query_groups", "key_group", "kept", "scores"]) as c:
        model(input_ids=ids, use_cache=False)
    differ = 0
    for i, r in focus_lab.routers(model).items():
        h = rms_normalize(c[f"layers.{i}.router_in"])  # (B, T, d)
        a_q = (h @ r.proj @ r.centroids.T) / cfg.tau + r.group_bias  # (B, T, K)
        a_k = (h @ r.key_proj @ r.centroids.T) / cfg.tau + r.group_bias
        qg, kg = c[f"layers.{i}.query_groups"], c[f"layers.{i}.key_group"]
        assert torch.equal(qg, a_q.topk(2, -1).indices)
        assert torch.equal(kg, a_k.argmax(-1))
        differ += int((kg != qg[..., 0]).sum())
        kept = c[f"layers.{i}.kept"]
        for b in range(2):
            for q in range(T):
                for j in range(T):
                    want = j <= q and (q - j < W or int(kg[b, j]) in qg[b, q].tolist())
                    assert bool(kept[b, q, j]) == want
    assert differ > 0  # the key role really used its own projection


@torch.no_grad()
def test_key_router_started_from_a_shared_file_gives_the_shared_outputs(tmp_path):
    shared = tiny_llama(layers=2)
    focus_lab.attach(shared, FocusConfig(mode="hard", window=W, num_groups=3, top_k=1, seed=3))
    with torch.no_grad():
        for r in focus_lab.routers(shared).values():
            r.group_bias.copy_(torch.randn(3))
    path = focus_lab.save_routers(shared, tmp_path / "shared.safetensors")
    ids = _ids(1)
    ref = shared(ids, use_cache=False).logits
    grown = tiny_llama(layers=2)
    focus_lab.attach(grown, FocusConfig(mode="hard", window=W, num_groups=3, top_k=1, key_router=True))
    cfg = focus_lab.load_routers(grown, path)
    assert cfg.key_router and cfg.seed == 3
    for r in focus_lab.routers(grown).values():
        assert torch.equal(r.key_proj, r.proj)
    assert torch.equal(grown(ids, use_cache=False).logits, ref)
    # a key-router file cannot load onto routers without a key projection
    kpath = focus_lab.save_routers(grown, tmp_path / "key.safetensors")
    with pytest.raises(RouterMismatchError, match="differs in shape"):
        focus_lab.load_routers(shared, kpath)


@torch.no_grad()
def test_save_load_round_trip_keeps_the_key_projection(tmp_path):
    model = _key_router_model()
    ids = _ids(2)
    ref = model(ids, use_cache=False).logits
    path = focus_lab.save_routers(model, tmp_path / "r.safetensors")
    other = tiny_llama(layers=2)
    assert focus_lab.load_routers(other, path).key_router
    for i, r in focus_lab.routers(other).items():
        assert torch.equal(r.key_proj, focus_lab.routers(model)[i].key_proj)
    assert torch.equal(other(ids, use_cache=False).logits, ref)


@torch.no_grad()
def test_soft_gate_pairs_query_probabilities_with_key_probabilities():
    cfg, layers = soft_forward_layers(_key_router_model(), _ids(3, batch=1))
    for r, h, kept in layers:
        p_q = sinkhorn(h @ r.proj @ r.centroids.T, cfg.tau, cfg.sinkhorn_iters)[0].exp()  # (1, T, K)
        p_k = sinkhorn(h @ r.key_proj @ r.centroids.T, cfg.tau, cfg.sinkhorn_iters)[0].exp()
        assert torch.allclose(kept, soft_gate_reference(p_q, p_k, W, cfg.eps, cfg.sink_tokens), atol=1e-5)


@torch.no_grad()
def test_decode_through_the_kv_cache_equals_the_full_forward():
    model = _key_router_model(top_k=2)
    ids = _ids(4, batch=1, T=48)
    full = model(ids).logits
    assert (cached_logits(model, ids, [30]) - full).abs().max().item() <= 1e-5
    focus_lab.set_config(model, backend="dense")  # the masked reference, not the decomposition
    assert (model(ids).logits - full).abs().max().item() <= 1e-5


def test_training_moves_the_key_projection_apart(tmp_path):
    from focus_lab import TrainConfig
    from focus_lab.train.loop import train
    model = tiny_llama(layers=2)
    cfg = FocusConfig(window=W, num_groups=3, top_k=1, key_router=True)
    focus_lab.attach(model, cfg)
    windows = [types.SimpleNamespace(input_ids=w) for w in _ids(5, batch=4, T=32)]
    train(model, windows, cfg, TrainConfig(steps=2, batch_size=2, seq_len=32, warmup=1, objective="distill",
                                           distill_queries=8), tmp_path, progress=False)
    for r in focus_lab.routers(model).values():
        assert not torch.equal(r.key_proj, r.proj)
    cfg2, _, tensors, _ = focus_lab.hf.retrofit.read_router_file(tmp_path / "routers.safetensors")
    assert cfg2.key_router and "layers.0.key_proj" in tensors


def test_key_router_is_a_shape_field():
    model = _key_router_model()
    with pytest.raises(ValueError, match="key_router"):
        focus_lab.forward_state(model, key_router=False)
    with pytest.raises(focus_lab.ConfigError, match="key_router"):
        FocusConfig(key_router="yes")


@torch.no_grad()
def test_key_fit_solves_the_weighted_ridge_regression():
    """analyses/studies/key_fit: the fitted W_k satisfies the normal equations of the weighted
    regression, rebuilt here from the cached router inputs and a brute-force attention."""
    from analyses.studies.key_fit import fit_key_projection
    model = tiny_llama(layers=2)
    focus_lab.attach(model, FocusConfig(mode="hard", window=W, num_groups=3, top_k=1, key_router=True, sink_tokens=2))
    ids = _ids(6, batch=1)
    fit_key_projection(model, [types.SimpleNamespace(input_ids=ids[0])], lam=0.5)
    with focus_lab.cache(model, ["router_in", "query", "key"]) as c:
        model(input_ids=ids, use_cache=False, focus=focus_lab.forward_state(model, mode="dense"))
    for i, r in focus_lab.routers(model).items():
        x = rms_normalize(c[f"layers.{i}.router_in"][0]).double()  # (T, d)
        q, k = c[f"layers.{i}.query"][0].double(), c[f"layers.{i}.key"][0].double()
        k = k.repeat_interleave(q.shape[0] // k.shape[0], 0)
        logits = q @ k.transpose(-1, -2) * model.model.layers[i].self_attn.scaling
        A = torch.zeros(T, T, dtype=torch.double)
        for h in range(q.shape[0]):
            for a in range(T):
                A[a, :a + 1] += torch.softmax(logits[h, a, :a + 1], -1) / q.shape[0]
        for a in range(T):
            for j in range(T):
                if a - j < W or j < 2:
                    A[a, j] = 0
        wk, wg = r.key_proj.double(), r.proj.double()
        G = x.T @ (A.sum(0)[:, None] * x) / A.sum()
        m = G.diagonal().mean()
        residual = G @ wk + 0.5 * m * (wk - wg) - x.T @ (A.T @ (x @ wg)) / A.sum()
        assert residual.abs().max() < 1e-4 * (x.T @ (A.T @ (x @ wg)) / A.sum()).abs().max()
        assert not torch.allclose(wk, wg)


@torch.no_grad()
def test_non_finite_key_projection_names_the_layer():
    model = _key_router_model()
    focus_lab.routers(model)[1].key_proj.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="layer 1"):
        model(input_ids=_ids(), use_cache=False)
