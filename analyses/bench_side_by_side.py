"""Tokens/s of ``focus-lab eval`` under two checkouts of focus-lab, side by side in one run.

For a change that should cost nothing (e.g. the patterns becoming values), the same held-out
windows are evaluated under each pattern by the checkout before (``--before DIR``, a git worktree
of the earlier commit) and by this one, alternating ``--rounds`` times so that both see the same
machine load; each pattern's tokens/s ratio (after / before) is the median over rounds. The two
checkouts may spell a pattern differently (``--map OLD=NEW``, e.g. ``hard_top2=default``); the
perplexities must agree exactly, which the script checks.

    git worktree add /tmp/before <commit>
    python -m analyses.bench_side_by_side --before /tmp/before --rounds 3 \\
        --map dense=dense,window=window,hard_top1=default_top1,hard_top2=default,random_top2=random_default
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def eval_once(tree: Path, patterns: str, seq_len: int, windows: int, out: Path) -> pd.DataFrame:
    """One ``focus-lab eval`` in checkout ``tree`` (its own code on the path, offline, one torch
    thread per process as the CPU allows); the table it wrote."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "focus_lab", "eval", "--patterns", patterns, "--seq-len", str(seq_len),
           "--max-windows", str(windows), "--out", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return pd.read_parquet(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the earlier checkout (a git worktree)")
    ap.add_argument("--map", required=True, help="OLD=NEW pattern spellings, comma list")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--windows", type=int, default=1)
    a = ap.parse_args(argv)
    pairs = [x.split("=", 1) for x in a.map.split(",")]
    old, new = ",".join(p[0] for p in pairs), ",".join(p[1] for p in pairs)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for side, tree, pats in (("before", a.before, old), ("after", ROOT, new)):
                df = eval_once(tree, pats, a.seq_len, a.windows, Path(tmp) / f"{side}{r}.parquet")
                for (o, n), row in zip(pairs, df.itertuples()):
                    rows.append({"round": r, "side": side, "pattern": n, "perplexity": row.perplexity,
                                 "tokens_per_second": row.tokens_per_second})
    df = pd.DataFrame(rows)
    ppl = df.pivot_table(index=["round", "pattern"], columns="side", values="perplexity")
    same = bool((ppl["before"] == ppl["after"]).all())
    tps = df.pivot_table(index="pattern", columns="side", values="tokens_per_second", aggfunc="median")
    tps["ratio"] = tps["after"] / tps["before"]
    per_round = df.pivot_table(index=["pattern", "round"], columns="side", values="tokens_per_second")
    spread = (per_round["after"] / per_round["before"]).groupby(level=0)
    tps["ratio_min"], tps["ratio_max"] = spread.min(), spread.max()
    from focus_lab.io import machine, machine_line
    print(f"machine: {machine_line(machine())}; "
          f"{a.rounds} rounds x {a.windows} window(s) of {a.seq_len} tokens, alternating checkouts")
    print(tps.loc[[p[1] for p in pairs]].to_string(float_format=lambda x: f"{x:.3f}"))
    print(f"perplexities equal in every round: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
