"""docs/reliability.md's calibration table of the recorder's memory estimate: per recording, the
estimate ``focus_lab.recording.recorder.estimate_memory`` gives before it starts against the peak
resident memory the real command reached, each measured by ``analyses/studies/record_memory.py
--label ...`` (one row of ``figures/results/record_memory.parquet`` per recording, with the phase
that peaked, the commit and the machine)."""

from __future__ import annotations

import re

import pandas as pd

from analyses.doc_blocks import REPO, Generated, MissingInput, block

PAGE = "docs/reliability.md"
PROSE_PAGES = (PAGE,)
#: versions of the software a GPU run used (torch 2.11, CUDA 13.0, transformers 5.23), not measurements
ALLOWED = {PAGE: {"2.11", "13.0", "5.23"}}
RECORD_MEMORY = "figures/results/record_memory.parquet"
GB = 1e9 / 2**30  # GiB per GB


def rows() -> pd.DataFrame:
    """The committed rows, in the order they were measured; ``peak_phase``: the phase whose RSS
    peak is the largest; ``error``: estimate / measured - 1."""
    df = pd.read_parquet(REPO / RECORD_MEMORY)
    if df.empty:
        raise MissingInput(RECORD_MEMORY)
    phases = [c for c in df.columns if c.startswith("phase_") and c.endswith("_gib")]
    df = df.copy()
    df["peak_phase"] = df[phases].idxmax(axis=1).str.removeprefix("phase_").str.removesuffix("_gib")
    df["error"] = df.estimate_gib / df.measured_gib - 1
    return df


@block("record-memory", RECORD_MEMORY)
def record_memory() -> Generated:
    """One row per recording: the estimate, the measured peak (GiB), their difference and the phase
    that peaked; then the range of the differences."""
    df = rows()
    lines = ["| recording (`focus-lab record ...`) | estimate | measured | estimate vs measured | peak phase |",
             "|---|---:|---:|---:|---|"]
    for r in df.itertuples():
        args = re.sub(r"\s*--out \S+", "", r.args).replace("|", "/")  # where it wrote does not matter
        lines.append(f"| {r.label}: `{args}` | {r.estimate_gib:.2f} GiB | {r.measured_gib:.2f} GiB | "
                     f"{100 * r.error:+.0f}% | {r.peak_phase} |")
    lo, hi = df.error.min(), df.error.max()
    lines += ["", f"Over these {len(df)} recordings the estimate is {100 * lo:+.0f}% to {100 * hi:+.0f}% off the "
              "measured peak."]
    commits = ", ".join(sorted(set(df.commit)))
    machines = "; ".join(sorted(set(df.machine)))
    loads = f"load average at the end {df.load_1min_end.min():.1f}-{df.load_1min_end.max():.1f}"
    inputs = (f"{RECORD_MEMORY}: `python analyses/studies/record_memory.py --label LABEL -- ARGS` per row, at "
              f"{commits}; {machines}; one torch thread unless the row says; {loads}")
    return Generated(inputs, "\n".join(lines))
