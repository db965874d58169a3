"""docs/studies/token-match-pairs.md: token-match pairs (``match_shifts = [0, 1]``) added to hard
top-k. The diagnosis against as many random pairs (copy_pairs.parquet), the nearest matching keys
only (copy_pairs_cap.parquet), the length table's protocol with and without the pairs (tables
``match_*`` against ``shipped_per_domain`` / ``shipped``, ``keyshift90_match_domains`` against
``keyshift90_domains`` of length_cells.parquet) and the speed benchmark (e2e_match.csv)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyses.blocks.common import over_dense, paired, table_router, windows_a_domain
from analyses.doc_blocks import LENGTH_CELLS, REPO, Generated, MissingInput, _Cells, _change, block, router_label

PAGE = "docs/studies/token-match-pairs.md"
PROSE_PAGES = (PAGE,)
#: the interval's level (a setting) and the criteria of docs/recipes.md (top-2 within +1.5% of dense,
#: top-1 within +4%)
ALLOWED = {PAGE: {"95%", "+1.5%", "+4%"}}

COPY_PAIRS = "figures/results/copy_pairs.parquet"
COPY_PAIRS_CAP = "figures/results/copy_pairs_cap.parquet"
E2E_MATCH = "figures/bench_attention/e2e_match.csv"
HELD_OUT = ("python-docs", "man-pages", "debian-reference")
TRAIN = ("kernel-docs", "python-source", "bible-kjv")
MATCH, WITHOUT = "match_per_domain", "shipped_per_domain"
KEYSHIFT_MATCH, KEYSHIFT = "keyshift90_match_domains", "keyshift90_domains"


@block("token-match-diagnosis", COPY_PAIRS)
def token_match_diagnosis() -> Generated:
    """``analyses.studies.copy_pairs.summarize``: hard top-2's perplexity change over dense with the
    token-match pairs added and with as many random distant pairs added per query row [lowest,
    highest over windows], and the distant pairs kept (of them, the share the pairs add)."""
    from analyses.studies.copy_pairs import summarize
    df = pd.read_parquet(REPO / COPY_PAIRS)
    s = summarize(df).set_index(["corpus", "pattern", "extra"])
    lines = ["| domain | windows | hard top-2 + token-match pairs | + as many random pairs | distant pairs kept (of them "
             "added) |", "|---|---:|---|---|---|"]
    for d in ("man-pages", "debian-reference", "python-docs"):
        m, r = s.loc[(d, "hard_top2", "s0+1")], s.loc[(d, "hard_top2", "random")]
        lines.append(f"| {d} | {int(m.windows)} | {m.change:+.2f}% [{m.lo:+.1f}, {m.hi:+.1f}] | {r.change:+.2f}% "
                     f"[{r.lo:+.1f}, {r.hi:+.1f}] | {m.pairs_kept:.3f} ({m.extra_pairs:.3f}) |")
    sha = df.routers_sha256.iloc[0]
    inputs = (f"{COPY_PAIRS} (python -m analyses.studies.copy_pairs --extras s0+1,random); routers {router_label(sha)}; "
              f"windows {'; '.join(f'{d} ' + ', '.join(str(int(w)) for w in sorted(g.window.unique())) for d, g in df.groupby('corpus'))} of "
              f"{int(df.seq_len.iloc[0])} tokens")
    return Generated(inputs, "\n".join(lines))


@block("token-match-held-out", LENGTH_CELLS)
def token_match_held_out() -> Generated:
    """The held-out domains with the shipped file: each pattern with the pairs over dense (95%
    paired interval over windows) [distant pairs kept], without them in parentheses; the router's
    margin over random groups at top-2; the paired change the pairs make at top-2 and top-1."""
    c = _Cells()
    lines = ["| domain | hard top-1 | hard top-2 | random top-2 | router over random, top-2 | paired change of top-2 "
             "from the pairs | of top-1 |", "|---|---|---|---|---|---|---|"]
    for d in HELD_OUT:
        cells = [f"{over_dense(c, MATCH, d, 4096, lab)} ({c.dense(WITHOUT, d, 4096, lab):+.1f}% "
                 f"[{c.kept(WITHOUT, d, 4096, lab):.2f}])"
                 for lab in ("hard_top1", "hard_top2", "random_top2")]
        r = c.summary(MATCH, d, 4096, "random_top2")
        cells.append(f"{_change(r, 'control_vs_router_pct', 'control_ci_lo', 'control_ci_hi')} "
                     f"({c.margin(WITHOUT, d, 4096, 'random_top2'):+.1f}%)")
        cells += [paired(c, (MATCH, lab), (WITHOUT, lab), d, 4096) for lab in ("hard_top2", "hard_top1")]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    inputs = (f"{LENGTH_CELLS} (tables {MATCH}, with the pairs, and {WITHOUT}); routers {table_router(c, MATCH)} "
              f"in both; {windows_a_domain(c, MATCH, HELD_OUT)}; patterns dense, hard_top1, "
              "hard_top2 (the file's top-2 budget), random_top2 (the same budget)")
    return Generated(inputs, "\n".join(lines))


#: the other texts: (row name, corpus, length, the table with the pairs, the table without them)
OTHER = [(d, d, 4096, "match_train_domains", WITHOUT) for d in TRAIN] + [
    ("*Persuasion*, 4096", "austen", 4096, "match_persuasion", "shipped"),
    ("*Persuasion*, 8192", "austen", 8192, "match_persuasion", "shipped"),
    ("*Hamlet*, 4096", "shakespeare", 4096, "match_hamlet", "shipped")]


@block("token-match-other", LENGTH_CELLS)
def token_match_other() -> Generated:
    """The broad mix's domains, *Persuasion* and *Hamlet*, with the pairs (without them in
    parentheses): hard top-1 and top-2 over dense [distant pairs kept], the paired change the pairs
    make (95% interval over windows), the router's margin over random groups at top-2 and, where
    the table has random top-1, at top-1."""
    c = _Cells()
    lines = ["| text | windows | hard top-1 | paired change of top-1 | hard top-2 [pairs kept] | paired change of top-2 | "
             "router over random, top-2 | router over random, top-1 |", "|---|---:|---|---|---|---|---|---|"]
    for name, d, L, t, base in OTHER:
        s1, s2 = c.summary(t, d, L, "hard_top1"), c.summary(t, d, L, "hard_top2")
        have1 = (c.cells["table"] == t) & (c.cells.label == "random_top1")
        top1_margin = (f"{c.margin(t, d, L, 'random_top1'):+.1f}% ({c.margin(base, d, L, 'random_top1'):+.1f}%)"
                       if have1.any() else "")
        lines.append(f"| {name} | {int(s2.windows)} | {s1.delta_vs_dense_pct:+.1f}% ({c.dense(base, d, L, 'hard_top1'):+.1f}%) | "
                     f"{paired(c, (t, 'hard_top1'), (base, 'hard_top1'), d, L)} | "
                     f"{s2.delta_vs_dense_pct:+.1f}% [{s2.distant_pairs_kept:.2f}] ({c.dense(base, d, L, 'hard_top2'):+.1f}%) | "
                     f"{paired(c, (t, 'hard_top2'), (base, 'hard_top2'), d, L)} | "
                     f"{c.margin(t, d, L, 'random_top2'):+.1f}% ({c.margin(base, d, L, 'random_top2'):+.1f}%) | {top1_margin} |")
    tables = list(dict.fromkeys(t for *_, t, _ in OTHER))
    inputs = (f"{LENGTH_CELLS} (tables {', '.join(tables)} with the pairs; {WITHOUT} and shipped without them); routers "
              f"{table_router(c, tables[0])} in every table; the windows the table's column says, of the tokens "
              "its rows say; patterns dense, hard_top1, hard_top2 (the file's top-2 budget), random_top1, random_top2")
    return Generated(inputs, "\n".join(lines))


@block("token-match-keyshift", LENGTH_CELLS)
def token_match_keyshift() -> Generated:
    """The 90-step routers trained with the key shift (their shift and both budgets) with the pairs:
    each pattern over dense (95% paired interval over windows) [distant pairs kept], the router's
    margin over random groups (shifted, same budgets and pairs) and the paired change the pairs make
    at top-2."""
    c = _Cells()
    lines = ["| domain | hard top-1 | hard top-2 [pairs kept] | random top-2 | router over random, top-2 | paired change "
             "of top-2 from the pairs |", "|---|---|---|---|---|---|"]
    for d in HELD_OUT:
        r = c.summary(KEYSHIFT_MATCH, d, 4096, "random_top2_keyshift")
        lines.append(f"| {d} | {over_dense(c, KEYSHIFT_MATCH, d, 4096, 'hard_top1_keyshift', kept=False)} | "
                     f"{over_dense(c, KEYSHIFT_MATCH, d, 4096, 'hard_top2_keyshift')} | {r.delta_vs_dense_pct:+.1f}% | "
                     f"{_change(r, 'control_vs_router_pct', 'control_ci_lo', 'control_ci_hi')} | "
                     f"{paired(c, (KEYSHIFT_MATCH, 'hard_top2_keyshift'), (KEYSHIFT, 'hard_top2_keyshift'), d, 4096)} |")
    inputs = (f"{LENGTH_CELLS} (tables {KEYSHIFT_MATCH}, with the pairs, against {KEYSHIFT}); routers "
              f"{table_router(c, KEYSHIFT_MATCH)} in both; 4 windows of 4096 tokens a domain; patterns dense, "
              "hard_top1_keyshift, hard_top2_keyshift, random_top2_keyshift")
    return Generated(inputs, "\n".join(lines))


@block("token-match-nearest", COPY_PAIRS_CAP, LENGTH_CELLS)
def token_match_nearest() -> Generated:
    """Only the nearest 4 or 16 matching keys per query (``match_latest``, copy_pairs_cap.parquet)
    against all of them (table ``match_per_domain``, the same first window): change of perplexity
    over dense on that one window."""
    cap = pd.read_parquet(REPO / COPY_PAIRS_CAP)
    c = _Cells()
    lines = ["| domain | pattern | nearest 4 | nearest 16 | all |", "|---|---|---:|---:|---:|"]
    for d in ("man-pages", "python-docs"):
        g = cap[cap.corpus == d]
        (w,) = g.window.unique()
        dense = g[g.pattern == "dense"].drop_duplicates("window")
        for lab in ("hard_top1", "hard_top2"):
            cells = []
            for k in (4, 16):
                r = g[(g.pattern == lab) & (g["cap"] == k)]
                if len(r) != 1:
                    raise MissingInput(f"{COPY_PAIRS_CAP} ({lab} on {d}, cap {k})")
                cells.append(f"{100 * np.expm1((r.nll.iloc[0] - dense.nll.iloc[0]) / r.tokens.iloc[0]):+.1f}%")
            a, b = c.rows(MATCH, d, 4096, lab), c.rows(MATCH, d, 4096, "dense")
            a, b = a[a.window == w], b[b.window == w]
            if not (len(a) and len(b)):
                raise MissingInput(f"{LENGTH_CELLS} (table {MATCH}: window {w} of {d})")
            cells.append(f"{100 * np.expm1(a.nll.iloc[0] - b.nll.iloc[0]):+.1f}%")
            lines.append(f"| {d} | {lab} | " + " | ".join(cells) + " |")
    inputs = (f"{COPY_PAIRS_CAP} (python -m analyses.studies.copy_pairs --extras s0+1 --cap 4 / 16); all pairs: "
              f"{LENGTH_CELLS} (table {MATCH}, the same window); routers {router_label(cap.routers_sha256.iloc[0])}; "
              f"window {', '.join(str(int(w)) for w in sorted(cap.window.unique()))} of 4096 tokens a domain")
    return Generated(inputs, "\n".join(lines))


@block("token-match-speed", E2E_MATCH)
def token_match_speed() -> Generated:
    """``analyses/bench_attention.py``'s e2e rows with the pairs: prefill tokens/s of the bare
    forward (dense, hard top-2, hard top-2 with the pairs), the pairs' cost in top-2's speed, each
    pattern's speed over dense's, and the token-match part's share of the forward
    (``share_other_attention_fn`` in this file); decode ms per token at 8192 tokens of context."""
    df = pd.read_csv(REPO / E2E_MATCH)
    pre = df[df.phase == "prefill"].set_index(["tokens", "pattern"])
    dec = df[df.phase == "decode"].set_index(["tokens", "pattern"])
    pats = ("dense", "hard_top2", "hard_top2_match")
    lines = ["| phase | dense / hard top-2 / with the pairs | the pairs' cost in top-2's speed | over dense: hard top-2 / "
             "with the pairs | the pairs' part of the forward |", "|---|---|---:|---|---:|"]
    for L in sorted({t for t, _ in pre.index}):
        r = {p: pre.loc[(L, p)] for p in pats}
        lines.append(f"| prefill {L}, tokens/s | " + " / ".join(f"{r[p].bare_tokens_per_s:.1f}" for p in pats)
                     + f" | {1 - r['hard_top2_match'].bare_tokens_per_s / r['hard_top2'].bare_tokens_per_s:.0%} | "
                     f"{r['hard_top2'].speedup_bare:.2f}x / {r['hard_top2_match'].speedup_bare:.2f}x | "
                     f"{r['hard_top2_match'].share_other_attention_fn:.0%} |")
    for L in sorted({t for t, _ in dec.index}):
        r = {p: dec.loc[(L, p)] for p in pats}
        lines.append(f"| decode after {L}, ms a token | " + " / ".join(f"{r[p].ms_per_token:.0f}" for p in pats)
                     + f" | | {r['hard_top2'].speedup_decode:.2f}x / {r['hard_top2_match'].speedup_decode:.2f}x | |")
    repeats = ", ".join(f"{ph} {int(g.repeats.max())}" for ph, g in df.groupby("phase"))
    inputs = (f"{E2E_MATCH} (python -m analyses.bench_attention --no-kernel --threads 1 --e2e-sizes 4096,8192 "
              f"--decode-contexts 8192); one *Persuasion* window a length; repeats: {repeats}; load average "
              f"{df.loadavg_min.min():.1f}-{df.loadavg_max.max():.1f}")
    return Generated(inputs, "\n".join(lines))
