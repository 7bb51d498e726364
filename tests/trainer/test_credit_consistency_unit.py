"""The config switches of issue 23 (algorithm.credit, filter.consistency_drop, the step light's
thresholds) and the trainer's consistency phase on a hand-made batch (no model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from primekit.config import ConfigError, load_config
from primekit.rollout.base import RolloutBatch
from primekit.trainer.collect import consistency_select
from primekit.trainer.experience import Experience

TINY = Path(__file__).resolve().parents[2] / "primekit" / "configs" / "tiny.yaml"


@pytest.mark.parametrize(("overrides", "message"), [
    (["algorithm.credit=max"], "algorithm.credit: Input should be 'sum' or 'min', got 'max'"),
    (["algorithm.credit_temperature=0"], "algorithm.credit_temperature: Input should be greater"),
    (["algorithm.credit=min", "algorithm.reward_mode=outcome"],
     "algorithm.credit: 'min' assigns credit over a process reward's steps"),
    (["filter.consistency_drop=1", "algorithm.reward_mode=outcome"],
     "filter.consistency_drop: consistency filtering compares the dense reward"),
    (["filter.consistency_drop=3"],  # K = 4, rloo needs 2 per group
     "filter.consistency_drop: 3 of rollout.n_samples=4 leaves fewer than 2 samples"),
    (["filter.consistency_drop=-1"], "filter.consistency_drop: Input should be greater than"),
    (["viz.steps_warn=0.6", "viz.steps_bad=0.5"], "viz.steps_warn/viz.steps_bad: need warn <= bad"),
])
def test_bad_settings_fail_with_one_line_naming_the_field(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, overrides)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_good_settings_load():
    cfg = load_config(TINY, ["algorithm.credit=min", "algorithm.credit_temperature=0.02",
                             "filter.consistency_drop=2"])
    assert (cfg.algorithm.credit, cfg.algorithm.credit_temperature) == ("min", 0.02)
    assert cfg.filter.consistency_drop == 2
    # reinforce needs only one sample per group: 3 of 4 may go
    assert load_config(TINY, ["filter.consistency_drop=3",
                              "algorithm.estimator=reinforce"]).filter.consistency_drop == 3
    defaults = load_config(TINY)
    assert (defaults.algorithm.credit, defaults.filter.consistency_drop) == ("sum", 0)


def _experience() -> Experience:
    # 2 groups of K = 3; response i has i + 1 valid tokens of reward r_i each.
    n, t = 6, 6
    mask = (torch.arange(t)[None, :] < torch.arange(1, n + 1)[:, None]).long()  # [6, 6]
    per_token = torch.tensor([0.5, -0.2, 0.1, 0.3, 0.0, -0.1])
    batch = RolloutBatch(prompt_ids=torch.ones(n, 2, dtype=torch.long),
                         prompt_mask=torch.ones(n, 2, dtype=torch.long),
                         response_ids=torch.arange(n * t).view(n, t) % 7 + 1,
                         response_mask=mask, sampling_logprobs=torch.zeros(n, t),
                         finished=torch.ones(n, dtype=torch.bool),
                         responses=[f"r{i}" for i in range(n)])
    return Experience(batch=batch, problems=[f"p{i // 3}" for i in range(n)],
                      verdicts=[f"v{i}" for i in range(n)],
                      group_ids=torch.arange(2).repeat_interleave(3),
                      outcome_rewards=torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 1.0]),
                      old_logprobs=torch.zeros(n, t), ref_logprobs=torch.zeros(n, t),
                      token_rewards=per_token[:, None] * mask)


def test_consistency_select_drops_by_dense_return_and_keeps_groups_whole():
    # Dense returns (reward x tokens): 0.5, -0.4, 0.3 | 1.2, 0.0, -0.6.
    # Group 0: 2 correct (0.5, -0.4), 1 wrong -> the correct one with the lower return: row 1.
    # Group 1: 1 correct (row 5), 2 wrong (1.2, 0.0) -> the wrong one the PRM likes most: row 3.
    exp = _experience()
    kept, metrics = consistency_select(exp, 1)
    assert [v for v in kept.verdicts] == ["v0", "v2", "v4", "v5"]
    assert kept.group_ids.tolist() == [0, 0, 1, 1]  # contiguous, K - 1 = 2 each
    assert kept.batch.responses == ["r0", "r2", "r4", "r5"]
    assert torch.equal(kept.token_rewards, exp.token_rewards[[0, 2, 4, 5]])
    assert torch.equal(kept.outcome_rewards, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert kept.values is None and len(kept) == 4
    assert float(metrics["filter/consistency_dropped_correct"]) == pytest.approx(1 / 6)
    assert float(metrics["filter/consistency_dropped_wrong"]) == pytest.approx(1 / 6)
    exp.token_rewards = None
    with pytest.raises(ValueError, match="needs a dense reward"):
        consistency_select(exp, 1)
