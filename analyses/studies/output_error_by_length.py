"""Attention recall and output error of the routed layers, one recording per length: the tidy
table behind docs/studies/gemma-length-gap.md.

Each run is a ``focus-lab record`` of one held-out window with ``--metrics coverage,output_error``
(``analyses.output_error_table.head_rows``: per (layer_idx, head, mask) the mean attention recall
``coverage`` and the mean relative output error ``||O_dense - O_mask|| / ||O_dense||`` over the
window's queries; masks ``focus`` (the router's hard top-k), ``random`` (balanced random groups
at the same sparsity), ``window_matched`` (a sliding window keeping as many pairs) and ``window``
(the local window and sinks alone)). This script stacks the runs with what made them (seq_len,
model, router file name and sha256, corpus, documents, the recording's command) and writes one
parquet (``SCHEMA_VERSION``), atomically::

    for L in 4096 8192 16384 32768; do
      focus-lab record --model gemma3-270m --seq-len $L --max-windows 1 --metrics coverage,output_error \\
        --no-pos --no-per-query --out runs/oe_gemma_$L
    done
    python -m analyses.studies.output_error_by_length runs/oe_gemma_4096 runs/oe_gemma_8192 \\
        runs/oe_gemma_16384 runs/oe_gemma_32768 --out figures/gemma/output_error_by_length.parquet

Raises SystemExit (one line) when a run lacks a table (``head_rows``) or two runs share a length.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1
OUT = Path("figures/gemma/output_error_by_length.parquet")


def run_rows(run: Path) -> pd.DataFrame:
    """``head_rows(run)`` with the run's provenance as columns: seq_len (tokens), model, router_name,
    routers_sha256, corpus, documents (comma-joined), command."""
    from analyses.output_error_table import head_rows
    heads = head_rows(run)
    m = json.loads((run / "manifest.json").read_text())
    routers = m.get("routers") or {}
    heads.insert(0, "seq_len", int(m["seq_len"]))
    for col, value in (("model", m["model"]["name"]), ("router_name", routers.get("name", "")),
                       ("routers_sha256", routers.get("sha256", "")), ("corpus", (m.get("corpus") or {}).get("name", "")),
                       ("documents", ",".join(m.get("documents", []))), ("command", m.get("command", ""))):
        heads[col] = value
    return heads


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", help="run directories recorded with --metrics coverage,output_error")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    df = pd.concat([run_rows(r) for r in a.runs], ignore_index=True)
    lengths = df.drop_duplicates(["seq_len", "command"]).seq_len
    if lengths.duplicated().any():
        raise SystemExit(f"two runs record {sorted(set(lengths[lengths.duplicated()]))} tokens: give one run a length")
    df["schema_version"] = SCHEMA_VERSION
    from focus_lab.io import write_parquet
    write_parquet(a.out, df)
    print(f"{len(df)} rows ({len(a.runs)} runs) -> {a.out}")


if __name__ == "__main__":
    main()
