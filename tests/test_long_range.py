"""focus_lab.recording.long_range on small hand-made tables, against sums done by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from focus_lab.recording import long_range as LR


def _edges():
    # window, layer, query, key, weight, token; distance = query - key
    rows = [(0, 0, 700, 10, 0.4, " the"), (0, 1, 800, 10, 0.2, " the"), (0, 1, 900, 50, 0.3, " a"),
            (0, 2, 600, 20, 0.1, " the"), (0, 2, 300, 200, 0.5, " the"), (1, 1, 700, 10, 0.5, " the")]
    df = pd.DataFrame(rows, columns=["window", "layer_idx", "query_position", "key_position", "weight", "key_token"])
    df["distance"] = df.query_position - df.key_position
    return df


def test_long_range_drops_by_hand():
    s = LR.long_range_drops(_edges(), min_distance=512, top_keys=1)
    far = 0.4 + 0.2 + 0.3 + 0.1 + 0.5  # all but the 100-token edge
    assert s.edges == 6
    assert s.far_share == pytest.approx(far / 2.0)
    assert s.token_share == pytest.approx((far - 0.3) / far)
    assert s.token_keys == 3  # (0, 10), (0, 20), (1, 10)
    assert s.top_keys_share == pytest.approx(0.6 / far)  # window 0, key 10
    assert s.token_weight_by_layer.to_dict() == pytest.approx({0: 0.4, 1: 0.7, 2: 0.1})


def test_long_range_drops_needs_long_edges():
    with pytest.raises(ValueError, match="longer than"):
        LR.long_range_drops(_edges(), min_distance=5000)


def test_group_kept_by_later_queries_by_hand():
    # one window of 4 positions, K = 3, k = 1; the key at position 1 is in group 2
    a = pd.DataFrame({"window": 0, "position": [0, 1, 2, 3], "layer_idx": 0, "group": [0, 2, 1, 2],
                      "top_k_groups": [[0], [2], [2], [1]]})
    kept = LR.group_kept_by_later_queries(a, pd.DataFrame({"window": [0, 0], "key_position": [1, 3]}))
    # key 1: queries 2 and 3 hold group 2? yes, no -> 1/2; key 3 has no later query (left out)
    assert kept.loc[0] == pytest.approx(0.5)


def test_loss_vs_token_drops_by_hand():
    loss = pd.DataFrame({"window": 0, "position": range(10), "delta": np.arange(10) / 10})
    edges = pd.DataFrame({"window": 0, "query_position": [9, 9, 3, 5], "weight": [0.2, 0.3, 0.4, 0.9],
                          "key_token": [" the", " the", " the", " a"]})
    r = LR.loss_vs_token_drops(loss, edges, top_share=0.1)
    w = np.zeros(10)
    w[9], w[3] = 0.5, 0.4
    d = np.arange(10) / 10
    assert r.spearman == pytest.approx(pd.Series(d).corr(pd.Series(w), method="spearman"))
    assert r.delta_top == pytest.approx(0.9) and r.delta_rest == pytest.approx(d[:9].mean())
    assert (r.queries, r.queries_with_drops) == (10, 2)


def test_coverage_pooled_over_layers_and_heads():
    cd = pd.DataFrame({"layer_idx": [0, 0, 1, 1, 0, 1], "head": 0,
                       "pattern": ["focus", "random", "focus", "random", "focus", "focus"],
                       "distance_lo": [128, 128, 128, 128, 0, 0], "distance_hi": [256, 256, 256, 256, 128, 128],
                       "mass": [0.2, 0.2, 0.4, 0.4, 0.8, 0.6], "kept_mass": [0.1, 0.05, 0.3, 0.1, 0.8, 0.6]})
    by_d = LR.coverage_by_distance(cd[cd.distance_lo > 0]).set_index(["pattern", "distance_lo"]).coverage
    assert by_d[("focus", 128)] == pytest.approx(0.4 / 0.6)
    assert by_d[("random", 128)] == pytest.approx(0.15 / 0.6)
    # every pattern, the share of its dense mass per bucket, NaN coverage where a bucket is empty
    every = pd.concat([cd, cd.iloc[:1].assign(distance_lo=256, distance_hi=512, mass=0.0, kept_mass=0.0)])
    all_d = LR.coverage_by_distance(every, patterns=None).set_index(["pattern", "distance_lo"])
    assert all_d.loc[("focus", 0), "mass_share"] == pytest.approx(1.4 / 2.0)  # focus: 1.4 of 2.0 at [0, 128)
    assert all_d.loc[("focus", 128), "mass_share"] == pytest.approx(0.6 / 2.0)
    assert all_d.loc[("random", 128), "mass_share"] == pytest.approx(1.0)
    assert math.isnan(all_d.loc[("focus", 256), "coverage"]) and all_d.loc[("focus", 256), "mass_share"] == 0
    by_l = LR.coverage_by_layer(cd, min_distance=128).set_index(["pattern", "layer_idx"]).coverage
    assert by_l[("focus", 1)] == pytest.approx(0.75) and not math.isnan(by_l[("random", 0)])
