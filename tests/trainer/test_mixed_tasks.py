"""A run on a file that mixes math and code rows (the paper's data format): each row is graded by
its own task's verifier, and the outcome reward is logged per task."""

from __future__ import annotations

from pathlib import Path

import pytest

from primekit.factory import build_rl_trainer
from primekit.verifiers.mixed import MixedVerifier
from primekit.verifiers.sandbox import namespaces_available

EURUS_SAMPLE = Path(__file__).resolve().parents[1] / "data" / "eurus2_rl_sample.jsonl"


@pytest.mark.skipif(not namespaces_available(), reason="grades code in the namespace sandbox")
def test_a_mixed_file_trains_with_per_row_verifiers_and_per_task_metrics(rl_config, tmp_path):
    # Six rows are too few to hold any out: the held-out problem comes from its own file.
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text('{"prompt": "What is 1+1?", "answer": "2", "task": "math"}\n')
    cfg = rl_config("data.source=file", f"data.train_path={EURUS_SAMPLE}",
                    f"data.eval_path={heldout}", "eval.num_problems=1",
                    "verifier.math_workers=1", "verifier.code_workers=1")
    trainer = build_rl_trainer(cfg)
    assert isinstance(trainer.verifier, MixedVerifier) and trainer.mixed_tasks

    graded: dict[str, list[float]] = {}  # task -> the scores its verifier gave
    real_build = trainer.verifier._build

    class Spy:
        def __init__(self, task):
            self.task, self.inner = task, real_build(task)

        def verify_batch(self, responses, problems):
            assert {p.task for p in problems} == {self.task}  # each row to its own task
            verdicts = self.inner.verify_batch(responses, problems)
            graded.setdefault(self.task, []).extend(v.score for v in verdicts)
            return verdicts

    trainer.verifier._build = Spy
    try:
        metrics = trainer.train_step()
    finally:
        trainer.verifier.close()
    assert metrics["train/skipped"] == 0.0 and metrics["filter/rounds"] == 1.0
    # 4 prompts of 6 rows (3 math, 3 code) always include both tasks
    assert sorted(graded) == ["code", "math"]
    for task, scores in graded.items():  # no filter, one round: every graded row was kept
        assert metrics[f"reward/outcome_mean/{task}"] == pytest.approx(sum(scores) / len(scores))
    assert sum(map(len, graded.values())) == 16  # 4 prompts x K = 4
    assert metrics["verify/error_rate"] == 0.0


def test_eval_takes_a_held_out_file_alone(sft_model_dir, tmp_path, capsys):
    # The helper's walkthrough (2026-12-08): `primekit eval ... data.eval_path=F` was refused
    # with "data.train_path: required"; evaluating needs no training file. Training still does.
    from primekit import cli
    from primekit.config import ConfigError, load_config
    from primekit.factory import build_rl_trainer

    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(f'{{"prompt": "{a}+{a}=", "answer": "{2 * a}", "task": '
                               f'"arithmetic"}}\n' for a in range(1, 4)))
    overrides = ["data.source=file", f"data.eval_path={heldout}", "eval.num_problems=3",
                 "eval.k=1", "rollout.max_new_tokens=8"]
    assert cli.main(["eval", "--config", "tiny", "--model", str(sft_model_dir),
                     *overrides]) == 0
    assert "eval/pass@1_greedy" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="^data.train_path: required when data.source is "
                                          "'file'$"):
        build_rl_trainer(load_config(None, [f"model.policy={sft_model_dir}", *overrides]))
