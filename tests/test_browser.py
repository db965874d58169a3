"""Real-browser test of the dashboard: `focus-lab app` on a free port, Debian Chromium driven by
Playwright, every page visited; no exception element, plotly charts rendered, screenshots saved.
Every page again on a run recorded from a tiny Gemma-3 (6 layers, 2 of them global and routed):
the layer selectors and the charts' layer axes hold the routed layers only.

Also a script for the screenshots of a real run (and each page's render time)::

    python tests/test_browser.py --runs runs --run smollm2-austen --out docs/screenshots
    python tests/test_browser.py --runs runs --pages overview --full-page --no-probe --out docs/screenshots
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
# (url path, title on the page, plotly charts expected at least)
PAGES = [("groups", "", "Groups", 3), ("overview", "overview", "Overview", 2), ("balance", "balance", "Balance", 2),
         ("coverage", "coverage", "Coverage", 2), ("audit", "audit", "Dependency audit", 2),
         ("compare", "compare", "Compare", 1), ("passkey", "passkey", "Passkey", 2),
         ("retrieval", "retrieval", "Retrieval", 2), ("probe", "probe", "Live probe", 1)]
# the run recorded from a tiny Gemma-3 (run_fixtures.make_tiny_run(model="gemma3")); sorts after tiny-k2
GEMMA_RUN = "tiny-k4-gemma3"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dashboard(runs: Path, port: int | None = None, timeout: float = 90.0):
    """`focus-lab app --runs <runs>` on 127.0.0.1; yields the base URL; always terminated."""
    port = port or free_port()
    env = {**os.environ, "STREAMLIT_SERVER_FILE_WATCHER_TYPE": "none", "STREAMLIT_SERVER_RUN_ON_SAVE": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log = tempfile.NamedTemporaryFile("w", prefix=f"focus-lab-app-{port}-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "focus_lab", "app", "--runs", str(runs), "--host", "127.0.0.1",
                             "--port", str(port)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the dashboard exited with {proc.returncode}; log: {log.name}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the dashboard did not answer on {url} within {timeout:.0f} s; log: {log.name}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def wait_rendered(page, title: str, charts: int, timeout_ms: int = 90_000) -> None:
    """Until the page's title shows, the script has finished (lib.guarded's end marker, no status
    widget), no element is still a loading skeleton, and ``charts`` plotly charts drew."""
    page.wait_for_selector(f'h1:has-text("{title}")', timeout=timeout_ms)
    page.wait_for_function(
        """(n) => {
             if (!document.querySelector('.fl-page-done')) return false;  // lib.guarded's end marker
             if (document.querySelector('[data-testid="stStatusWidget"]')) return false;
             if (document.querySelector('[data-testid="stSkeleton"]')) return false;  // lazy elements loading
             const cs = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
             return cs.length >= n && cs.every(c => c.querySelector('.js-plotly-plot .main-svg'));
           }""",
        arg=charts, timeout=timeout_ms, polling=100)
    page.wait_for_timeout(300)  # plotly's last layout pass


# every plotly chart of the page as plotly.js drew it: title and, per trace, type, name, x and y as strings
CHART_DATA_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(g => {
    const t = (g.layout || {}).title;
    return {title: (t && typeof t === 'object') ? (t.text || '') : (t || ''),
            traces: (g.data || []).map(d => ({type: d.type || 'scatter', name: d.name == null ? null : String(d.name),
                                              x: d.x == null ? null : Array.from(d.x, String),
                                              y: d.y == null ? null : Array.from(d.y, String)}))};
})"""


def chart_data(page) -> list[dict]:
    """The page's plotly charts as drawn (``CHART_DATA_JS``): [{title, traces: [{type, name, x, y}]}]."""
    return page.evaluate(CHART_DATA_JS)


def select_options(page, label: str) -> list[str]:
    """The options a selectbox or multiselect labelled ``label`` offers, read from its open
    drop-down (closed again after)."""
    box = page.locator('[data-testid="stSelectbox"], [data-testid="stMultiSelect"]').filter(
        has=page.locator(f'input[aria-label="{label}"]'))
    options = page.locator(f'[role="listbox"][aria-label="{label}"] [role="option"]')
    for attempt in range(3):  # a click while another drop-down is still closing does not open this one
        box.locator('button[aria-haspopup="listbox"]').click()
        try:
            options.first.wait_for(timeout=5_000)
            break
        except Exception:
            if attempt == 2:
                raise
    texts = [t.strip() for t in options.all_inner_texts()]
    page.keyboard.press("Escape")
    options.first.wait_for(state="detached")
    return texts


def visit_all(url: str, run: str, out: Path, width: int = 1280, height: int = 800, click_probe: bool = True,
              full_page: bool = False, expect_charts: bool = True, only: list[str] | None = None,
              inspect=None) -> dict[str, dict]:
    """Visit every page of the dashboard (or those named in ``only``) for ``run``; screenshots into ``out``. Returns
    {page: {seconds, charts, exceptions, errors}}; seconds from navigation until rendered
    (the probe page: until the probe's chart rendered after the click, model load included).
    ``inspect(page, name) -> dict``, when given, runs on each rendered page after its screenshot;
    what it returns is the page's ``inspect`` entry."""
    from playwright.sync_api import sync_playwright
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            ctx = browser.new_context(viewport={"width": width, "height": height})
            page = ctx.new_page()
            page.set_default_timeout(90_000)
            # warm-up: first load of the app (imports, caches) is not a page's render time
            page.goto(f"{url}/?run={run}", wait_until="domcontentloaded")
            wait_rendered(page, "Groups", 1)
            for name, path, title, charts in PAGES:
                if only is not None and name not in only:
                    continue
                charts = charts if expect_charts else 0  # a real run may lack a page's tables
                t0 = time.perf_counter()
                page.goto(f"{url}/{path}?run={run}", wait_until="domcontentloaded")
                if name == "probe":
                    page.wait_for_selector('h1:has-text("Live probe")')
                    if click_probe:
                        page.get_by_role("button", name="Run probe").click()
                        page.wait_for_function(  # the probe's chart, or its error message
                            """() => document.querySelector('[data-testid="stPlotlyChart"] .main-svg')
                                     || document.querySelector('[data-testid="stAlertContentError"]')""",
                            timeout=240_000, polling=200)
                        wait_rendered(page, title, charts, timeout_ms=240_000)
                    else:
                        wait_rendered(page, title, 0)
                else:
                    wait_rendered(page, title, charts)
                seconds = time.perf_counter() - t0
                shot = out / f"{name}.png"
                if full_page:  # streamlit scrolls inside its main container: grow the viewport instead
                    h = page.evaluate("""() => { const m = document.querySelector('[data-testid="stMain"]');
                                                  return m ? m.scrollHeight : document.body.scrollHeight; }""")
                    page.set_viewport_size({"width": width, "height": int(min(max(h, height), 8000))})
                    page.wait_for_timeout(800)
                page.screenshot(path=str(shot))
                if full_page:
                    page.set_viewport_size({"width": width, "height": height})
                results[name] = {
                    "seconds": round(seconds, 2),
                    "charts": page.locator(".js-plotly-plot").count(),
                    "exceptions": page.locator('[data-testid="stException"]').count(),
                    "errors": [e.inner_text()[:200] for e in page.locator('[data-testid="stAlertContentError"]').all()],
                    "screenshot": str(shot),
                }
                if inspect is not None:
                    results[name]["inspect"] = inspect(page, name)
        finally:
            browser.close()
    return results


def _have_browser() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    return None


@pytest.mark.browser
@pytest.mark.skipif(_have_browser() is not None, reason=str(_have_browser()))
def test_every_page_renders_in_chromium(tmp_path):
    from run_fixtures import make_synthetic_passkey_dir, make_tiny_run
    runs = tmp_path / "runs"
    make_tiny_run(runs / "tiny")
    make_tiny_run(runs / "tiny-k2", num_groups=2, top_k=1, seed=1)
    make_tiny_run(runs / GEMMA_RUN, model="gemma3", layers=6)  # after tiny-k2: tiny's Compare B stays tiny-k2
    make_synthetic_passkey_dir(runs / "passkey")  # the Passkey page's folder (not a run)
    retrieval = runs / "retrieval"  # the Retrieval page's folder: the committed suite output (not a run)
    retrieval.mkdir()
    for name in ("cases", "trace"):
        shutil.copy(REPO / "figures" / "results" / f"retrieval_{name}.parquet", retrieval / f"{name}.parquet")
    shots = tmp_path / "screenshots"
    with dashboard(runs) as url:
        res = visit_all(url, "tiny", shots)
        gemma = visit_all(url, GEMMA_RUN, tmp_path / "screenshots-gemma", inspect=inspect_layers)
    print(json.dumps(res, indent=1))
    print(json.dumps({name: r["seconds"] for name, r in gemma.items()}))
    for result, folder in ((res, shots), (gemma, tmp_path / "screenshots-gemma")):
        for name, _, _, charts in PAGES:
            r = result[name]
            assert r["exceptions"] == 0, (name, r)
            assert not r["errors"], (name, r)
            assert r["charts"] >= charts, (name, r)
            assert (folder / f"{name}.png").stat().st_size > 5_000
    check_routed_layers(gemma, runs / f".{GEMMA_RUN}-assets" / "model" / "config.json")


def inspect_layers(page, name: str) -> dict:
    """What a page shows of the run's layers: its charts as drawn and the options of its layer selectors."""
    out = {"charts": chart_data(page)}
    labels = {"groups": ("Layer", "to layer (from the layer before it)"), "coverage": ("Layer",),
              "audit": ("Layers",)}.get(name, ())
    out["options"] = {label: select_options(page, label) for label in labels}
    return out


def check_routed_layers(res: dict, config: Path) -> None:
    """On the Gemma run every page shows the routed layers, the model's global ones (read from its
    saved config), and no other: layer selectors, the layer axes of the heatmaps and the traces
    of per-layer curves."""
    types = json.loads(config.read_text())["layer_types"]
    routed = [str(i) for i, t in enumerate(types) if t == "full_attention"]
    assert routed == ["2", "5"] and len(types) == 6  # only some layers routed

    def chart(page: str, title: str) -> dict:
        titles = [re.sub(r"<[^>]*>", "", c["title"]) for c in res[page]["inspect"]["charts"]]  # drawn bold
        found = [c for c, t in zip(res[page]["inspect"]["charts"], titles) if t.startswith(title)]
        assert len(found) == 1, (page, title, titles)
        return found[0]

    opts = {page: r["inspect"]["options"] for page, r in res.items()}
    assert opts["groups"]["Layer"] == routed
    assert opts["groups"]["to layer (from the layer before it)"] == routed[1:]
    assert chart("groups", f"layer {routed[0]} → layer {routed[1]}")
    assert opts["coverage"]["Layer"] == ["all", *routed]
    assert [o for o in opts["audit"]["Layers"] if o != "Select all"] == routed  # the multiselect's own first entry
    assert chart("balance", "hard (top-1) group share per layer")["traces"][0]["y"] == routed
    assert chart("coverage", "coverage of dense attention (attention recall), focus mask")["traces"][0]["y"] == routed
    assert chart("probe", "group of each token")["traces"][0]["y"] == routed  # rows: the routed layers only
    assert {t["name"] for t in chart("overview", "largest group share per step, each layer")["traces"]} == set(routed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="screenshots and render times of every dashboard page")
    ap.add_argument("--runs", type=Path, default=REPO / "runs")
    ap.add_argument("--run", default="smollm2-austen")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    ap.add_argument("--repeat", type=int, default=1, help="visits per page (render time: the median)")
    ap.add_argument("--no-probe", action="store_true", help="do not press Run probe (no model load)")
    ap.add_argument("--full-page", action="store_true", help="screenshots of the whole page, not the viewport")
    ap.add_argument("--palette", action="store_true", help="shrink the PNGs to 256 colours (needs Pillow)")
    ap.add_argument("--pages", default=None, help="comma list of the pages to visit, e.g. overview (default: all: "
                    + ", ".join(name for name, *_ in PAGES) + ")")
    a = ap.parse_args(argv)
    only = None if a.pages is None else [x.strip() for x in a.pages.split(",") if x.strip()]
    unknown = sorted(set(only or []) - {name for name, *_ in PAGES})
    if unknown:
        ap.error(f"--pages: unknown page(s) {', '.join(unknown)}")
    runs = a.runs.resolve()
    allres: list[dict] = []
    with dashboard(runs) as url:
        for i in range(a.repeat):
            out = a.out if i == 0 else Path(tempfile.mkdtemp(prefix="focus-lab-shots-"))
            allres.append(visit_all(url, a.run, out, click_probe=not a.no_probe, full_page=a.full_page,
                                    expect_charts=False, only=only))
    summary = {}
    for name in allres[0]:
        secs = [r[name]["seconds"] for r in allres]  # in visit order (the first probe loads the model)
        summary[name] = {**allres[0][name], "seconds_all": secs, "seconds_median": sorted(secs)[len(secs) // 2]}
    if a.palette:
        from PIL import Image
        for png in (a.out / f"{name}.png" for name in allres[0]):
            Image.open(png).convert("RGB").quantize(256, dither=Image.Dither.NONE).save(png, optimize=True)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
