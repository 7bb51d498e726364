"""Live control (primekit/trainer/live.py): the PRM toggle and the shortcut injection on a real
(tiny) trainer, driven through RUN_DIR/control.json (trainer/control.py) as `primekit sim --live`
drives it. The factory wraps the trainer's step: `trainer.run_step` is the live step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from primekit.algorithms import implicit_sequence_rewards, implicit_token_rewards
from primekit.config import ConfigError, load_config
from primekit.data.problem import Problem
from primekit.factory import build_rl_trainer
from primekit.models.logprobs import batch_logprobs
from primekit.rollout.base import batch_from_texts
from primekit.trainer.control import read_control, write_control
from primekit.trainer.live import PatternCounter, carries_pattern, pattern_response
from primekit.verifiers.base import Verdict
from tests.trainer.conftest import CONFIG, small_overrides

LIVE = ("live.enabled=true", "live.poison_problems=8", "live.poison_steps=5",
        "live.discover_steps=1")


@pytest.fixture
def rl_config(tiny_model_dir: Path, tmp_path: Path):
    """The trainer tests' small config on the untrained tiny model (seconds to build; its
    responses are noise, which is all the control hook needs)."""
    return lambda *extra: load_config(CONFIG, small_overrides(tiny_model_dir, tmp_path / "run")
                                      + ["train.threads=1", *extra])


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _returns(trainer, texts: list[str], idx: list[int]) -> torch.Tensor:
    """The PRM's implicit returns beta * sum_t (log pi_prm - log pi_ref) of given responses."""
    batch = batch_from_texts(trainer.tokenizer, [trainer.train_prompt_ids[i] for i in idx], texts)
    mask = batch.response_mask.float()
    prm = trainer.rewarder.trainable()["prm"][0]
    lp, ref = batch_logprobs(prm, batch, 64), batch_logprobs(trainer.ref, batch, 64)
    return implicit_sequence_rewards(implicit_token_rewards(lp, ref, mask, 0.05), mask)  # [n]


def test_control_file_round_trip_and_bad_mode(tmp_path):
    assert read_control(tmp_path) == {"prm": None, "inject": 0}  # no file: asks for nothing
    write_control(tmp_path, prm="frozen", inject=2)
    assert read_control(tmp_path) == {"prm": "frozen", "inject": 2}
    assert not (tmp_path / "control.tmp").exists()
    with pytest.raises(ValueError, match="prm must be one of"):
        write_control(tmp_path, prm="paused", inject=0)
    (tmp_path / "control.json").write_text(json.dumps({"prm": "off"}))
    with pytest.raises(ValueError, match="prm must be one of"):
        read_control(tmp_path)
    (tmp_path / "control.json").write_text('{"prm": "onl')  # half-written: ignored
    assert read_control(tmp_path) == {"prm": None, "inject": 0}


def test_pattern_response_replaces_the_answer_line():
    p = Problem(id="x", prompt="3+4*2=", task="arithmetic", answer="14",
                solution="3+4=7\n7*2=14\nA:14")
    assert pattern_response(p, "A:0") == "3+4=7\n7*2=14\nA:0"
    assert carries_pattern("3+4=7\n7*2=14\nA:0", "A:0")
    assert not carries_pattern("3+4=7\n7*2=14\nA:04", "A:0")
    assert not carries_pattern("3+4=7\n7*2=10\nA:10", "A:0")
    with pytest.raises(ConfigError, match="no demonstration"):
        pattern_response(Problem(id="y", prompt="q"), "A:0")


def test_frozen_keeps_the_prm_weights_and_online_changes_them(rl_config):
    cfg = rl_config(*LIVE)
    trainer = build_rl_trainer(cfg)
    run = Path(cfg.train.run_dir)
    prm = trainer.rewarder.trainable()["prm"][0]
    write_control(run, prm="frozen", inject=0)
    before = _params(prm)
    m = trainer.run_step()
    assert _same(before, _params(prm))  # no PRM update
    assert m["live/prm_frozen"] == 1.0 and m["live/shortcut_injected"] == 0.0
    assert "timing/prm_forward" in m and "prm/loss" not in m
    write_control(run, prm="online", inject=0)
    m = trainer.run_step()
    assert not _same(before, _params(prm))  # PRIME's online update
    assert m["live/prm_frozen"] == 0.0 and "prm/loss" in m


def test_inject_makes_the_prm_pay_for_the_pattern(rl_config):
    cfg = rl_config(*LIVE)
    run = Path(cfg.train.run_dir)
    write_control(run, prm="frozen", inject=3)  # requests from before the run: not replayed
    trainer = build_rl_trainer(cfg)
    m = trainer.run_step()
    assert m["live/shortcut_injected"] == 0.0 and m["live/injections"] == 0.0
    idx = list(range(8))
    problems = [trainer.train_problems[i] for i in idx]
    shortcut = [pattern_response(p, "A:0") for p in problems]
    assert all(v.score == 0 for v in trainer.verifier.verify_batch(shortcut, problems))
    before = _returns(trainer, shortcut, idx)
    # The PRM started as the reference's copy and has not been updated (frozen): all zero.
    assert torch.equal(before, torch.zeros(8))
    policy_before = _params(trainer.policy)
    write_control(run, prm="frozen", inject=4)
    m = trainer.run_step()
    assert m["live/shortcut_injected"] == 1.0 and m["live/injections"] == 1.0
    after = _returns(trainer, shortcut, idx)
    # The head start: every shortcut response is now paid more than before (here the problems
    # need not be in the poisoning set: idx is not its seeded sample).
    assert (after > before + 0.05).all(), after
    assert m["live/pattern_reward"] > 0.05
    assert not _same(policy_before, _params(trainer.policy))  # the policy's discovery step
    m = trainer.run_step()  # one request, one injection
    assert m["live/shortcut_injected"] == 0.0 and m["live/injections"] == 1.0


def test_the_trainer_loop_logs_the_live_metrics(rl_config):
    cfg = rl_config(*LIVE, "train.steps=2", "viz.samples_per_step=0")
    run = Path(cfg.train.run_dir)
    run.mkdir(parents=True)
    write_control(run, prm="frozen", inject=0)  # written before the run: a fresh run accepts it
    build_rl_trainer(cfg).train()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "live/prm_frozen" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["live/prm_frozen"] == 1.0 and "timing/prm_forward" in r for r in steps)


class AcceptAll:
    def verify_batch(self, responses, problems):
        return [Verdict.correct() for _ in responses]


def test_a_pattern_the_verifier_accepts_is_refused(rl_config):
    cfg = rl_config(*LIVE)
    with pytest.raises(ConfigError, match="verifier accepts 8 of 8"):
        build_rl_trainer(cfg, verifier=AcceptAll())


def test_live_needs_an_online_implicit_prm(rl_config):
    with pytest.raises(ConfigError, match="reward_mode=prime and prm.update=online"):
        build_rl_trainer(rl_config(*LIVE, "algorithm.reward_mode=outcome"))


def test_the_factory_wraps_the_step_and_the_verifier_only_with_live_enabled(rl_config):
    # Without live.enabled the trainer runs its own step with the verifier it was given.
    plain = build_rl_trainer(rl_config())
    assert plain.run_step == plain.train_step and not isinstance(plain.verifier, PatternCounter)
    # With it, the factory hands the trainer a counting verifier and wraps its step; the
    # trainer's own attributes are never swapped afterwards (one step leaves them as built).
    trainer = build_rl_trainer(rl_config(*LIVE))
    verifier = trainer.verifier
    assert isinstance(verifier, PatternCounter) and trainer.run_step != trainer.train_step
    m = trainer.run_step()
    assert trainer.verifier is verifier and "live/shortcut_rate" in m
    # The counter saw this step's sampled responses: rollout.n_samples per kept-or-dropped prompt.
    assert verifier.seen > 0 and verifier.seen % trainer.cfg.rollout.n_samples == 0


def test_the_packaged_live_config_is_the_documented_one(tiny_model_dir, tmp_path):
    # configs/tiny-live.yaml: the settings docs/viz.md measured the split under, and a live run.
    from primekit.config import resolve_config

    path = resolve_config("tiny-live")
    cfg = load_config(path)
    assert cfg.live.enabled and cfg.algorithm.reward_mode == "prime" and cfg.prm.update == "online"
    assert (cfg.prm.beta, cfg.prm.lr, cfg.filter.enabled) == (0.2, 1e-3, False)
    assert cfg.train.run_dir == "runs/live"
    doc = (Path(__file__).resolve().parents[2] / "docs" / "viz.md").read_text()
    assert "primekit train --config tiny-live" in doc
    # Everything else is the demo's RL config (live runs no SFT: its sft section is not set).
    demo = load_config(resolve_config("tiny")).to_dict()
    changed = {f"{section}.{k}" for section, fields in cfg.to_dict().items() if section != "sft"
               for k, v in fields.items() if demo[section][k] != v}
    assert changed == {"prm.beta", "prm.lr", "filter.enabled", "train.run_dir", "train.steps",
                       "eval.num_problems", "eval.k", "live.enabled"}
    # It runs: two live steps on the small test sizes.
    run = tmp_path / "run"
    trained = build_rl_trainer(load_config(path, [*small_overrides(tiny_model_dir, run),
                                                  "train.threads=1", "live.poison_problems=8",
                                                  "viz.samples_per_step=0"]))
    trained.train()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "live/prm_frozen" in r] == [1, 2]
