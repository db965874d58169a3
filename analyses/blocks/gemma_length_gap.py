"""docs/studies/gemma-length-gap.md's tables: why random groups catch up with Gemma-3-270M's router
as the context grows.

- ``gemma-length-gap``: per length on held-out *Persuasion*, the perplexity change of random groups
  over the router of stage g4 (``gemma3-270m/needle-mix``) at top-2 (the committed length table
  ``gemma3_needle_mix``, paired interval over
  windows) beside the routed layers' attention recall and output error on window 0 (one recording
  per length, ``analyses.studies.output_error_by_length``: the router's hard top-2 mask, balanced
  random groups at the same sparsity, and a sliding window keeping as many pairs), with the
  router-minus-random output error's 95% bootstrap interval over the 12 (layer, head) pairs;
- ``gemma-length-gap-distill8k``: the router file distilled 20 more steps at 8192 tokens
  (``gemma3-270m/distill64-8k``, g5's file, committed length table ``gemma3_distill64_8k``)
  against stage g4's file and random groups, on the same windows, paired intervals over windows
  from 3 windows up;
- ``gemma-length-gap-retrieval``: RULER's single needle, the same cases under both files' default
  (hard top-2): scores and the paired difference of score and answer log-prob over cases.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analyses.doc_blocks import (GEMMA_G4_RETRIEVAL, GEMMA_RETRIEVAL, GEMMA_TABLE, GEMMA_G4_TABLE, GEMMA_G5_RETRIEVAL, GEMMA_G5_TABLE, HAYSTACK, HELD_NAMES, LENGTH_CELLS, REPO, Generated, MissingInput, _cells,
                                 _change, _read_cases, block, router_label)

PAGE = "docs/studies/gemma-length-gap.md"
KEYSHIFT_PAGE = "docs/studies/gemma-key-shift.md"
PROSE_PAGES = (PAGE, KEYSHIFT_PAGE)
#: settings, not measurements: 12 (layer, head) pairs (3 routed layers x 4 heads) and the 12 steps
#: of the stage at 16384 tokens, 20 steps at 8192 tokens, the 128-token window
ALLOWED = {PAGE: {"12", "20"}}

OE = "figures/gemma/output_error_by_length.parquet"
#: g5's file with balanced random groups in layer 11 (`focus-lab routers set-rules`; no training)
RANDOM11_TABLE = "gemma3_distill64_8k_random11"
#: g5's file's output error on training-domain text (the end of Mansfield Park), per length
OE_TRAIN = "figures/gemma/output_error_training_text.parquet"
RANDOM11_RULE = "hard_top2+random_layers([11])"
#: g5's file distilled 12 more steps at 16384 tokens (not shipped)
DISTILL16K_TABLE = "gemma3_distill64_16k"
#: stage g5 run on Austen's and Shakespeare's training texts instead of Austen's alone (not shipped)
MIX_TABLE = "gemma3_distill64_8k_mix"
#: g5's file with keys in their predecessor's group (rule ``key_shift``, labels
#: ``hard_topK_keyshift``; no training, the same file's tensors)
KEYSHIFT_TABLE = "gemma3_distill64_8k_keyshift"
KEYSHIFT_SUFFIX = "_keyshift"
#: the shift's retrieval runs (dense and ``hard_top2+key_shift``) on the same cases (seeds) as the
#: g5 file's and stage g4's runs, at 16384 and 32768 tokens
KEYSHIFT_RETRIEVAL = GEMMA_RETRIEVAL
#: the same, with and without the shift, on a third held-out domain: code (the end of the
#: local file ``python_stdlib``, Python's standard library source, which no Gemma stage trained on)
KEYSHIFT_CODE_TABLE = "gemma3_distill64_8k_keyshift_code"


def _oe() -> pd.DataFrame:
    path = REPO / OE
    if not path.exists():
        raise MissingInput(OE)
    return pd.read_parquet(path)


def head_difference(heads: pd.DataFrame, a: str = "focus", b: str = "random", reps: int = 2000,
                    seed: int = 0) -> tuple[float, float, float, int, int]:
    """Mean over (layer_idx, head) of ``a``'s output error minus ``b``'s, its 95% bootstrap interval
    (heads resampled with replacement, ``reps`` times), the heads where ``a``'s error is lower and
    the heads compared (``reps`` 0: the interval is NaN). ``heads``: rows of one length, or of one
    layer at one length (columns layer_idx, head, pattern, output_error)."""
    p = heads.pivot_table(index=["layer_idx", "head"], columns="pattern", values="output_error")
    d = (p[a] - p[b]).to_numpy(float)
    rng = np.random.default_rng(seed)
    boots = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(reps)] or [float("nan")]
    return float(d.mean()), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5)), int((d < 0).sum()), len(d)


@block("gemma-length-gap", OE, LENGTH_CELLS)
def gemma_length_gap() -> Generated:
    """Per length: windows and random top-2's perplexity change over the router (> 0: the router is
    better); recall and output error (means over the heads) of the router, random groups and the
    window of as many pairs; router minus random output error with its interval over heads, and the
    heads where the router's error is lower."""
    from analyses.length_table import summarize
    oe = _oe()
    cells = _cells(GEMMA_G4_TABLE)
    cells = cells[cells.corpus == "austen"]
    s = summarize(cells).set_index(["seq_len", "label"])
    lines = ["| tokens | windows (perplexity) | random top-2 vs router, perplexity | recall: router / random / window of as "
             "many pairs | output error: router / random / window of as many pairs | router - random, output error | "
             "heads where the router's error is lower |", "|---:|---:|---|---|---|---|---:|"]
    for L, g in oe.groupby("seq_len", sort=True):
        if (L, "dense") not in s.index:
            raise MissingInput(f"{LENGTH_CELLS} (table {GEMMA_G4_TABLE}, austen at {L} tokens)")
        n = int(s.loc[(L, "dense")].windows)
        m = g.groupby("pattern")[["coverage", "output_error"]].mean()
        diff, lo, hi, lower, heads = head_difference(g)
        trio = lambda col: " / ".join(f"{m.loc[p, col]:.3f}" for p in ("focus", "random", "window_matched"))  # noqa: E731
        lines.append(f"| {L} | {n} | {_change(s.loc[(L, 'random_top2')], 'control_vs_router_pct', 'control_ci_lo', 'control_ci_hi', n)} | "
                     f"{trio('coverage')} | {trio('output_error')} | {diff:+.3f} [{lo:+.3f}, {hi:+.3f}] | {lower} of {heads} |")
    sha = oe.routers_sha256.iloc[0]
    inputs = (f"{OE} (one recording of Persuasion's window 0 per length, `focus-lab record --metrics coverage,output_error`, "
              f"routers {router_label(sha)}, the router's mask its hard top-2); {LENGTH_CELLS} (table {GEMMA_G4_TABLE}, austen)")
    return Generated(inputs, "\n".join(lines))


def lever_table(new: pd.DataFrame, base: pd.DataFrame, new_name: str, base_name: str,
                versus_dense: bool = False) -> list[str]:
    """Markdown rows comparing two router files' length tables on the windows ``new`` ran on: per
    held-out corpus and length, random groups' perplexity change over each file's hard top-1 and
    top-2 (> 0: the router is better), and ``new``'s change over ``base`` at each k, with 95% paired
    intervals over windows from 3 windows up; ``-`` at a k that ``new`` did not run. ``new``,
    ``base``: committed cells of one table each, ``new``'s with the dense and random rows it reused
    from ``base``'s runs. ``versus_dense``: a last column, ``new``'s hard top-2 change over dense
    with its paired interval (the issue's goal is stated against dense)."""
    from analyses.length_table import summarize
    from focus_lab.eval.evaluate import paired_change
    lines = [f"| held out | tokens | windows | random top-1 vs router: {base_name} / {new_name} | random top-2 vs router: "
             f"{base_name} / {new_name} | {new_name} vs {base_name}, hard top-1 | {new_name} vs {base_name}, hard top-2 |",
             "|---|---:|---:|---|---|---|---|"]
    if versus_dense:
        lines[0] += f" {new_name}, hard top-2 vs dense |"
        lines[1] += "---|"
    for (c, L), g in new.groupby(["corpus", "seq_len"], sort=True):
        ks = [k for k in (1, 2) if (g.label == f"hard_top{k}").any()]
        wins = sorted(set.intersection(*(set(g[g.label == f"hard_top{k}"].window) for k in ks)))
        h = base[(base.corpus == c) & (base.seq_len == L) & base.window.isin(wins)]
        g = g[g.window.isin(wins)]
        n = len(wins)
        a, b = summarize(h).set_index("label"), summarize(g).set_index("label")
        vs = lambda r: _change(r, "control_vs_router_pct", "control_ci_lo", "control_ci_hi", n)  # noqa: E731
        vs_new = lambda k: vs(b.loc[f"random_top{k}"]) if k in ks else "-"  # noqa: E731

        def change(k: int) -> str:
            if k not in ks:
                return "-"
            d, lo, hi = paired_change(g[g.label == f"hard_top{k}"], h[h.label == f"hard_top{k}"])
            return f"{d:+.1f}%" if n < 3 else f"{d:+.1f}% [{lo:+.1f}, {hi:+.1f}]"
        lines.append(f"| {HELD_NAMES.get(g.heldout.iloc[0], g.heldout.iloc[0])} | {L} | {n} | "
                     f"{vs(a.loc['random_top1'])} / {vs_new(1)} | {vs(a.loc['random_top2'])} / "
                     f"{vs_new(2)} | {change(1)} | {change(2)} |")
        if versus_dense:
            lines[-1] += f" {_change(b.loc['hard_top2'], 'delta_vs_dense_pct', 'ci_lo', 'ci_hi', n) if 2 in ks else '-'} |"
    return lines


def lever_block(new_table: str, base_table: str, new_name: str, base_name: str, rule: str = "",
                suffix: str = "", versus_dense: bool = False) -> Generated:
    """``lever_table`` of two committed tables (``new_table`` on its windows against
    ``base_table``), with the inputs line: both files' names and sha256, ``rule`` the pattern
    written into ``new_table``'s file when it has one, and the table whose runs gave the dense and
    random rows both reuse. ``suffix``: the lever is a rule added to the same file's hard patterns,
    ``new_table``'s rows ``hard_topK{suffix}`` stand for its hard top-K (rows without the suffix
    are dropped)."""
    new, base = _cells(new_table), _cells(base_table)
    if suffix:
        hard = new.label.str.startswith("hard_top")
        new = new[~hard | new.label.str.endswith(suffix)]
        new = new.assign(label=new.label.str.removesuffix(suffix))
    lines = lever_table(new, base, new_name, base_name, versus_dense)
    sha = lambda df: router_label(df[df.label.isin(["hard_top1", "hard_top2"])].routers_sha256.iloc[0])  # noqa: E731
    controls = new[new.label.isin(["dense", "random_top1", "random_top2"])]
    # a table committed again reuses its own rows: the runs that measured them are the other tables'
    reused = ", ".join(sorted(set(controls.reused_from.fillna("")) - {"", new_table})) or new_table
    inputs = (f"{LENGTH_CELLS} (tables {new_table} and {base_table}, the same windows); routers {sha(new)}"
              + (f" (`{rule}`)" if rule else "") + f" against {sha(base)}; dense and random groups from {reused}'s runs "
              "(they do not depend on the router file)")
    return Generated(inputs, "\n".join(lines))


@block("gemma-length-gap-distill8k", LENGTH_CELLS)
def gemma_length_gap_distill8k() -> Generated:
    """The file distilled at 8192 tokens (table ``GEMMA_G5_TABLE``) against stage g4's file
    (``GEMMA_G4_TABLE``) on the same windows (``lever_block``)."""
    return lever_block(GEMMA_G5_TABLE, GEMMA_G4_TABLE, "distill64-8k", "needle-mix")


@block("gemma-length-gap-layers", OE_TRAIN)
def gemma_length_gap_layers() -> Generated:
    """Per length and routed layer of the recordings on training-domain text (``OE_TRAIN``): the
    output error of the router's hard top-2 mask and of balanced random groups at the same
    sparsity (means over the layer's heads), their difference and the heads where the router's
    error is lower."""
    path = REPO / OE_TRAIN
    if not path.exists():
        raise MissingInput(OE_TRAIN)
    oe = pd.read_parquet(path)
    lines = ["| tokens | layer | output error: router / random | router - random | heads where the router's error is lower |",
             "|---:|---:|---|---|---:|"]
    for (L, layer), g in oe.groupby(["seq_len", "layer_idx"], sort=True):
        m = g.groupby("pattern").output_error.mean()
        diff, _, _, lower, heads = head_difference(g, reps=0)
        lines.append(f"| {L} | {layer} | {m['focus']:.3f} / {m['random']:.3f} | {diff:+.3f} | {lower} of {heads} |")
    docs = ", ".join(sorted({d.split(":")[0] for d in oe.documents}))
    inputs = (f"{OE_TRAIN} (one recording per length of the held-out end of the local file `{docs}`: the training "
              f"novels Emma, then Mansfield Park; `focus-lab record --metrics coverage,output_error`, routers "
              f"{router_label(oe.routers_sha256.iloc[0])}, the router's mask its hard top-2)")
    return Generated(inputs, "\n".join(lines))


@block("gemma-length-gap-random11", LENGTH_CELLS)
def gemma_length_gap_random11() -> Generated:
    """Stage g5's file with balanced random groups in layer 11 (table ``RANDOM11_TABLE``) against
    g5's file (``GEMMA_G5_TABLE``) on the windows it ran on (``lever_block``)."""
    return lever_block(RANDOM11_TABLE, GEMMA_G5_TABLE, "random in 11", "distill64-8k", RANDOM11_RULE)


@block("gemma-length-gap-distill16k", LENGTH_CELLS)
def gemma_length_gap_distill16k() -> Generated:
    """Stage g5's file distilled 12 more ``distill64`` steps at 16384 tokens (table
    ``DISTILL16K_TABLE``) against g5's file (``GEMMA_G5_TABLE``) on the windows it ran on
    (``lever_block``)."""
    return lever_block(DISTILL16K_TABLE, GEMMA_G5_TABLE, "distill64-16k", "distill64-8k")


@block("gemma-length-gap-mix", LENGTH_CELLS)
def gemma_length_gap_mix() -> Generated:
    """Stage g5's 20 ``distill64`` steps at 8192 tokens from g4's file on Austen's and
    Shakespeare's training texts (table ``MIX_TABLE``, hard top-2 only) against g5's file,
    whose g5 trained on Austen's alone (``GEMMA_G5_TABLE``), on the windows it ran on (``lever_block``)."""
    return lever_block(MIX_TABLE, GEMMA_G5_TABLE, "mix-8k", "distill64-8k")


@block("gemma-length-gap-keyshift", LENGTH_CELLS)
def gemma_length_gap_keyshift() -> Generated:
    """Stage g5's file with keys in their predecessor's group (``key_shift``, docs/levers.md
    §1.7; table ``KEYSHIFT_TABLE``, rows ``hard_topK_keyshift``) against the same file without it
    (``GEMMA_G5_TABLE``), on the windows it ran on (``lever_block``)."""
    return lever_block(KEYSHIFT_TABLE, GEMMA_G5_TABLE, "key shift", "distill64-8k", "hard_topK+key_shift",
                       KEYSHIFT_SUFFIX, versus_dense=True)


@block("gemma-keyshift-random", LENGTH_CELLS)
def gemma_keyshift_random() -> Generated:
    """Random groups under the key shift (the shipped file's table ``GEMMA_TABLE``, rows
    ``random_topK``: ``random_topK+key_shift``) against random groups without it (g5's table
    ``GEMMA_G5_TABLE``) on the same windows: per corpus and length, the perplexity change at each
    k (95% paired interval over windows from 3 windows up; ``evaluate.paired_change``) and the
    distant pairs kept by each. Shifting balanced random groups by one token gives balanced random
    groups, so the two should differ by a draw's noise only."""
    from focus_lab.eval.evaluate import paired_change
    new, old = _cells(GEMMA_TABLE), _cells(GEMMA_G5_TABLE)
    lines = ["| held out | tokens | windows | random top-1: with / without the shift | distant pairs kept | "
             "random top-2: with / without the shift | distant pairs kept |", "|---|---:|---:|---|---|---|---|"]
    for (c, L), g in new.groupby(["corpus", "seq_len"], sort=True):
        h = old[(old.corpus == c) & (old.seq_len == L)]
        cells = []
        for k in (1, 2):
            a, b = g[g.label == f"random_top{k}"], h[h.label == f"random_top{k}"]
            if set(a.window) != set(b.window):
                raise MissingInput(f"{LENGTH_CELLS} (tables {GEMMA_TABLE} and {GEMMA_G5_TABLE}: random_top{k} on the "
                                   f"same windows of {c} at {L})")
            n = a.window.nunique()
            d, lo, hi = paired_change(a, b)
            cells += [f"{d:+.2f}%" if n < 3 else f"{d:+.2f}% [{lo:+.2f}, {hi:+.2f}]",
                      f"{a.distant_pairs_kept.mean():.3f} / {b.distant_pairs_kept.mean():.3f}"]
        lines.append(f"| {HELD_NAMES.get(g.heldout.iloc[0], g.heldout.iloc[0])} | {L} | {n} | " + " | ".join(cells) + " |")
    pats = sorted(set(new[new.label.str.startswith("random_top")].canonical_pattern))
    inputs = (f"{LENGTH_CELLS} (table {GEMMA_TABLE}: {', '.join(f'`{x}`' for x in pats)}; table {GEMMA_G5_TABLE}: "
              "`random_top1`, `random_top2`; the same windows, seed 0)")
    return Generated(inputs, "\n".join(lines))


@block("gemma-length-gap-keyshift-code", LENGTH_CELLS)
def gemma_length_gap_keyshift_code() -> Generated:
    """The key shift on a third held-out domain (table ``KEYSHIFT_CODE_TABLE``: dense, hard top-2
    with and without the shift, random top-2 on the same windows, one run): per corpus and
    length, dense's perplexity, each hard top-2's change over dense, random top-2's change over
    each (> 0: the router is better) and the shift's change over the file alone, 95% paired
    intervals over windows from 3 windows up (``evaluate.paired_change``)."""
    from analyses.length_table import summarize
    from focus_lab.eval.evaluate import paired_change
    cells = _cells(KEYSHIFT_CODE_TABLE)
    lines = ["| held out | tokens | windows | dense perplexity | hard top-2 vs dense: distill64-8k / key shift | "
             "random top-2 vs router: distill64-8k / key shift | key shift vs distill64-8k, hard top-2 |",
             "|---|---:|---:|---:|---|---|---|"]

    def fmt(a: pd.DataFrame, b: pd.DataFrame, n: int) -> str:
        d, lo, hi = paired_change(a, b)
        return f"{d:+.1f}%" if n < 3 else f"{d:+.1f}% [{lo:+.1f}, {hi:+.1f}]"
    for (c, L), g in cells.groupby(["corpus", "seq_len"], sort=True):
        rows = {lab: g[g.label == lab] for lab in ("dense", "hard_top2", "hard_top2_keyshift", "random_top2")}
        n = rows["dense"].window.nunique()
        sm = summarize(g).set_index("label")  # perplexity and change over dense, as every length table
        lines.append(f"| `{Path(c).stem}` | {L} | {n} | {sm.loc['dense'].perplexity:.2f} | {_change(sm.loc['hard_top2'], windows=n)} / "
                     f"{_change(sm.loc['hard_top2_keyshift'], windows=n)} | {fmt(rows['random_top2'], rows['hard_top2'], n)} / "
                     f"{fmt(rows['random_top2'], rows['hard_top2_keyshift'], n)} | "
                     f"{fmt(rows['hard_top2_keyshift'], rows['hard_top2'], n)} |")
    inputs = (f"{LENGTH_CELLS} (table {KEYSHIFT_CODE_TABLE}: the held-out last tenth of the local file "
              f"`python_stdlib`, Python's standard library source but asyncio, one run); routers "
              f"{router_label(cells.routers_sha256.iloc[0])}, `hard_top2` and `hard_top2+key_shift`")
    return Generated(inputs, "\n".join(lines))


@block("gemma-length-gap-keyshift-retrieval", *KEYSHIFT_RETRIEVAL, *GEMMA_G5_RETRIEVAL, *GEMMA_G4_RETRIEVAL)
def gemma_length_gap_keyshift_retrieval() -> Generated:
    """RULER's single needle under the key shift (``KEYSHIFT_RETRIEVAL``) against the shipped
    file's default (hard top-2, ``GEMMA_G5_RETRIEVAL``) and random groups (``random_default``, stage
    g4's runs: they do not depend on the router file), on the cases the shift ran: per task and
    length, cases, each pattern's score (dense from the shift's own run) and the shift's paired
    differences over the cases (``retrieval_tables.paired_difference``, 95% bootstrap interval):
    score and answer log-prob (nats) against the file alone, score against random groups."""
    from focus_lab.eval import retrieval_tables as rt
    ks, ship, g4 = (_read_cases(f) for f in (KEYSHIFT_RETRIEVAL, GEMMA_G5_RETRIEVAL, GEMMA_G4_RETRIEVAL))
    label = "hard_top2+key_shift"
    both = pd.concat([ks[ks.pattern.isin(["dense", label])], ship[ship.pattern == "default"],
                      g4[g4.pattern == "random_default"]], ignore_index=True)
    lines = ["| task | haystack | tokens | cases | dense | distill64-8k | random groups | key shift | "
             "key shift - distill64-8k, score | answer log-prob (nats) | key shift - random groups, score |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    fmt = lambda d: f"{d.difference:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}]"  # noqa: E731
    for (task, L), g in ks.groupby(["task", "length"], sort=False):
        seeds = set(g[g.pattern == label].seed)
        c = both[(both.task == task) & (both.length == L) & both.seed.isin(seeds)]
        score = lambda pat: c[c.pattern == pat].score.mean()  # noqa: E731
        d_ship = rt.paired_difference(c, label, "default").iloc[0]
        d_lp = rt.paired_difference(c, label, "default", "answer_logprob").iloc[0]
        d_rand = rt.paired_difference(c, label, "random_default").iloc[0]
        lines.append(f"| {task} | {HAYSTACK.get(task, '')} | {L} | {len(seeds)} | {score('dense'):.2f} | "
                     f"{score('default'):.2f} | {score('random_default'):.2f} | {score(label):.2f} | {fmt(d_ship)} | "
                     f"{fmt(d_lp)} | {fmt(d_rand)} |")
    inputs = (f"{', '.join(KEYSHIFT_RETRIEVAL)} (dense and `{label}` on g5's file, "
              f"{router_label(ks[ks.pattern == label].router_sha256.iloc[0])}); g5's file's default from "
              f"{', '.join(GEMMA_G5_RETRIEVAL)}; random groups from stage g4's runs ({', '.join(GEMMA_G4_RETRIEVAL)}); "
              "the same seeds")
    return Generated(inputs, "\n".join(lines))


@block("gemma-length-gap-retrieval", *GEMMA_G4_RETRIEVAL, *GEMMA_G5_RETRIEVAL)
def gemma_length_gap_retrieval() -> Generated:
    """Per task and length of stage g4's retrieval runs: cases, dense's score, the default's score
    under ``gemma3-270m/needle-mix`` and under ``gemma3-270m/distill64-8k`` (``-`` where the latter
    did not run), and distill64-8k minus needle-mix in score and answer log-prob (nats), paired over
    the cases both ran (``retrieval_tables.paired_difference``, 95% bootstrap interval)."""
    from focus_lab.eval import retrieval_tables as rt
    g4, new = _read_cases(GEMMA_G4_RETRIEVAL), _read_cases(GEMMA_G5_RETRIEVAL)
    both = pd.concat([g4[g4.pattern == "default"].assign(pattern="needle-mix"),
                      new[new.pattern == "default"].assign(pattern="distill64-8k")], ignore_index=True)
    diffs = {col: rt.paired_difference(both, "distill64-8k", "needle-mix", col).set_index(["task", "length"])
             for col in ("score", "answer_logprob")}
    lines = ["| task | haystack | tokens | cases | dense | needle-mix | distill64-8k | distill64-8k - needle-mix, score | "
             "answer log-prob (nats) |", "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for (task, L), g in g4.groupby(["task", "length"], sort=False):
        score = lambda pat, frame=g: frame[frame.pattern == pat].score.mean()  # noqa: E731
        n = new[(new.task == task) & (new.length == L)]
        if len(n):
            d, lp = diffs["score"].loc[(task, L)], diffs["answer_logprob"].loc[(task, L)]
            tail = (f"{score('default', n):.2f} | {d.difference:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}] | "
                    f"{lp.difference:+.2f} [{lp.lo:+.2f}, {lp.hi:+.2f}] |")
        else:
            tail = "- | - | - |"
        lines.append(f"| {task} | {HAYSTACK.get(task, '')} | {L} | {g.seed.nunique()} | {score('dense'):.2f} | "
                     f"{score('default'):.2f} | {tail}")
    inputs = (f"{', '.join(GEMMA_G4_RETRIEVAL)} (gemma3-270m/needle-mix); {', '.join(GEMMA_G5_RETRIEVAL)} "
              "(gemma3-270m/distill64-8k); the default pattern of each file (hard top-2), the same seeds")
    return Generated(inputs, "\n".join(lines))
