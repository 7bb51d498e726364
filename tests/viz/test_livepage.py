"""`primekit sim --live`'s server (primekit/viz/live.py) over HTTP, on a hand-written run."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from primekit import cli
from primekit.config import VizConfig
from primekit.trainer.control import read_control, write_control
from primekit.viz.live import LiveApp, live_events
from primekit.viz.server import start_in_thread
from tests.viz.fixture_run import metric_row


def live_row(step: int) -> dict:
    """Frozen from step 3 (injected there), online again from step 6."""
    return {**metric_row(step), "live/prm_frozen": float(3 <= step < 6),
            "live/shortcut_injected": float(step == 3), "live/injections": float(step >= 3),
            "live/shortcut_rate": 0.5 if step >= 3 else 0.0, "live/pattern_reward": 0.9}


def write_live_run(run, steps: int):
    run.mkdir(exist_ok=True)
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps(live_row(s)) + "\n")
    return run


def call(url: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path.lstrip("/"), data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_events_follow_the_live_metrics():
    rows = [live_row(s) for s in range(1, 8)] + [{"step": 7, "eval/pass@1_greedy": 0.5}]
    assert live_events(rows) == [
        {"step": 1, "event": "PRM online"}, {"step": 3, "event": "PRM frozen"},
        {"step": 3, "event": "shortcut injected"}, {"step": 6, "event": "PRM online"}]


def test_state_toggle_and_inject_over_http(tmp_path):
    run = write_live_run(tmp_path / "run", 4)
    server, url = start_in_thread(LiveApp(run, VizConfig()).routes())
    try:
        s = call(url, "/api/state?since=0")
        assert s["n"] == 4 and s["step"] == 4 and len(s["rows"]) == 4
        assert s["rows"][0]["derived/verifier_acc"] == 0.5  # the dashboard's derived keys
        assert s["applied"] == {"prm": "frozen", "injections": 1}
        assert s["requested"] == {"prm": "online", "inject": 0}  # no control file yet
        assert [e["event"] for e in s["events"]] == ["PRM online", "PRM frozen",
                                                      "shortcut injected"]
        s = call(url, "/api/toggle", {"mode": "frozen", "since": 4})
        assert read_control(run) == {"prm": "frozen", "inject": 0} and s["rows"] == []
        call(url, "/api/inject", {})
        s = call(url, "/api/inject", {})
        assert read_control(run) == {"prm": "frozen", "inject": 2}
        assert s["requested"] == {"prm": "frozen", "inject": 2}
        with open(run / "metrics.jsonl", "a") as f:  # the run goes on
            f.write(json.dumps(live_row(5)) + "\n")
        s = call(url, "/api/state?since=4")
        assert [r["step"] for r in s["rows"]] == [5] and s["step"] == 5
        with pytest.raises(urllib.error.HTTPError) as e:
            call(url, "/api/toggle", {"mode": "paused"})
        assert e.value.code == 400
    finally:
        server.shutdown()


def test_the_page_picks_up_an_existing_control_file(tmp_path):
    run = write_live_run(tmp_path / "run", 2)
    write_control(run, prm="frozen", inject=3)
    app = LiveApp(run, VizConfig())
    assert app.state()["requested"] == {"prm": "frozen", "inject": 3}
    with pytest.raises(FileNotFoundError, match="run directory not found"):
        LiveApp(tmp_path / "nope", VizConfig())


def test_sim_live_dispatches_to_the_live_page(tmp_path, monkeypatch):
    seen = {}

    def fake(run_dir, viz, *, port, open_browser):
        seen.update(run_dir=run_dir, port=port, open_browser=open_browser)

    monkeypatch.setattr("primekit.viz.live.run_live", fake)
    assert cli.main(["sim", "--no-browser", "--port", "0", "--live", str(tmp_path)]) == 0
    assert seen == {"run_dir": tmp_path, "port": 0, "open_browser": False}
    assert cli.main(["sim", "--no-browser", "--map", "--live", str(tmp_path)]) == 2
