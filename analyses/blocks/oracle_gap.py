"""docs/studies/oracle-gap.md's table: the shipped file's routers against random groups and the
oracle at their budget (``analyses.studies.oracle_gap``), with the share of the range from
random groups to the oracle the routers cover, how closely the oracle and MoBA's gate keep the
groups' pair count, and the cost of a forward under each rule."""

from __future__ import annotations

import pandas as pd

from analyses.doc_blocks import REPO, Generated, MissingInput, block, router_label

PAGE = "docs/studies/oracle-gap.md"
PROSE_PAGES = (PAGE,)
#: settings: the interval's level
ALLOWED = {PAGE: {"95%"}}

ORACLE = "figures/oracle/oracle_gap.parquet"
#: the rules a forward's cost is shown for (the rest cost what these do)
COST = ("dense", "default", "default+oracle", "default+moba", "hard_top2+moba")
#: how many of the last windows the cost is the mean of
COST_WINDOWS = 2


def _over_dense(res: pd.DataFrame, label: str) -> float:
    from focus_lab.eval.evaluate import paired_change
    a, b = res[res.label == label], res[res.label == "dense"]
    if not len(a):
        raise MissingInput(f"{ORACLE} (pattern {label})")
    return paired_change(a, b)[0]


@block("oracle-gap", ORACLE)
def oracle_gap() -> Generated:
    """``gap_table``'s rows; then the share of the range from random groups to the oracle that the
    routers cover under the file's rules ((random - router) / (random - oracle), each a change
    over dense), the largest difference of distant pairs kept between a rule and its ``+oracle``
    / ``+moba``, and the seconds of a forward on the last windows (and over dense's)."""
    from analyses.studies.oracle_gap import gap_table
    res = pd.read_parquet(REPO / ORACLE)
    head, table = gap_table(res)
    rnd, mine, orc = (_over_dense(res, x) for x in ("random_default", "default", "default+oracle"))
    kept = res.groupby("label").distant_pairs_kept.mean()
    diffs = [abs(kept[f"{b}{s}"] - kept[b]) for b in ("hard_top1", "hard_top2", "default")
             for s in ("+oracle", "+moba") if f"{b}{s}" in kept.index]
    last = sorted(res.window.unique())[-COST_WINDOWS:]
    sec = res[res.window.isin(last)].groupby("label").seconds.mean()
    lines = [table, "",
             f"Under the file's rules the routers cover {100 * (rnd - mine) / (rnd - orc):.0f}% of the range from random "
             f"groups to the oracle (({rnd:.2f} - {mine:.2f}) / ({rnd:.2f} - {orc:.2f}), changes over dense). The distant "
             f"pairs kept by a rule and by its `+oracle` or `+moba` differ by at most {max(diffs):.4f} of the pairs.", "",
             f"| a forward of {int(res.seq_len.iloc[0])} tokens, windows {', '.join(map(str, last))} | seconds | "
             "over dense |", "|---|---:|---:|"]
    for lab in COST:
        lines.append(f"| `{lab}` | {sec[lab]:.1f} | {sec[lab] / sec['dense']:.1f}x |")
    r = res.iloc[0]
    inputs = (f"{ORACLE}; routers {router_label(r.router_sha256)}; {r.corpus} held out, {res.window.nunique()} windows "
              f"of {int(r.seq_len)} tokens ({', '.join(map(str, sorted(res.window.unique())))}); commits "
              f"{', '.join(sorted(res.commit.unique()))}; patterns {', '.join(dict.fromkeys(res.label))}")
    return Generated(inputs, "\n".join(lines))
