"""The package boundary (issue 17 item 1): ``import focus_lab`` is light and resolves its public
names lazily; the run reader (what the dashboard needs) does not import torch."""

import subprocess
import sys

import pytest


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_import_and_run_reader_do_not_load_torch():
    mods = _modules_after("import focus_lab, focus_lab.runs")
    assert "focus_lab.runs" in mods
    assert "torch" not in mods and "transformers" not in mods


def test_public_names_resolve_on_first_use():
    import focus_lab
    from focus_lab.config import FocusConfig
    from focus_lab.retrofit import attach
    assert focus_lab.FocusConfig is FocusConfig and focus_lab.attach is attach
    assert callable(focus_lab.record)
    assert set(focus_lab.__all__) <= set(dir(focus_lab))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        focus_lab.not_a_name
