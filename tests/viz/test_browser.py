"""The pages in a real browser: headless Chromium (Debian's `chromium`) driven by playwright.

Marked `browser`: the default suite (and `-m slow`) leaves them out; `.ci/browser.sh` installs
Chromium and playwright and runs them (`pytest -m browser`). Without either they skip, saying
which. PRIMEKIT_CHROMIUM overrides the browser binary (default: `chromium` on PATH).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from primekit.config import SimConfig, VizConfig
from primekit.viz.dashboard import DashboardApp
from primekit.viz.server import start_in_thread
from primekit.viz.simpage import SimApp
from tests.viz.fixture_run import write_run

pytestmark = pytest.mark.browser

SCENE_TIMEOUT_MS = 30_000  # each scene must show within this (they take about 2-5 s)


def _chromium() -> str:
    path = os.environ.get("PRIMEKIT_CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.skip("no Chromium: apt-get install chromium (or set PRIMEKIT_CHROMIUM); "
                    ".ci/browser.sh does both")
    return path


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed: pip install 'primekit[browser]'")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=_chromium(), headless=True,
                              args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def _not_blank(png: Path) -> tuple[int, float]:
    """(distinct colours, share of non-white pixels) of a screenshot."""
    import matplotlib.image

    img = (matplotlib.image.imread(png)[..., :3] * 255).astype(np.uint8)  # [H, W, 3]
    colours = len(np.unique(img.reshape(-1, 3), axis=0))
    return colours, float((img.min(-1) < 250).mean())


def _label(page, selector: str) -> str:
    return page.locator(f"{selector} .label").inner_text()


def test_sim_page_shows_the_three_scenes(browser, tmp_path):
    server, url = start_in_thread(SimApp(SimConfig(), VizConfig()).routes())
    page = browser.new_page(viewport={"width": 1200, "height": 1000})
    try:
        page.goto(url)
        page.click("#preset-frozen")
        assert not page.is_checked("#prm-online")
        page.click("#play")
        page.wait_for_function("parseInt(document.getElementById('step-count').textContent"
                               ".split(' ')[1]) >= 20", timeout=SCENE_TIMEOUT_MS)
        assert _label(page, "#gap-light") == "Reward tracks truth"  # before the shortcut
        page.click("#inject")
        page.wait_for_function("document.querySelector('#gap-light .label').textContent"
                               " === 'Reward hacking'", timeout=SCENE_TIMEOUT_MS)
        assert page.locator("#gap-light").get_attribute("data-color") == "red"
        hacked = tmp_path / "sim-hacking.png"
        page.screenshot(path=str(hacked))
        page.check("#prm-online")  # the toggle, mid-run, while playing
        page.wait_for_function("document.querySelector('#gap-light .label').textContent"
                               " === 'Reward tracks truth'", timeout=SCENE_TIMEOUT_MS)
        assert page.locator("#gap-light").get_attribute("data-color") == "green"
        assert "PRM online" in page.inner_text("#events")
        page.click("#play")  # pause
        recovered = tmp_path / "sim-recovered.png"
        page.screenshot(path=str(recovered))
        for shot in (hacked, recovered):
            colours, inked = _not_blank(shot)
            assert colours > 50 and inked > 0.02, (shot, colours, inked)
        chart = tmp_path / "chart.png"
        page.locator("#chart canvas").first.screenshot(path=str(chart))
        assert _not_blank(chart)[1] > 0.01  # curves drawn on the canvas
        _keep(hacked, recovered)
    finally:
        page.close()
        server.shutdown()


def test_dashboard_renders_a_fixture_run(browser, tmp_path):
    runs = [write_run(tmp_path / "hacked"), write_run(tmp_path / "short", steps=6)]
    server, url = start_in_thread(DashboardApp(runs, VizConfig()).routes())
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    try:
        page.goto(url)
        page.wait_for_function("document.getElementById('run-1')?.dataset.lines === '6'",
                               timeout=SCENE_TIMEOUT_MS)
        assert page.locator("#run-0").get_attribute("data-lines") == "20"
        assert _label(page, "#run-0 .gap-light") == "Reward hacking"
        assert _label(page, "#run-0 .prm-light") == "PRM wrong"
        assert _label(page, "#run-1 .gap-light") == "Reward tracks truth"
        assert _label(page, "#run-1 .prm-light") == "PRM accurate"
        assert page.locator("#run-0 .samples .tok").count() == 12  # 2 responses x 6 tokens
        assert page.locator("#run-0 canvas").count() == 4  # four charts
        chart = tmp_path / "acc.png"
        page.locator("#run-0 .chart-acc canvas").first.screenshot(path=str(chart))
        assert _not_blank(chart)[1] > 0.01
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        colours, inked = _not_blank(shot)
        assert colours > 50 and inked > 0.02
        _keep(shot)
    finally:
        page.close()
        server.shutdown()


def _keep(*shots: Path) -> None:
    """Copy screenshots to $PRIMEKIT_SCREENSHOTS when set (.ci/browser.sh keeps them)."""
    out = os.environ.get("PRIMEKIT_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        for s in shots:
            shutil.copy(s, Path(out) / s.name)
