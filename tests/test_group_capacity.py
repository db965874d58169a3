"""FocusConfig.group_capacity: a key whose first-choice group is the first choice of more than
``capacity * (p + 1)`` of positions 0..p moves to its second group (docs/method.md §2.9).

Checked against a position-by-position loop written from the definition, the groups a hooked
forward shows against those recomputed from ``h @ W @ C.T``, and the KV-cache decode and the
two-call decomposition against the full forward through the masked reference."""

import pytest
import torch

import focus_lab
from focus_lab import FocusConfig
from focus_lab.patterns.legacy import CAPACITY, legacy_changes as pattern_changes  # the committed tables' labels
from focus_lab.method.config import ConfigError
from focus_lab.method.core import distant_pairs_kept, rms_normalize
from focus_lab.patterns.rules.capacity import capacity_key_group
from conftest import cached_logits, random_ids, tiny_llama

W = 4  # window (tokens), also the positions that never move


def _loop(logits, capacity, warmup, start=0, counts=None, overflow="second"):
    """The rule one position at a time, from its definition (an evicted key: group K)."""
    B, T, K = logits.shape
    out = torch.empty(B, T, dtype=torch.long)
    for b in range(B):
        n = [0] * K if counts is None else counts[b].tolist()
        for t in range(T):
            order = logits[b, t].argsort(descending=True).tolist()
            first, p = order[0], start + t
            n[first] += 1
            over = p >= warmup and n[first] > capacity * (p + 1)
            out[b, t] = (K if overflow == "evict" else order[1]) if over else first
    return out


@pytest.mark.parametrize("overflow", ["second", "evict"])
@pytest.mark.parametrize("capacity", [0.3, 0.5, 0.9])
def test_rule_equals_the_loop_in_one_forward_and_in_two(capacity, overflow):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 90, 3, generator=g)
    logits[:, 20:70, 0] += 3.0  # a stretch where most tokens pick group 0
    first = logits.argmax(-1)
    want = _loop(logits, capacity, W, overflow=overflow)
    got, counts = capacity_key_group(logits, first, capacity, 0, W, overflow=overflow)
    assert torch.equal(got, want)
    assert torch.equal(counts, torch.stack([torch.bincount(f, minlength=3) for f in first]))
    moved = (got != first).sum().item()
    assert moved > 0 if capacity < 0.9 else True  # the test sees the rule at work
    assert (got == 3).sum().item() == (moved if overflow == "evict" else 0)  # evicted: group K = 3
    a, ca = capacity_key_group(logits[:, :50], first[:, :50], capacity, 0, W, overflow=overflow)  # a prefill,
    b, _ = capacity_key_group(logits[:, 50:], first[:, 50:], capacity, 50, W, ca, overflow)  # then the rest
    assert torch.equal(torch.cat([a, b], 1), want)
    with pytest.raises(RuntimeError, match="position 50"):
        capacity_key_group(logits[:, 50:], first[:, 50:], capacity, 50, W)


def _model(top_k=1, **changes):
    model = tiny_llama(layers=2)
    cfg = FocusConfig(**{"mode": "hard", "window": W, "num_groups": 3, "top_k": top_k, "group_capacity": 0.5,
                         **changes})
    focus_lab.attach(model, cfg)
    with torch.no_grad():  # group 0 the first choice of most tokens: the cap has work to do
        for r in focus_lab.routers(model).values():
            r.group_bias.copy_(torch.tensor([4.0, 0.0, 0.0]))
    return model


@torch.no_grad()
def test_the_forward_moves_the_keys_the_rule_names_and_keeps_fewer_pairs():
    model = _model(top_k=1)
    cfg = focus_lab.focus_config(model)
    ids = random_ids(3, batch=1, T=60)
    with focus_lab.cache(model, ["router_in", "query_groups", "key_group"]) as c:
        model(input_ids=ids, use_cache=False)
    with focus_lab.cache(model, ["query_groups", "key_group"]) as free:
        model(input_ids=ids, use_cache=False, focus=focus_lab.forward_state(model, group_capacity=0.0))
    for i, r in focus_lab.routers(model).items():
        h = rms_normalize(c[f"layers.{i}.router_in"])  # (B, T, d)
        a = (h @ r.proj @ r.centroids.T) / cfg.tau + r.group_bias  # (B, T, K)
        qg, kg = c[f"layers.{i}.query_groups"], c[f"layers.{i}.key_group"]
        assert torch.equal(qg, a.topk(1, -1).indices)  # queries keep their groups
        assert torch.equal(kg, _loop(a, 0.5, W))
        assert torch.equal(free[f"layers.{i}.key_group"], a.argmax(-1))
        assert (kg != a.argmax(-1)).any()
        kept = distant_pairs_kept(qg, kg, W)
        assert kept < distant_pairs_kept(free[f"layers.{i}.query_groups"], free[f"layers.{i}.key_group"], W)


@torch.no_grad()
def test_capacity_layers_cap_only_the_layers_named():
    """``capacity_layers=[1]``: layer 1's keys follow the rule, layer 0's stay at their top-1,
    and the cached decode still equals the full forward."""
    model = _model(top_k=1, capacity_layers=[1])
    cfg = focus_lab.focus_config(model)
    assert (cfg.capacity_at(0), cfg.capacity_at(1)) == (0.0, 0.5)
    ids = random_ids(5, batch=1, T=60)
    with focus_lab.cache(model, ["router_in", "key_group"]) as c:
        model(input_ids=ids, use_cache=False)
    for i, r in focus_lab.routers(model).items():
        h = rms_normalize(c[f"layers.{i}.router_in"])  # (B, T, d)
        a = (h @ r.proj @ r.centroids.T) / cfg.tau + r.group_bias  # (B, T, K)
        want = _loop(a, 0.5, W) if i == 1 else a.argmax(-1)
        assert torch.equal(c[f"layers.{i}.key_group"], want)
    assert not torch.equal(_loop(a, 0.5, W), a.argmax(-1))  # layer 1's rule moved keys
    ref = model(ids, focus=focus_lab.forward_state(model, backend="dense")).logits
    assert (cached_logits(model, ids, [30, 37]) - ref).abs().max().item() <= 1e-5
    with pytest.raises(ConfigError, match="capacity_layers"):
        FocusConfig(num_groups=4, group_capacity=0.5, capacity_layers=[-1])
    assert FocusConfig(num_groups=4, group_capacity=0.5, capacity_layers=(3, 1, 3)).capacity_layers == [1, 3]


@pytest.mark.parametrize("top_k,key_shift,overflow", [(1, 0, "second"), (2, 1, "second"), (1, 0, "evict"),
                                                     (2, 1, "evict")])
@torch.no_grad()
def test_two_call_path_and_kv_cache_decode_equal_the_masked_reference(top_k, key_shift, overflow):
    model = _model(top_k=top_k, key_shift=key_shift, sink_tokens=2, capacity_overflow=overflow)
    ids = random_ids(4, batch=1, T=48)
    ref = model(ids, focus=focus_lab.forward_state(model, backend="dense")).logits
    assert (model(ids).logits - ref).abs().max().item() <= 1e-5
    # without the cap the outputs differ: the test sees the rule
    free = model(ids, focus=focus_lab.forward_state(model, group_capacity=0.0)).logits
    assert (free - ref).abs().max().item() > 1e-3
    assert (cached_logits(model, ids, [30, 37]) - ref).abs().max().item() <= 1e-5
    if top_k == 2:  # a moved key reaches the queries whose second group it joins: the overflows differ
        other = "second" if overflow == "evict" else "evict"
        assert (model(ids, focus=focus_lab.forward_state(model, capacity_overflow=other)).logits - ref).abs().max() > 1e-3


@torch.no_grad()
def test_evicted_keys_are_kept_by_the_window_and_sinks_only():
    """With ``capacity_overflow="evict"`` a key over the capacity is in no group: the hooked key
    groups equal the loop's (K for an evicted key), the brute-force mask of those groups keeps
    an evicted key only within the window or as a sink, fewer distant pairs than moving them
    to their second group, and the group shares sum to the kept keys' share."""
    from focus_lab.method.core import hard_group_shares, hard_mask
    model = _model(top_k=2, sink_tokens=1, capacity_overflow="evict")
    cfg = focus_lab.focus_config(model)
    ids = random_ids(7, batch=1, T=60)
    with focus_lab.cache(model, ["router_in", "query_groups", "key_group"]) as c:
        model(input_ids=ids, use_cache=False)
    with focus_lab.cache(model, ["query_groups", "key_group"]) as moved:
        model(input_ids=ids, use_cache=False, focus=focus_lab.forward_state(model, capacity_overflow="second"))
    pos = torch.arange(60)
    for i, r in focus_lab.routers(model).items():
        h = rms_normalize(c[f"layers.{i}.router_in"])  # (B, T, d)
        a = (h @ r.proj @ r.centroids.T) / cfg.tau + r.group_bias  # (B, T, K)
        qg, kg = c[f"layers.{i}.query_groups"], c[f"layers.{i}.key_group"]
        assert torch.equal(kg, _loop(a, 0.5, W, overflow="evict"))
        out = kg[0] == 3  # (T,) evicted keys
        assert out.sum() > 10
        m = hard_mask(qg, kg, W, pos, pos, sinks=1)[0]  # (T, T)
        d = pos[:, None] - pos[None, :]  # (T, T)
        assert torch.equal(m[:, out], ((d >= 0) & ((d < W) | (pos[None, :] < 1)))[:, out])
        kept = distant_pairs_kept(qg, kg, W, 1)
        assert kept < distant_pairs_kept(moved[f"layers.{i}.query_groups"], moved[f"layers.{i}.key_group"], W, 1)
        shares = hard_group_shares(kg, 3)
        assert shares.shape == (3,) and abs(float(shares.sum()) - (1 - out.float().mean().item())) < 1e-6


def test_bad_capacity_and_the_pattern_suffix():
    for bad in (0.25, 1.5, -0.1, True):
        with pytest.raises(ConfigError, match="group_capacity"):
            FocusConfig(num_groups=4, group_capacity=bad)
    assert FocusConfig(num_groups=4, group_capacity=0.26).group_capacity == 0.26
    assert pattern_changes("hard_top2_cap", 4) == {"mode": "hard", "top_k": 2, "assignment": "router",
                                                   "group_capacity": CAPACITY, "capacity_layers": None,
                                                   "capacity_overflow": "second", "capacity_top_k": None}
    # @LAYERS: the cap in those layers only
    assert pattern_changes("hard_top2_match_cap60@0+13-15", 4) == {
        "mode": "hard", "top_k": 2, "assignment": "router", "match_shifts": [0, 1], "group_capacity": 0.6,
        "capacity_layers": [0, 13, 14, 15], "capacity_overflow": "second", "capacity_top_k": None}
    # _evict: the same capacity and layers, the keys over it in no group
    assert pattern_changes("hard_top2_evict70@13+15-16", 4) == {
        "mode": "hard", "top_k": 2, "assignment": "router", "group_capacity": 0.7,
        "capacity_layers": [13, 15, 16], "capacity_overflow": "evict", "capacity_top_k": None}
    assert pattern_changes("hard_top2_evict", 4)["group_capacity"] == CAPACITY
    with pytest.raises(ConfigError, match="capacity_overflow"):
        FocusConfig(num_groups=4, group_capacity=0.5, capacity_overflow="drop")
    assert pattern_changes("hard_top2_cap@2", 4)["capacity_layers"] == [2]
    with pytest.raises(ConfigError, match="capacity layers"):
        pattern_changes("hard_top2_cap@-3", 4)
    assert pattern_changes("hard_top2_match_nocap", 4)["group_capacity"] == 0.0
    # _capNN: the capacity NN / 100, after the other suffixes
    assert pattern_changes("hard_top2_match_cap70", 4) == {"mode": "hard", "top_k": 2, "assignment": "router",
                                                           "match_shifts": [0, 1], "group_capacity": 0.7,
                                                           "capacity_layers": None, "capacity_overflow": "second", "capacity_top_k": None}
    with pytest.raises(ConfigError, match="unknown pattern"):
        pattern_changes("hard_top2_cap7", 4)
    with pytest.raises(ConfigError, match="group_capacity"):  # 0.05 <= 1 / num_groups
        FocusConfig(num_groups=4, **pattern_changes("hard_top2_cap05", 4))


def test_capacity_top_k_limits_the_cap_to_the_asked_top_k():
    """capacity_top_k = [2] (the shipped file's): the cap in force for top-2 only, in its layers;
    an explicit _cap / _evict suffix applies it to any top-k, _nocap drops it; the length table
    records what each pattern ran with, so a row made without the cap never stands for one with it."""
    from analyses.length_table import capacity_in_force
    cfg = FocusConfig(num_groups=4, group_capacity=0.5, capacity_layers=[13, 15], capacity_overflow="evict",
                      capacity_top_k=[2])
    assert [cfg.replace(mode="hard", top_k=k).capacity_at(13) for k in (1, 2, 3)] == [0.0, 0.5, 0.0]
    assert cfg.replace(mode="hard", top_k=2).capacity_at(14) == 0.0
    assert capacity_in_force(cfg, "hard_top2") == "0.5@13,15:evict"
    assert capacity_in_force(cfg, "hard_top1") == ""
    assert capacity_in_force(cfg, "hard_top2_nocap") == ""
    assert capacity_in_force(cfg, "random_top2") == capacity_in_force(cfg, "shuffled_top2") == ""
    assert capacity_in_force(cfg, "hard_top1_evict@13") == "0.5@13:evict"  # the suffix: any top-k
    assert capacity_in_force(FocusConfig(num_groups=4), "hard_top2_cap") == "0.5@all:second"
    for bad in ([0], [5], [True], 2):
        with pytest.raises(ConfigError, match="capacity_top_k"):
            FocusConfig(num_groups=4, capacity_top_k=bad)
    assert FocusConfig(num_groups=4, capacity_top_k=[2, 1, 2]).capacity_top_k == [1, 2]


def test_capacity_reuse_rule_keeps_rows_without_the_cap_out():
    """length_table.same_router_rows: rows of a file differing only in the capacity (the shipped
    file's ``capacity_only_sha256``) count for hard top-1 (no cap under either file) and not for
    hard top-2 (the cap now in force); rows recorded with the same capacity count."""
    import pandas as pd
    from analyses.length_table import same_router_rows
    cfg = FocusConfig(num_groups=4, group_capacity=0.5, capacity_layers=[13], capacity_overflow="evict",
                      capacity_top_k=[2], mode="hard")
    old = pd.DataFrame({"label": ["hard_top1", "hard_top2", "hard_top2"], "window": [0, 0, 1],
                        "routers_sha256": ["before", "before", "before"], "seed": 0,
                        "capacity": ["", "", "0.5@13:evict"]})
    got = same_router_rows(old, ["hard_top1", "hard_top2"], [0, 1], cfg, set(), "own", {"before"})
    assert sorted(zip(got.label, got.window)) == [("hard_top1", 0), ("hard_top2", 1)]
    assert same_router_rows(old, ["hard_top1"], [0], cfg, set(), "own").empty  # another file: nothing


def test_study_tables_from_hand_made_rows():
    """analyses.studies.group_capacity: scores relative to dense, pairs kept and the paired
    log-prob change on three cases; perplexity changes over dense and the cap's over hard top-2
    on two windows, checked by hand."""
    import math
    import pandas as pd
    from analyses.studies.group_capacity import perplexity_rows, retrieval_rows
    rows = []
    for seed in range(3):
        for p, score, lp, pairs in (("dense", 1.0, -1.0, 1.0), ("hard_top2", 1.0, -1.5, 0.65),
                                    ("hard_top2_cap", 1.0 if seed else 0.0, -2.0 - seed, 0.55)):
            rows.append({"task": "niah_single_1", "length": 4096, "seed": seed, "pattern": p, "score": score,
                         "answer_logprob": lp, "distant_pairs_kept": pairs, "needle_pairs_kept": 1.0,
                         "needle_mass_kept": 1.0, "seconds": 1.0, "bare_forward_seconds": 1.0})
    rows.append({**rows[0], "task": "passkey"})  # a task without the cap: left out
    r = retrieval_rows(pd.DataFrame(rows))
    assert list(r.task) == ["niah_single_1"] and r.cases[0] == 3
    assert r["hard_top2_cap vs dense"][0].startswith("0.67 [") and r["hard_top2 vs dense"][0] == "1.00 [1.00, 1.00]"
    assert math.isclose(r["hard_top2_cap pairs"][0], 0.55) and r["cap - hard_top2 (nats)"][0].startswith("-1.50 [")
    cells = pd.DataFrame([{"corpus": "austen", "seq_len": 4096, "window": w, "label": p, "nll": nll, "tokens": 100,
                           "distant_pairs_kept": 0.5, "max_group_share": 0.3}
                          for w in (0, 1) for p, nll in (("dense", 2.0), ("hard_top2", 2.01), ("hard_top2_cap", 2.03))])
    p = perplexity_rows(cells)
    assert math.isclose(p["hard_top2 vs dense %"][0], 100 * (math.exp(0.01) - 1), rel_tol=1e-9)
    assert p["cap - hard_top2 (%)"][0] == f"{100 * (math.exp(0.02) - 1):+.2f} [{100 * (math.exp(0.02) - 1):+.2f}, " \
                                          f"{100 * (math.exp(0.02) - 1):+.2f}]"
    # the sweep: two tables sharing their dense and hard top-2 windows, each capacity against hard top-2
    from analyses.studies.group_capacity import sweep_rows
    sweep = pd.DataFrame([{"corpus": "man-pages", "seq_len": 4096, "window": w, "label": p, "nll": nll, "tokens": 100}
                          for w in (0, 1) for p, nll in (("dense", 2.0), ("hard_top2", 2.01), ("hard_top2_cap", 2.05),
                                                         ("hard_top2_cap70", 2.02))])
    both = pd.concat([sweep[sweep.label != "hard_top2_cap70"], sweep[sweep.label != "hard_top2_cap"]])
    s = sweep_rows(both, patterns=("hard_top2_cap", "hard_top2_cap70"))
    assert len(s) == 1 and s.windows[0] == 2
    for p, d in (("hard_top2_cap", 0.04), ("hard_top2_cap70", 0.01)):
        assert s[f"{p} - hard_top2 (%)"][0].startswith(f"{100 * (math.exp(d) - 1):+.2f} [")
    assert sweep_rows(both, patterns=("hard_top2_cap60",)).empty  # a capacity no table holds: no row
    # per-layer caps: each pattern's change over hard top-2 per corpus, a corpus without it left blank
    from analyses.studies.group_capacity import over_hard_top2
    other = sweep.assign(corpus="python-docs")
    other = other[other.label != "hard_top2_cap70"]
    o = over_hard_top2(pd.concat([sweep, other]), ("hard_top2_cap70", "hard_top2_cap"))
    assert list(o.pattern) == ["hard_top2_cap70", "hard_top2_cap"]
    assert o["man-pages 4096"][0].startswith(f"{100 * (math.exp(0.01) - 1):+.2f} [") and pd.isna(o["python-docs 4096"][0])
    assert o["python-docs 4096"][1] == o["man-pages 4096"][1]
    # the pattern pair is a parameter: the same rows under another cap's name
    renamed = cells.replace({"label": {"hard_top2_cap": "hard_top2_cap@14"}})
    q = perplexity_rows(renamed, ("hard_top2", "hard_top2_cap@14"))
    assert q["cap - hard_top2 (%)"][0] == perplexity_rows(cells)["cap - hard_top2 (%)"][0]


def test_saved_probe_rows_merge_by_key(tmp_path):
    """``group_capacity --save``: the rows of two invocations accumulate in one parquet, a row saved
    again under its key replaces the old one, ``layer_means`` counts a pattern of two invocations
    once, and a file of other columns is refused."""
    import pandas as pd
    from analyses.studies.group_capacity import SAVED_COLUMNS, layer_means, save_rows
    from focus_lab.hf.shipped import shipped_router_file
    from focus_lab.io import file_sha256

    def rows(inp, pattern, first, pairs, seed=0):
        return pd.DataFrame([{"input": inp, "length": 4096, "seed": seed, "pattern": pattern, "moved_from": first,
                              "layer_idx": i, "k": 2, "assignment": "routed", "pairs": pairs + i / 10,
                              "largest_group": 0.3, "moved": 0.0} for i in range(2)])
    path = tmp_path / "layers.parquet"
    save_rows(path, pd.concat([rows("niah_single_1", "a", "a", 0.5), rows("niah_single_1", "b", "a", 0.4)]), "layers")
    t = save_rows(path, pd.concat([rows("niah_single_1", "a", "a", 0.6), rows("man-pages:167", "a", "a", 0.7, None),
                                   rows("niah_single_1", "b", "b", 0.4)]), "layers")
    assert list(t.columns) == SAVED_COLUMNS["layers"] and len(t) == 8
    assert set(t.routers_sha256) == {file_sha256(shipped_router_file())} and (t.schema_version == 1).all()
    m = layer_means(pd.read_parquet(path)).set_index(["input", "pattern"])
    assert m.loc[("niah_single_1", "a")].pairs == pytest.approx(0.65)  # replaced, not averaged with 0.55
    assert m.loc[("niah_single_1", "b")].layers == 2 and pd.isna(m.loc[("man-pages:167", "a")].seed)
    loo = pd.DataFrame([{"task": "niah_single_1", "length": 8192, "seed": 6, "pattern": "p", "variant": "p",
                         "answer_logprob": -1.0}])
    with pytest.raises(SystemExit, match="columns"):
        save_rows(path, loo, "leave_one_out")


@torch.no_grad()
def test_rewind_point_gives_back_the_prefill_caches():
    """``state.rewind_point``: after a prefill of 30 tokens and 6 more through its caches,
    ``restore()`` gives caches that decode exactly as a fresh prefill's (KV cache cropped, the
    FocusCache's key groups, first-choice counts and next key groups as they were); a cache of
    other layer types is copied instead of cropped."""
    from transformers.cache_utils import DynamicLayer
    from focus_lab.hf.retrofit import FocusForward
    from focus_lab.hf.state import rewind_point
    model = _model(top_k=2, key_shift=1)
    ids = random_ids(6, batch=1, T=40)

    def prefill():
        state = focus_lab.forward_state(model, cache=True)
        return model(ids[:, :30], use_cache=True, focus=state).past_key_values, state

    past, state = prefill()
    restore = rewind_point(past, state.cache)
    model(ids[:, 30:36], past_key_values=past, use_cache=True, focus=state)  # e.g. a teacher-forced answer
    assert past.get_seq_length() == 36 and state.cache.seen(0) == 36
    past2, fcache = restore()
    assert past2 is past and past2.get_seq_length() == 30 and fcache.seen(0) == 30  # cropped, not copied
    got = model(ids[:, 30:34], past_key_values=past2, use_cache=True, focus=FocusForward(state.config, fcache)).logits
    fresh, fstate = prefill()
    want = model(ids[:, 30:34], past_key_values=fresh, use_cache=True, focus=fstate).logits
    assert torch.equal(got, want)
    assert {"capacity", "key_shift"} <= set(next(iter(fstate.cache.carried.values())))  # both restored

    class OtherLayer(DynamicLayer):  # not a plain DynamicLayer: copied, and the copy is the prefill's
        pass
    past, state = prefill()
    for layer in past.layers:
        layer.__class__ = OtherLayer
    restore = rewind_point(past, state.cache)
    model(ids[:, 30:36], past_key_values=past, use_cache=True, focus=state)
    past2, fcache = restore()
    assert past2 is not past and past2.get_seq_length() == 30 and past.get_seq_length() == 36
    got = model(ids[:, 30:34], past_key_values=past2, use_cache=True, focus=FocusForward(state.config, fcache)).logits
    assert torch.equal(got, want)
