"""docs/studies/recipes-sweep.md's tables: every training recipe after 30 steps at 512 tokens (and
``sinks64`` after 120), evaluated on the same 3 windows of 1024 tokens of *Persuasion*
(``analyses.studies.recipes_sweep``): the controls, then per recipe soft and hard top-1 / top-2
over dense, the distant pairs kept, the largest group and the training seconds."""

from __future__ import annotations

import pandas as pd

from analyses.doc_blocks import REPO, Generated, MissingInput, block

PAGE = "docs/studies/recipes-sweep.md"
PROSE_PAGES = (PAGE,)
ALLOWED = {PAGE: set()}

RECIPES = "figures/results/recipes.parquet"
SWEEP, LONG = "30 steps", "sinks64, 120 steps"
#: the rows in the page's order: (sweep, recipe, what it is)
ROWS = ((SWEEP, "sinks64", "64 sinks, calibrated bias"), (SWEEP, "coverage64", "coverage objective, 64 sinks"),
        (SWEEP, "sinks", "4 sinks"), (SWEEP, "sinks_straight_through", ""), (SWEEP, "sinks_anneal", ""),
        (SWEEP, "sinks_hard_phase", "Gumbel hard phase"), (SWEEP, "coverage", ""), (SWEEP, "calibrated", "no sinks"),
        (SWEEP, "hard_phase", ""), (SWEEP, "anneal", ""), (SWEEP, "straight_through", ""),
        (SWEEP, "paper", "no sinks, argmax of raw scores"), (LONG, "sinks64", ""))
CONTROLS = (("dense", "dense"), ("window", "the sliding window"), ("window_sinks4", "the window with 4 sink tokens"),
            ("random_hard_top1", "balanced random groups, top-1"), ("random_hard_top2", "balanced random groups, top-2"),
            ("random_sinks4_hard_top1", "random groups with 4 sinks, top-1"),
            ("random_sinks4_hard_top2", "random groups with 4 sinks, top-2"))


def _row(df: pd.DataFrame, sweep: str, recipe: str, label: str) -> pd.Series:
    r = df[(df.sweep == sweep) & (df.recipe == recipe) & (df.label == label)]
    if len(r) != 1:
        raise MissingInput(f"{RECIPES} ({sweep}: {recipe} {label})")
    return r.iloc[0]


@block("recipes-sweep", RECIPES)
def recipes_sweep() -> Generated:
    """The controls' perplexity (once, 30-step sweep), then per recipe the change over dense of
    soft, hard top-1 and hard top-2 (their perplexities beside), distant pairs kept at top-1 /
    top-2, the largest hard group's share at top-1 / top-2 and the training seconds; the sweep's totals."""
    df = pd.read_parquet(REPO / RECIPES)
    dense = float(_row(df, SWEEP, "controls", "dense").perplexity)
    lines = ["| control | perplexity | distant pairs kept |", "|---|---:|---:|"]
    for label, what in CONTROLS:
        r = _row(df, SWEEP, "controls", label)
        lines.append(f"| {what} | {r.perplexity:.2f} | {r.distant_pairs_kept:.2f} |")
    ch = lambda r: f"{100 * (r.perplexity / dense - 1):+.1f}%"  # noqa: E731
    lines += ["", "| recipe | soft | hard top-1 | hard top-2 | perplexity, top-1 / top-2 | pairs kept, top-1 / top-2 | "
              "largest group, top-1 / top-2 | train s |", "|---|---|---|---|---|---|---|---:|"]
    for sweep, recipe, what in ROWS:
        s, t1, t2 = (_row(df, sweep, recipe, x) for x in ("soft", "hard_top1", "hard_top2"))
        name = f"`{recipe}`" + (f" ({what})" if what else "") + (", 120 steps" if sweep == LONG else "")
        lines.append(f"| {name} | {ch(s)} | {ch(t1)} | {ch(t2)} | {t1.perplexity:.2f} / {t2.perplexity:.2f} | "
                     f"{t1.distant_pairs_kept:.2f} / {t2.distant_pairs_kept:.2f} | "
                     f"{t1.max_group_share:.2f} / {t2.max_group_share:.2f} | "
                     f"{t1.train_seconds:.0f} |")
    train = df.drop_duplicates(["sweep", "recipe"]).train_seconds.sum()
    ev = df.seconds.sum()
    lines += ["", f"In all: training {train:.0f} s, evaluation {ev:.0f} s ({(train + ev) / 3600:.1f} h)."]
    tokens = int(df.tokens.iloc[0])
    inputs = (f"{RECIPES} (sweeps {SWEEP!r} and {LONG!r}); 3 windows of 1024 tokens of Persuasion, {tokens} tokens "
              "pooled, one perplexity per pattern; dense from the 30-step sweep's controls")
    return Generated(inputs, "\n".join(lines))
