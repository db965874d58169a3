"""Recording overhead: a recorded forward (every metric) against a plain Focus forward.

The embedded SmolLM2-135M with a router file (default: the file shipped with focus-lab), hard mode,
one window of held-out Austen at each length, at each count of torch threads. Plain and recorded
forwards alternate (side by side in one process, so machine load hits both alike); the median of
each over ``--reps`` pairs is kept, in process CPU time and in wall time. ``Recording.tables()``
(turning the reductions into DataFrames, done once per run, not per forward) is timed separately.
Goal: ratio <= 2.

Writes the tidy table ``--out`` (default ``figures/results/bench_record.parquet``, atomically,
replacing it): one row per length, thread count and thing timed (``timed``: ``plain forward``,
``recorded forward``, ``tables()``) with the medians ``cpu_s`` and ``wall_s``, ``cpu_ratio`` and
``wall_ratio`` (over the plain forward's median at the same length and threads), the 1-minute load
average before and after that length and thread count's pairs, the router file, the commit and the
machine (``SCHEMA_VERSION``). docs/run_schema.md's overhead table is generated from it
(``analyses.blocks.reference_pages``). It times things: run it on its own, not under ``nice``; the
load average in the rows says what else ran.

    .venv/bin/python analyses/studies/bench_record.py [--lengths 512 1024] [--threads 1 2] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

import focus_lab
from focus_lab.recording.recorder import ALL_METRICS

REPO = Path(__file__).resolve().parents[2]
SCHEMA_VERSION = 1
TABLE = REPO / "figures" / "results" / "bench_record.parquet"
TIMED = ("plain forward", "recorded forward", "tables()")


def measure(model, ids, reps: int) -> dict[str, tuple[list[float], list[float]]]:
    """{timed: (CPU seconds, wall seconds) per rep}: ``reps`` alternating plain and recorded forwards
    of ``ids`` (after one warm-up of each), and each recording's ``tables()``."""
    out = {t: ([], []) for t in TIMED}

    def timed(what: str, fn):
        c0, t0 = time.process_time(), time.perf_counter()
        result = fn()
        out[what][0].append(time.process_time() - c0)
        out[what][1].append(time.perf_counter() - t0)
        return result

    def recorded():
        with focus_lab.record(model, metrics=ALL_METRICS) as rec:
            model(input_ids=ids, use_cache=False)
        return rec

    with torch.no_grad():
        model(input_ids=ids, use_cache=False)  # warm-up
        recorded()
        for _ in range(reps):
            timed("plain forward", lambda: model(input_ids=ids, use_cache=False))
            rec = timed("recorded forward", recorded)
            timed("tables()", rec.tables)
    return out


def rows(times: dict, tokens: int, threads: int, reps: int, load: tuple[float, float], common: dict) -> list[dict]:
    """The tidy rows of one length and thread count: medians, and ratios over the plain forward's."""
    med = {t: (statistics.median(c), statistics.median(w)) for t, (c, w) in times.items()}
    plain_cpu, plain_wall = med["plain forward"]
    return [{"schema_version": SCHEMA_VERSION, "tokens": tokens, "threads": threads, "timed": t, "reps": reps,
             "cpu_s": c, "wall_s": w, "cpu_ratio": c / plain_cpu, "wall_ratio": w / plain_wall,
             "load_1min_before": round(load[0], 2), "load_1min_after": round(load[1], 2), **common}
            for t, (c, w) in med.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads (torch.set_num_threads)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mode", default="hard")
    ap.add_argument("--routers", default="shipped", help="a router file: path, manifest name or 'shipped'")
    ap.add_argument("--out", type=Path, default=TABLE)
    args = ap.parse_args(argv)
    from focus_lab.data import load_corpus, make_windows
    from focus_lab.hf.models import load_model
    from focus_lab.hf.shipped import resolve_routers, router_columns
    from focus_lab.io import machine, machine_line, write_parquet
    model, tok = load_model(verbose=False)
    path = resolve_routers(args.routers)
    focus_lab.load_routers(model, path)
    focus_lab.set_config(model, mode=args.mode)
    meta = router_columns(path)
    common = {"model": "smollm2-135m-instruct", "mode": args.mode, "metrics": ",".join(ALL_METRICS),
              "router_name": meta["router_name"], "router_sha256": meta["router_sha256"], "commit": meta["commit"],
              "machine": machine_line(machine()), "nproc": os.cpu_count(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")}
    corp = load_corpus("austen")
    out = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for T in args.lengths:
            ids = make_windows(corp.heldout, tok, T, max_windows=1)[0].input_ids[None]
            before = os.getloadavg()[0]
            times = measure(model, ids, args.reps)
            new = rows(times, T, threads, args.reps, (before, os.getloadavg()[0]), common)
            out += new
            p, r, t = new
            print(f"T={T:5d} threads={threads}  plain {p['cpu_s']:.2f} s CPU / {p['wall_s']:.2f} s wall  recorded "
                  f"{r['cpu_s']:.2f} / {r['wall_s']:.2f} s = {r['cpu_ratio']:.2f}x CPU, {r['wall_ratio']:.2f}x wall  "
                  f"(tables() {t['wall_s']:.2f} s once per run; load {p['load_1min_before']:.1f} -> "
                  f"{p['load_1min_after']:.1f} on {os.cpu_count()} cores)", flush=True)
    write_parquet(args.out, pd.DataFrame(out))
    print(f"wrote {args.out} ({common['commit']}; {common['machine']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
