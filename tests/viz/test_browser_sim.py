"""The sim page's controls in a real browser (headless Chromium via playwright; marker `browser`,
run by .ci/browser.sh, skipped without Chromium or playwright): presets restore their knobs, a bad
knob is an inline error that blocks nothing else, and extreme knobs never blank the page; the
dashboard's axes and legends, and the dashboard following a metrics.jsonl rewritten under it.

Every check waits for the page's answer from the server (the knobs the server holds are mirrored
in `document.body.dataset.knobs`, its step in `dataset.t`), never reads right after a click.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from primekit.config import SimConfig, VizConfig
from primekit.viz.dashboard import DashboardApp
from primekit.viz.server import start_in_thread
from primekit.viz.simpage import SimApp
from tests.viz.fixture_run import metric_row, write_run

pytestmark = pytest.mark.browser

TIMEOUT_MS = 120_000  # generous: a busy 2-core machine; each wait ends as soon as its answer shows


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed: pip install 'primekit[browser]'")
    path = os.environ.get("PRIMEKIT_CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.skip("no Chromium: apt-get install chromium (or set PRIMEKIT_CHROMIUM); "
                    ".ci/browser.sh does both")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True,
                              args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def sim_page(browser):
    server, url = start_in_thread(SimApp(SimConfig(), VizConfig()).routes())
    page = browser.new_page(viewport={"width": 1200, "height": 1100})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(url)
    _wait_knobs(page, "k.beta === 0.5 && k.prm_lr === 0.2")
    yield page, url
    assert dialogs == []  # no alert(), ever
    page.close()
    server.shutdown()


def _wait_knobs(page, condition: str) -> dict:
    """Wait until the knobs the server last answered with (k) satisfy `condition`."""
    page.wait_for_function(f"(() => {{ const d = document.body.dataset.knobs; if (!d) return false;"
                           f" const k = JSON.parse(d); return {condition}; }})()",
                           timeout=TIMEOUT_MS)
    return json.loads(page.evaluate("document.body.dataset.knobs"))


def _wait_step(page, at_least: int) -> int:
    page.wait_for_function(f"parseInt(document.body.dataset.t) >= {at_least}", timeout=TIMEOUT_MS)
    return int(page.evaluate("document.body.dataset.t"))


def _set(page, selector: str, text: str) -> None:
    page.fill(selector, text)
    page.press(selector, "Enter")  # `change` fires: the page sends this one knob


def test_preset_restores_its_knobs_after_a_change(sim_page):
    page, _ = sim_page
    assert "\u03b2 0.5, rate 0.2, PRM frozen" in page.inner_text("#preset-frozen")
    _set(page, "#beta", "0.1")
    _set(page, "#prm-lr", "0")
    _wait_knobs(page, "k.beta === 0.1 && k.prm_lr === 0")
    page.click("#preset-frozen")
    knobs = _wait_knobs(page, "k.prm_mode === 'frozen'")
    assert knobs == {"beta": 0.5, "prm_lr": 0.2, "prm_mode": "frozen"}
    page.wait_for_function("document.getElementById('beta').value === '0.5'", timeout=TIMEOUT_MS)
    assert page.input_value("#prm-lr") == "0.2"
    assert page.is_disabled("#prm-lr")  # frozen: the update rate does nothing
    # The issue's scene now hacks: Play, Inject, the gap light turns red.
    page.fill("#speed", "5")
    page.click("#play")
    _wait_step(page, 30)
    page.click("#inject")
    page.wait_for_function("document.querySelector('#gap-light .label').textContent"
                           " === 'Reward hacking'", timeout=TIMEOUT_MS)
    page.click("#play")
    _set(page, "#beta", "0.3")
    _wait_knobs(page, "k.beta === 0.3")
    page.click("#reset")  # Reset restores the current preset's knobs too
    _wait_knobs(page, "k.beta === 0.5 && k.prm_mode === 'frozen'")
    page.wait_for_function("document.getElementById('beta').value === '0.5'", timeout=TIMEOUT_MS)
    assert page.inner_text("#step-count") == "step 0"


def test_out_of_range_knob_is_inline_and_the_other_still_applies(sim_page):
    page, _ = sim_page
    _set(page, "#beta", "10")
    page.wait_for_function("document.getElementById('beta-error').textContent.length > 0",
                           timeout=TIMEOUT_MS)
    assert page.inner_text("#beta-error") == (
        "beta (reward weight beta) must be a number in [0.01, 2], got '10'")
    assert page.input_value("#beta") == "10"  # the user's text stays beside its error
    _set(page, "#prm-lr", "0.05")  # the other knob, while beta is still wrong
    knobs = _wait_knobs(page, "k.prm_lr === 0.05")
    assert knobs["beta"] == 0.5 and page.inner_text("#prm-lr-error") == ""
    assert page.inner_text("#beta-error") != ""
    _set(page, "#beta", "")  # cleared: an error, not a crash
    page.wait_for_function("document.getElementById('beta-error').textContent.endsWith("
                           "'got nothing')", timeout=TIMEOUT_MS)
    _set(page, "#beta", "0.25")  # fixed: the error goes
    _wait_knobs(page, "k.beta === 0.25")
    page.wait_for_function("document.getElementById('beta-error').textContent === ''",
                           timeout=TIMEOUT_MS)


def test_extreme_knobs_never_blank_the_page(sim_page, tmp_path):
    page, url = sim_page
    page.click("#preset-online")
    _set(page, "#beta", "2")
    _set(page, "#prm-lr", "1")  # the largest allowed (the issue's 10 and 50 are refused)
    _wait_knobs(page, "k.beta === 2 && k.prm_lr === 1")
    page.fill("#speed", "20")
    page.click("#step")
    _wait_step(page, 1)
    page.click("#inject")
    page.wait_for_function("document.getElementById('inject').disabled", timeout=TIMEOUT_MS)
    page.click("#play")
    _wait_step(page, 300)
    page.click("#play")
    page.wait_for_function("document.getElementById('play').textContent === 'Play'",
                           timeout=TIMEOUT_MS)
    assert page.inner_text("#status") == ""  # no step was refused
    # The server's state is strict JSON with finite numbers only.
    raw = page.evaluate("fetch('/api/state?since=0').then(r => r.text())")
    assert "NaN" not in raw and "Infinity" not in raw
    state = json.loads(raw)
    assert all(math.isfinite(h[k]) for h in state["history"]
               for k in ("accuracy", "reported", "prm_accuracy", "gap"))
    page.reload()  # a reload shows the run: knobs, lights, curves
    t = _wait_step(page, state["t"])
    assert t >= state["t"] and page.inner_text("#step-count") == f"step {t}"
    _wait_knobs(page, "k.beta === 2 && k.prm_lr === 1")
    assert page.input_value("#beta") == "2" and page.input_value("#prm-lr") == "1"
    assert page.locator("#gap-light").get_attribute("data-color") in ("green", "amber", "red")
    assert page.locator("#prm-light").get_attribute("data-color") in ("green", "amber", "red")
    chart = tmp_path / "chart.png"
    page.locator("#chart canvas").first.screenshot(path=str(chart))
    assert _inked(chart) > 0.01  # curves drawn
    shot = tmp_path / "sim-extreme.png"
    page.screenshot(path=str(shot), full_page=True)
    _keep(shot)


def test_events_window_and_resize(sim_page, tmp_path):
    page, _ = sim_page
    page.click("#preset-frozen")
    _wait_knobs(page, "k.prm_mode === 'frozen'")
    page.fill("#speed", "10")
    page.click("#play")
    _wait_step(page, 30)
    page.click("#inject")
    _wait_step(page, 120)
    page.check("#prm-online")
    _wait_knobs(page, "k.prm_mode === 'online'")
    _wait_step(page, 200)
    page.click("#play")
    page.wait_for_function("document.getElementById('play').textContent === 'Play'",
                           timeout=TIMEOUT_MS)
    # Sliding window: the last 100 steps only, then the whole run.
    page.select_option("#x-window", "100")
    xmin, xmax = page.evaluate("[chart.scales.x.min, chart.scales.x.max]")
    assert xmax - xmin == 100
    page.select_option("#x-window", "0")
    assert page.evaluate("chart.scales.x.min") == 0
    # Integer step ticks only.
    ticks = page.evaluate("chart.axes[0]._values")
    assert ticks and all(v == "" or v.isdigit() for v in ticks), ticks
    # Charts follow the window: narrower viewport, narrower canvas.
    wide = page.evaluate("chart.width")
    page.set_viewport_size({"width": 800, "height": 1100})
    page.wait_for_function(f"chart.width < {wide - 200}", timeout=TIMEOUT_MS)
    shot = tmp_path / "sim-events.png"
    page.screenshot(path=str(shot), full_page=True)
    _keep(shot)


def test_dashboard_ticks_legend_and_a_rewritten_file(browser, tmp_path):
    run = write_run(tmp_path / "run", steps=6)
    server, url = start_in_thread(DashboardApp([run], VizConfig()).routes())
    page = browser.new_page(viewport={"width": 1200, "height": 1400})
    try:
        page.goto(url)
        page.wait_for_function("document.getElementById('run-0')?.dataset.lines === '6'",
                               timeout=TIMEOUT_MS)
        for chart in ("acc", "prm", "hack", "timing"):
            # uPlot draws the tick labels on the canvas; these are the strings it drew.
            ticks = [t for t in page.evaluate(f"runs[0].charts.{chart}.axes[0]._values") if t]
            assert ticks and all(t.isdigit() for t in ticks), (chart, ticks)  # 1, 2, ... only
            labels = page.locator(f"#run-0 .chart-{chart} .u-legend th").all_inner_texts()
            assert len(labels) == len(set(labels)), (chart, labels)  # one entry per series
        # A resume rewrites metrics.jsonl under the open page: steps 1-3, then 4 new ones.
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({**metric_row(s), "reward/outcome_mean": 0.9}) + "\n" for s in range(1, 8)))
        page.wait_for_function("document.getElementById('run-0').dataset.lines === '7'",
                               timeout=TIMEOUT_MS)
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
        assert page.inner_text("#run-0 .run-step") == "7 metric lines"
    finally:
        page.close()
        server.shutdown()


def _inked(png: Path) -> float:
    import matplotlib.image

    img = (matplotlib.image.imread(png)[..., :3] * 255).astype(np.uint8)  # [H, W, 3]
    return float((img.min(-1) < 250).mean())


def _keep(*shots: Path) -> None:
    """Copy screenshots to $PRIMEKIT_SCREENSHOTS when set (.ci/browser.sh keeps them)."""
    out = os.environ.get("PRIMEKIT_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        for s in shots:
            shutil.copy(s, Path(out) / s.name)
