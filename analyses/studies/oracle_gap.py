"""How far are the routers from the best distant keys at their own budget?

The rule ``oracle`` (``focus_lab.patterns.rules.oracle``) keeps, for each query, as many distant
keys as its groups keep, the ones dense attention weighs most: the upper reference at matched
sparsity. This study evaluates, on the same held-out windows, the router's patterns, the same
patterns with ``+oracle``, MoBA's block gate at the same budget (``+moba``), and random and
shuffled groups (the controls at matched sparsity),
per window, so every gap has a paired bootstrap interval over windows. The per-layer budget,
random-group layers and capacity of the router file are its ``default``; the bare ``hard_topK``
is the paper's rule on the same routers (in the file's random-group layers 1-9 those routers
were never trained).

Outputs ``<out>/oracle_gap.parquet`` (``evaluate(..., per_window=True)`` rows plus ``seq_len``,
``router_name``, ``router_sha256``, ``commit``; written after each window: a killed run resumes
with the (window, pattern) rows it has; a pattern added later runs on the windows done) and
``oracle_gap.md``. Usage (about 4 minutes a window of 4096 tokens
for the default patterns on 2 CPU cores)::

    python -m analyses.studies.oracle_gap --seq-len 4096 --windows 8
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import focus_lab
from focus_lab.data import load_corpus, make_windows
from focus_lab.eval.evaluate import paired_change, parse_patterns
from focus_lab.hf.models import load_model
from focus_lab.hf.shipped import code_commit, named_file, router_path
from focus_lab.io import file_sha256, write_parquet

PATTERNS = ("dense,hard_top1,hard_top1+oracle,random_top1,hard_top2,hard_top2+oracle,hard_top2+moba,random_top2,"
            "shuffled_top2,default,default+oracle,default+moba,random_default,shuffled_default")
# (pattern, against): the rows of the table
GAPS = (("hard_top1", "dense"), ("hard_top1+oracle", "dense"), ("random_top1", "dense"),
        ("hard_top2", "dense"), ("hard_top2+oracle", "dense"), ("hard_top2+moba", "dense"), ("random_top2", "dense"),
        ("shuffled_top2", "dense"),
        ("default", "dense"), ("default+oracle", "dense"), ("default+moba", "dense"), ("random_default", "dense"),
        ("shuffled_default", "dense"),
        ("hard_top1", "hard_top1+oracle"), ("hard_top2", "hard_top2+oracle"), ("default", "default+oracle"),
        ("random_top2", "hard_top2"), ("hard_top2+moba", "hard_top2"), ("random_default", "default"),
        ("shuffled_default", "default"), ("default+moba", "default"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="gemma3-270m, an HF id or a local path; default: the embedded SmolLM2-135M")
    ap.add_argument("--routers", default="shipped", help="router file: a path, a name or 'shipped' (the model's)")
    ap.add_argument("--corpus", default="austen")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--patterns", default=PATTERNS)
    ap.add_argument("--out", type=Path, default=Path("figures/oracle"))
    args = ap.parse_args(argv)
    model, tok = load_model(args.model)
    path = router_path(args.routers, args.model)
    focus_lab.attach(model)
    cfg = focus_lab.load_routers(model, path)
    pats = parse_patterns(args.patterns, cfg)
    corp = load_corpus(args.corpus)
    windows = make_windows(corp.heldout, tok, args.seq_len, max_windows=args.windows)
    out = args.out / "oracle_gap.parquet"
    sha = file_sha256(path)
    old = pd.read_parquet(out) if out.is_file() else pd.DataFrame()
    if len(old):
        old = old[(old.router_sha256 == sha) & (old.seq_len == args.seq_len)]
    rows = [old] if len(old) else []
    done = set(zip(old.window, old.label)) if len(old) else set()
    for w in windows:
        todo = [(lab, ch) for lab, ch in pats if (int(w.index), lab) not in done]  # a pattern added later runs alone
        if not todo:
            continue
        df = focus_lab.evaluate(model, [w], todo, batch_size=1, progress=False)
        df.insert(1, "window", int(w.index))
        df = df.assign(seq_len=args.seq_len, corpus=corp.name, router_name=named_file(sha) or str(path),
                       router_sha256=sha, commit=code_commit())
        rows.append(df)
        write_parquet(out, pd.concat(rows, ignore_index=True))
        print(f"window {w.index}: " + ", ".join(f"{r.label} {r.perplexity:.3f}" for r in df.itertuples()), flush=True)
    res = pd.concat(rows, ignore_index=True)
    report(res, args.out / "oracle_gap.md")


def report(res: pd.DataFrame, path: Path) -> None:
    """Write ``gap_table``'s head and table to ``path`` and print it."""
    head, table = gap_table(res)
    path.write_text(head + "\n\n" + table + "\n")
    print(path.read_text())


def gap_table(res: pd.DataFrame) -> tuple[str, str]:
    """(head, table): what ran (corpus, windows, router file, commits), and the table of gaps
    (perplexity change %, paired 95% interval over windows; distant pairs kept) of ``GAPS`` rows
    whose two patterns ran."""
    by = {lab: g for lab, g in res.groupby("label")}
    n = res.window.nunique()
    lines = [f"| pattern | against | change | 95% interval | distant pairs kept | windows |",
             "|---|---|---:|---:|---:|---:|"]
    for a, b in GAPS:
        if a not in by or b not in by:
            continue
        d, lo, hi = paired_change(by[a], by[b])
        lines.append(f"| `{a}` | `{b}` | {d:+.2f}% | [{lo:+.2f}, {hi:+.2f}] | "
                     f"{by[a].distant_pairs_kept.mean():.3f} | {len(by[a])} |")
    head = (f"Held-out text of `{res.corpus.iloc[0]}`, {n} windows of {int(res.seq_len.iloc[0])} tokens; router file "
            f"`{res.router_name.iloc[0]}` ({res.router_sha256.iloc[0][:8]}); commits {', '.join(sorted(res.commit.unique()))}.")
    return head, "\n".join(lines)


if __name__ == "__main__":
    main()
