"""The experiment's progress display: each running run's step from its metrics.jsonl, and an ETA
from the running runs' own rates (a resumed run counted from its checkpoint's step)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from primekit.experiment.runner import Display, Running, latest_step


def write_steps(run_dir: Path, last: int, cut: bool = False) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": s, "reward/outcome_mean": 0.5}) for s in range(1, last + 1)]
    text = "\n".join(lines) + "\n"
    if cut:  # a crash mid-line: the cut line is not a step
        text += '{"step": ' + str(last + 1) + ', "rew'
    (run_dir / "metrics.jsonl").write_text(text)
    return run_dir


def test_latest_step_reads_the_last_complete_line(tmp_path):
    assert latest_step(tmp_path / "nothing") is None
    assert latest_step(write_steps(tmp_path / "a", 7)) == 7
    assert latest_step(write_steps(tmp_path / "b", 7, cut=True)) == 7
    # 3000 lines (~100 KB) are more than the 64 KiB read from the end: still the last one.
    assert latest_step(write_steps(tmp_path / "c", 3000)) == 3000


def test_eta_from_running_rates_and_runs_left(tmp_path):
    a, b = write_steps(tmp_path / "A", 50), write_steps(tmp_path / "B", 55)
    now = time.time() + 1  # launched before their metrics.jsonl was written (the older is stale)
    d = Display(total=4, done=1, parallel=2, live=False)
    # A: fresh, 100 s for 50 steps -> 2 s/step; 50 steps left = 100 s; a whole run 200 s.
    d.started("A", Running(a, 100, 0, now - 100))
    # B: resumed at step 40, 30 s for 15 steps -> 2 s/step; 45 steps left = 90 s; whole 200 s.
    d.started("B", Running(b, 100, 40, now - 30))
    # One run left (4 - 1 done - 2 running) at the mean whole run, 200 s:
    # (100 + 90 + 200) / 2 slots = 195 s.
    assert d.eta(now) == "3m15s"
    # A finished run of 300 s this session joins the mean: (300 + 200 + 200) / 3 = 233.3 s;
    # (100 + 90 + 233.3) / 2 = 211.7 s.
    d.durations.append(300.0)
    assert d.eta(now) == "3m32s"
    assert d.steps() == "A 50/100, B 55/100"


def test_eta_unknown_until_a_step_or_a_run_is_done(tmp_path):
    now = time.time()
    d = Display(total=3, done=0, parallel=2, live=False)
    # Resumed at step 40, no step of this attempt logged yet: no rate.
    d.started("A", Running(write_steps(tmp_path / "A", 40), 100, 40, now - 20))
    assert d.eta(now) == "?"
    assert d.steps() == "A 40/100"
    # A run of 120 s finished earlier this session: A counts as half a run (60 s), two runs left
    # (3 - 0 done - 1 running; 2 x 120 s): (60 + 240) / 2 slots = 150 s.
    d.durations.append(120.0)
    assert d.eta(now) == "2m30s"


def test_a_resumed_runs_stale_steps_are_not_a_rate(tmp_path):
    # The last attempt logged up to step 114 after its checkpoint at 100; until the resumed run
    # starts (and drops them) its metrics.jsonl is older than the launch: no rate from it.
    run_dir = write_steps(tmp_path / "A", 114)
    launch = 1.8e9
    os.utime(run_dir / "metrics.jsonl", (launch - 60, launch - 60))
    d = Display(total=1, done=0, parallel=1, live=False)
    d.started("A", Running(run_dir, 160, 100, launch))
    assert d.eta(launch + 5) == "?"
    os.utime(run_dir / "metrics.jsonl", (launch + 70, launch + 70))  # written by this attempt
    # 14 steps in 70 s = 5 s/step; 46 steps left = 230 s.
    assert d.eta(launch + 70) == "3m50s"


def test_tick_prints_the_steps_at_its_interval(tmp_path, capsys):
    d = Display(total=2, done=0, parallel=1, live=False, every=60)
    d.started("A", Running(write_steps(tmp_path / "A", 12), 40, 0, 1000.0))
    d._last_tick = 1000.0
    d.tick(now=1030.0)  # before the interval: nothing
    assert capsys.readouterr().out == ""
    d.tick(now=1060.0)  # 60 s for 12 steps = 5 s/step: 28 steps left = 140 s, 1 run left = 200 s
    out = capsys.readouterr().out
    # (140 + 200) / 1 slot = 340 s.
    assert "progress: A 12/40 [0/2; done 0 · running 1 · left 1 · eta 5m40s]" in out
    d.tick(now=1090.0)  # the interval counts from the last line
    assert capsys.readouterr().out == ""
    d.ended("A")
    d.tick(now=2000.0)  # nothing running: nothing to say
    assert capsys.readouterr().out == ""


def test_a_finished_resumed_attempt_counts_as_a_whole_run(tmp_path):
    d = Display(total=2, done=0, parallel=1, live=False)
    d.started("A", Running(tmp_path / "A", 160, 100, 0.0))
    d.ended("A", 300.0)  # 60 steps of 160 in 300 s: a whole run 300 x 160 / 60 = 800 s
    d.done += 1
    d.started("B", Running(tmp_path / "B", 160, 0, 0.0))
    d.ended("B", None)  # failed: no length
    d.failed += 1
    assert d.durations == [800.0]
    assert d.running == [] and d.active == {}
