"""docs/studies/tech-budget-top1.md: a top-1 budget chosen on technical training text for the routers
trained with the key shift. The sweep (study ``top1_tech_keyshift`` of layer_budget.parquet, pooled
with the literary ``top1``) and its two allocations, written into the file and measured with the
length table's protocol (tables ``keyshift_{tech,pooled}_top1_*`` of length_cells.parquet) against
the literary top-1 budget on the same routers."""

from __future__ import annotations

import pandas as pd

from analyses.blocks.common import margin, over_dense, paired, tables_routers
from analyses.doc_blocks import LENGTH_CELLS, REPO, Generated, MissingInput, _Cells, block, router_label

PAGE = "docs/studies/tech-budget-top1.md"
PROSE_PAGES = (PAGE,)
#: the interval's level (a setting) and the criterion of docs/recipes.md (top-1 within +4% of dense)
ALLOWED = {PAGE: {"95%", "+4%"}}

LAYER_BUDGET = "figures/results/layer_budget.parquet"
DOMAINS = ("python-docs", "man-pages", "debian-reference")
BUDGETS = {"pooled": "keyshift_pooled_top1", "tech": "keyshift_tech_top1"}  # + _domains / _persuasion
#: the literary top-1 budget on the same routers: the technical domains, then *Persuasion*
LITERARY = {"domains": "keyshift_top1_budget_domains", "persuasion": "keyshift_budgets_persuasion"}
#: uniform top-1 with the shift (the routers before any budget)
UNIFORM = {"domains": "keyshift_trained_domains", "persuasion": "keyshift_trained_persuasion"}
TOP1 = "hard_top1_keyshift"
RANDOM1 = "random_top1_keyshift"


def sweep_block(study: str, pool: str, base_k: int) -> Generated:
    """A layer-budget sweep on technical text (``study`` of layer_budget.parquet) and the two
    allocations made from it: ``tech`` (the sweep alone) and ``pooled`` (with the literary study
    ``pool``, ``layer_budget.allocate``). One row per layer either allocation moves: the sweep's
    NLL change (nats a token, mean over its corpora and windows, against uniform top-``base_k``)
    with that layer alone at k - 1 and at k + 1, the k each allocation gives it; then the specs,
    and the literary sweep's largest cost of one layer at k - 1."""
    from analyses.studies.layer_budget import allocate, deltas, spec_string
    lb = pd.read_parquet(REPO / LAYER_BUDGET)

    def rows(name: str) -> pd.DataFrame:
        g = lb[lb.study == name].drop(columns="study")
        if not len(g):
            raise MissingInput(f"{LAYER_BUDGET} (study {name})")
        return g
    tech, lit = deltas(rows(study)), deltas(rows(pool))
    specs = {"tech": allocate(tech, base_k=base_k)[0],
             "pooled": allocate(pd.concat([tech, lit], ignore_index=True), base_k=base_k)[0]}
    by = tech.groupby(["layer_idx", "top_k"]).delta_nll.mean().unstack()
    lo, hi = base_k - 1, base_k + 1
    lines = [f"| layer | NLL change at k = {lo} | at k = {hi} | `tech` | `pooled` |", "|---:|---:|---:|---:|---:|"]
    for layer in sorted(set(specs["tech"]) | set(specs["pooled"])):
        lines.append(f"| {layer} | {by.loc[layer, lo]:+.4f} | {by.loc[layer, hi]:+.4f} | "
                     + " | ".join(str(specs[a].get(layer, base_k)) for a in ("tech", "pooled")) + " |")
    lit_by = lit.groupby(["layer_idx", "top_k"]).delta_nll.mean().unstack()[lo]
    lines += ["", "| allocation | `--layer-top-k` |", "|---|---|"]
    lines += [f"| `{a}` | `{spec_string(specs[a])}` |" for a in ("tech", "pooled")]
    lines += ["", f"The literary sweep `{pool}`: its costliest layer at k = {lo} is layer {int(lit_by.idxmax())}, "
              f"{lit_by.max():+.4f} nats a token."]
    t = rows(study)
    corpora = ", ".join(sorted(t.corpus.unique()))
    windows = t.groupby("corpus").window.nunique().max()
    sha = t.routers_sha256.iloc[0]
    inputs = (f"{LAYER_BUDGET} (studies {study}, {pool}); routers of {study} {router_label(sha)}; {corpora}, "
              f"{windows} window(s) of {int(t.seq_len.iloc[0])} tokens each; every other layer at k = {base_k}; "
              "allocations by analyses.studies.layer_budget.allocate")
    return Generated(inputs, "\n".join(lines))


@block("tech-budget-top1-sweep", LAYER_BUDGET)
def tech_budget_top1_sweep() -> Generated:
    """The top-1 sweep on technical text with the shift (``sweep_block``)."""
    return sweep_block("top1_tech_keyshift", "top1", 1)


def _texts(c: _Cells) -> list[tuple[str, str, int, str]]:
    """(row name, corpus, length, kind) of the table's rows."""
    out = [(d, d, 4096, "domains") for d in DOMAINS]
    return out + [(f"*Persuasion* {L}", "austen", L, "persuasion") for L in (4096, 8192)]


@block("tech-budget-top1", LENGTH_CELLS)
def tech_budget_top1() -> Generated:
    """Per text: hard top-1 with the shift over dense [distant pairs kept] under the literary,
    ``pooled`` and ``tech`` budgets and at uniform top-1; for each technical budget its paired
    change against the literary one with its 95% interval over windows (< 0: better) and the
    router's margin over random groups under the same budget and shift."""
    c = _Cells()
    lines = ["| text | windows | uniform top-1 | literary budget | `pooled` | paired change | over random | `tech` | "
             "paired change | over random |", "|---|---:|---|---|---|---|---|---|---|---|"]
    for name, d, L, kind in _texts(c):
        lit = LITERARY[kind]
        kept = lambda t: over_dense(c, t, d, L, TOP1, ci=False)  # noqa: E731
        cells = [str(int(c.summary(f"{BUDGETS['tech']}_{kind}", d, L, "dense").windows)), kept(UNIFORM[kind]), kept(lit)]
        for b in ("pooled", "tech"):
            t = f"{BUDGETS[b]}_{kind}"
            over = margin(c, t, d, L, RANDOM1) if kind == "domains" else ""
            cells += [kept(t), paired(c, (t, TOP1), (lit, TOP1), d, L), over]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    tables = [f"{BUDGETS[b]}_{k}" for b in BUDGETS for k in ("domains", "persuasion")]
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(tables)}; the literary budget {LITERARY['domains']}, "
              f"{LITERARY['persuasion']}; uniform top-1 {UNIFORM['domains']}, {UNIFORM['persuasion']}); routers "
              + tables_routers(c, [*tables[::2], *LITERARY.values(), *UNIFORM.values()])
              + "; windows as the table's column says; patterns dense, "
              f"{TOP1}, {RANDOM1}")
    return Generated(inputs, "\n".join(lines))


@block("tech-budget-top1-random", LENGTH_CELLS)
def tech_budget_top1_random() -> Generated:
    """Random groups (shifted) under each technical budget, paired against random groups under the
    literary budget, with the 95% interval over windows (< 0: the budget helps them too)."""
    c = _Cells()
    lines = ["| text | `pooled` | `tech` |", "|---|---|---|"]
    for d in DOMAINS:
        cells = [paired(c, (f"{BUDGETS[b]}_domains", RANDOM1), (LITERARY["domains"], RANDOM1), d, 4096)
                 for b in ("pooled", "tech")]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    inputs = (f"{LENGTH_CELLS} (tables {BUDGETS['pooled']}_domains, {BUDGETS['tech']}_domains against "
              f"{LITERARY['domains']}); 4 windows of 4096 tokens a domain; pattern {RANDOM1}")
    return Generated(inputs, "\n".join(lines))
