"""docs/studies/gemma-long-context-bounds.md's tables: Gemma-3-270M with the model's own attention
on the 2-core CPU, from 4096 to 32768 tokens.

- ``gemma-bounds-forward``: one forward per cell (length x pattern) as ``analyses.bench_gemma_length``
  recorded it in ``figures/gemma/bench_length.csv`` (body, LM head, the global layers' share, peaks,
  load), a cell that did not finish with the status it recorded; then the dense forward by part per
  length (the sliding and the global layers from the same forward's layer hooks) and the bound on
  any end-to-end speed-up from the routed (global) layers;
- ``gemma-bounds-train``: seconds a router-training step, per model, stage and length, from
  ``figures/gemma/train_step_cost.csv`` (one row per step), against SmolLM2's step under the same
  load and against the SmolLM2 chain's own record of its stage 2 (``figures/results/smollm2_chain.json``).
"""

from __future__ import annotations

import json
import re

import pandas as pd

from analyses.doc_blocks import REPO, Generated, MissingInput, block

PAGE = "docs/studies/gemma-long-context-bounds.md"
PROSE_PAGES = (PAGE,)
#: not measurements: software versions (transformers 5.23, torch 2.13); arithmetic from Gemma-3-270M's
#: shapes (hidden 640, 4 query heads of 256, vocabulary 262,144, 18 layers): the LM head's 1.37 TFLOP
#: against the body's 0.82 TFLOP of linear work at 4096 tokens (1.7x), a global layer's 2.2 TFLOP of
#: causal attention at 32K and 4.4 TFLOP non-causal, the (T, 262144) fp32 logits' 4.3 GB per 4096
#: tokens (8.6 GB at 8192)
ALLOWED = {PAGE: {"5.23", "2.13", "1.37", "0.82", "1.7x", "2.2", "4.4", "4.3", "8.6"}}

BENCH = "figures/gemma/bench_length.csv"
TRAIN = "figures/gemma/train_step_cost.csv"
CHAIN = "figures/results/smollm2_chain.json"
#: Gemma-3-270M's decoder layers; the global ones are ``analyses.bench_gemma_length.GLOBAL_LAYERS``
N_LAYERS = 18
MODELS = {"gemma3-270m": "Gemma-3-270M", "smollm2-135m-instruct": "SmolLM2-135M"}


def _bench() -> pd.DataFrame:
    df = pd.read_csv(REPO / BENCH)
    if df.empty:
        raise MissingInput(BENCH)
    return df


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.status == "ok"]


def _load(r) -> str:
    return f"{r.load1_before:.1f} -> {r.load1_after:.1f}"


@block("gemma-bounds-forward", BENCH)
def gemma_bounds_forward() -> Generated:
    """Per cell: body, LM head and end-to-end seconds, dense over the pattern end to end, the global
    layers' share of the body (and their seconds), the body's peak, what the body added over the
    loaded model, the process's peak, the pairs the fresh groups keep and the 1-minute load before
    and after; a cell that did not finish gives its recorded status and projected peak. Then per
    length the dense forward by part and the end-to-end bound with the routed layers free."""
    from analyses.bench_gemma_length import GLOBAL_LAYERS
    df = _bench()
    dense = _ok(df[df.pattern == "dense"]).set_index("T")
    lines = ["| tokens | pattern | body s | LM head s | end to end s | dense / pattern, end to end | global layers, "
             "share of the body | body peak GiB | body over the loaded model GiB | process peak GiB | pairs kept | "
             "load (1 min) |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    notes = []
    for r in df.itertuples():
        head = f"| {r.T} | `{r.pattern}` | "
        if r.status != "ok":
            lines.append(head + f"did not finish (below) | | | | | | | {r.peak_rss_gib:.1f} | | {_load(r)} |")
            proj = (f"; the script's projected peak (the loaded model plus 4x what the body added at "
                    f"{r.T // 2} tokens) {r.projected_gib:.1f} GiB" if pd.notna(r.projected_gib) else "")
            notes.append(f"{r.T} `{r.pattern}`, as recorded: {r.status.rstrip('.')}{proj}.")
            continue
        ratio = f"{dense.total_s[r.T] / r.total_s:.2f}x" if r.pattern != "dense" and r.T in dense.index else ""
        pairs = f"{r.group_pairs_share:.2f}" if pd.notna(r.group_pairs_share) else ""
        lines.append(head + f"{r.body_s:.0f} | {r.head_s:.0f} | {r.total_s:.0f} | {ratio} | "
                     f"{100 * r.global_share_of_body:.0f}% ({r.global_layers_s:.0f} s) | {r.body_peak_gib:.1f} | "
                     f"{r.body_peak_gib - r.rss_loaded_gib:.1f} | {r.peak_rss_gib:.1f} | {pairs} | {_load(r)} |")
    if notes:
        lines += [""] + notes
    n_global = len(GLOBAL_LAYERS)
    n_sliding = N_LAYERS - n_global
    lines += ["", f"The dense forward by part (the decoder layers timed by hooks in the same forward; the bound: "
              "dense end to end over dense end to end less the global layers, what hard top-k could gain were the "
              "routed layers free):", "",
              f"| tokens | the {n_sliding} sliding layers: s, share of the body, each | the {n_global} global layers: "
              "s, each | body outside the layers s | LM head, share of end to end | LM head, slowest over fastest "
              "cell of the length | bound, end to end |", "|---:|---|---|---:|---:|---:|---:|"]
    heads = _ok(df).groupby("T").head_s.agg(["min", "max", "count"])
    for T, r in dense.iterrows():
        sliding = r.layers_s - r.global_layers_s
        h = heads.loc[T]
        spread = f"+{100 * (h['max'] / h['min'] - 1):.0f}% ({int(h['count'])} cells)" if h["count"] > 1 else ""
        lines.append(f"| {T} | {sliding:.1f} ({100 * sliding / r.body_s:.0f}%, {sliding / n_sliding:.1f} each) | "
                     f"{r.global_layers_s:.1f} ({r.global_layers_s / n_global:.1f} each) | "
                     f"{r.body_s - r.layers_s:.1f} | {100 * r.head_s / r.total_s:.0f}% | {spread} | "
                     f"{r.total_s / (r.total_s - r.global_layers_s):.2f}x |")
    machines = "; ".join(sorted(set(df.machine.dropna())))
    inputs = (f"{BENCH}: `python -m analyses.bench_gemma_length`, one row per cell, each cell in a process of its own, "
              f"{df.created.min()} to {df.created.max()}; {machines}; {', '.join(sorted(set(df.grad_mode.dropna())))}, one Persuasion window per length; "
              f"the LM head timed on the first {int(dense.head_measured_tokens.max())} positions and scaled linearly "
              "beyond; fresh routers (num_groups 4, window 128, sink_tokens 64)")
    return Generated(inputs, "\n".join(lines))


def _stage(r) -> str:
    """``1 (`sinks64`, LM objective)`` from a row's stage (``s1_sinks64``) and recipe."""
    n = re.match(r"s(\d+)_", r.stage)
    recipe = re.match(r"(\S+)(?: \((.*)\))?$", r.recipe)
    what = f"`{recipe[1]}`" + (f", {recipe[2]}" if recipe[2] else "")
    return f"{n[1] if n else r.stage} ({what})"


@block("gemma-bounds-train", TRAIN, CHAIN)
def gemma_bounds_train() -> Generated:
    """Per model, stage and length: the mean seconds of a step (each step's in order), the
    process's peak RSS, and the step over SmolLM2's at the same stage and length under the same
    load; then SmolLM2's step here over the step of its chain's own record (stage 2, a lighter load)."""
    df = pd.read_csv(REPO / TRAIN)
    if df.empty:
        raise MissingInput(TRAIN)
    g = df.groupby(["model", "stage", "recipe", "seq_len", "batch_size"], sort=False)
    means = g.step_seconds.mean()
    smol = {(k[1], k[3]): v for k, v in means.items() if k[0].startswith("smollm2")}
    lines = ["| model | stage (recipe) | tokens a step | seconds a step (each step) | process peak RSS | "
             "over SmolLM2's step, same stage and length |", "|---|---|---:|---:|---:|---:|"]
    for (model, stage, recipe, L, b), s in g:
        s = s.sort_values("step")
        r = s.iloc[0]
        tokens = f"{b} x {L}" if b > 1 else f"{L}"
        mean = s.step_seconds.mean()
        vs = f"{mean / smol[(stage, L)]:.2f}x" if not model.startswith("smollm2") and (stage, L) in smol else ""
        lines.append(f"| {MODELS.get(model, model)} | {_stage(r)} | {tokens} | {mean:.1f} "
                     f"({', '.join(f'{x:.1f}' for x in s.step_seconds)}) | {s.process_peak_rss_gib.max():.1f} GiB | {vs} |")
    rec = json.loads((REPO / CHAIN).read_text())
    name, st = next(((k, v) for k, v in rec["stages"].items() if k.startswith("s2_distill64_4096")), (None, None))
    steps = re.search(r"--stop-after (\d+)", st["command"]) if st else None
    if not steps:
        raise MissingInput(f"{CHAIN} (stage s2_distill64_4096 with --stop-after)")
    per = st["seconds"] / int(steps[1])
    here = smol.get(("s2_distill64", 4096))
    if here is None:
        raise MissingInput(f"{TRAIN} (SmolLM2's s2_distill64 at 4096)")
    lines += ["", f"SmolLM2's chain record ({CHAIN}, stage `{name}`): {steps[1]} steps of `distill64` at 4096 tokens in "
              f"{st['seconds']:.0f} s, the process's start included, highest 1-minute load {st['max_load_1min']:.1f}: "
              f"{per:.1f} s a step at most. SmolLM2's step here is {here / per:.1f}x that."]
    loads = [float(x.split()[0]) for x in (*df.load_avg_before, *df.load_avg_after)]
    machines = "; ".join(sorted(set(df.machine)))
    m = rec.get("machine", {})
    chain_machine = f"{m.get('cpu_model', '?')}, {m.get('nproc', '?')} cores, {m.get('mem_gib', '?')} GiB, torch {m.get('torch', '?')}"
    inputs = (f"{TRAIN}: `focus-lab train`'s train_log.parquet, one row per step; {machines}; 1-minute load "
              f"average {min(loads):.2f} to {max(loads):.2f} before and after each run; {CHAIN} ({chain_machine})")
    return Generated(inputs, "\n".join(lines))
