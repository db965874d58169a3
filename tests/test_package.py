"""The package boundary: ``import focus_lab`` is light and resolves its public
names lazily; the run reader (what the dashboard needs) does not import torch."""

import os
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
    from focus_lab.method.config import FocusConfig
    from focus_lab.hf.retrofit import attach
    assert focus_lab.FocusConfig is FocusConfig and focus_lab.attach is attach
    assert callable(focus_lab.record) and callable(focus_lab.hooks) and callable(focus_lab.cache)
    assert set(focus_lab.__all__) <= set(dir(focus_lab))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        focus_lab.not_a_name


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel of the project, built from a copy of the checkout (the build leaves nothing in it)."""
    import shutil
    from pathlib import Path
    tmp = tmp_path_factory.mktemp("wheel")
    repo = Path(__file__).resolve().parents[1]
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, src / name)
    for folder in ("focus_lab", "app", "analyses"):
        shutil.copytree(repo / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(out), str(src)], capture_output=True, text=True, cwd=tmp,
                           env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert build.returncode == 0, build.stderr[-2000:]
    (whl,) = out.glob("focus_lab-*.whl")
    return whl


def test_wheel_holds_the_dashboard_as_focus_lab_app_and_the_figures_command(wheel):
    """The repository's app/ folder installs as the package focus_lab.app (every file of it, no
    top-level ``app``); the wheel declares both console scripts."""
    import zipfile
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    app_files = {p.relative_to(repo / "app").as_posix() for p in (repo / "app").rglob("*.py")}
    assert {"main.py", "lib.py", "app_pages/overview.py"} <= app_files
    assert {f"focus_lab/app/{f}" for f in app_files} <= names
    assert not any(n.startswith("app/") for n in names)
    assert {"focus_lab/routers/MANIFEST.json", "focus_lab/cli.py", "analyses/figures.py",
            "analyses/studies/__init__.py"} <= names
    assert "focus-lab = focus_lab.cli:app" in entry_points
    assert "focus-lab-figures = analyses.figures:main" in entry_points


def test_non_editable_install_has_everything_the_cli_needs(wheel, tmp_path):
    """The wheel installed (not editable) into a fresh folder: the installed package, run from
    outside the checkout, carries the dashboard and the shipped routers, and its CLI starts."""
    from pathlib import Path
    target = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                            str(target), str(wheel)], capture_output=True, text=True, cwd=tmp_path,
                           env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert build.returncode == 0, build.stderr[-2000:]
    probe = ("import focus_lab, focus_lab.cli as c, focus_lab.hf.shipped as s, pathlib\n"
             "cmd = c._app_command(pathlib.Path('.'), '127.0.0.1', 1)\n"
             "print(focus_lab.__file__); print(cmd[4]); print(s.shipped_router_file())\n"
             "import analyses.common as ac; print(ac.REPO)")
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    init, main, routers, root = out.stdout.split()
    # the installed figure runner writes under the working directory, never into site-packages
    assert Path(root) == tmp_path.resolve(), root
    assert init.startswith(str(target)), init  # the installed copy, not the checkout
    assert Path(main) == target / "focus_lab" / "app" / "main.py" and Path(main).is_file()
    pages = Path(main).parent / "app_pages"
    assert {p.name for p in pages.glob("*.py")} >= {"groups.py", "overview.py", "audit.py", "probe.py"}
    assert routers.startswith(str(target)) and Path(routers).is_file()
    cli = subprocess.run([sys.executable, "-m", "focus_lab", "--help"], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert cli.returncode == 0 and "record" in cli.stdout
    # the dashboard's shared module imports from the installed package, without any path edit
    lib = subprocess.run([sys.executable, "-c", "import focus_lab.app.lib as l; print(l.__file__)"],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert lib.returncode == 0 and lib.stdout.strip() == str(target / "focus_lab" / "app" / "lib.py"), lib.stderr


def test_no_sys_path_edits_in_the_package_or_the_dashboard():
    """focus_lab/ and app/ import each other as installed packages: no file edits sys.path."""
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    files = [*(repo / "focus_lab").rglob("*.py"), *(repo / "app").rglob("*.py")]
    assert len(files) > 30
    for f in files:
        text = f.read_text()
        assert "sys.path" not in text and "syspath" not in text, f


def test_figures_are_the_analyses_command_not_the_library_cli():
    """``focus-lab-figures`` / ``python -m analyses.figures`` take the figure options;
    ``focus-lab figures`` only points there (one line, exit 2), and the CLI never imports analyses."""
    from typer.testing import CliRunner
    from focus_lab.cli import app
    res = subprocess.run([sys.executable, "-m", "analyses.figures", "--help"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    for option in ("--quick", "--out", "--only", "--threads", "--png", "--update-readme", "--routers"):
        assert option in res.stdout, option
    res = CliRunner().invoke(app, ["figures", "--quick", "--only", "lora"])
    assert res.exit_code == 2
    assert res.output.strip() == ("error: the figures are made by the analyses package's own command: "
                                  "focus-lab-figures --quick --only lora (focus-lab-figures --help lists its options)")
    mods = _modules_after("import focus_lab.cli")
    assert not any(m == "analyses" or m.startswith("analyses.") for m in mods)


def test_cli_defaults_are_the_dataclasses_defaults():
    """Every `focus-lab train` option named like a FocusConfig / TrainConfig field defaults to
    that field's default (one place for each default)."""
    import dataclasses
    import typer
    from focus_lab.cli import app
    from focus_lab.method.config import CONCERNS, TRAIN_CONCERNS
    cmd = typer.main.get_command(app).commands["train"]
    concerns = [*CONCERNS.values(), *TRAIN_CONCERNS.values()]  # the fields, by concern
    fields = {f.name: f.default for dc in concerns for f in dataclasses.fields(dc)
              if f.default is not dataclasses.MISSING}
    checked = 0
    for p in cmd.params:
        if p.name in fields and p.default is not None:  # None: "the recipe's" (sink_tokens)
            assert p.default == fields[p.name], (p.name, p.default, fields[p.name])
            checked += 1
    assert checked >= 12, checked


def test_record_cli_defaults_are_the_record_options_defaults():
    """Every `focus-lab record` option named like a RecordOptions field defaults to that field's
    default ('default' metrics: DEFAULT_METRICS); layers / heads / pattern default to None: all layers and
    heads, no pattern maps, as the dataclass's None / []."""
    import dataclasses
    import typer
    from focus_lab.cli import app
    from focus_lab.recording.options import DEFAULT_METRICS, RecordOptions
    cmd = typer.main.get_command(app).commands["record"]
    fields = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
              for f in dataclasses.fields(RecordOptions)}
    params = {p.name: p.default for p in cmd.params}
    assert params["metrics"] == "default" and fields["metrics"] == DEFAULT_METRICS
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
