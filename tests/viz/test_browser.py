"""The pages in a real browser: headless Chromium (Debian's `chromium`) driven by playwright.

Marked `browser`: the default suite (and `-m slow`) leaves them out; `.ci/browser.sh` installs
Chromium and playwright and runs them (`pytest -m browser`). Without either they skip, saying
which. PRIMEKIT_CHROMIUM overrides the browser binary (default: `chromium` on PATH).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from primekit.config import SimConfig, VizConfig
from primekit.trainer.control import read_control
from primekit.viz.dashboard import DashboardApp
from primekit.viz.live import LiveApp
from primekit.viz.server import start_in_thread
from primekit.viz.simpage import SimApp
from tests.viz.fixture_run import write_run

pytestmark = pytest.mark.browser

SCENE_TIMEOUT_MS = 30_000  # each scene must show within this (they take about 2-5 s)
# A real run's step takes about a second on the tiny model; a busy 2-core machine stretches it.
RUN_TIMEOUT_MS = 120_000
REPO = Path(__file__).resolve().parents[2]


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
        page.click("#preset-frozen")  # the page shows the server's answer when it arrives
        page.wait_for_function("!document.getElementById('prm-online').checked",
                               timeout=SCENE_TIMEOUT_MS)
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
        # Sampled accuracy 0.5 -> 0.3 at step 11: drop 0.2, far beyond its noise.
        assert _label(page, "#run-0 .accuracy-light") == "Accuracy falling"
        assert _label(page, "#run-1 .accuracy-light") == "Not enough steps yet"  # 6 < 10 steps
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


# ---------------------------------------------------------------------------- a real run
@pytest.fixture(scope="module")
def live_run(browser, tiny_model_dir, tmp_path_factory):
    """A real PRIME run under live control, training in a subprocess while the tests look at it:
    the untrained tiny model (its responses are noise; the control's effect on the models is
    tests/trainer/test_live.py's), a small batch, many steps; stopped at the end."""
    run = tmp_path_factory.mktemp("live") / "run"
    run.mkdir()
    overrides = [
        f"model.policy={tiny_model_dir}", f"train.run_dir={run}", "train.steps=400",
        "train.prompts_per_step=4", "train.save_every=0", "train.report_to=[]",
        "train.threads=1", "rollout.max_new_tokens=12", "filter.enabled=false",
        "prm.mini_batch_size=16", "prm.micro_batch_size=16", "policy.mini_batch_size=16",
        "policy.micro_batch_size=16", "policy.ppo_epochs=1", "data.num_train=200",
        "data.num_eval=8", "eval.num_problems=8", "viz.samples_per_step=2", "live.enabled=true",
        "live.poison_problems=8", "live.poison_steps=3", "live.discover_steps=1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")])}
    with open(run.parent / "train.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; from primekit.cli import "
                                 "main; sys.exit(main())", "train", "--config", "tiny",
                                 *overrides], stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=REPO)
        deadline = time.monotonic() + RUN_TIMEOUT_MS / 1000
        while not (run / "metrics.jsonl").exists() and time.monotonic() < deadline:
            if proc.poll() is not None:  # it died before its first step: say why
                pytest.fail(f"the live run exited with {proc.returncode}:\n"
                            f"{(run.parent / 'train.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield run
        proc.terminate()  # SIGTERM: the trainer stops after its step
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _live_rows(run: Path) -> list[dict]:
    """The run's per-step rows so far (the file grows while we read: only whole lines count)."""
    text = (run / "metrics.jsonl").read_text()
    lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]
    return [r for r in map(json.loads, lines) if "live/prm_frozen" in r]


def _last_step(run: Path) -> int:
    """The last step the run has logged (0 before its first)."""
    rows = _live_rows(run)
    return rows[-1]["step"] if rows else 0


def _step(page) -> int:
    return int(page.inner_text("#step-count").split()[1])


def test_live_page_controls_a_real_run(browser, live_run, tmp_path):
    server, url = start_in_thread(LiveApp(live_run, VizConfig()).routes())
    page = browser.new_page(viewport={"width": 1200, "height": 1400})
    start = time.perf_counter()
    try:
        page.goto(url)
        page.wait_for_function("parseInt(document.getElementById('step-count').textContent"
                               ".split(' ')[1]) >= 2", timeout=RUN_TIMEOUT_MS)
        assert page.is_checked("#prm-online")  # the run starts online
        before = _last_step(live_run)  # the trainer's logged steps bound where requests land
        page.uncheck("#prm-online")  # freeze the real PRM mid-run
        page.click("#inject")
        # The page shows the injection pending once its request returned: control.json asks for
        # it from then on.
        page.wait_for_function("document.getElementById('pending').textContent"
                               ".includes('shortcut injection')", timeout=RUN_TIMEOUT_MS)
        assert read_control(live_run) == {"prm": "frozen", "inject": 1}
        after = _last_step(live_run)
        page.wait_for_function("document.getElementById('events').textContent"
                               ".includes('shortcut injected')", timeout=RUN_TIMEOUT_MS)
        rows = _live_rows(live_run)
        frozen = [r["step"] for r in rows if r["live/prm_frozen"] == 1.0]
        injected = [r["step"] for r in rows if r["live/shortcut_injected"] == 1.0]
        # The trainer reads control.json before every step. Both requests were written after step
        # `before` was logged, and the injection while at most step `after` + 1 was running, so
        # it lands on a step in (before, after + 2]. The toggle and the button are two requests,
        # the toggle first: the freeze lands on the injection's step or earlier, never later.
        assert len(injected) == 1 and before < injected[0] <= after + 2, (before, after, injected)
        assert frozen and before < frozen[0] <= injected[0], (before, frozen, injected)
        assert frozen == list(range(frozen[0], frozen[-1] + 1)), frozen  # frozen from then on
        assert "timing/prm_forward" in rows[-1]  # a frozen PRM only scores
        assert rows[-1]["live/pattern_reward"] > rows[0]["live/pattern_reward"]  # head start
        assert "PRM frozen" in page.inner_text("#events")
        page.check("#prm-online")  # and back online
        page.wait_for_function("document.getElementById('events').textContent"
                               ".split('PRM online').length === 3", timeout=RUN_TIMEOUT_MS)
        online = [r["step"] for r in _live_rows(live_run) if r["live/prm_frozen"] == 0.0]
        assert online[-1] > injected[0]
        assert page.inner_text("#pending") == ""
        assert page.locator("#prm-light .label").inner_text() != "-"
        assert page.locator("#accuracy-light .label").inner_text() != "-"  # set by every poll
        assert page.locator("#samples .tok").count() > 0  # the latest responses, coloured
        shot = tmp_path / "live.png"
        page.screenshot(path=str(shot), full_page=True)
        colours, inked = _not_blank(shot)
        assert colours > 50 and inked > 0.02
        for chart in ("chart", "shortcut-chart"):
            png = tmp_path / f"{chart}.png"
            page.locator(f"#{chart} canvas").first.screenshot(path=str(png))
            assert _not_blank(png)[1] > 0.01, chart
        _keep(shot)
        print(f"live page: {time.perf_counter() - start:.0f} s, run at step {_step(page)}")
    finally:
        page.close()
        server.shutdown()


def test_dashboard_follows_a_real_run(browser, live_run, tmp_path):
    server, url = start_in_thread(DashboardApp([live_run], VizConfig()).routes())
    page = browser.new_page(viewport={"width": 1200, "height": 1400})
    try:
        page.goto(url)
        page.wait_for_function("parseInt(document.getElementById('run-0')?.dataset.lines) > 0",
                               timeout=RUN_TIMEOUT_MS)
        first = int(page.locator("#run-0").get_attribute("data-lines"))
        shown = page.inner_text("#run-0 .run-step")
        # The run goes on; the open page (never reloaded) follows it.
        page.wait_for_function(f"parseInt(document.getElementById('run-0').dataset.lines) >= "
                               f"{first + 3}", timeout=RUN_TIMEOUT_MS)
        assert page.inner_text("#run-0 .run-step") != shown
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
        png = tmp_path / "dashboard-live.png"
        page.locator("#run-0 .chart-acc canvas").first.screenshot(path=str(png))
        assert _not_blank(png)[1] > 0.01
        shot = tmp_path / "dashboard-live-page.png"
        page.screenshot(path=str(shot), full_page=True)
        _keep(shot)
    finally:
        page.close()
        server.shutdown()
