"""The viz commands' argument handling (the servers themselves are tested without the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from primekit import cli


def test_dashboard_splits_run_dirs_from_overrides(tmp_path, monkeypatch):
    seen = {}

    def fake(run_dirs, viz, *, port, open_browser):
        seen.update(run_dirs=run_dirs, window=viz.window, port=port, open_browser=open_browser)

    monkeypatch.setattr("primekit.viz.dashboard.run_dashboard", fake)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    assert cli.main(["dashboard", "--no-browser", "--port", "0", str(a), str(b),
                     "viz.window=5"]) == 0
    assert seen == {"run_dirs": [Path(a), Path(b)], "window": 5, "port": 0,
                    "open_browser": False}


def test_sim_takes_overrides_and_the_configured_port(monkeypatch):
    seen = {}

    def fake(cfg, viz, *, port, open_browser, with_map):
        seen.update(beta=cfg.beta, port=port, with_map=with_map, open_browser=open_browser)

    monkeypatch.setattr("primekit.viz.simpage.run_sim", fake)
    assert cli.main(["sim", "--no-browser", "--map", "sim.beta=0.3", "viz.port=9999"]) == 0
    assert seen == {"beta": 0.3, "port": 9999, "with_map": True, "open_browser": False}


def test_bad_override_and_missing_model_are_one_line_errors(tmp_path, capsys):
    assert cli.main(["sim", "--no-browser", "sim.beta=-1"]) == 2
    assert "sim.beta" in capsys.readouterr().err
    assert cli.main(["heatmap", "--model", str(tmp_path / "nope"), "--prm", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["sim", "dashboard", "heatmap", "rerank"])
def test_commands_are_listed(command, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert command in capsys.readouterr().out


@pytest.fixture
def busy_port():
    """A port another server is listening on."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("port, message", [
    ("99999", "--port must be 0 (any free port) to 65535, got 99999"),
    ("-1", "--port must be 0 (any free port) to 65535, got -1"),
    ("busy", "is in use"),
])
@pytest.mark.parametrize("command", [["sim", "--map"], ["dashboard", "RUN"], ["sim", "--live", "RUN"]])
def test_bad_or_busy_port_is_one_line_before_any_work(command, port, message, busy_port,
                                                      tmp_path, capsys, monkeypatch):
    def no_sweep(*a, **k):
        raise AssertionError("the map's sweep ran before the port was checked")

    monkeypatch.setattr("primekit.viz.danger.sweep", no_sweep)
    port = str(busy_port) if port == "busy" else port
    argv = [str(tmp_path) if a == "RUN" else a for a in command]
    assert cli.main([argv[0], "--no-browser", "--port", port, *argv[1:]]) == 2
    err = _one_line(capsys)
    assert err.startswith("primekit: error: ") and message in err
    if port == str(busy_port):
        assert f"port {busy_port} on 127.0.0.1 is in use" in err and "--port 0" in err


def test_configured_port_out_of_range_is_one_line(capsys):
    assert cli.main(["sim", "--no-browser", "viz.port=70000"]) == 2
    assert "got 70000" in _one_line(capsys)


@pytest.mark.parametrize("value", ["0", "-3", "two"])
@pytest.mark.parametrize("command", ["heatmap", "rerank"])
def test_problems_must_be_a_positive_count(command, value, tmp_path, capsys):
    # --problems 0 once meant viz.num_problems' default, and -3 sliced nearly the whole held-out
    # set (497 problems); both are usage errors now, before any model is loaded.
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--model", str(tmp_path), "--prm", str(tmp_path), "--problems", value])
    assert exit_.value.code == 2
    assert "--problems" in capsys.readouterr().err


def _scored(ref: str):
    import torch

    from primekit.data.problem import Problem
    from primekit.viz.scoring import Scored

    problem = Problem(id="p", prompt="1+2=", answer="3", task="arithmetic")
    return Scored(problems=[problem] * 2, responses=["A:3", "A:4"], tokens=[["A:3"], ["A:4"]],
                  scores=torch.tensor([1.0, 0.0]), statuses=["correct", "incorrect"],
                  token_rewards=torch.tensor([[0.2], [-0.1]]), response_mask=torch.ones(2, 1),
                  k=2, beta=0.05, ref=ref)


def test_heatmap_and_rerank_name_the_reference_they_scored_against(tmp_path, monkeypatch):
    # --ref left out with a run's PRM: the reference is the PRM's own, found in its run, and the
    # figure and rerank.json must name that one, not --model (a walkthrough found them naming
    # --model while the console named the PRM's reference).
    seen = []

    def fake(cfg, *, model, prm, ref, num_problems, k, temperature, seed):
        seen.append(ref)
        return _scored("runs/demo/sft-prm")

    monkeypatch.setattr("primekit.viz.scoring.sample_and_score", fake)
    out = tmp_path / "viz"
    common = ["--model", "runs/demo/prime/final/policy", "--prm", "runs/demo/prime/final/prm",
              "--problems", "1", f"viz.out_dir={out}", "viz.rerank_ns=[1,2]", "viz.rerank_draws=2"]
    assert cli.main(["heatmap", *common]) == 0
    assert "vs reference runs/demo/sft-prm (beta" in (out / "heatmap.html").read_text()
    assert cli.main(["rerank", *common]) == 0
    import json

    record = json.loads((out / "rerank.json").read_text())
    assert record["ref"] == "runs/demo/sft-prm" and record["model"].endswith("final/policy")
    assert seen == [None, None]  # the commands passed --ref through unresolved
