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


def test_non_editable_install_has_everything_the_cli_needs(tmp_path):
    """``pip install .`` (not editable) into a fresh folder: the installed package, run from
    outside the checkout, carries the dashboard and the shipped routers, and its CLI starts."""
    import shutil
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, src / name)
    for pkg in ("focus_lab", "analyses"):
        shutil.copytree(repo / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                            "--no-index", "-q", "--target", str(target), str(src)],
                           capture_output=True, text=True, cwd=tmp_path,
                           env={**__import__("os").environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert build.returncode == 0, build.stderr[-2000:]
    probe = ("import focus_lab, focus_lab.cli as c, focus_lab.shipped as s, pathlib\n"
             "cmd = c._app_command(pathlib.Path('.'), '127.0.0.1', 1)\n"
             "print(focus_lab.__file__); print(cmd[4]); print(s.shipped_router_file())\n"
             "import analyses.common as ac; print(ac.REPO)")
    env = {**__import__("os").environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    init, main, routers, root = out.stdout.split()
    # the installed figure runner writes under the working directory, never into site-packages
    assert Path(root) == tmp_path.resolve(), root
    assert init.startswith(str(target)), init  # the installed copy, not the checkout
    assert main.startswith(str(target)) and Path(main).is_file()
    pages = Path(main).parent / "app_pages"
    assert {p.name for p in pages.glob("*.py")} >= {"groups.py", "audit.py", "probe.py"}
    assert routers.startswith(str(target)) and Path(routers).is_file()
    cli = subprocess.run([sys.executable, "-m", "focus_lab", "--help"], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert cli.returncode == 0 and "record" in cli.stdout


def test_cli_defaults_are_the_dataclasses_defaults():
    """Every `focus-lab train` option named like a FocusConfig / TrainConfig field defaults to
    that field's default (one place for each default, issue 17 item 3)."""
    import dataclasses
    import typer
    from focus_lab.cli import app
    from focus_lab.config import FocusConfig, TrainConfig
    cmd = typer.main.get_command(app).commands["train"]
    fields = {f.name: f.default for dc in (FocusConfig, TrainConfig) for f in dataclasses.fields(dc)
              if f.default is not dataclasses.MISSING}
    checked = 0
    for p in cmd.params:
        if p.name in fields and p.default is not None:  # None: "the recipe's" (sink_tokens)
            assert p.default == fields[p.name], (p.name, p.default, fields[p.name])
            checked += 1
    assert checked >= 12, checked


def test_record_cli_defaults_are_the_record_options_defaults():
    """Every `focus-lab record` option named like a RecordOptions field defaults to that field's
    default ('all' metrics: ALL_METRICS); layers / heads / pattern default to None: all layers and
    heads, no pattern maps, as the dataclass's None / []."""
    import dataclasses
    import typer
    from focus_lab.cli import app
    from focus_lab.config import ALL_METRICS, RecordOptions
    cmd = typer.main.get_command(app).commands["record"]
    fields = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
              for f in dataclasses.fields(RecordOptions)}
    params = {p.name: p.default for p in cmd.params}
    assert params["metrics"] == "all" and fields["metrics"] == ALL_METRICS
    assert params["layers"] is None is fields["layers"] and params["heads"] is None is fields["heads"]
    assert params["pattern"] is None and fields["patterns"] == []
    checked = [n for n in params if n in fields and n not in ("metrics", "layers", "heads")]
    for name in checked:
        assert params[name] == fields[name], (name, params[name], fields[name])
    assert sorted(checked) == ["costly_top_n", "edge_min_weight", "edge_threshold", "edge_top_n", "per_query",
                               "sink_positions"], checked


def test_main_job_steps_run_as_separate_processes(capfd):
    """``focus-lab quickstart`` runs each step as ``python -m focus_lab ARGS`` (its own process,
    so the job's peak RSS is its largest step's): a step's output reaches the terminal, its
    failure stops the job with the step's exit code."""
    import typer
    from focus_lab.cli import _invoke
    _invoke("eval", "--help")
    assert "--patterns" in capfd.readouterr().out
    with pytest.raises(typer.Exit) as e:
        _invoke("no-such-command")
    assert e.value.exit_code == 2
    assert "No such command" in capfd.readouterr().err
