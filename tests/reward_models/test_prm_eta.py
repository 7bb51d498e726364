"""Clip's threshold from a step PRM's held-out probabilities: the rule, and the warning at RL start
when eta does not suit the PRM (gao-clip-delta: eta 0.25 left Clip-Delta's reward exactly 0)."""

from __future__ import annotations

import json

import pytest
import torch

from primekit.config import ConfigError
from primekit.reward_models.dense import _warn_about_eta
from primekit.reward_models.prm import eta_warning, resolve_eta, suggested_eta


def test_suggested_eta_is_halfway_between_the_class_medians():
    probs = torch.tensor([0.1, 0.3, 0.2, 0.9, 0.7, 0.8, 0.6])
    correct = torch.tensor([0, 0, 0, 1, 1, 1, 1], dtype=torch.bool)
    # wrong: 0.1, 0.2, 0.3 -> median 0.2; right: 0.6, 0.7, 0.8, 0.9 -> median (0.7 + 0.8) / 2 = 0.75
    # eta = (0.2 + 0.75) / 2 = 0.475
    assert suggested_eta(probs, correct) == pytest.approx(0.475)
    assert suggested_eta(probs, torch.ones(7, dtype=torch.bool)) is None
    assert suggested_eta(probs, torch.zeros(7, dtype=torch.bool)) is None


# gao-clip-delta's arithmetic step PRM (runs/arithmetic/step-prm/train_metrics.json, rounded)
ARITH = {"step_prm/heldout_prob_label0_p25": 0.605, "step_prm/heldout_prob_label1_p75": 0.927,
         "step_prm/suggested_eta": 0.797}


@pytest.mark.parametrize("eta, expected", [
    (0.25, "explicit.eta=0.25 is below 0.60, the lower quartile of this PRM's probabilities on "
           "held-out steps labelled wrong: Clip will penalise fewer than a quarter of the wrong "
           "steps; this PRM's held-out steps suggest explicit.eta=0.80 (explicit.eta=auto takes it)"),
    (0.80, None),
    (0.95, "explicit.eta=0.95 is above 0.93, the upper quartile of this PRM's probabilities on "
           "held-out steps labelled right: Clip will penalise more than three quarters of the "
           "right steps; this PRM's held-out steps suggest explicit.eta=0.80 (explicit.eta=auto "
           "takes it)"),
])
def test_eta_warning(eta, expected):
    assert eta_warning(eta, ARITH) == expected


def test_no_warning_without_the_quartiles():
    assert eta_warning(0.01, {}) is None


def test_the_rewarder_warns_from_the_prm_directory(tmp_path, capsys):
    (tmp_path / "train_metrics.json").write_text(json.dumps({"summary": ARITH}))
    _warn_about_eta(str(tmp_path), 0.25)
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "warning: explicit.eta=0.25 is below 0.60" in out and "suggest explicit.eta=0.80" in out
    _warn_about_eta(str(tmp_path), 0.8)
    _warn_about_eta("some-org/hub-prm", 0.25)  # not a local directory: nothing to read
    assert capsys.readouterr().out == ""


def test_resolve_eta(tmp_path):
    assert resolve_eta(0.25, None) == 0.25
    (tmp_path / "train_metrics.json").write_text(json.dumps({"summary": ARITH}))
    assert resolve_eta("auto", str(tmp_path)) == 0.797
    with pytest.raises(ConfigError, match="explicit.eta=auto: no step_prm/suggested_eta in "):
        resolve_eta("auto", str(tmp_path / "missing"))
