"""docs/studies/restored-drops.md's tables: the audit's costliest queries with their heaviest
dropped edge put back, alone and with every recorded dropped edge (``analyses.studies.restored_drops``),
split by whether that edge ends on a ``" the"`` key, and one group of one layer cut, by part of
speech."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analyses.doc_blocks import REPO, Generated, block, router_label

PAGE = "docs/studies/restored-drops.md"
PROSE_PAGES = (PAGE,)
#: settings: the recorder's thresholds (dense weight above 0.05, per layer, head and query the
#: heaviest above 0.01)
ALLOWED = {PAGE: {"0.05", "0.01"}}

DROPS = "figures/results/restored_drops.parquet"
ABLATION = "figures/results/group_ablation.parquet"
SUMMARY = "figures/results/restored_drops.json"
#: a part of speech counts for "most hurt" from this many tokens of the window
MIN_TOKENS = 20


def _quart(x: pd.Series) -> tuple[float, float, float]:
    q1, med, q3 = np.quantile(x.dropna().to_numpy(), [0.25, 0.5, 0.75])
    return float(q1), float(med), float(q3)


#: the same study on Gemma-3-270M's one recorded window of 32,768 tokens (docs/studies/gemma-routers.md)
GEMMA_DIR = "figures/gemma/restored_32k"


@block("restored-drops", DROPS, ABLATION, SUMMARY)
def restored_drops() -> Generated:
    """The restored drops of SmolLM2-135M's main-job run (``tables``)."""
    return tables(DROPS, ABLATION, SUMMARY)


@block("gemma-32k-restored", f"{GEMMA_DIR}/restored_drops.parquet", f"{GEMMA_DIR}/group_ablation.parquet",
       f"{GEMMA_DIR}/restored_drops.json")
def gemma_32k_restored() -> Generated:
    """The restored drops of Gemma-3-270M's 32K recording (``tables``)."""
    return tables(f"{GEMMA_DIR}/restored_drops.parquet", f"{GEMMA_DIR}/group_ablation.parquet",
                  f"{GEMMA_DIR}/restored_drops.json")


def tables(drops: str, ablation: str, summary_json: str) -> Generated:
    """The restored share of each query's loss delta (``restored_drops.summary``: median, quartiles,
    counts), for the heaviest edge alone and every recorded edge; the heaviest edge split by its
    key (``" the"`` or not), with the distances and layers of the edges that recover at least
    half; per group of the ablated layer, the token-weighted mean loss change of cutting it and
    the parts of speech it hurts most."""
    from analyses.studies.restored_drops import summary
    df = pd.read_parquet(REPO / drops)
    s = summary(df)
    meta = json.loads((REPO / summary_json).read_text())
    delta = df.nll_hard - df.nll_dense
    lines = [f"{s['queries']} queries; loss delta (hard minus dense) median {s['delta_median']:.3f} nats, "
             f"{delta.min():.3f} to {delta.max():.3f}; recorded dropped edges a query, median "
             f"{s['edges_of_query_median']:.0f}.", "",
             "| restored | median | quartiles | recover >= 1/2 | recover < 1/10 | loss grows |",
             "|---|---:|---|---:|---:|---:|"]
    for col, what in (("recovered", "the heaviest dropped edge alone"),
                      ("recovered_all", "every recorded dropped edge of the query")):
        r = s[col]
        lines.append(f"| {what} | {r['median']:.3f} | {r['q1']:.3f} to {r['q3']:.3f} | {r['at_least_half']} | "
                     f"{r['below_tenth']} | {r['negative']} |")
    the = df.key_token.str.strip() == "the"
    lines += ["", "| the heaviest dropped edge's key | queries | layers (queries) | median recovered | quartiles | "
              "recover > 1/10 | recover >= 1/2 |", "|---|---:|---|---:|---|---:|---:|"]
    for name, g in (('`" the"`', df[the]), ("any other", df[~the])):
        if not len(g):  # no heaviest edge of that kind: a row of zeros would print quartiles of nothing
            lines.append(f"| {name} | 0 | - | - | - | 0 | 0 |")
            continue
        q1, med, q3 = _quart(g.recovered)
        layers = ", ".join(f"{k} ({n})" for k, n in g.layer_idx.value_counts().sort_index().items())
        lines.append(f"| {name} | {len(g)} | {layers} | {med:.4f} | {q1:.3f} to {q3:.3f} | "
                     f"{int((g.recovered > 0.1).sum())} | {int((g.recovered >= 0.5).sum())} |")
    half = df[df.recovered >= 0.5]
    lines += ["", f"The median query gets back {100 * s['recovered']['median']:.1f}% of its loss delta from its heaviest "
              f"dropped edge alone, {100 * s['recovered_all']['median']:.0f}% from every recorded dropped edge.", ""]
    copies = int((half.key_token.str.strip() == half.next_token.str.strip()).sum())
    lines += [f"The {len(half)} edges that recover at least half: {half.distance.min()} to {half.distance.max()} "
              f"tokens back, in layers {', '.join(map(str, sorted(half.layer_idx.unique())))}; {copies} of them "
              f"end on an earlier occurrence of the very token to predict; the edge that costs its "
              f"query most recovers {df.recovered.min():.3f} of the delta."]
    ab = pd.read_parquet(REPO / ablation)
    lines += ["", "| layer, group cut | tokens | mean loss change (nats) | proper nouns: those whose query joins the group / "
              f"all in the window, change | most hurt (parts of speech of {MIN_TOKENS}+ tokens) |",
              "|---|---:|---:|---|---|"]
    for (layer, group), d in ab.groupby(["layer_idx", "group"]):
        w = (d.delta * d.tokens).sum() / d.tokens.sum()
        top = d[d.tokens >= MIN_TOKENS].sort_values("delta", ascending=False).head(2)
        pn = d[d.pos == "PROPN"].iloc[0]
        lines.append(f"| {layer}, {group} | {int(d.tokens.sum())} | {w:+.4f} | {int(pn.tokens_in_group)} / "
                     f"{int(pn.tokens)}, {pn.delta:+.3f} | "
                     + ", ".join(f"{r.pos} {r.delta:+.3f} ({r.tokens})" for r in top.itertuples()) + " |")
    inputs = (f"{drops} ({s['queries']} costliest queries of {meta['windows']} window{'s' if meta['windows'] != 1 else ''} of "
              f"{meta['seq_len']} tokens, "
              f"{meta['mode']} mode, run {meta['run']}); {summary_json}; {ablation} (layers "
              f"{', '.join(map(str, meta['ablated_layers']))}, the first window); routers "
              f"{router_label(meta['routers_sha256'])}")
    return Generated(inputs, "\n".join(lines))
