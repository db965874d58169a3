"""The generated blocks of recipes.md (stage table), passkey_reference.md (prompt formats) and
reliability.md (recorder memory): one cell of each recomputed by hand from the committed data."""

from __future__ import annotations

import json
import re

import pandas as pd

from analyses import doc_blocks
from analyses.doc_blocks import REPO


def _row(text: str, first: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r}")


def test_recipe_stages_total_and_a_stage_from_the_chain_record():
    rec = json.loads((REPO / "figures/results/smollm2_chain.json").read_text())
    total = sum(s["seconds"] for s in rec["stages"].values())
    text = doc_blocks.render("recipe-stages")
    assert f"**{total:.0f} s = {total / 60:.1f} min**" in _row(text, "**all**")[2]
    s7 = rec["stages"]["s7_needle_mix_seed0"]
    row = _row(text, "7. the needle mix")
    assert row[2] == f"{s7['seconds']:.0f}" and row[3] == f"{s7['peak_rss_gb']:.2f} GiB"
    assert "<out>/s5_budget.safetensors" in row[1] and "checkpoints/" not in row[1]
    assert f"within {rec['against_reference']['max_abs_diff']:.1e}" in text


def test_passkey_formats_counts_the_committed_cases_by_hand():
    df = pd.read_parquet(REPO / "figures/results/passkey_cases.parquet")
    chat = df[(df.table == "prompt_formats_1k_2k") & (df.format == "chat") & (df.length == 2048)]
    assert len(chat) == 9  # 3 keys x 3 depths
    row = _row(doc_blocks.render("passkey-formats"), "`chat`")
    assert row[3] == f"{int(chat.exact_match.sum())}/9"
    assert row[5].strip("*") == f"{chat.key_logprob.mean():.2f}"


def test_record_memory_error_recomputed_from_a_row():
    df = pd.read_parquet(REPO / "figures/results/record_memory.parquet")
    r = df.iloc[0]
    text = doc_blocks.render("record-memory")
    line = next(l for l in text.splitlines() if l.startswith(f"| {r.label}:"))
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    assert cells[1] == f"{r.estimate_gib:.2f} GiB" and cells[2] == f"{r.measured_gib:.2f} GiB"
    assert cells[3] == f"{100 * (r.estimate_gib / r.measured_gib - 1):+.0f}%"
    assert "--out" not in cells[0]
    phases = {c[len("phase_"):-len("_gib")]: r[c] for c in df.columns if re.fullmatch(r"phase_.+_gib", c)}
    assert cells[4] == max(phases, key=lambda k: phases[k] if pd.notna(phases[k]) else -1)
