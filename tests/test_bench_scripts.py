"""The benchmark scripts of analyses/: the machine each describes comes from one place
(``focus_lab.io.machine`` / ``machine_line``), and the recorder benchmark's tidy rows
(analyses/studies/bench_record.py) are medians and ratios over the plain forward's."""

from __future__ import annotations

import pytest

from analyses.doc_blocks import REPO

BENCHES = sorted((REPO / "analyses").glob("bench_*.py")) + [REPO / "analyses" / "studies" / "bench_record.py"]


@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.name)
def test_a_benchmark_describes_its_machine_with_focus_lab_io(path):
    src = path.read_text(encoding="utf-8")
    assert "platform." not in src and "import platform" not in src, path.name
    assert "from focus_lab.io import machine" in src, path.name


def test_bench_record_rows_are_medians_and_ratios_over_the_plain_forward():
    from analyses.studies.bench_record import SCHEMA_VERSION, TIMED, rows
    times = {"plain forward": ([1.0, 3.0, 2.0], [2.0, 4.0, 10.0]),
             "recorded forward": ([3.0, 2.0, 4.0], [8.0, 6.0, 7.0]),
             "tables()": ([0.5, 0.5, 0.5], [1.0, 2.0, 3.0])}
    out = {r["timed"]: r for r in rows(times, 512, 1, 3, (1.234, 2.0), {"commit": "abc"})}
    assert list(out) == list(TIMED)
    plain, rec, tab = out["plain forward"], out["recorded forward"], out["tables()"]
    assert (plain["cpu_s"], plain["wall_s"], plain["cpu_ratio"], plain["wall_ratio"]) == (2.0, 4.0, 1.0, 1.0)
    assert (rec["cpu_s"], rec["wall_s"]) == (3.0, 7.0)
    assert rec["cpu_ratio"] == pytest.approx(1.5) and rec["wall_ratio"] == pytest.approx(1.75)
    assert tab["wall_ratio"] == pytest.approx(0.5)
    for r in out.values():
        assert (r["schema_version"], r["tokens"], r["threads"], r["reps"], r["commit"]) == (SCHEMA_VERSION, 512, 1, 3, "abc")
        assert (r["load_1min_before"], r["load_1min_after"]) == (1.23, 2.0)
