"""docs/studies/restored-rows.md's table: the two passkey cases at 8192 tokens that hard top-2
fails where dense succeeds, each row set's distant pairs put back (``analyses.studies.restored_rows``),
the answer's log-prob and the share of hard top-2's loss recovered; the token-match pairs' row from
the committed retrieval suite; which cases fail and what the needle trace says of them."""

from __future__ import annotations

import pandas as pd

from analyses.doc_blocks import REPO, Generated, MissingInput, block

PAGE = "docs/studies/restored-rows.md"
PROSE_PAGES = (PAGE,)
#: settings: the row sets' sizes are integers; nothing else
ALLOWED = {PAGE: set()}

ROWS = "figures/results/restored_rows.parquet"
NEEDLE_MIX = "figures/results/needle_mix_cases.parquet"
SUITE = "figures/results/retrieval_cases.parquet"
#: the suite's pattern of the needle-mix file's hard top-2 with the token-match pairs
MATCH = "hard_top2_match_nocap"
TASK, LENGTH = "passkey", 8192


def _label(restored: str) -> str:
    if restored == "dense":
        return "none: dense"
    if restored == "hard_top2":
        return "none: hard top-2"
    rest = restored.removeprefix("hard_top2 + ")
    rest = rest.replace(" -> needle sentence", " to the needle sentence's keys only")
    return rest if ", layers" in rest else f"{rest}, every layer"


@block("restored-rows", ROWS, NEEDLE_MIX, SUITE)
def restored_rows() -> Generated:
    """Per restored row set and seed: the answer's teacher-forced log-prob (nats), its change over
    dense and the share of hard top-2's loss against dense recovered; the token-match row from the
    suite's committed cases ("-" where a seed is not among them); the cases of the needle-mix
    file's suite run that hard top-2 fails where dense succeeds, and the needle attention its
    answer rows keep there."""
    df = pd.read_parquet(REPO / ROWS)
    df = df[(df.task == TASK) & (df.length == LENGTH)]
    seeds = list(dict.fromkeys(sorted(df.seed.unique())))
    if not seeds:
        raise MissingInput(f"{ROWS} ({TASK} at {LENGTH})")
    by = {s: g.set_index("restored") for s, g in df.groupby("seed")}
    head = "| restored | " + " | ".join(f"seed {s}: log-prob (nats) | vs dense | recovered" for s in seeds) + " |"
    lines = [head, "|---|" + "---:|---:|---:|" * len(seeds)]
    for restored in dict.fromkeys(df.restored):
        cells = []
        for s in seeds:
            r, dense = by[s].loc[restored], by[s].loc["dense", "answer_logprob"]
            rec = "" if restored == "dense" else f"{100 * r.recovered:.0f}%"
            cells += [f"{r.answer_logprob:.2f}", "" if restored == "dense" else f"{r.answer_logprob - dense:+.2f}", rec]
        lines.append(f"| {_label(restored)} | " + " | ".join(cells) + " |")
    suite = pd.read_parquet(REPO / SUITE)
    suite = suite[(suite.task == TASK) & (suite.length == LENGTH) & (suite.pattern == MATCH)].set_index("seed")
    cells = []
    for s in seeds:
        if s in suite.index:
            lp = float(suite.loc[s, "answer_logprob"])
            dense, hard = by[s].loc["dense", "answer_logprob"], by[s].loc["hard_top2", "answer_logprob"]
            cells += [f"{lp:.2f}", f"{lp - dense:+.2f}", f"{100 * (lp - hard) / (dense - hard):.0f}%"]
        else:
            cells += ["-", "-", "-"]
    lines.append("| hard top-2 with token-match pairs (no restoring; the suite's cases) | " + " | ".join(cells) + " |")

    nm = pd.read_parquet(REPO / NEEDLE_MIX)
    nm = nm[(nm.task == TASK) & (nm.length == LENGTH)].pivot_table(index="seed", columns="pattern",
                                                                   values=["score", "answer_logprob", "needle_mass_kept"])
    found, hard = int(nm["score"]["dense"].sum()), int((nm["score"]["dense"] * nm["score"]["hard_top2"]).sum())
    fails = [int(s) for s in nm.index if nm["score"].loc[s, "dense"] == 1 and nm["score"].loc[s, "hard_top2"] == 0]
    diff = max(abs(nm["answer_logprob"].loc[s, p] - by[s].loc[r, "answer_logprob"])
               for s in seeds for p, r in (("dense", "dense"), ("hard_top2", "hard_top2")))
    lines += ["", f"The needle-mix file's suite run ({len(nm)} cases of {TASK} at {LENGTH} tokens): dense finds "
              f"{found}, hard top-2 {hard} of them ({hard / found:.2f}); it fails seeds {', '.join(map(str, fails))}. "
              "There its answer rows keep " + ", ".join(f"{nm['needle_mass_kept'].loc[s, 'hard_top2']:.3f} (seed {s})"
                                                        for s in fails)
              + " of their dense attention to the needle's value tokens. The restored rows' dense and hard top-2 "
              f"log-probs match that run's within {diff:.0e} nats."]
    inputs = (f"{ROWS} ({TASK}, {LENGTH} tokens, seeds {', '.join(map(str, seeds))}; the rows carry no router "
              f"column: the needle-mix file, whose cases they match); {NEEDLE_MIX} (pattern hard_top2, dense); "
              f"{SUITE} (pattern {MATCH})")
    return Generated(inputs, "\n".join(lines))
