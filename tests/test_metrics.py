"""focus_lab.method.metrics against brute-force computations (explicit loops over pairs)."""

import math

import numpy as np
import pytest
import torch

from focus_lab.method import core
from focus_lab.method import metrics as M
from focus_lab.method.config import FocusConfig


# ------------------------------------------------------------------ brute force references

def bf_mask(qg, kg, w, T, s=0):
    """M(i,j) = [j<=i] and (g(j) in G(i) or i-j < w or j < s), one pair at a time."""
    m = np.zeros((T, T), dtype=bool)
    for i in range(T):
        for j in range(i + 1):
            m[i, j] = (i - j < w) or j < s or (int(kg[j]) in [int(x) for x in qg[i]])
    return m


def bf_dense(q, k, scale):
    """(H, T, T) causal softmax, one row at a time, in float64."""
    H, T, _ = q.shape
    P = np.zeros((H, T, T))
    for h in range(H):
        for i in range(T):
            s = np.array([float(q[h, i] @ k[h, j]) * scale for j in range(i + 1)])
            e = np.exp(s - s.max())
            P[h, i, : i + 1] = e / e.sum()
    return P


def bf_soft(q, k, scale, p, w, eps, sinks=0):
    """(H, T, T) Focus soft attention: gated logits + log max(p_i . p_j, eps)."""
    H, T, _ = q.shape
    S = np.zeros((H, T, T))
    for h in range(H):
        for i in range(T):
            s = []
            for j in range(i + 1):
                x = float(q[h, i] @ k[h, j]) * scale
                if i - j >= w and j >= sinks:
                    x += math.log(max(float(p[i] @ p[j]), eps))
                s.append(x)
            s = np.array(s)
            e = np.exp(s - s.max())
            S[h, i, : i + 1] = e / e.sum()
    return S


def _groups(T, K, k, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, T, K, generator=g)
    qg, kg = core.hard_assign(scores, 0.1, k)
    return scores, qg, kg


def _qk(B, H, T, D, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)


# ------------------------------------------------------------------ balance

def test_balance_numbers_on_a_hand_made_assignment():
    # 4 tokens, K = 3: hard groups 0,0,0,1; soft rows given explicitly
    q = torch.tensor([[0.8, 0.2, 0.0], [0.6, 0.2, 0.2], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    hard = torch.tensor([0, 0, 0, 1])
    s = M.balance_stats(q, hard, 3)
    assert s["hard_largest_share"] == pytest.approx(0.75)
    assert s["soft_largest_share"] == pytest.approx(2.4 / 4)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(3)
    assert s["hard_entropy"] == pytest.approx(h)
    soft = np.array([2.4, 1.4, 0.2]) / 4
    assert s["soft_entropy"] == pytest.approx(-(soft * np.log(soft)).sum() / math.log(3))
    assert s["empty_groups"] == 1
    assert s["marginal_error"] == pytest.approx(abs(0.2 - 4 / 3) / (4 / 3))  # the emptiest column
    soft_t, hard_t = M.group_shares(q, hard, 3)
    assert torch.allclose(soft_t, torch.tensor(soft, dtype=torch.float32))
    assert torch.allclose(hard_t, torch.tensor([0.75, 0.25, 0.0]))


def test_balanced_and_collapsed_extremes():
    K = 4
    uniform = torch.full((8, K), 1 / K)
    s = M.balance_stats(uniform, torch.arange(8) % K, K)
    assert s["soft_entropy"] == pytest.approx(1) and s["hard_entropy"] == pytest.approx(1)
    assert s["marginal_error"] == pytest.approx(0, abs=1e-6) and s["empty_groups"] == 0
    collapsed = torch.zeros(8, K)
    collapsed[:, 2] = 1
    s = M.balance_stats(collapsed, torch.full((8,), 2), K)
    assert s["hard_largest_share"] == 1 and s["hard_entropy"] == pytest.approx(0)
    assert s["empty_groups"] == 3 and s["marginal_error"] == pytest.approx(3.0)
    assert M.normalized_entropy(torch.tensor([1.0])) == 1.0


def test_assignment_distributions_reuse_core():
    g = torch.Generator().manual_seed(3)
    scores = 0.1 * torch.randn(2, 30, 4, generator=g) + torch.tensor([0.1, 0.0, 0.0, 0.0])  # S/tau ~ N(0, 1)
    bias = torch.tensor([0.5, -0.2, 0.0, 0.1])
    d = M.assignment_distributions(scores, 0.1, 10, bias)
    assert set(d) == set(M.ASSIGNMENT_KINDS)
    for q, hard in d.values():
        assert torch.allclose(q.sum(-1), torch.ones(2, 30), atol=1e-5)
        assert torch.equal(hard, q.argmax(-1))
    assert torch.equal(d["causal"][1], core.hard_assign(scores, 0.1, 1, bias)[1])
    assert torch.allclose(d["sinkhorn"][0], core.sinkhorn(scores, 0.1, 10)[0].exp())
    # Sinkhorn balances the columns; plain softmax does not have to
    assert M.marginal_error(d["sinkhorn"][0][0]) < 1e-2 < M.marginal_error(d["softmax"][0][0])
    margin = M.top1_margin(scores, 0.1, bias)
    a = scores / 0.1 + bias
    srt = a.sort(-1, descending=True).values
    assert torch.allclose(margin, srt[..., 0] - srt[..., 1])


# ------------------------------------------------------------------ pair counts

@pytest.mark.parametrize("T,w,K,k,s", [(1, 4, 3, 1, 0), (9, 4, 3, 2, 0), (30, 5, 4, 1, 0), (30, 40, 4, 2, 0),
                                       (25, 1, 2, 2, 0), (30, 5, 4, 1, 3), (12, 3, 2, 1, 20),
                                       (40, 6, 4, 2, 5), (64, 3, 8, 3, 9)])
def test_kept_pairs_and_matched_window(T, w, K, k, s):
    _, qg, kg = _groups(T, K, k, seed=T + w)
    m = bf_mask(qg[0], kg[0], w, T, s)
    assert int(M.kept_pairs(qg, kg, w, s)[0]) == m.sum()
    for ww in (1, w, T + 3):
        assert M.window_pairs(T, ww, s) == bf_mask(torch.full((T, 1), -1), kg[0], ww, T, s).sum()
    wm = M.matched_window(int(m.sum()), T, s)
    best = min(range(1, T + 1), key=lambda x: (abs(M.window_pairs(T, x, s) - m.sum()), x))
    assert wm == best


def test_distance_edges():
    assert M.distance_edges(512, 128) == [0, 128, 256, 512]
    assert M.distance_edges(1024, 128) == [0, 128, 256, 512, 1024]
    assert M.distance_edges(600, 128) == [0, 128, 256, 512, 600]
    assert M.distance_edges(50, 128) == [0, 50]


def test_expand_kv_matches_transformers_repeat_kv():
    from transformers.models.llama.modeling_llama import repeat_kv
    k = torch.randn(2, 3, 5, 4)
    assert torch.equal(M.expand_kv(k, 9), repeat_kv(k, 3))
    assert torch.equal(M.expand_kv(k, 9, [1, 7]), repeat_kv(k, 3)[:, [1, 7]])


# ------------------------------------------------------------------ attention metrics

@pytest.mark.parametrize("chunk,sinks", [(1 << 21, 0), (200, 0), (300, 2)])  # one chunk / many chunks
def test_attention_metrics_against_brute_force(chunk, sinks):
    B, H, T, D, K, k, w, ns = 2, 3, 23, 8, 3, 1, 5, 2
    q, key = _qk(B, H, T, D, seed=1)
    scale = 0.4
    g = torch.Generator().manual_seed(5)
    scores = torch.randn(B, T, K, generator=g)
    qg, kg = core.hard_assign(scores, 0.1, k)
    log_p, _ = core.sinkhorn(scores, 0.1, 10)
    rq, rk = M.random_groups(B, T, FocusConfig(num_groups=K, top_k=k, window=w), layer_idx=0)
    thr, top_n, min_w = 0.08, 1, 0.01
    res = M.attention_metrics(q, key, scale, qg, kg, w, sinks=sinks, random_query_groups=rq, random_key_group=rk,
                              log_p=log_p, eps=1e-6, sink_positions=ns, edge_threshold=thr, edge_top_n=top_n,
                              edge_min_weight=min_w, pattern_heads=[1], chunk_elements=chunk)
    edges = M.distance_edges(T, w)
    got_edges = set(zip(res.edges["batch"].tolist(), res.edges["head"].tolist(), res.edges["query"].tolist(),
                        res.edges["key"].tolist()))
    want_edges = set()
    for b in range(B):
        P = bf_dense(q[b].double().numpy(), key[b].double().numpy(), scale)
        S = bf_soft(q[b].double().numpy(), key[b].double().numpy(), scale, log_p[b].exp().double().numpy(), w,
                    1e-6, sinks)
        p = log_p[b].exp().double().numpy()
        m = bf_mask(qg[b], kg[b], w, T, sinks)
        mr = bf_mask(rq[b], rk[b], w, T, sinks)
        wm = int(res.matched_window[b])
        assert wm == M.matched_window(int(m.sum()), T, sinks)
        win = lambda i, j, ww=w: i - j < ww or j < sinks  # noqa: E731
        gated = lambda i, j: not win(i, j)  # noqa: E731
        for h in range(H):
            for i in range(T):
                row, srow = P[h, i], S[h, i]
                js = range(i + 1)
                pq = {n: float(t[b, h, i]) for n, t in res.per_query.items()}
                assert pq["coverage_focus"] == pytest.approx(sum(row[j] for j in js if m[i, j]), abs=1e-5)
                assert pq["coverage_random"] == pytest.approx(sum(row[j] for j in js if mr[i, j]), abs=1e-5)
                assert pq["coverage_window"] == pytest.approx(sum(row[j] for j in js if win(i, j)), abs=1e-5)
                assert pq["coverage_window_matched"] == pytest.approx(
                    sum(row[j] for j in js if win(i, j, wm)), abs=1e-5)
                assert pq["dropped"] == pytest.approx(sum(row[j] for j in js if not m[i, j]), abs=1e-5)
                assert pq["coverage_focus"] + pq["dropped"] == pytest.approx(1, abs=1e-5)
                assert pq["dense_distant"] == pytest.approx(sum(row[j] for j in js if gated(i, j)), abs=1e-5)
                assert pq["sink_mass"] == pytest.approx(sum(row[j] for j in js if j < ns), abs=1e-5)
                assert pq["sink_dropped"] == pytest.approx(sum(row[j] for j in js if j < ns and not m[i, j]), abs=1e-5)
                assert pq["soft_distant"] == pytest.approx(sum(srow[j] for j in js if gated(i, j)), abs=1e-5)
                assert pq["soft_crossing"] == pytest.approx(sum(srow[j] for j in js if not m[i, j]), abs=1e-5)
                assert pq["soft_crossing_expected"] == pytest.approx(
                    sum(srow[j] * (1 - p[i] @ p[j]) for j in js if gated(i, j)), abs=1e-5)
                dropped = sorted(((row[j], j) for j in js if not m[i, j]), reverse=True)
                for r, (wt, j) in enumerate(dropped):
                    if wt > thr or (r < top_n and wt > min_w):
                        want_edges.add((b, h, i, j))
            for mi in range(len(edges) - 1):
                lo, hi = edges[mi], edges[mi + 1]
                sel = [(i, j) for i in range(T) for j in range(i + 1) if lo <= i - j < hi]
                mass = sum(P[h, i, j] for i, j in sel)
                assert float(res.bucket_mass[b, h, mi]) == pytest.approx(mass, abs=1e-4)
                for name, keep in (("focus", lambda i, j: m[i, j]), ("random", lambda i, j: mr[i, j]),
                                   ("window", win), ("window_matched", lambda i, j: win(i, j, wm))):
                    kept = sum(P[h, i, j] for i, j in sel if keep(i, j))
                    assert float(res.bucket_kept[name][b, h, mi]) == pytest.approx(kept, abs=1e-4), (name, lo, hi)
        assert np.allclose(res.patterns[1]["dense"][b].numpy(), P[1], atol=1e-5)
        assert np.allclose(res.patterns[1]["soft"][b].numpy(), S[1], atol=1e-5)
        assert np.array_equal(res.patterns[1]["kept"][b].numpy(), m)
        assert int(res.pairs["focus"][b]) == m.sum() and int(res.pairs["random"][b]) == mr.sum()
    assert got_edges == want_edges and want_edges
    soft = {bb: bf_soft(q[bb].double().numpy(), key[bb].double().numpy(), scale, log_p[bb].exp().double().numpy(),
                        w, 1e-6, sinks) for bb in range(B)}
    for bb, hh, ii, jj, sw in zip(res.edges["batch"].tolist(), res.edges["head"].tolist(), res.edges["query"].tolist(),
                                  res.edges["key"].tolist(), res.edges["soft_weight"].tolist()):
        assert sw == pytest.approx(soft[bb][hh, ii, jj], abs=1e-6)
    w_ = res.edges["weight"].numpy()
    assert (w_ > 0).all()


def test_coverage_is_one_when_the_window_covers_everything():
    B, H, T, D = 1, 2, 20, 4
    q, key = _qk(B, H, T, D, seed=2)
    _, qg, kg = _groups(T, 4, 1, seed=0)
    scores = torch.randn(B, T, 4)
    rq, rk = core.hard_assign(scores, 0.1, 1)
    res = M.attention_metrics(q, key, 0.5, qg, kg, T, random_query_groups=rq, random_key_group=rk,
                              log_p=core.sinkhorn(scores, 0.1, 10)[0], edge_threshold=0.0, edge_top_n=3)
    for p in M.COVERAGE_PATTERNS:
        assert torch.allclose(res.per_query[f"coverage_{p}"], torch.ones(B, H, T), atol=1e-5), p
    assert torch.all(res.per_query["dropped"] == 0)
    assert torch.all(res.per_query["soft_crossing"] == 0)
    assert len(res.edges["weight"]) == 0


def test_crossing_mass_is_zero_with_one_group():
    B, H, T, D, w = 2, 2, 30, 4, 3
    q, key = _qk(B, H, T, D, seed=4)
    scores = torch.randn(B, T, 1)
    qg, kg = core.hard_assign(scores, 0.1, 1)
    log_p, _ = core.sinkhorn(scores, 0.1, 10)
    res = M.attention_metrics(q, key, 0.5, qg, kg, w, log_p=log_p)
    assert torch.all(res.per_query["soft_crossing"] == 0)
    assert torch.allclose(res.per_query["soft_crossing_expected"], torch.zeros(B, H, T), atol=1e-5)  # fp32 p.p = 1
    assert torch.allclose(res.per_query["coverage_focus"], torch.ones(B, H, T), atol=1e-5)
    assert res.per_query["soft_distant"].sum() > 0  # there is distant mass, none of it crosses


# ------------------------------------------------------------------ linguistics

def test_contingency_and_cluster_scores():
    groups = np.array([0, 0, 1, 1, 1, 2])
    labels = np.array(["NOUN", "NOUN", "VERB", "VERB", "ADJ", "ADJ"])
    ct = M.contingency(groups, labels)
    cell = ct[(ct.group == 1) & (ct.label == "VERB")].iloc[0]
    assert cell.tokens == 2 and cell.share_of_group == pytest.approx(2 / 3)
    assert cell.share_of_label == pytest.approx(1.0) and cell.lift == pytest.approx(2 * 6 / (3 * 2))
    assert ct["tokens"].sum() == 6
    s = M.cluster_scores(groups, labels)
    # by hand: H(C) = log 3; H(C|G) = 3/6 * H(2/3, 1/3); homogeneity = 1 - H(C|G)/H(C)
    hcg = 0.5 * -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    assert s["homogeneity"] == pytest.approx(1 - hcg / math.log(3))
    perfect = M.cluster_scores(np.array([2, 2, 0, 0, 1, 1]), np.array(list("aabbcc")))
    assert perfect == pytest.approx({"nmi": 1.0, "homogeneity": 1.0, "completeness": 1.0})
    dom = M.dominant_labels(ct)
    assert dom[1][0] == ("VERB", pytest.approx(2 / 3))


def test_kmeans_groups_separate_obvious_clusters():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 0.1, (20, 5)), rng.normal(5, 0.1, (20, 5))])
    lab = M.kmeans_groups(x, 2, seed=0)
    assert len(set(lab[:20])) == 1 and len(set(lab[20:])) == 1 and lab[0] != lab[-1]


def test_long_windows_take_the_per_chunk_path(monkeypatch):
    """Above _WHOLE_MAX tokens the pair tables and masks are built per chunk: same numbers."""
    B, H, T, D, K, w = 1, 2, 60, 4, 3, 7
    q, key = _qk(B, H, T, D, seed=9)
    scores = torch.randn(B, T, K, generator=torch.Generator().manual_seed(2))
    qg, kg = core.hard_assign(scores, 0.1, 1)
    rq, rk = M.random_groups(B, T, FocusConfig(num_groups=K, top_k=1, window=w), layer_idx=1)
    kw = dict(sinks=2, random_query_groups=rq, random_key_group=rk, log_p=core.sinkhorn(scores, 0.1, 10)[0],
              edge_threshold=0.05, edge_top_n=2, chunk_elements=300)
    a = M.attention_metrics(q, key, 0.5, qg, kg, w, **kw)
    monkeypatch.setattr(M, "_WHOLE_MAX", 10)
    b = M.attention_metrics(q, key, 0.5, qg, kg, w, **kw)
    for n in a.per_query:
        assert torch.allclose(a.per_query[n], b.per_query[n], atol=1e-6), n
    for n in a.pairs:
        assert torch.equal(a.pairs[n], b.pairs[n]), n
    for n in a.bucket_kept:
        assert torch.allclose(a.bucket_kept[n], b.bucket_kept[n], atol=1e-5), n
    assert all(torch.equal(a.edges[n], b.edges[n]) for n in ("query", "key"))
