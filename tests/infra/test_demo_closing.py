"""The demo's closing lines name only what the PRIME run wrote (issue 21: they promised
TensorBoard events on an install without tensorboard)."""

from __future__ import annotations

import pytest

from primekit import cli
from primekit.demo import run_outputs, weak_sft_note


def test_closing_line_names_what_is_there(tmp_path):
    run = tmp_path / "prime"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "checkpoints" / "step_000001" / "model.pt").write_bytes(b"x")
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "tensorboard").mkdir()  # made, but nothing written into it
    line = run_outputs(run)
    assert line.splitlines()[0] == f"PRIME run (checkpoints, metrics.jsonl): {run}"
    assert line.splitlines()[1].startswith("no TensorBoard events (tensorboard is not installed")
    (run / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"e")
    (run / "samples.jsonl").write_text("{}\n")
    assert run_outputs(run) == (f"PRIME run (checkpoints, metrics.jsonl, samples.jsonl, "
                                f"tensorboard): {run}")
    assert run_outputs(tmp_path / "none").startswith("PRIME run (nothing written)")


@pytest.mark.slow
def test_a_demo_without_tensorboard_does_not_claim_its_events(tmp_path, capsys):
    # The smallest demo, with TensorBoard off (as on an install without the package).
    run = tmp_path / "demo"
    argv = ["demo", "--run-dir", str(run), "sft.steps=2", "sft.threads=1", "train.steps=1",
            "train.threads=1", "data.num_train=64", "data.num_eval=4", "eval.num_problems=4",
            "eval.k=1", "train.prompts_per_step=2", "rollout.max_new_tokens=8",
            "filter.enabled=false", "train.report_to=[]"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "TensorBoard events" not in out.split("PRIME run (")[1].splitlines()[0]
    assert (f"PRIME run (checkpoints, final, metrics.jsonl, samples.jsonl): {run / 'prime'}"
            in out.splitlines())
    assert "no TensorBoard events" in out
    assert not (run / "prime" / "tensorboard").exists()
    # Two SFT steps teach nothing: the demo says its SFT model is weak and what to do.
    assert "note: the SFT model solves" in out and "use more sft.steps, another sft.seed" in out


def test_weak_sft_note():
    assert weak_sft_note(0.5, 0) is None and weak_sft_note(0.902, 1) is None
    note = weak_sft_note(0.294, 2)
    assert note.startswith("note: the SFT model solves 29.4% of the held-out problems")
    assert "sft.seed=2" in note
