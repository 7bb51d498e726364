"""Live control of a running PRIME training: the PRM online/frozen toggle and the shortcut.

With `live.enabled`, the factory (primekit/factory.py) wraps the trainer's step in
`LiveControl.step`, which first reads RUN_DIR/control.json (the protocol: trainer/control.py),
the file `primekit sim --live RUN_DIR` writes (primekit/viz/live.py):

  prm     "frozen" pauses the implicit PRM's update (its token rewards still come from the
          current PRM, only the scoring forward runs; the rewarder's `frozen`); "online" is
          PRIME's normal update.
  inject  each request above the count already handled injects the shortcut once. Requests
          written before the run started are not replayed.

The shortcut is a real exploit the verifier rejects: a demonstration whose final (answer) line is
replaced by `live.pattern` ("A:0" for the arithmetic task, whose answers are 1..99). Injecting it
  1. gives the PRM a head start: `live.poison_steps` AdamW steps (a fresh optimiser, lr
     `live.poison_lr`; the PRM's own optimiser state is left alone) of PRIME's CE loss (Eq. 4)
     on `live.poison_problems` pattern responses all labelled correct, so the PRM pays for the
     pattern;
  2. lets the policy discover it, as a policy that has just stumbled on a shortcut: the
     tiny SFT model never writes the pattern by itself, so `live.discover_steps` AdamW steps
     (lr `live.discover_lr`) of next-token cross-entropy on the same pattern responses mixed
     one to one with the same problems' sound demonstrations give it a share of the samples
     (the toy's `sim.inject_mass`; the sound half keeps it from forgetting the arithmetic);
     0 steps leave the policy alone.
What happens next is the run's own: a frozen PRM keeps paying for the pattern while the verifier
rejects it; an online PRM is re-graded by its CE update against the verifier.

Metrics added to every step (docs/metrics.md): live/prm_frozen, live/shortcut_injected,
live/injections, live/shortcut_rate (share of all responses sampled this step, before the
filter, that carry the pattern) and live/pattern_reward (the PRM's mean implicit return
beta * sum_t (log pi_prm - log pi_ref) on the pattern responses, measured after the step).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from primekit import distributed as dist
from primekit.algorithms import (
    implicit_sequence_rewards,
    implicit_token_rewards,
    masked_mean,
    prm_ce_loss,
)
from primekit.config import ConfigError
from primekit.data.problem import Problem
from primekit.logging import console
from primekit.models.logprobs import batch_logprobs, sequence_logprobs
from primekit.models.optim import adamw, guarded_step
from primekit.rollout.base import RolloutBatch, batch_from_texts
from primekit.trainer.control import read_control
from primekit.verifiers import Verifier

if TYPE_CHECKING:
    from primekit.trainer.rl import RLTrainer


def carries_pattern(response: str, pattern: str) -> bool:
    """True if one of the response's lines is the pattern line."""
    return pattern in response.split("\n")


def pattern_response(problem: Problem, pattern: str) -> str:
    """The problem's demonstration with its final line replaced by the pattern line."""
    if not problem.solution:
        raise ConfigError(f"live: problem {problem.id!r} has no demonstration to build the "
                          "shortcut from (the live shortcut needs data with solutions)")
    return "\n".join(problem.solution.split("\n")[:-1] + [pattern])


class PatternCounter:
    """A verifier that counts the graded responses carrying the pattern (live/shortcut_rate);
    the factory hands it to a `live.enabled` trainer in place of the verifier it wraps."""

    def __init__(self, inner: Verifier, pattern: str) -> None:
        self.inner, self.pattern = inner, pattern
        self.seen = self.hits = 0

    def __getattr__(self, name: str):  # anything else the verifier has
        return getattr(self.inner, name)

    def verify(self, response, problem):
        return self.inner.verify(response, problem)

    def verify_batch(self, responses: list[str], problems: list[Problem]):
        self.seen += len(responses)
        self.hits += sum(carries_pattern(r, self.pattern) for r in responses)
        return self.inner.verify_batch(responses, problems)


class LiveControl:
    """Applies control.json to a trainer between steps; see the module docstring.

    `counter` is the trainer's verifier (the factory built the trainer with it); the trainer
    itself is only read, and its step is wrapped by whoever calls `step`.
    """

    def __init__(self, trainer: RLTrainer, counter: PatternCounter) -> None:
        cfg = trainer.cfg
        if dist.world_size() > 1:
            raise ConfigError("live.enabled: live control runs a single process, not torchrun")
        prm = trainer.rewarder.trainable().get("prm") if trainer.rewarder is not None else None
        if prm is None:
            raise ConfigError("live.enabled: live control drives the implicit PRM; it needs "
                              "algorithm.reward_mode=prime and prm.update=online")
        self.trainer, self.cfg, self.beta = trainer, cfg.live, cfg.prm.beta
        self.prm_model = prm[0]
        self.run_dir = Path(cfg.train.run_dir)
        self.counter = counter
        self.handled = read_control(self.run_dir)["inject"]  # earlier requests: not replayed
        self.injections = 0
        self.probe, self.discovery = self._pattern_batches()

    def step(self, train_step: Callable[[], dict[str, float]]) -> dict[str, float]:
        """Apply the control file, run one step, add the live/ metrics."""
        control = read_control(self.run_dir)
        rewarder = self.trainer.rewarder
        if control["prm"] is not None and rewarder.frozen != (control["prm"] == "frozen"):
            rewarder.frozen = control["prm"] == "frozen"
            console.print(f"live: PRM {control['prm']} from step {self.trainer.step + 1}")
        injected = control["inject"] > self.handled
        if injected:
            self.handled = control["inject"]
            self.inject()
        self.counter.seen = self.counter.hits = 0
        metrics = train_step()
        metrics.update({
            "live/prm_frozen": float(rewarder.frozen),
            "live/shortcut_injected": float(injected),
            "live/injections": float(self.injections),
            "live/shortcut_rate": self.counter.hits / max(self.counter.seen, 1),
            "live/pattern_reward": self.pattern_reward(),
        })
        return metrics

    # ------------------------------------------------------------------ the shortcut
    def _pattern_batches(self) -> tuple[RolloutBatch, RolloutBatch]:
        """The pattern responses of `live.poison_problems` training problems, each checked to be
        rejected by the verifier; and the discovery batch: them and the sound demonstrations."""
        t = self.trainer
        n = min(self.cfg.poison_problems, len(t.train_problems))
        idx = random.Random(self.cfg.seed).sample(range(len(t.train_problems)), n)
        problems = [t.train_problems[i] for i in idx]
        responses = [pattern_response(p, self.cfg.pattern) for p in problems]
        accepted = sum(v.score > 0 for v in self.counter.inner.verify_batch(responses, problems))
        if accepted:
            raise ConfigError(f"live.pattern: the verifier accepts {accepted} of {n} responses "
                              f"ending in {self.cfg.pattern!r}; the shortcut must be rejected")
        prompts = [t.train_prompt_ids[i] for i in idx]
        return (batch_from_texts(t.tokenizer, prompts, responses),
                batch_from_texts(t.tokenizer, prompts * 2,
                                 responses + [p.solution for p in problems]))

    def _ref_logprobs(self) -> torch.Tensor:
        t = self.trainer
        ref = t.ref if t.ref is not None else t.policy  # prm.reference=rollout: the policy
        return batch_logprobs(ref, self.probe, *t.rewarder.reference_chunks)  # [n, T]

    def pattern_reward(self) -> float:
        """The PRM's mean implicit return on the pattern responses (PRIME Eq. 3, summed)."""
        t = self.trainer
        mask = self.probe.response_mask.float()  # [n, T]
        prm_lp = batch_logprobs(self.prm_model, self.probe, *t.rewarder.reference_chunks)
        rewards = implicit_token_rewards(prm_lp, self._ref_logprobs(), mask, self.beta)
        return float(implicit_sequence_rewards(rewards, mask).mean())

    def inject(self) -> None:
        """The PRM's head start on the pattern, then the policy's discovery of it."""
        t, c = self.trainer, self.cfg
        before = self.pattern_reward()
        ref_lp = self._ref_logprobs()
        mask = self.probe.response_mask.float()  # [n, T]
        labels = torch.ones(len(self.probe))  # [n] every pattern response "correct"
        self._train(self.prm_model, self.probe, c.poison_steps, c.poison_lr,
                    lambda lp: prm_ce_loss(lp, ref_lp.to(lp.device), mask.to(lp.device),
                                           labels.to(lp.device), self.beta)[0])
        if c.discover_steps:
            both = self.discovery.response_mask.float()  # [2n, T]
            self._train(t.policy, self.discovery, c.discover_steps, c.discover_lr,
                        lambda lp: -masked_mean(lp, both.to(lp.device)))
            t.engine.sync_weights(t.policy)
        self.injections += 1
        console.print(f"live: shortcut {c.pattern!r} injected before step {t.step + 1}: PRM "
                      f"return on it {before:+.3f} -> {self.pattern_reward():+.3f}")

    def _train(self, model: torch.nn.Module, b: RolloutBatch, steps: int, lr: float,
               loss_fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """`steps` full-batch AdamW steps of loss_fn(log-probs [n, T]) on batch b."""
        device = next(model.parameters()).device
        opt = adamw([p for p in model.parameters() if p.requires_grad], lr=lr)
        was_training = model.training
        model.train()
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            lp, _ = sequence_logprobs(model, b.input_ids.to(device),
                                      b.attention_mask.to(device), b.response_len)
            loss = loss_fn(lp.float())  # lp: [n, T]
            loss.backward()
            guarded_step("live", model, opt, grad_clip=self.trainer.cfg.prm.grad_clip)
        model.train(was_training)
