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
