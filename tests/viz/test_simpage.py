"""`primekit sim`'s JSON endpoints drive the toy model: the three scenes over HTTP."""

from __future__ import annotations

import json
import urllib.request

import pytest

from primekit.config import ConfigError, SimConfig, VizConfig
from primekit.viz.server import start_in_thread
from primekit.viz.simpage import SimApp


@pytest.fixture
def sim_url():
    server, url = start_in_thread(SimApp(SimConfig(), VizConfig()).routes())
    yield url
    server.shutdown()


def post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())


def test_scenes_over_http(sim_url):
    s = post(sim_url, "api/preset", {"name": "frozen"})
    assert s["knobs"]["prm_mode"] == "frozen" and s["t"] == 0 and not s["shortcut_available"]
    post(sim_url, "api/step", {"n": 30})
    s = post(sim_url, "api/inject", {})
    assert s["shortcut_available"]
    s = post(sim_url, "api/step", {"n": 40, "since": 60})
    assert s["t"] == 70 and [h["step"] for h in s["history"]] == list(range(60, 71))
    assert s["lights"]["gap"]["label"] == "Reward hacking"
    s = post(sim_url, "api/toggle", {})  # no mode: flip
    assert s["knobs"]["prm_mode"] == "online"
    s = post(sim_url, "api/step", {"n": 10})
    assert s["lights"]["gap"]["label"] == "Reward tracks truth"
    s = post(sim_url, "api/knobs", {"beta": 0.25, "prm_lr": 0.01})
    assert s["knobs"] == {"beta": 0.25, "prm_lr": 0.01, "prm_mode": "online"}
    # Reset restores the preset's own knobs (SimConfig's beta 0.5, rate 0.2) and its PRM mode.
    s = post(sim_url, "api/reset", {})
    assert s["t"] == 0 and s["preset"] == "frozen"
    assert s["knobs"] == {"beta": 0.5, "prm_lr": 0.2, "prm_mode": "frozen"}
    post(sim_url, "api/knobs", {"beta": 0.1})
    s = post(sim_url, "api/preset", {"name": "online"})
    assert s["knobs"] == {"beta": 0.5, "prm_lr": 0.2, "prm_mode": "online"}
    assert s["presets"] == {"online": {"beta": 0.5, "prm_lr": 0.2, "prm_mode": "online"},
                            "frozen": {"beta": 0.5, "prm_lr": 0.2, "prm_mode": "frozen"}}
    assert s["bounds"] == {"beta": [0.01, 2.0], "prm_lr": [0.0, 1.0]}


def test_the_issue_beta_is_restored_by_the_frozen_preset(sim_url):
    # Issue 21: beta = 0.1, then "Frozen reward hacks", Play, Inject gave no hack (gap -0.24).
    post(sim_url, "api/knobs", {"beta": 0.1})
    s = post(sim_url, "api/preset", {"name": "frozen"})
    assert s["knobs"]["beta"] == 0.5
    post(sim_url, "api/step", {"n": 30})
    post(sim_url, "api/inject", {})
    s = post(sim_url, "api/step", {"n": 40})
    assert s["lights"]["gap"]["label"] == "Reward hacking"


def error_of(url: str, path: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data,
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req)
    return err.value.code, json.loads(err.value.read())


def test_one_bad_knob_never_blocks_the_other(sim_url):
    # The issue: clearing beta sent null and the whole call failed, rate included.
    code, out = error_of(sim_url, "api/knobs", {"beta": None, "prm_lr": 0.05})
    assert code == 400 and set(out["errors"]) == {"beta"}
    assert out["errors"]["beta"] == ("beta (reward weight beta) must be a number in [0.01, 2], "
                                     "got nothing")
    assert out["state"]["knobs"]["prm_lr"] == 0.05  # the valid one was set
    assert out["state"]["knobs"]["beta"] == 0.5  # the bad one left as it was
    code, out = error_of(sim_url, "api/knobs", {"beta": 10, "prm_lr": 50})
    assert code == 400 and set(out["errors"]) == {"beta", "prm_lr"}
    assert "[0, 1], got 50" in out["errors"]["prm_lr"]
    s = post(sim_url, "api/knobs", {"beta": "2"})  # the bound itself, as the field's text
    assert s["knobs"]["beta"] == 2.0 and "errors" not in s


def test_extreme_knobs_keep_the_state_finite(sim_url):
    # The issue's sequence with the largest knobs allowed: Online, 5 steps, Inject, 200 more.
    post(sim_url, "api/preset", {"name": "online"})
    post(sim_url, "api/knobs", {"beta": 2, "prm_lr": 1})
    post(sim_url, "api/step", {"n": 5})
    post(sim_url, "api/inject", {})
    post(sim_url, "api/step", {"n": 200})
    raw = urllib.request.urlopen(sim_url + "api/state?since=0").read().decode()
    state = json.loads(raw)  # a reload: the whole run, strict JSON
    assert "NaN" not in raw and "Infinity" not in raw
    assert state["t"] == 205 and len(state["history"]) == 206


@pytest.mark.parametrize("path, body, message", [
    ("api/step", {"n": 0}, "n must lie in"),
    ("api/preset", {"name": "x"}, "unknown preset"),
    ("api/knobs", {"beta": -1}, "beta (reward weight beta) must be a number in [0.01, 2]"),
    ("api/knobs", {"lr": 1}, "unknown knob(s) ['lr']"),
    ("api/toggle", {"mode": "sideways"}, "PRM mode must be"),
])
def test_bad_input_is_a_400_with_one_line(sim_url, path, body, message):
    with pytest.raises(urllib.error.HTTPError) as err:
        post(sim_url, path, body)
    assert err.value.code == 400 and message in json.loads(err.value.read())["error"]


def test_static_files_and_404s(sim_url):
    js = urllib.request.urlopen(sim_url + "static/vendor/uPlot.iife.min.js").read()
    assert len(js) > 40_000
    for path in ("static/../sim.py", "api/map", "map.png", "nope"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(sim_url + path)
        assert err.value.code == 404, path
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(sim_url + "api/map")
    assert json.loads(err.value.read()) == {"error": "no map: start with `primekit sim --map`"}
    code, out = error_of(sim_url, "api/step", b"[1, 2]")
    assert code == 400 and out["error"] == "the request body must be a JSON object"


def test_configured_knobs_outside_the_bounds_are_refused():
    with pytest.raises(ConfigError, match=r"sim.beta \(reward weight beta\) must be a number in "
                       r"\[0.01, 2\], got 10"):
        SimApp(SimConfig(beta=10.0), VizConfig())
