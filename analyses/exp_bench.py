"""Experiment ``bench``: ``make_data(ctx)`` makes ``<out>/data/bench.parquet`` (run and cached by
``analyses/figures.py``, ``focus-lab-figures``). Read by ``analyses/fig_pareto.py``,
``analyses/fig_speedup_length.py``, ``analyses/table_reproduction.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd

from analyses.common import Context, bench_dir


def make_data(ctx: Context) -> pd.DataFrame:
    """The kernel benchmark's table (analyses/bench_attention.py): read from
    ``figures/bench_attention/kernel.csv`` when that exists, else run the script with
    ``settings.bench_args`` into ``data/bench_attention/``."""
    src = bench_dir(ctx.out)
    if src is None:
        dst = ctx.data / "bench_attention"
        cmd = [sys.executable, "-m", "analyses.bench_attention", *ctx.settings.bench_args, "--out", str(dst)]
        ctx.log("  running " + " ".join(cmd[1:]))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL if ctx.quick else None)
        src = dst
    df = pd.read_csv(src / "kernel.csv")
    df["source"] = str(src)
    return df
