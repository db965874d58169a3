"""``focus-lab-figures`` (or ``python -m analyses.figures``): every paper figure and the
reproduction table from recorded data. ``main`` is the command; ``run_figures`` the
same from Python.

Two layers, both in this package:

* **experiments** (``EXPERIMENTS``): one module per experiment, ``analyses/exp_<name>.py``,
  exposing ``make_data(ctx) -> DataFrame`` that trains / evaluates / records; its result is
  cached as ``<out>/data/<name>.parquet`` (record runs as run directories under
  ``<out>/data/runs/``). An experiment whose parquet exists is skipped, so an interrupted run
  resumes where it stopped; multi-part experiments also cache each part under
  ``<out>/data/<name>.parts/``. ``<out>/data/<name>.json`` keeps its wall time and settings.
* **figures and tables** (``FIGURES``): one module per figure (``analyses/fig_*.py``,
  ``analyses/table_*.py``) exposing ``make_figure(data_dir) -> plotly Figure`` or
  ``make_table(data_dir) -> DataFrame`` over those files (and run directories). Figures are
  written as self-contained HTML, and PNG through kaleido + Chromium (``BROWSER_PATH``, default
  ``/usr/bin/chromium``) when that works; tables as Markdown. ``<out>/README.md`` lists each
  output, its data and the command that made it.

Both are imported as modules of the ``analyses`` package (``importlib.import_module``). What they
share (settings, context, style) is in ``analyses/common.py``.

``--quick`` runs the same code on a tiny random Llama, a tiny BPE tokenizer and built-in
texts (minutes; used by tests/test_figures.py). The full set runs on the embedded SmolLM2-135M
with the routers shipped in the package (``focus_lab/routers/``; ``--routers`` for another
file) at long context (``analyses.common.FULL``: baselines, domains and recorded runs at 4096
tokens; the length table's cells from 512 to 8192 tokens): 38 min on a quiet 2-core CPU with
``--threads 2`` when the committed length-table cells are reused, hours without.
PNGs are committed (palette-optimized); the HTML files are generated.
Sources: docs/method.md §1-§6.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pandas as pd
import torch
import typer

from focus_lab.io import atomic_path, write_json, write_parquet

from analyses.common import REPO, Context, placeholder



# ============================================================================================
# experiments

@dataclass
class Experiment:
    """One experiment: ``name`` (``analyses/exp_<name>.py``, ``data/<name>.parquet``) and what it is."""

    name: str
    what: str
    # whether the results depend on the router file in use: such a cache is recomputed when it
    # was made with another file (``run_experiments``)
    uses_router: bool = True
    # folders under ``data/`` that the experiment fills besides ``<name>.parquet`` and
    # ``<name>.parts/``, cleared with them when the cache is stale
    caches: tuple = ()

    @property
    def module(self) -> str:
        return f"analyses.exp_{self.name}"

    def make_data(self, ctx: Context) -> pd.DataFrame:
        return importlib.import_module(self.module).make_data(ctx)


EXPERIMENTS: list[Experiment] = [
    Experiment("router", "the trained Focus routers (or a short training)"),
    Experiment("baselines", "Focus + every baseline on held-out Austen (settings.seq_len tokens)"),
    Experiment("causal_leak", "soft full / prefix-causal Sinkhorn / hard causal (settings.soft_seq_len tokens)"),
    Experiment("transfer_domain", "Austen router on Shakespeare and Python docs"),
    Experiment("records", "recorded runs: Focus and the router baselines", caches=("runs",)),
    Experiment("transfer_length", "the length table's cells, 512 to 8192 tokens, two corpora (committed cells reused)"),
    Experiment("lora", "LoRA at the router's parameter budget"),
    Experiment("collapse", "Sinkhorn vs softmax training (no trained router needed)", uses_router=False),
    Experiment("ablation", "K / window / tau / Sinkhorn iterations, short runs (no trained router needed)",
               uses_router=False),
    Experiment("bench", "kernel benchmark table (analyses/bench_attention.py)", uses_router=False),
    Experiment("passkey", "passkey retrieval by length and depth (committed probe tables reused)"),
]


def parse_only(only: list[str] | None) -> list[str] | None:
    """Experiment names for ``--only``: repeated options and comma-separated lists alike
    (``--only baselines,records`` = ``--only baselines --only records``). Raises
    ``focus_lab.method.config.ConfigError`` (one line, exit 2 from the CLI) naming the unknown names
    and the valid ones (a misspelt name would otherwise run nothing and say nothing)."""
    if not only:
        return None
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    valid = [e.name for e in EXPERIMENTS]
    unknown = [n for n in names if n not in valid]
    if unknown:
        from focus_lab.method.config import ConfigError
        raise ConfigError(f"unknown experiment(s) {', '.join(unknown)} for --only; choose from {', '.join(valid)}")
    return names or None


def _routers_in_use(ctx: Context, e: Experiment) -> str | None:
    """sha256 of the router file experiment ``e`` would use now, or None when it does not depend
    on one (``uses_router``), or (experiment "router" without ``--routers`` or a shipped file)
    when the routers are trained by the run itself."""
    if not e.uses_router:
        return None
    from focus_lab.io import file_sha256
    if e.name == "router":
        p = ctx.default_routers
        return file_sha256(p) if p is not None and Path(p).is_file() else None
    try:
        return ctx.router_id()
    except FileNotFoundError:  # experiment "router" has not run: it fails and says so
        return None


def _clear(ctx: Context, e: Experiment) -> None:
    """Delete an experiment's cache: ``<name>.parquet``, its ``.json``, ``<name>.parts/`` and its
    ``caches`` folders."""
    import shutil
    for f in (ctx.data / f"{e.name}.parquet", ctx.data / f"{e.name}.json"):
        f.unlink(missing_ok=True)
    for d in (ctx.data / f"{e.name}.parts", *(ctx.data / c for c in e.caches)):
        shutil.rmtree(d, ignore_errors=True)


def run_experiments(ctx: Context, only: list[str] | None = None) -> dict[str, dict]:
    """Run (or skip, when cached) every experiment in order; a failing experiment is logged and
    the others go on. A cache made with another router file than the run uses (sha256 in its
    ``<name>.json``; none recorded counts as another) is deleted and recomputed, so that a new
    shipped file or ``--routers`` never re-renders another file's results. Returns {name: status dict}."""
    status = {}
    for e in EXPERIMENTS:
        target = ctx.data / f"{e.name}.parquet"
        meta_p = ctx.data / f"{e.name}.json"
        cached = json.loads(meta_p.read_text()) if target.is_file() and meta_p.is_file() else {}
        if only and e.name not in only:
            if target.is_file():  # not run now, but its cached wall time still counts
                status[e.name] = {"status": "cached", **cached}
            continue
        want = _routers_in_use(ctx, e)
        if target.is_file() and want is not None and cached.get("routers_sha256") != want:
            ctx.log(f"[{e.name}] cached with other routers (sha256 {str(cached.get('routers_sha256'))[:12]}; "
                    f"this run uses {want[:12]}): recomputing")
            _clear(ctx, e)
        if target.is_file():
            ctx.log(f"[{e.name}] cached ({target})")
            status[e.name] = {"status": "cached", **cached}
            continue
        ctx.log(f"[{e.name}] {e.what} ...")
        t0 = time.perf_counter()
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            df = e.make_data(ctx)
        except Exception as ex:  # keep going: the figure that needs it says so
            import traceback
            ctx.log(f"[{e.name}] FAILED: {type(ex).__name__}: {ex}\n{traceback.format_exc()}")
            status[e.name] = {"status": f"failed: {type(ex).__name__}: {ex}"}
            continue
        secs = time.perf_counter() - t0
        write_parquet(target, df)
        meta = {"seconds": secs, "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                "settings": dataclasses.asdict(ctx.settings), "torch_threads": torch.get_num_threads(),
                "loadavg": os.getloadavg(),
                "routers_sha256": ctx.router_id() if e.uses_router else None}
        write_json(meta_p, meta)
        status[e.name] = {"status": "ran", **meta}
        ctx.log(f"[{e.name}] done in {secs:.0f}s -> {target}")
    return status


# ============================================================================================
# figures and tables

@dataclass
class Output:
    """One figure or table: ``name`` (file stem under <out>/), ``module`` (analyses/<module>.py),
    ``number`` in the issue's list (0 for extra tables)."""

    name: str
    module: str
    number: int


FIGURES: list[Output] = [
    Output("fig01_pareto", "fig_pareto", 1),
    Output("fig02_speedup_length", "fig_speedup_length", 2),
    Output("fig03_collapse", "fig_collapse", 3),
    Output("fig04_topk", "fig_topk", 4),
    Output("fig05_groups_pos", "fig_groups_pos", 5),
    Output("fig06_coverage_distance", "fig_coverage_distance", 6),
    Output("fig07_ablation", "fig_ablation", 7),
    Output("fig08_domain_transfer", "fig_domain_transfer", 8),
    Output("fig09_lora", "fig_lora", 9),
    Output("fig10_length_transfer", "fig_length_transfer", 10),
    Output("fig11_causal_leak", "fig_causal_leak", 11),
    Output("fig12_passkey", "fig_passkey", 12),
    Output("fig13_length_models", "fig_length_models", 13),
    Output("table_baselines", "table_baselines", 0),
    Output("table_reproduction", "table_reproduction", 0),
]


def load_output(module: str):
    """The figure or table module ``analyses/<module>.py``."""
    return importlib.import_module(f"analyses.{module}")


def _browser_env() -> None:
    if not os.environ.get("BROWSER_PATH"):
        for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"):
            if Path(p).is_file():
                os.environ["BROWSER_PATH"] = p
                break


class _KeepEarlier(Exception):
    """``render(names=...)``: a chosen output's data are missing; its earlier files stay."""


def render(out: Path, data_dir: Path, log: Callable[[str], None] = print, png: bool = True,
           names: list[str] | None = None) -> list[dict]:
    """Make every figure (HTML, PNG) and table (Markdown) from the cached data, or only the
    outputs ``names`` (e.g. ["fig02_speedup_length"]). Returns one record per output: name,
    files, title, description, data, status. Every output is written, a placeholder where its
    data are missing; with ``names`` such an output keeps its earlier files instead (status
    "skipped: missing data ...", no files)."""
    records = []
    figs, png_paths = [], []
    for o in FIGURES:
        if names is not None and o.name not in names:
            continue
        mod = load_output(o.module)
        rec = {"name": o.name, "number": o.number, "module": f"analyses/{o.module}.py",
               "title": getattr(mod, "TITLE", o.name), "description": (mod.__doc__ or "").strip(),
               "data": list(getattr(mod, "DATA", ())), "files": [], "status": "ok"}
        try:
            if hasattr(mod, "make_figure"):
                try:
                    fig = mod.make_figure(data_dir)
                except FileNotFoundError as e:
                    if names is not None:  # a chosen output: keep what is there
                        raise _KeepEarlier(e) from e
                    fig = placeholder(rec["title"], str(e))
                    rec["status"] = f"missing data: {e}"
                html = out / f"{o.name}.html"
                with atomic_path(html) as tmp:
                    fig.write_html(tmp, include_plotlyjs=True, full_html=True)
                rec["files"].append(html.name)
                figs.append(fig)
                png_paths.append(out / f"{o.name}.png")
            else:
                try:
                    table = mod.make_table(data_dir)
                    md = mod.to_markdown(table) if hasattr(mod, "to_markdown") else table.to_markdown(index=False)
                except FileNotFoundError as e:
                    if names is not None:  # a chosen output: keep what is there
                        raise _KeepEarlier(e) from e
                    md = f"*no data yet: {e}*\n"
                    rec["status"] = f"missing data: {e}"
                path = out / f"{o.name}.md"
                with atomic_path(path) as tmp:
                    tmp.write_text(f"# {rec['title']}\n\n{md}\n")
                rec["files"].append(path.name)
        except _KeepEarlier as e:
            rec["status"] = f"skipped: missing data: {e}"
        except Exception as e:  # one broken figure must not stop the others
            import traceback
            log(f"[render] {o.name} FAILED: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            rec["status"] = f"failed: {type(e).__name__}: {e}"
        records.append(rec)
        log(f"[render] {o.name}: {rec['status']}")
    if png and figs:
        _browser_env()
        try:
            import plotly.io as pio
            t0 = time.perf_counter()
            pio.write_images(figs, [str(p) for p in png_paths], scale=1.5,
                             width=[f.layout.width or 1200 for f in figs],
                             height=[f.layout.height or 550 for f in figs])
            log(f"[render] {len(figs)} PNG files in {time.perf_counter() - t0:.0f}s "
                f"(kaleido, {os.environ.get('BROWSER_PATH', 'default browser')})")
            saved = sum(optimize_png(p) for p in png_paths)
            log(f"[render] PNG files palette-optimized: {saved / 1e6:.1f} MB saved")
            names = {p.stem for p in png_paths}
            for rec in records:
                if rec["name"] in names:
                    rec["files"].append(f"{rec['name']}.png")
        except Exception as e:
            log(f"[render] PNG not written ({type(e).__name__}: {e}); the HTML files are")
    elif figs:  # --no-png: PNG files of an earlier run stay listed, marked as not re-rendered
        names = {p.stem for p in png_paths}
        for rec in records:
            if rec["name"] in names and (out / f"{rec['name']}.png").is_file():
                rec["files"].append(f"{rec['name']}.png")
                rec["stale"] = [f"{rec['name']}.png"]
    return records


def optimize_png(path: Path, colors: int = 256) -> int:
    """Rewrite the PNG ``path`` with a ``colors``-colour palette (Pillow), atomically, when that
    makes it smaller (plotly figures have few colours: typically 3-5x smaller, so the committed
    figures stay small). Returns the bytes saved (0 when Pillow is missing or nothing is gained)."""
    try:
        from PIL import Image
    except ImportError:
        return 0
    before = path.stat().st_size
    with Image.open(path) as im:
        pal = im.convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    with atomic_path(path) as tmp:
        pal.save(tmp, format="PNG", optimize=True)
    after = path.stat().st_size
    return max(0, before - after)


# ============================================================================================
# README files

def _routers_line(status: dict) -> str:
    """The README's sentence naming the router file the experiments were made with (the sha256
    each experiment's cache records, ``run_experiments``)."""
    shas = sorted({v["routers_sha256"] for v in status.values() if v.get("routers_sha256")})
    if not shas:
        return "Router file of the experiments: not recorded."
    return "Router file of the experiments: " + ", ".join(f"sha256 `{x[:12]}...`" for x in shas) + (
        " (several: experiments made with different files)" if len(shas) > 1 else "") + "."


def write_readme(ctx: Context, records: list[dict], status: dict, wall: float, command: str) -> Path:
    """``<out>/README.md``: every output, what it shows, its data and the command that made it."""
    s = ctx.settings
    what = ("quick mode: a tiny random Llama, a tiny BPE tokenizer, built-in texts; the numbers mean nothing"
            if ctx.quick else "the embedded SmolLM2-135M")
    lines = [
        "# Figures and tables (generated)",
        "",
        f"Generated by `{command}` ({what}) "
        f"on {time.strftime('%Y-%m-%d %H:%M')}; this invocation took {wall / 60:.1f} min "
        "(cached experiments are skipped, so a rerun only renders). Delete `data/<experiment>.parquet` "
        "(and `data/<experiment>.parts/`) to recompute one experiment.",
        "",
        _routers_line(status),
        "",
        "Every figure is a PNG (kaleido + Chromium, palette-optimized; committed, so a fresh clone shows "
        "it) and an interactive, self-contained HTML file (plotly, no network needed; generated, not "
        "committed: `focus-lab-figures` writes it beside the PNG). Each comes from `analyses/<module>.py` "
        "(`make_figure(data_dir)` / `make_table(data_dir)`), reading only the cached experiment results "
        "under `data/`.",
        "",
        "Data: `data/<experiment>.parquet`, made by `make_data(ctx)` in `analyses/exp_<experiment>.py` "
        "(wall times below).",
        "",
        "| # | output | what it shows | data | module | status |",
        "|---:|---|---|---|---|---|",
    ]
    lines += [readme_row(r, ctx.out) for r in records]  # committed files (PNG, Markdown) linked
    total = sum(v.get("seconds", 0) or 0 for v in status.values())
    lines += ["", "## Experiments and their settings", "",
              f"Wall time of all experiments (as run, possibly over several invocations, which may have "
              f"shared the CPU with each other): {total / 60:.0f} min.", "",
              "| experiment | what | wall time | status |", "|---|---|---:|---|"]
    for e in EXPERIMENTS:
        st = status.get(e.name, {})
        secs = st.get("seconds")
        lines.append(f"| `{e.name}` | {e.what} | {f'{secs / 60:.1f} min' if isinstance(secs, (int, float)) else '-'} "
                     f"| {st.get('status', 'not run')} |")
    lines += ["", "Settings (`analyses.common." + ("QUICK" if ctx.quick else "FULL") + "`; chosen for a 2-core "
              "CPU shared with other jobs: few steps and few windows, so every number is noisy and "
              "short-schedule):", "", "| setting | value |", "|---|---|",
              *[f"| `{k}` | `{json.dumps(v)}` |" for k, v in dataclasses.asdict(s).items()], "",
              "Commands that made the data:", "",
              f"- everything: `{command}` (experiments in order: "
              + ", ".join(e.name for e in EXPERIMENTS) + ")",
              "- routers: the routers shipped with the package (`focus_lab/routers/`, provenance in its "
              "MANIFEST.json and docs/recipes.md), or `--routers <file>` (any `focus-lab train` output)",
              "- cells of the length tables (`<table>/cells/`, `python analyses/length_table.py`) and the "
              "passkey tables (`passkey/<run>/`, `focus-lab probe passkey`) are committed and reused when "
              "they were made with the same router file (sha256), or with one its MANIFEST lists as holding "
              "the same tensors under the same random layers (dense and random rows: any file, same seed, "
              "no per-layer k); what they lack is computed",
              "- speed benchmark: `python analyses/bench_attention.py` (its own outputs in "
              "`bench_attention/` are read when present, else experiment `bench` runs it with "
              "`" + " ".join(s.bench_args) + "`)",
              "- recorded runs: `data/runs/<method>/` (schema v1, open with `focus_lab.runs.Run.open`)", ""]
    path = ctx.out / "README.md"
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines))
    return path


def parse_render_only(spec: str) -> list[str]:
    """``--render-only`` "fig02_speedup_length,table_baselines" -> output names; ConfigError
    naming the unknown ones and the valid choices."""
    from focus_lab.method.config import ConfigError
    names = [n.strip() for n in spec.split(",") if n.strip()]
    valid = [o.name for o in FIGURES]
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise ConfigError(f"unknown output(s) {', '.join(unknown) or '(none given)'} for --render-only; "
                          f"choose from {', '.join(valid)}")
    return names


def readme_row(rec: dict, out: Path) -> str:
    """The README table's row of one ``render`` record (its committed files linked with their
    size, the generated HTML named without a link)."""
    files = ", ".join(f"`{f}` (generated)" if f.endswith(".html") else
                      f"[{f}]({f}) ({(out / f).stat().st_size / 1e3:.0f} kB"
                      + ("; from an earlier run, not re-rendered with --no-png" if f in rec.get("stale", ()) else "")
                      + ")" if (out / f).is_file()
                      else f"[{f}]({f})" for f in rec["files"]) or "(none)"
    data = "; ".join(f"`data/{d}.parquet`" for d in rec["data"]) or "-"
    status_txt = rec["status"] if len(rec["status"]) < 80 else rec["status"][:77] + "..."
    return f"| {rec['number'] or ''} | {files} | {rec['title']} | {data} | `{rec['module']}` | {status_txt} |"


def update_readme_rows(out: Path, records: list[dict]) -> Path:
    """Replace, in ``<out>/README.md`` (written by a full run), the rows of the outputs in
    ``records`` (``render(names=...)``), leaving every other line as it was. Raises
    FileNotFoundError when there is no README yet (run ``focus-lab-figures`` once)."""
    path = Path(out) / "README.md"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run focus-lab-figures once before --render-only")
    lines = path.read_text().split("\n")
    for rec in records:
        key = f"`{rec['module']}`"
        lines = [readme_row(rec, Path(out)) if ln.startswith("|") and key in ln else ln for ln in lines]
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines))
    return path


# ============================================================================================
# entry point

def run_figures(out: str | Path | None = None, quick: bool = False, only: list[str] | None = None,
                threads: int | None = 1, png: bool = True, update_readme: bool = False,
                routers: str | Path | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Run the experiments (cached) and render every figure and table into ``out``.

    Args:
        out: output folder (default ``figures`` in the repository, ``figures/quick`` with quick).
        quick: tiny model and inputs (minutes). only: experiment names to run (others are only
            read from the cache; ``parse_only``: comma lists accepted, unknown names raise
            ConfigError before anything runs). threads: torch threads (1: a polite default on
            a shared CPU).
        png: also write PNG files through kaleido. update_readme: write the reproduction table
            into docs/reproduction.md (between its markers). routers: a router file instead of
            the shipped routers.
    Returns: {"out", "records", "status", "seconds"}.
    """
    only = parse_only(only)
    t0 = time.perf_counter()
    out = Path(out) if out is not None else REPO / "figures" / ("quick" if quick else "")
    out.mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(exist_ok=True)
    if threads:
        torch.set_num_threads(threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    say = log or (lambda m: print(f"{time.strftime('%H:%M:%S')} {m}", flush=True))
    ctx = Context(out, quick, say, Path(routers) if routers else None)
    status = run_experiments(ctx, only)
    records = render(out, out / "data", say, png=png)
    wall = time.perf_counter() - t0
    cmd = "focus-lab-figures" + (" --quick" if quick else "") + (f" --out {out}" if out != REPO / "figures" else "")
    write_readme(ctx, records, status, wall, cmd)
    if update_readme:
        if Path(out).resolve() != (REPO / "figures").resolve():
            say(f"[docs] --update-readme: the docs' blocks read figures/data/, not {out}/data/: nothing written")
        else:
            from analyses import doc_blocks
            changed, problems = doc_blocks.write()
            say(f"[docs] generated blocks rewritten in {len(changed)} page(s)" + "".join(f"\n  {p}" for p in problems))
    say(f"figures done in {wall / 60:.1f} min -> {out}")
    return {"out": out, "records": records, "status": status, "seconds": wall}


# ============================================================================================
# command line: focus-lab-figures (pyproject [project.scripts]) and python -m analyses.figures

cli = typer.Typer(add_completion=False)


@cli.command()
def figures(
    quick: bool = typer.Option(False, help="tiny random model and built-in texts (minutes; what the test runs)"),
    out: Optional[Path] = typer.Option(None, help="output folder (default figures/, or figures/quick with --quick)"),
    only: Optional[list[str]] = typer.Option(None, help="run only these experiments, e.g. --only baselines,records "
                                             "(others are read from the cache)"),
    threads: int = typer.Option(1, help="torch threads (1 is polite on a shared CPU)"),
    png: bool = typer.Option(True, help="also write PNG files (kaleido + Chromium)"),
    update_readme: bool = typer.Option(False, help="then rewrite the docs' generated blocks (as --docs; "
                                       "only with the default --out figures/)"),
    routers: Optional[Path] = typer.Option(None, help="router file (default: the routers shipped with the package)"),
    render_only: Optional[str] = typer.Option(None, help="re-render only these outputs from the data they read, "
                                              "e.g. fig02_speedup_length (no experiment runs; their rows of "
                                              "README.md are rewritten, the rest left as it was)"),
    docs: bool = typer.Option(False, "--docs", help="only rewrite the generated result blocks of README.md, docs/ "
                              "and figures/ from the committed tables (analyses/doc_blocks.py; seconds, no "
                              "experiment runs); --check: only say which differ"),
    check: bool = typer.Option(False, "--check", help="with --docs: write nothing, list the blocks that differ "
                               "from what --docs writes; exit 1 if any"),
) -> None:
    """Regenerate every paper figure and the reproduction table (cached, resumable experiments);
    ``--docs``: the docs' generated result blocks only."""
    from focus_lab.errors import guard

    if check and not docs:
        raise typer.BadParameter("--check goes with --docs (it checks the docs' generated blocks)")
    if docs:
        from analyses import doc_blocks
        if check:
            problems = doc_blocks.check()
        else:
            changed, problems = doc_blocks.write()
            typer.echo(f"rewrote the generated blocks of {len(changed)} page(s)"
                       + (": " + ", ".join(changed) if changed else ""))
        for line in problems:
            typer.echo(line, err=True)
        if check and not problems:
            typer.echo(f"every generated block is what `{doc_blocks.COMMAND}` writes")
        raise typer.Exit(1 if problems else 0)

    def run():
        if render_only is not None:
            names = parse_render_only(render_only)
            folder = Path(out) if out is not None else REPO / "figures" / ("quick" if quick else "")
            records = render(folder, folder / "data", png=png, names=names)
            update_readme_rows(folder, [r for r in records if not r["status"].startswith("skipped")])
            skipped = [r["name"] for r in records if r["status"].startswith("skipped")]
            if skipped:
                raise FileNotFoundError(f"--render-only: no data for {', '.join(skipped)} under {folder / 'data'} "
                                        "(their earlier files are kept); run focus-lab-figures --only <experiment> first")
            typer.echo(f"re-rendered {', '.join(r['name'] + ': ' + r['status'] for r in records)} in {folder}")
            return records
        res = run_figures(out, quick=quick, only=only, threads=threads, png=png, update_readme=update_readme,
                          routers=routers)
        failed = [r["name"] for r in res["records"] if r["status"].startswith("failed")]
        typer.echo(f"wrote {len(res['records'])} outputs to {res['out']} (README.md lists them)"
                   + (f"; failed: {', '.join(failed)}" if failed else ""))
        return res
    guard(run)


def main() -> None:
    """The ``focus-lab-figures`` command (``[project.scripts]``; also ``python -m analyses.figures``):
    ``run_figures`` with its options; a bad option or input (an unknown ``--only`` name, a missing
    router file) is one line and exit code 2 (``focus_lab.errors.guard``)."""
    cli()


if __name__ == "__main__":
    main()
