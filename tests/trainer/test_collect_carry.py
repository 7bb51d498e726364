"""The online filter's carry: surplus groups kept for later steps, rounds sized by the pass rate,
carried rows' old log-probs recomputed, and exact resume with carried groups in play."""

from __future__ import annotations

import pytest
import torch

from primekit.config import FilterConfig
from primekit.data.problem import Problem
from primekit.factory import build_rl_trainer
from primekit.models.logprobs import batch_logprobs
from primekit.rollout.base import RolloutBatch
from primekit.trainer.collect import GroupCarry, collect_groups
from primekit.verifiers import Verdict

K = 2
PASS, FAIL = (1.0, 0.0), (1.0, 1.0)  # group mean 0.5 passes lo = hi = 0.5; 1.0 does not
FILTER = FilterConfig(lo=0.5, hi=0.5, oversample=1.0, max_rounds=4)


class Rounds:
    """A fake rollout round: the next group patterns from a script; response i is "g<number>"
    so that a test can tell which sampled group ended up where; records the prompts asked."""

    def __init__(self, script: list[list[tuple[float, float]]]) -> None:
        self.script, self.asked, self.made = list(script), [], 0

    def __call__(self, n: int):
        self.asked.append(n)
        groups = self.script.pop(0)
        assert len(groups) == n, (groups, n)
        names = []
        for _ in groups:
            names += [f"g{self.made}"] * K
            self.made += 1
        rows = len(names)
        batch = RolloutBatch(torch.ones(rows, 1, dtype=torch.long),
                             torch.ones(rows, 1, dtype=torch.long),
                             torch.ones(rows, 3, dtype=torch.long),
                             torch.ones(rows, 3, dtype=torch.long),
                             torch.zeros(rows, 3), torch.ones(rows, dtype=torch.bool), names)
        problems = [Problem(id=name, prompt="p") for name in names]
        verdicts = [Verdict.correct() if s == 1.0 else Verdict.incorrect()
                    for g in groups for s in g]
        return batch, problems, verdicts


def _collect(rounds: Rounds, carry: GroupCarry, need: int = 2):
    return collect_groups(rounds, need=need, group_size=K, filt=FILTER, pad_id=0, carry=carry)


def test_surplus_groups_are_carried_and_rounds_follow_the_pass_rate():
    carry = GroupCarry(max_age=1)
    # Step 1, need 2: the first round asks 2 prompts (no pass rate yet: 1.0); 1 of 2 passes
    # (g0). Pass rate 1/2: the refill asks ceil(1 / 0.5) = 2; both pass (g2, g3), g2 fills the
    # batch and g3 is carried.
    rounds = Rounds([[PASS, FAIL], [PASS, PASS]])
    exp, m = _collect(rounds, carry)
    assert rounds.asked == [2, 2]
    assert exp.batch.responses == ["g0", "g0", "g2", "g2"] and exp.age.tolist() == [0] * 4
    assert [g.batch.responses for g in carry.groups] == [["g3", "g3"]]
    assert (carry.seen, carry.passed) == (4, 3)
    assert m["filter/keep_rate"] == 3 / 4  # passed / sampled, the carried surplus included
    assert (m["filter/carried_in"], m["filter/carried_out"], m["filter/carry_dropped"]) == (0, 1, 0)
    # Response tokens (3 per row, all real): 4 groups x 2 x 3 sampled, 2 groups x 2 x 3 trained.
    assert (m["filter/sampled_tokens"], m["filter/batch_tokens"]) == (24, 12)
    # The fixed-size training reward: the step's first need x K = 4 samples, those of g0 (PASS:
    # 1, 0) and g1 (FAIL: 1, 1): 3 / 4, whatever was sampled after them; over all 8 samples
    # (g2 and g3 pass: 1, 0 each) the mean is 5 / 8.
    assert m["reward/outcome_mean_fixed"] == 0.75 and m["reward/outcome_mean_sampled"] == 5 / 8

    # Step 2: g3 comes first (one update old, age 1); 1 missing; pass rate 3/4 over every step
    # so far: ceil(1 / 0.75) = 2 prompts; the first (g4) is taken, the second fails.
    rounds = Rounds([[PASS, FAIL]])
    rounds.made = 4
    exp, m = _collect(rounds, carry)
    assert rounds.asked == [2]
    assert exp.batch.responses == ["g3", "g3", "g4", "g4"]
    assert exp.age.tolist() == [1, 1, 0, 0]
    assert carry.groups == [] and (carry.seen, carry.passed) == (6, 4)
    assert (m["filter/carried_in"], m["filter/carried_out"], m["filter/carry_dropped"]) == (1, 0, 0)


def test_carry_is_bounded_in_size_and_age():
    # Pass rate 1/4 so far, need 1: ceil(1 / 0.25) = 4 prompts, all pass. g0 trains; g1, g2,
    # g3 are surplus; capacity 2 keeps the youngest two (all are age 0: the later sampled), g2
    # and g3; g1 is dropped.
    carry = GroupCarry(max_age=1, capacity=2, seen=4, passed=1)
    rounds = Rounds([[PASS] * 4])
    exp, m = _collect(rounds, carry, need=1)
    assert rounds.asked == [4]
    assert exp.batch.responses == ["g0", "g0"]
    assert [g.batch.responses[0] for g in carry.groups] == ["g2", "g3"]
    assert (m["filter/carried_out"], m["filter/carry_dropped"]) == (2, 1)
    # Next step: the oldest-first g2 fills the batch; nothing is sampled; g3 stays carried.
    exp, m = _collect(Rounds([]), carry, need=1)
    assert exp.batch.responses == ["g2", "g2"] and exp.age.tolist() == [1, 1]
    assert m["filter/rounds"] == 0 and m["filter/sampled_tokens"] == 0
    assert m["reward/outcome_mean_fixed"] != m["reward/outcome_mean_fixed"]  # NaN: no samples
    assert m["filter/carried_in"] == 1 and [g.batch.responses[0] for g in carry.groups] == ["g3"]
    # Next step g3 would be two updates old (> max_age 1): dropped. The pass rate is now
    # (1 + 4) / (4 + 4): ceil(1 / 0.625) = 2 fresh prompts; g4 passes and trains.
    rounds = Rounds([[PASS, FAIL]])
    rounds.made = 4
    exp, m = _collect(rounds, carry, need=1)
    assert rounds.asked == [2]
    assert exp.batch.responses == ["g4", "g4"] and exp.age.tolist() == [0, 0]
    assert (m["filter/carried_in"], m["filter/carry_dropped"]) == (0, 1)
    assert carry.groups == []


def test_without_carry_surplus_is_thrown_away_and_counted():
    # filter.carry_steps=0, the behaviour before carrying: pass rate 1/2, need 1: 2 prompts,
    # both pass, g0 trains and g1 is thrown away.
    carry = GroupCarry(max_age=0, seen=2, passed=1)
    exp, m = _collect(Rounds([[PASS, PASS]]), carry, need=1)
    assert exp.batch.responses == ["g0", "g0"]
    assert (m["filter/carried_out"], m["filter/carry_dropped"]) == (0, 1)
    assert carry.groups == []


class ParityVerifier:
    """1 for a response of even length: outcomes that differ within a group (the barely trained
    model is almost never right on the real task), so that the filter passes some groups."""

    def verify_batch(self, responses, problems):
        return [Verdict.correct() if len(r) % 2 == 0 else Verdict.incorrect() for r in responses]


def test_carried_rows_get_old_logprobs_of_the_current_policy(rl_config):
    # policy.old_logprobs resolves to "rollout" (HF engine, T = 1): fresh rows reuse the
    # sampler's log-probs; a carried row (age 1) was sampled by the policy before the last
    # update, so its old log-probs are recomputed under the current policy.
    trainer = build_rl_trainer(rl_config(), verifier=ParityVerifier())
    assert trainer.cfg.policy.old_logprobs == "rollout"
    exp, _ = trainer.collect({})
    trainer.train_step()  # one update: the policy that sampled `exp` is now the old one
    age = torch.zeros(len(exp), dtype=torch.long)
    age[:4] = 1  # the first group (K = 4) carried
    old = trainer.old_logprobs(exp.batch, age)
    mask = exp.batch.response_mask.float()
    assert torch.equal(old[4:], exp.batch.sampling_logprobs[4:].float() * mask[4:])
    with torch.no_grad():
        now = batch_logprobs(trainer.policy, exp.batch.select(torch.arange(4)), *trainer.layout)
    assert torch.equal(old[:4], now.to(old.dtype))
    # The update moved the policy: the sampler's log-probs of those rows are no longer right.
    assert (old[:4] - exp.batch.sampling_logprobs[:4]).abs().max() > 1e-4


@pytest.mark.slow
def test_resume_with_carried_groups_matches_the_uninterrupted_run(rl_config, tmp_path):
    # The filter on (a group passes with 2 or 3 of 4 even-length responses) with surplus groups
    # carried: 4 steps straight vs 2 steps, a restart from the checkpoint, 2 more. Carried
    # groups are dropped at every checkpoint (both runs save after step 2); the pass rate that
    # sizes the rounds is checkpointed.
    filt = ("filter.enabled=true", "filter.lo=0.5", "filter.hi=0.75", "filter.oversample=2",
            "filter.max_rounds=8", "train.prompts_per_step=2", "eval.k=1", "train.save_every=2")
    full = build_rl_trainer(rl_config(*filt, "train.steps=4", f"train.run_dir={tmp_path / 'a'}"),
                            verifier=ParityVerifier())
    full_history = full.train()
    half = build_rl_trainer(rl_config(*filt, "train.steps=2", f"train.run_dir={tmp_path / 'b'}"),
                            verifier=ParityVerifier())
    half.train()
    resumed = build_rl_trainer(rl_config(*filt, "train.steps=4",
                                         f"train.run_dir={tmp_path / 'b'}"),
                               resume=True, verifier=ParityVerifier())
    resumed_history = resumed.train()
    steps = [m for m in full_history if "filter/carried_in" in m]
    # Groups were carried into steps 2 and 4 and none into step 3 (dropped at the checkpoint).
    assert [m["filter/carried_in"] > 0 for m in steps] == [False, True, False, True]
    for a, b in zip(full.policy.parameters(), resumed.policy.parameters()):
        assert torch.equal(a, b)

    def stable(metrics):  # NaN (reward/outcome_mean_sampled of a step that sampled nothing,
        # its batch all carried) as a string, since NaN != NaN
        return {k: "nan" if v != v else v for k, v in metrics.items()
                if not k.startswith(("timing/", "throughput/")) and k != "eval/wall_s"}

    assert [stable(m) for m in steps[2:]] == [
        stable(m) for m in resumed_history if "filter/carried_in" in m][-2:]


def test_a_step_that_graded_nothing_logs_nan_rates_not_zeros():
    # A step trained only on groups carried over grades nothing: its verify/ rates and keep rate
    # were 0.0 (a false "nothing correct"), while reward/outcome_mean_sampled was NaN.
    import math

    from primekit.trainer.collect import _global_collect_metrics

    out = _global_collect_metrics(torch.zeros(0), [], groups_kept=0, groups_seen=0, rounds=0,
                                  fixed=0, traced=(0, 0))
    for key in ("verify/error_rate", "verify/timeout_rate", "verify/correct_rate",
                "verify/mean_score", "filter/keep_rate", "reward/outcome_mean_sampled"):
        assert math.isnan(out[key]), key
    assert out["verify/retries"] == 0.0
    # two verdicts, one correct: the rates as before
    out = _global_collect_metrics(torch.tensor([1.0, 0.0]), [Verdict.correct(),
                                  Verdict.incorrect()], groups_kept=1, groups_seen=2, rounds=1,
                                  fixed=2, traced=(0, 0))
    assert (out["verify/correct_rate"], out["filter/keep_rate"]) == (0.5, 0.5)


def test_a_run_that_trains_on_nothing_says_why(rl_config):
    # The helper's walkthrough (2026-12-08): the tiny model on math rows (it writes `A:7`, which
    # math-verify cannot read) kept no group at any step and exited 0 with a generic warning.
    from primekit.trainer.collect import IDLE_WARN_STEPS

    class NoAnswer:
        def verify_batch(self, responses, problems):
            return [Verdict.incorrect(reason="no final answer found") for _ in responses]

    trainer = build_rl_trainer(rl_config("filter.enabled=true", "filter.max_rounds=1"),
                               verifier=NoAnswer())
    for _ in range(IDLE_WARN_STEPS - 1):
        assert "policy/loss" not in trainer.train_step()
    with pytest.warns(UserWarning, match=r"5 steps in a row trained on nothing: no sampled "
                      r"group's mean outcome lay in \[filter.lo, filter.hi\] = \[.*\]\. The last "
                      r"step's \d+ verdicts: 100% incorrect \(no final answer found\)\. If the "
                      r"verifier cannot read the model's answers"):
        trainer.train_step()
