"""Peak memory of ``focus-lab record`` by phase, against ``record.estimate_memory``.

Runs the real CLI command in this process (arguments after ``--``), samples the resident set
size (psutil, every 10 ms) in a thread, and labels the samples by phase: ``start`` (imports,
corpus, windows, routers), ``load`` (the model), ``record`` (the recorded forwards), ``spacy``
(``load_spacy``, also called by each window's POS join inside the recording), ``tables``
(``Recording.tables``), ``loss_delta`` (the forwards of the mode the recorded forward does not
give: ``next_token_nll``, after the recording), ``write`` (the parquet
files), ``done`` (after ``record_run`` returned: the heap the allocator kept). Prints the peak
RSS of each phase, the process's overall peak (``ru_maxrss``) and the estimate the recorder
computes for the same command (``record.memory_parts``, the breakdown of
``estimate_memory``), in GiB. Used to calibrate the estimate (docs/reliability.md).

    .venv/bin/python analyses/studies/record_memory.py -- --seq-len 1024 --max-windows 1 --layers 0-3 --out /tmp/m

With ``--label TEXT`` before the ``--`` the measurement is also written as one row of the tidy table
``--table`` (default ``figures/results/record_memory.parquet``; a row of the same label is
replaced): the label, the command's arguments, the measured peak and each phase's (GiB), the
estimate and its terms (GiB), wall seconds, the commit and the machine (``SCHEMA_VERSION``).
docs/reliability.md's calibration table is generated from it.

    .venv/bin/python analyses/studies/record_memory.py --label "1024 tokens, layers 0-3" -- --seq-len 1024 ...
"""

from __future__ import annotations

import contextlib
import resource
import sys
import threading
import time

import psutil

GiB = 1024 ** 3
SCHEMA_VERSION = 1
TABLE = "figures/results/record_memory.parquet"


class Sampler:
    def __init__(self, every: float = 0.01):
        self.phase = "start"
        self.peaks: dict[str, int] = {}
        self.order: list[str] = []
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._every = every
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            time.sleep(self._every)

    def sample(self):
        rss = self._proc.memory_info().rss
        if self.phase not in self.peaks:
            self.order.append(self.phase)
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)

    def start(self):
        self._t.start()

    def stop(self):
        self._stop.set()
        self._t.join()

    @contextlib.contextmanager
    def during(self, name: str):
        prev, self.phase = self.phase, name
        try:
            yield
        finally:
            self.sample()
            self.phase = prev


def wrap(owner, attr: str, sampler: Sampler, phase: str):
    fn = getattr(owner, attr)

    def wrapped(*a, **k):
        with sampler.during(phase):
            return fn(*a, **k)
    setattr(owner, attr, wrapped)


def write_row(table: str, label: str, args: list[str], peak: int, phases: dict[str, int], est: dict[str, int],
              seconds: float) -> None:
    """Replace or add the row ``label`` of the tidy table ``table`` (parquet, written atomically)."""
    from pathlib import Path

    import pandas as pd

    from focus_lab.hf.shipped import code_commit
    from focus_lab.io import machine, machine_line, write_parquet
    row = {"schema_version": SCHEMA_VERSION, "label": label, "args": " ".join(args),
           "measured_gib": peak / GiB, "estimate_gib": est.get("peak", float("nan")) / GiB,
           **{f"phase_{k}_gib": v / GiB for k, v in phases.items()},
           **{f"est_{k}_gib": v / GiB for k, v in est.items() if k != "peak"},
           "seconds": round(seconds, 1), "commit": code_commit(), "machine": machine_line(machine()),
           "load_1min_end": round(__import__("os").getloadavg()[0], 2)}
    path = Path(table)
    old = pd.read_parquet(path) if path.is_file() else pd.DataFrame()
    if len(old):
        old = old[old.label != label]
    write_parquet(path, pd.concat([old, pd.DataFrame([row])], ignore_index=True))
    print(f"row {label!r} written to {path}")


def main() -> None:
    argv = sys.argv[1:]
    label, table = None, TABLE
    while argv and argv[0] in ("--label", "--table"):
        if len(argv) < 2:
            raise SystemExit(f"{argv[0]} needs a value")
        if argv[0] == "--label":
            label = argv[1]
        else:
            table = argv[1]
        argv = argv[2:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    from focus_lab.recording import recorder as R
    from focus_lab.recording import linguistics
    from focus_lab.hf import models
    import runpy
    s = Sampler()
    wrap(models, "load_model", s, "load")
    wrap(linguistics, "load_spacy", s, "spacy")
    wrap(R.Recording, "tables", s, "tables")
    wrap(R, "next_token_nll", s, "loss_delta")
    est = {}
    real_record_run = R.record_run

    def record_run(model, tok, windows, *a, **k):
        est.update(R.memory_parts(**R.memory_inputs(model, windows, **{
            n: k[n] for n in ("metrics", "layers", "heads", "patterns", "with_pos", "per_query", "chunk_elements",
                              "edge_top_n") if n in k})))
        s.phase = "record"
        try:
            return real_record_run(model, tok, windows, *a, **k)
        finally:
            s.phase = "done"
    R.record_run = record_run
    real_atomic = R.atomic_path

    @contextlib.contextmanager
    def atomic(path):
        with s.during("write"), real_atomic(path) as tmp:
            yield tmp
    R.atomic_path = atomic
    s.start()
    t0 = time.perf_counter()
    try:
        # the real command in this process (its stages wrapped above), as `python -m focus_lab` runs it
        sys.argv = ["focus-lab", "record", "--memory-limit", "1000", *argv]
        try:
            runpy.run_module("focus_lab", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            if e.code:
                raise
    finally:
        s.stop()
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"\nwall {dt:.0f} s; peak RSS (ru_maxrss) {peak / GiB:.3f} GiB ({peak / 1e9:.3f} GB)")
    for ph in s.order:
        print(f"  phase {ph:<11} peak RSS {s.peaks[ph] / GiB:.3f} GiB")
    if est:
        total = est["peak"]
        print(f"estimate {total / GiB:.3f} GiB = {total / 1e9:.3f} GB ({total / peak - 1:+.1%} vs the measured "
              "peak); peak = runtime + model + recorded + slack + max(record, spacy, tables, loss_delta, write):")
        for k, v in est.items():
            print(f"  {k:<11} {v / GiB:.3f} GiB")
    if label:
        write_row(table, label, argv, peak, {ph: s.peaks[ph] for ph in s.order}, est, dt)


if __name__ == "__main__":
    main()
