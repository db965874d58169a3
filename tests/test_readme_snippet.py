"""The README's library snippet runs as written: its first ```python block is exec()'d on the
embedded model (offline, conftest sets HF_HUB_OFFLINE), in a temporary working directory (it
writes routers.safetensors there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def first_python_block(text: str) -> str:
    """The body of the first fenced ```python block of a markdown text."""
    m = re.search(r"^```python[ \t]*\n(.*?)^```[ \t]*$", text, re.S | re.M)
    if m is None:
        raise AssertionError("README.md has no ```python block")
    return m.group(1)


def test_first_python_block_is_found():
    text = "intro\n```bash\nls\n```\n```python\nx = 1\ny = x + 1\n```\n```python\nz = 3\n```\n"
    assert first_python_block(text) == "x = 1\ny = x + 1\n"


@pytest.mark.slow
def test_readme_library_snippet_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = first_python_block(README.read_text(encoding="utf-8"))
    scope: dict = {"__name__": "readme_snippet"}
    exec(compile(code, f"{README}:python block", "exec"), scope)
    ids, logits, groups, model = scope["input_ids"], scope["logits"], scope["groups"], scope["model"]
    assert ids.ndim == 2 and 0 < ids.shape[1] < 100  # a short text: a few dozen tokens at most
    assert logits.shape[:2] == ids.shape
    assert len(groups) == model.config.num_hidden_layers  # one key_group per routed layer
    assert (tmp_path / "routers.safetensors").is_file()
    assert not hasattr(model, "_focus_state") or model.__dict__.get("_focus_state") is None  # detached
