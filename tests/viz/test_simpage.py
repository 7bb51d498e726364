"""`primekit sim`'s JSON endpoints drive the toy model: the three scenes over HTTP."""

from __future__ import annotations

import json
import urllib.request

import pytest

from primekit.config import SimConfig, VizConfig
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
    s = post(sim_url, "api/reset", {})
    assert s["t"] == 0 and s["knobs"]["beta"] == 0.25 and s["preset"] == "frozen"
    s = post(sim_url, "api/preset", {"name": "online"})
    assert s["knobs"]["prm_mode"] == "online"


@pytest.mark.parametrize("path, body, message", [
    ("api/step", {"n": 0}, "n must lie in"),
    ("api/preset", {"name": "x"}, "unknown preset"),
    ("api/knobs", {"beta": -1}, "beta must be > 0"),
    ("api/toggle", {"mode": "sideways"}, "PRM mode must be"),
])
def test_bad_input_is_a_400_with_one_line(sim_url, path, body, message):
    with pytest.raises(urllib.error.HTTPError) as err:
        post(sim_url, path, body)
    assert err.value.code == 400 and message in json.loads(err.value.read())["error"]


def test_static_files_and_no_map(sim_url):
    js = urllib.request.urlopen(sim_url + "static/vendor/uPlot.iife.min.js").read()
    assert len(js) > 40_000
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(sim_url + "static/../sim.py")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(sim_url + "api/map")
    assert err.value.code == 400
