"""Recording overhead: wall time of a recorded forward (all metrics) over a plain Focus forward.

The embedded SmolLM2-135M with Focus attached (trained routers when present, else fresh ones),
hard mode, one window of held-out Austen at each length. Plain and recorded forwards alternate
(side by side in one process, so machine load hits both alike); the median of each is
reported. ``tables()`` (turning the reductions into DataFrames, done once per run, not per
forward) is timed separately. Goal: ratio <= 2.

    .venv/bin/python analyses/studies/bench_record.py [--lengths 512 1024] [--reps 5] [--out logs/bench_record.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]

import focus_lab  # noqa: E402
from focus_lab.hf.models import load_model  # noqa: E402
from focus_lab.recording.recorder import ALL_METRICS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mode", default="hard")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--routers", type=Path, default=REPO / "checkpoints" / "smollm2-austen" / "routers.safetensors")
    ap.add_argument("--out", type=Path, default=REPO / "logs" / "bench_record.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(verbose=False)
    if args.routers.is_file():
        focus_lab.load_routers(model, args.routers)
        source = str(args.routers)
    else:
        focus_lab.attach(model, focus_lab.FocusConfig())
        source = "fresh routers (no trained file)"
    focus_lab.set_config(model, mode=args.mode)
    from focus_lab.data import load_corpus, make_windows
    corp = load_corpus("austen")
    results = []
    for T in args.lengths:
        ids = make_windows(corp.heldout, tok, T, max_windows=1)[0].input_ids[None]
        plain, recorded, tables, plain_cpu, recorded_cpu, ratios = [], [], [], [], [], []
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)  # warm-up
            with focus_lab.record(model, metrics=ALL_METRICS):
                model(input_ids=ids, use_cache=False)
            for _ in range(args.reps):
                c0, t0 = time.process_time(), time.perf_counter()
                model(input_ids=ids, use_cache=False)
                plain.append(time.perf_counter() - t0)
                plain_cpu.append(time.process_time() - c0)
                c0, t0 = time.process_time(), time.perf_counter()
                with focus_lab.record(model, metrics=ALL_METRICS) as rec:
                    model(input_ids=ids, use_cache=False)
                recorded.append(time.perf_counter() - t0)
                recorded_cpu.append(time.process_time() - c0)
                ratios.append(recorded[-1] / plain[-1])
                t0 = time.perf_counter()
                rec.tables()
                tables.append(time.perf_counter() - t0)
        med = statistics.median
        row = {"seq_len": T, "plain_s": med(plain), "recorded_s": med(recorded), "tables_s": med(tables),
               "plain_cpu_s": med(plain_cpu), "recorded_cpu_s": med(recorded_cpu), "reps": args.reps,
               "plain_all": plain, "recorded_all": recorded, "pair_ratios": ratios,
               "load_avg": list(os.getloadavg())}
        row["ratio"] = row["recorded_s"] / row["plain_s"]
        row["median_pair_ratio"] = med(ratios)
        row["cpu_ratio"] = row["recorded_cpu_s"] / row["plain_cpu_s"]
        results.append(row)
        print(f"T={T:5d}  plain {row['plain_s']:.3f} s  recorded {row['recorded_s']:.3f} s  wall ratio "
              f"{row['ratio']:.2f}x (median of pairs {row['median_pair_ratio']:.2f}x)  CPU time "
              f"{row['plain_cpu_s']:.2f} / {row['recorded_cpu_s']:.2f} s = {row['cpu_ratio']:.2f}x  "
              f"(tables() {row['tables_s']:.2f} s once per run; load avg {row['load_avg'][0]:.1f} "
              f"on {os.cpu_count()} cores)", flush=True)
    info = {"model": "smollm2-135m-instruct", "routers": source, "mode": args.mode,
            "threads": args.threads, "metrics": list(ALL_METRICS), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(info, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
