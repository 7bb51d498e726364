"""`primekit dashboard`'s reading of a run directory, its lights and its JSON endpoints."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest

from primekit.config import VizConfig
from primekit.viz.dashboard import DashboardApp, RunFollower, derive
from primekit.viz.server import start_in_thread
from tests.viz.fixture_run import metric_row, write_run


def test_derive():
    healthy, hacked = derive(metric_row(1)), derive(metric_row(15))
    assert healthy["derived/reported"] == 0.5 and healthy["derived/gap"] == 0.0
    assert hacked["derived/reported"] == pytest.approx(1 / (1 + math.exp(-3)))
    assert hacked["derived/gap"] == pytest.approx(1 / (1 + math.exp(-3)) - 0.2)
    assert hacked["derived/prm_acc"] == 0.3  # pairwise first
    no_pairwise = derive({"prm/acc_abs": 0.7})
    assert no_pairwise["derived/prm_acc"] == 0.7 and "derived/gap" not in no_pairwise
    orm = derive({"reward/outcome_mean": 0.5, "explicit/orm_score_mean": 0.9})
    assert orm["derived/gap"] == pytest.approx(0.4)
    assert "derived/reported" not in derive({"reward/outcome_mean": 0.5})  # outcome-only run


def test_follower_reads_incrementally_and_lights_turn(tmp_path):
    run = write_run(tmp_path / "run", steps=10)
    f = RunFollower(run)
    f.poll()
    assert len(f.rows) == 10
    assert f.lights(VizConfig())["gap"]["label"] == "Reward tracks truth"
    assert f.lights(VizConfig())["prm"]["color"] == "green"
    # The trainer appends steps 11..20; the last line is still being written.
    with open(run / "metrics.jsonl", "a") as out:
        for step in range(11, 21):
            out.write(json.dumps(metric_row(step)) + "\n")
        out.write('{"step": 21, "reward/outc')
    f.poll()
    assert [r["step"] for r in f.rows] == list(range(1, 21))
    lights = f.lights(VizConfig())
    assert lights["gap"]["label"] == "Reward hacking" and lights["prm"]["color"] == "red"
    assert lights["gap"]["value"] == pytest.approx(1 / (1 + math.exp(-3)) - 0.2)
    # The latest step's samples only: step 10's two rows (step 9's are replaced).
    assert [s["response"] for s in f.samples] == ["10-0", "10-1"]
    html = f.samples_html()
    assert len(html) == 2 and html[0].count('class="tok"') == 6


def test_dashboard_endpoints(tmp_path):
    runs = [write_run(tmp_path / "a"), write_run(tmp_path / "b", steps=5)]
    server, url = start_in_thread(DashboardApp(runs, VizConfig()).routes())
    try:
        meta = json.loads(urllib.request.urlopen(url + "api/runs").read())
        assert meta["runs"] == [str(r) for r in runs] and meta["thresholds"]["gap_bad"] == 0.3
        a = json.loads(urllib.request.urlopen(url + "api/run?i=0&since=0").read())
        assert a["n"] == 20 and len(a["rows"]) == 20 and a["samples_step"] == 20
        assert a["lights"]["gap"]["color"] == "red"
        a2 = json.loads(urllib.request.urlopen(url + "api/run?i=0&since=20").read())
        assert a2["rows"] == [] and a2["n"] == 20  # nothing new
        b = json.loads(urllib.request.urlopen(url + "api/run?i=1").read())
        assert b["n"] == 5 and b["lights"]["gap"]["color"] == "green"
        assert b"<!doctype html>" in urllib.request.urlopen(url).read()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url + "api/run?i=5")
        assert err.value.code == 400
    finally:
        server.shutdown()


def test_missing_run_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run directory not found"):
        DashboardApp([tmp_path / "nope"], VizConfig())


def _write(path, steps, **extra) -> None:
    path.write_text("".join(json.dumps({**metric_row(s), **extra}) + "\n" for s in steps))


def test_follower_follows_a_file_rewritten_under_it(tmp_path):
    run = write_run(tmp_path / "run", steps=20)
    metrics = run / "metrics.jsonl"
    f = RunFollower(run)
    f.poll()
    assert len(f.rows) == 20 and f.generation == 0
    # A resume from step 12: the file truncated to steps 1-12 in place (same inode, smaller),
    # then steps 13-14 appended. Before, the stale offset read mid-line: HTTP 400 "Extra data".
    lines = metrics.read_text().splitlines(keepends=True)
    with open(metrics, "r+") as out:
        out.truncate(sum(len(x) for x in lines[:12]))
    with open(metrics, "a") as out:
        for step in (13, 14):
            out.write(json.dumps({**metric_row(step), "resumed": 1}) + "\n")
    f.poll()
    assert [r["step"] for r in f.rows] == list(range(1, 15)) and f.generation == 1
    assert f.rows[-1]["resumed"] == 1
    # Rewritten in place to a longer file whose line at the old offset differs (same inode).
    _write(metrics, range(1, 30), resumed=2)
    f.poll()
    assert [r["step"] for r in f.rows] == list(range(1, 30)) and f.generation == 2
    # Replaced by a rename (a new inode), any size.
    (run / "new.jsonl").write_text(json.dumps(metric_row(1)) + "\n")
    (run / "new.jsonl").replace(metrics)
    f.poll()
    assert [r["step"] for r in f.rows] == [1] and f.generation == 3
    # Appends after that are read incrementally again; a line that is not JSON is skipped.
    with open(metrics, "a") as out:
        out.write("{broken\n" + json.dumps(metric_row(2)) + "\n")
    f.poll()
    assert [r["step"] for r in f.rows] == [1, 2] and f.generation == 3
    assert f._metrics.skipped == 1


def test_dashboard_endpoint_across_a_rewrite(tmp_path):
    run = write_run(tmp_path / "run", steps=20)
    server, url = start_in_thread(DashboardApp([run], VizConfig()).routes())
    try:
        a = json.loads(urllib.request.urlopen(url + "api/run?i=0&since=0&gen=-1").read())
        assert a["n"] == 20 and a["gen"] == 0
        _write(run / "metrics.jsonl", range(1, 8))  # a resume rewrote it: steps 1-7
        b = json.loads(urllib.request.urlopen(url + "api/run?i=0&since=20&gen=0").read())
        # The page's generation is stale: everything from row 0, and the new generation.
        assert b["gen"] == 1 and b["since"] == 0 and [r["step"] for r in b["rows"]] == \
            list(range(1, 8))
        c = json.loads(urllib.request.urlopen(url + "api/run?i=0&since=7&gen=1").read())
        assert c["rows"] == [] and c["n"] == 7
    finally:
        server.shutdown()
