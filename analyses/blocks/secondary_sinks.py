"""docs/studies/secondary-sinks.md: routers in every layer (``smollm2-135m/distill64-4k``, table
``every_layer_routed`` of length_cells.parquet) against random and shuffled groups at the same k,
the length table's protocol; and the recorded tables (where the long-range dropped mass goes, the
dense mass kept by distance and per layer, router and random groups) from the tidy summary of the
two ``focus-lab record`` runs (``analyses.studies.secondary_sinks``: secondary_sinks.parquet)."""

from __future__ import annotations

import pandas as pd

from analyses.doc_blocks import (HELD_NAMES, LENGTH_CELLS, REPO, Generated, MissingInput, _Cells, _change,
                                 _windows_text, block, router_label)

PAGE = "docs/studies/secondary-sinks.md"
PROSE_PAGES = (PAGE,)
#: the interval's level, the recorder's thresholds (a heavy edge: dense weight > 0.05; a query's heaviest
#: dropped edge > 0.01), the share of later queries that keep any one group under balanced random
#: groups at top-2 of 4 (2 / 4): settings and a constant, not measurements
ALLOWED = {PAGE: {"95%", "0.05", "0.01", "50%"}}

TABLE = "every_layer_routed"
CONTROLS = ("random_top1", "random_top2", "shuffled_top1", "shuffled_top2")


@block("secondary-sinks-every-layer", LENGTH_CELLS)
def secondary_sinks_every_layer() -> Generated:
    """Per held-out text at 4096 and 8192 tokens: hard top-1 and top-2 over dense [distant pairs
    kept] with routers in every layer, and each control's perplexity over the router's at the same
    k with its 95% paired interval over windows (> 0: the router is better)."""
    c = _Cells()
    df = c.cells[c.cells["table"] == TABLE]
    lines = ["| text | tokens | windows | hard top-1 | hard top-2 | random top-1 vs router | random top-2 vs router | "
             "shuffled top-1 vs router | shuffled top-2 vs router |", "|---|---:|---:|---|---|---|---|---|---|"]
    for corpus in ("austen", "shakespeare"):
        held = HELD_NAMES.get(df[df.corpus == corpus].heldout.iloc[0], corpus)
        for L in (4096, 8192):
            n = int(c.summary(TABLE, corpus, L, "dense").windows)
            cells = [f"{c.dense(TABLE, corpus, L, p):+.1f}% [{c.kept(TABLE, corpus, L, p):.2f}]" for p in ("hard_top1", "hard_top2")]
            cells += [_change(c.summary(TABLE, corpus, L, p), "control_vs_router_pct", "control_ci_lo", "control_ci_hi", n)
                      for p in CONTROLS]
            lines.append(f"| {held} | {L} | {n} | " + " | ".join(cells) + " |")
    shas = sorted(df.routers_sha256.unique())
    inputs = (f"{LENGTH_CELLS} (table {TABLE}); routers {'; '.join(router_label(s) for s in shas)}, every layer routed; "
              f"{_windows_text(df[df.seq_len.isin([4096, 8192])])}; patterns dense, hard_top1, hard_top2, "
              + ", ".join(CONTROLS))
    return Generated(inputs, "\n".join(lines))


# ============================================================================================
# the recorded runs (figures/results/secondary_sinks.parquet)

SINKS = "figures/results/secondary_sinks.parquet"
#: the layers the shipped file gives balanced random groups (FocusConfig.random_layers, method §2.6)
RANDOM_LAYERS = tuple(range(1, 10))
#: how many of the layers with most long-range `" the"` weight the drops table names
TOP_LAYERS = 6


def _sinks() -> pd.DataFrame:
    df = pd.read_parquet(REPO / SINKS)
    if df.empty:
        raise MissingInput(f"{SINKS} (no rows)")
    return df


def _scalar(df: pd.DataFrame, L: int, quantity: str) -> float:
    r = df[(df.seq_len == L) & (df.quantity == quantity) & (df.layer_idx < 0) & (df.pattern == "")]
    if len(r) != 1:
        raise MissingInput(f"{SINKS} (quantity {quantity} at {L} tokens)")
    return float(r.value.iloc[0])


def _per_layer(df: pd.DataFrame, L: int, quantity: str, pattern: str = "") -> pd.Series:
    r = df[(df.seq_len == L) & (df.quantity == quantity) & (df.pattern == pattern)]
    if r.empty:
        raise MissingInput(f"{SINKS} (quantity {quantity} at {L} tokens)")
    return r.set_index("layer_idx").value.sort_index()


def _top_layers(df: pd.DataFrame, L: int) -> list[int]:
    """The ``TOP_LAYERS`` layers of most long-range `" the"` weight, heaviest first."""
    w = _per_layer(df, L, "the_weight")
    return [int(l) for l in w.sort_values(ascending=False, kind="stable").index[:TOP_LAYERS]]


def _sinks_inputs(df: pd.DataFrame) -> str:
    runs = df.drop_duplicates("seq_len").sort_values("seq_len")
    shas = sorted(df.routers_sha256.unique())
    r = runs.iloc[0]
    return (f"{SINKS}; routers {'; '.join(router_label(s) for s in shas)}, every layer routed, hard top-{r.top_k} of "
            f"{r.num_groups}; " + ", ".join(f"{w.windows} window of {w.seq_len} tokens" for w in runs.itertuples())
            + f" of {HELD_NAMES.get(r.documents, r.documents)}, recorded at commit {', '.join(sorted(runs.run_commit.unique()))}")


def _length(L: int) -> str:
    return f"{L // 1024}K" if L % 1024 == 0 else str(L)


@block("secondary-sinks-drops", SINKS)
def secondary_sinks_drops() -> Generated:
    """Per recorded run: the recorded dropped edges, the share of their dense weight beyond the long
    range, of that the share on `" the"` keys (how many keys) and on the 10 heaviest key positions,
    the layers of most `" the"` weight, the share of later queries that keep those keys' group in
    those layers (range over the layers), and per query the Spearman correlation of the loss delta
    with the weight of its dropped `" the"` edges and the mean delta of the top tenth against the rest."""
    df = _sinks()
    md = int(df.min_distance.iloc[0])
    k, K = int(df.top_k.iloc[0]), int(df.num_groups.iloc[0])
    lines = [f"| run | recorded dropped edges | share of their weight at distance > {md} | of that, on `\" the\"` keys "
             f"| on the {int(df.top_keys.iloc[0])} heaviest key positions | the {TOP_LAYERS} layers with most `\" the\"` "
             f"weight | later queries that keep those keys' group at top-{k}, in those layers (random groups: "
             f"{100 * k // K}%) | per query, Spearman of the loss delta and the weight of its dropped `\" the\"` edges "
             "| mean loss delta (nats), top tenth of that weight / the rest |",
             "|---|---:|---:|---:|---:|---|---|---:|---|"]
    for L in sorted(df.seq_len.unique()):
        s = lambda q: _scalar(df, L, q)  # noqa: E731
        top = _top_layers(df, L)
        kept = _per_layer(df, L, "the_group_kept").reindex(top)
        lines.append(f"| {int(df[df.seq_len == L].windows.iloc[0])} x {L} | {s('dropped_edges'):,.0f} | "
                     f"{100 * s('far_share'):.0f}% | **{100 * s('the_share'):.0f}%** ({s('the_keys'):.0f} keys) | "
                     f"{100 * s('top_keys_share'):.0f}% | {', '.join(map(str, top))} | "
                     f"{100 * kept.min():.0f}-{100 * kept.max():.0f}% | {s('loss_spearman'):.3f} | "
                     f"{s('delta_top_decile'):.3f} / {s('delta_rest'):.3f} |")
    return Generated(_sinks_inputs(df) + f"; dropped edges: dense weight > {df.edge_threshold.iloc[0]:g}, and each "
                     f"query's heaviest above {df.edge_min_weight.iloc[0]:g}, per layer and head", "\n".join(lines))


def _bucket(lo: int, hi: int) -> str:
    f = lambda x: f"{x // 1024}K" if x >= 1024 else str(x)  # noqa: E731
    return f"{f(lo)}-{f(hi)}"


@block("secondary-sinks-coverage", SINKS)
def secondary_sinks_coverage() -> Generated:
    """Per recorded run and distance bucket beyond the window: the dense mass the router's top-k mask
    keeps and the mass balanced random groups at the same K and k keep, pooled over layers and heads."""
    df = _sinks()
    cov = df[(df.quantity == "coverage") & (df.distance_lo >= df.focus_window)]
    buckets = sorted(set(zip(cov.distance_lo, cov.distance_hi)))
    lines = ["| distance (tokens) | " + " | ".join(_bucket(lo, hi) for lo, hi in buckets) + " |",
             "|---|" + "---|" * len(buckets)]
    for L in sorted(cov.seq_len.unique()):
        c = cov[cov.seq_len == L].set_index(["pattern", "distance_lo"]).value
        cells = [f"{c[('focus', lo)]:.2f} / {c[('random', lo)]:.2f}" if ("focus", lo) in c.index else ""
                 for lo, _ in buckets]
        lines.append(f"| {_length(L)}: router / random | " + " | ".join(cells) + " |")
    return Generated(_sinks_inputs(df) + f"; coverage_distance, patterns focus and random; the window "
                     f"(0-{int(df.focus_window.iloc[0])}) keeps everything", "\n".join(lines))


def _range(x: pd.Series) -> str:
    return f"{x.min():+.2f} to {x.max():+.2f}"


@block("secondary-sinks-layers", SINKS)
def secondary_sinks_layers() -> Generated:
    """Per recorded run: the router's dense mass kept beyond the window minus random groups', per
    layer (pooled over heads and distance buckets): each of layers 1-9, then its range over layers
    1-9 and over the others; and the share of the longest run's long-range `" the"` weight (the drops
    table's) each layer or set of layers holds."""
    df = _sinks()
    lengths = sorted(df.seq_len.unique())
    L = lengths[-1]
    the = _per_layer(df, L, "the_weight")
    the = the / the.sum()
    lines = ["| layers | " + " | ".join(f"{_length(n)}: router minus random, dense mass kept beyond the window"
                                        for n in lengths) + f" | {_length(L)}: share of the long-range `\" the\"` weight |",
             "|---|" + "---:|" * (len(lengths) + 1)]
    diffs = {n: _per_layer(df, n, "coverage_beyond_window", "focus") - _per_layer(df, n, "coverage_beyond_window",
                                                                                   "random") for n in lengths}
    for layer in RANDOM_LAYERS:
        lines.append(f"| {layer} | " + " | ".join(f"{diffs[n][layer]:+.2f}" for n in lengths)
                     + f" | {100 * the[layer]:.0f}% |")
    first, last = RANDOM_LAYERS[0], RANDOM_LAYERS[-1]
    for name, inside in ((f"{first}-{last}", True), ("the others", False)):
        pick = lambda x: x[x.index.isin(RANDOM_LAYERS) == inside]  # noqa: E731
        lines.append(f"| {name} | " + " | ".join(_range(pick(diffs[n])) for n in lengths)
                     + f" | {100 * pick(the).sum():.0f}% |")
    return Generated(_sinks_inputs(df) + "; coverage_distance beyond the window, patterns focus and random, "
                     "pooled over heads and buckets per layer", "\n".join(lines))
