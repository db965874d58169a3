"""The reference pages (the method notes, the guides, the API and command references, the glossary):
their prose joins the numbers-in-prose check (``analyses.doc_blocks.prose_problems``), and the two
measured tables they state results from are generated here:

* ``method-recipes`` (docs/method.md §3.4): every recipe trained 30 steps at 512 tokens and the
  controls, on the same 3 windows of 1024 tokens of *Persuasion* (``figures/results/recipes.parquet``,
  ``python -m analyses.studies.recipes_sweep``): the collapse of the paper's recipe (§1.3) and what
  the sinks buy (§2.1) come from it;
* ``retrieval-cost`` (docs/retrieval.md, "Cost"): a case's seconds over one bare forward of its
  prompt in the shipped file's committed retrieval suite, per device and length
  (``focus_lab.eval.retrieval_tables.cost_summary``);
* ``record-overhead`` (docs/run_schema.md, "Memory and cost of recording"): the recorder's CPU and wall time over a plain
  forward (``figures/results/bench_record.parquet``, ``analyses/studies/bench_record.py``).

``ALLOWED`` lists, per page, the numbers that are not measurements: settings and defaults, criteria,
identifiers (arXiv numbers, section numbers), the paper's reported numbers, and sizes and shares
that are arithmetic of the settings (each checked by tests/test_reference_blocks.py).
"""

from __future__ import annotations

import pandas as pd

from analyses.blocks.common import case_routers
from analyses.doc_blocks import REPO, Generated, MissingInput, block

PROSE_PAGES = ("docs/method.md", "docs/controls.md", "docs/retrieval.md", "docs/probe.md", "docs/decomposition.md",
               "docs/run_schema.md", "docs/run_tables.md", "docs/train.md", "docs/passkey.md", "docs/audit.md",
               "docs/tutorial.md", "docs/api.md", "docs/cli.md", "docs/glossary.md", "docs/figures.md",
               "docs/intervene.md", "docs/layout.md", "docs/README.md")

#: numbers that are no measurement, per page (as written in the prose)
ALLOWED = {
    # controls.md: MoBA's expected pairs kept against k / blocks (as method.md had them), and the
    # "about 1%" noise level that motivates the interval rule
    "docs/controls.md": {"0.54", "0.31", "1%"},
    "docs/method.md": {
        # section numbers (headings "### 1.1 ...")
        "1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7",
        "2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9",
        "3.1", "3.2", "3.3", "3.4", "3.5",
        "0.05",    # FocusConfig.bias_momentum, the default group-bias momentum
        "0.25",    # 1/K at K = 4
        "0.02",    # tau_final of the annealing recipes (focus_lab/train/recipes.py)
        "34.5",    # the paper's ablation: d_g = 768 and d_g = 16 give the same perplexity [notes]
        "0.6",     # the paper's Table 9: 16 settings move fine-tuned perplexity by 0.6 [notes]
        # arithmetic of the mask, w = 128 and 64 sinks: the sink pairs' share of the distant pairs
        # at 512 and 1024 tokens
        "31%", "14%",
        # MoBA at 4096 tokens, blocks of 128, 64 sinks: block top-10 keeps an expected 0.54 of the
        # distant pairs (baselines.moba_distant_kept), not 10/32 = 0.31
        "0.54", "0.31",
        "95%",     # the bootstrap interval's level (§8)
    },
    "docs/retrieval.md": {
        "2404.06654", "2404.15574",  # arXiv identifiers (RULER; Wu et al.)
        "1.3x",    # retrieval_tables.COST_GOAL, the cost criterion
        "50%",     # the dense score below which a task is marked (a criterion)
        "0.1",     # retrieval_tables.RETRIEVAL_HEAD_THRESHOLD
        "95%",     # the bootstrap interval's level
    },
    # one (B, H, T, T) float32 pattern: 9 heads x 4096^2 x 4 bytes = 0.60 GB
    "docs/probe.md": {"0.6"},
    "docs/decomposition.md": {
        "8.6x",            # the paper's decomposition speedup at 1M tokens [abstract]
        "0.2x", "4.1x",    # the paper's Table 6, 1K to 1M tokens [notes]
        "1.5",             # the paper's full attention at 1M tokens, seconds [notes]
        "20%",             # decomposition._buckets(waste=1.2): at most 20% padding work
        # one layer's keys (or values) in float32 at 8192 tokens: 3 KV heads x 64 x 8192 x 4 bytes
        "6.3",
    },
    # one window's (T, vocabulary) float32 logits: 4096 x 49152 x 4 bytes = 0.8 GB
    "docs/run_schema.md": {"0.8"},
    "docs/passkey.md": {"100%"},  # the depths 0-100% of the haystack (--depths)
    "docs/glossary.md": {"95%"},
}


# ============================================================================================
# docs/method.md: the recipes at 512 tokens

RECIPES_SWEEP = "figures/results/recipes.parquet"
SWEEP = "30 steps"
LONGER = "sinks64, 120 steps"
CONTROLS = (("dense", "dense", None),
            ("sliding window (w = 128)", "window", None),
            ("sliding window + 4 sinks", "window_sinks4", None),
            ("random groups, top-1 / top-2", "random_hard_top1", "random_hard_top2"),
            ("random groups + 4 sinks, top-1 / top-2", "random_sinks4_hard_top1", "random_sinks4_hard_top2"))


def _sweep() -> pd.DataFrame:
    df = pd.read_parquet(REPO / RECIPES_SWEEP)
    for sweep in (SWEEP, LONGER):
        if not (df.sweep == sweep).any():
            raise MissingInput(f"{RECIPES_SWEEP} (sweep {sweep!r})")
    return df


@block("method-recipes", RECIPES_SWEEP)
def method_recipes() -> Generated:
    """docs/method.md §3.4: the controls (perplexity, distant pairs kept), then per recipe its sink
    tokens and group bias (``focus_lab.train.recipes``), the soft gate's, hard top-1's and hard
    top-2's perplexity and the largest hard group's share of the tokens (at top-1, as the study's
    report), recipes in order of hard top-2; the longer ``sinks64`` run last."""
    from focus_lab.train.recipes import RECIPES
    df = _sweep()
    ctl = df[(df.sweep == SWEEP) & (df.recipe == "controls")].set_index("label")
    lines = ["| control | perplexity | distant pairs kept |", "|---|---:|---:|"]
    for name, a, b in CONTROLS:
        labels = [x for x in (a, b) if x]
        if not all(x in ctl.index for x in labels):
            raise MissingInput(f"{RECIPES_SWEEP} (controls {', '.join(labels)})")
        lines.append(f"| {name} | {' / '.join(f'{ctl.perplexity[x]:.2f}' for x in labels)} | "
                     f"{' / '.join(f'{ctl.distant_pairs_kept[x]:.2f}' for x in labels)} |")
    lines += ["", "| recipe | sink tokens | group bias | soft | hard top-1 | hard top-2 | largest hard group |",
              "|---|---:|---|---:|---:|---:|---:|"]

    def row(g: pd.DataFrame, name: str, recipe: str) -> str:
        g = g.set_index("label")
        focus, _ = RECIPES[recipe]
        bias = "none (b = 0)" if focus.get("bias_momentum", 0.05) == 0 else "calibrated"
        return (f"| {name} | {focus.get('sink_tokens', 0)} | {bias} | {g.perplexity['soft']:.2f} | "
                f"{g.perplexity['hard_top1']:.2f} | {g.perplexity['hard_top2']:.2f} | {g.max_group_share['hard_top1']:.2f} |")
    runs = df[(df.sweep == SWEEP) & (df.recipe != "controls")]
    order = runs[runs.label == "hard_top2"].sort_values("perplexity").recipe
    lines += [row(runs[runs.recipe == r], f"`{r}`", r) for r in order]
    longer = df[(df.sweep == LONGER) & (df.recipe == "sinks64")]
    lines.append(row(longer, "`sinks64`, 120 steps", "sinks64"))
    tokens = int(ctl.tokens["dense"])
    inputs = (f"{RECIPES_SWEEP} (python -m analyses.studies.recipes_sweep --report; sweeps '{SWEEP}' and "
              f"'{LONGER}'); each recipe trained at 512 tokens on Austen without Persuasion from one initialization "
              f"(its routers not kept); 3 windows of 1024 tokens of Persuasion, {tokens} predicted tokens, one pooled "
              "perplexity per pattern; patterns dense, window, window + 4 sinks, random groups, soft, hard_top1, hard_top2")
    return Generated(inputs, "\n".join(lines))


# ============================================================================================
# docs/retrieval.md: the cost of a case

RETRIEVAL_CASES = "figures/results/retrieval_cases.parquet"


@block("retrieval-cost", RETRIEVAL_CASES)
def retrieval_cost() -> Generated:
    """docs/retrieval.md's cost table: per device and length, the case-patterns with a timed bare
    forward, the median and quartiles of a case's seconds over one bare forward of its prompt
    under the same pattern, the share within ``COST_GOAL``, the median seconds of a case-pattern,
    and dense's and hard top-2's medians (``retrieval_tables.cost_summary``)."""
    from focus_lab.eval.retrieval_tables import COST_GOAL, cost_summary
    cases = pd.read_parquet(REPO / RETRIEVAL_CASES)
    for col in ("device", "seconds", "bare_forward_seconds", "router_name"):
        if col not in cases:
            raise MissingInput(f"{RETRIEVAL_CASES} (column {col})")
    cases = cases.dropna(subset=["bare_forward_seconds"])
    lines = [f"| device | tokens | case-patterns | a case over one bare forward: median [quartiles] | within {COST_GOAL}x "
             "| seconds a case-pattern, median | dense | hard top-2 |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    for (device, length), g in cases.groupby(["device", "length"]):
        s = cost_summary(g).set_index("pattern")
        a = s.loc["all"]
        pat = lambda p: f"{s.loc[p, 'median']:.2f}x" if p in s.index else "-"  # noqa: E731
        lines.append(f"| {device} | {length} | {int(a.cases)} | {a['median']:.2f}x [{a.q25:.2f}, {a.q75:.2f}] | "
                     f"{100 * a.within_goal:.0f}% | {g.seconds.median():.1f} | {pat('dense')} | {pat('hard_top2')} |")
    inputs = (f"{RETRIEVAL_CASES} (focus-lab probe retrieval: the shipped file's committed suite, its runs merged); "
              f"routers {case_routers(cases)}; every task, case and pattern with a timed bare forward; cost = seconds / "
              "bare_forward_seconds (focus_lab.eval.retrieval_tables.cost_summary)")
    return Generated(inputs, "\n".join(lines))


# ============================================================================================
# docs/run_schema.md: what recording costs over a plain forward

BENCH_RECORD = "figures/results/bench_record.parquet"
RECORDED, PLAIN, TABLES = "recorded forward", "plain forward", "tables()"


@block("record-overhead", BENCH_RECORD)
def record_overhead() -> Generated:
    """docs/run_schema.md's overhead table: per torch threads and length, a plain and a recorded
    forward's median CPU and wall seconds, the recorded one's ratios over the plain one's, one
    ``tables()`` (wall seconds), and the 1-minute load average before and after that length's pairs."""
    df = pd.read_parquet(REPO / BENCH_RECORD)
    if not set(df.timed) >= {PLAIN, RECORDED, TABLES}:
        raise MissingInput(f"{BENCH_RECORD} (timed {PLAIN!r}, {RECORDED!r}, {TABLES!r})")
    s = df.set_index(["threads", "tokens", "timed"])
    lines = ["| torch threads | tokens | plain forward, CPU / wall | recorded forward, CPU / wall | recorded / plain, "
             "CPU | recorded / plain, wall | `tables()`, wall | 1-min load average, before / after |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for threads, tokens in sorted({k[:2] for k in s.index}):
        p, r, t = (s.loc[(threads, tokens, x)] for x in (PLAIN, RECORDED, TABLES))
        lines.append(f"| {threads} | {tokens} | {p.cpu_s:.2f} / {p.wall_s:.2f} s | {r.cpu_s:.2f} / {r.wall_s:.2f} s | "
                     f"{r.cpu_ratio:.2f}x | {r.wall_ratio:.2f}x | {t.wall_s:.2f} s | "
                     f"{p.load_1min_before:.1f} / {p.load_1min_after:.1f} |")
    r = df.iloc[0]
    inputs = (f"{BENCH_RECORD}: `python analyses/studies/bench_record.py` at {', '.join(sorted(set(df.commit)))}; "
              f"{'; '.join(sorted(set(df.machine)))}; {r.model}, routers {case_routers(df)}, {r['mode']} mode, "
              f"every metric; one window of held-out Austen a length; medians of {int(df.reps.min())} alternated "
              "pairs (process CPU time and wall time)")
    return Generated(inputs, "\n".join(lines))
