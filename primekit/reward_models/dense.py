"""Dense rewards from a frozen explicit reward model, for RL (Gao et al. 2024, Eq. 2-6).

What the trainer gets from `ExplicitRewarder.token_rewards` is r(q, s_1:t) of Eq. 2, UNSCALED:
the trainer multiplies it by algorithm.process_coef (alpha, paper: 1) and adds the success reward
Correct(q, s) times algorithm.outcome_coef (paper: 5).

- ORM (SR+OR, Eq. 3): r_outcome = sigmoid(ORM logit) at the last valid token (EOS included when
  produced); every other token 0.
- PRM (SR+PR, Eq. 4): the raw step reward is r_process(q, p^(k)) = sigmoid(PRM logit) at the last
  token of step k, a probability in [0, 1] as in Gao et al. The step rewards [N, S] go through
  explicit.transform (algorithms.process_rewards.PROCESS_REWARD_TRANSFORMS) and each lands on its
  step's last token (`place_step_rewards`).
  eta (Clip, Eq. 5: min(r_process - eta, 0)) is in the same units, a probability threshold in
  (0, 1]: steps the PRM rates above eta get 0, the others a penalty of r_process - eta. With eta
  <= 0 Clip would zero every reward (probabilities are >= 0), so clip and clip-delta require
  0 < eta <= 1. PR-Normed standardises over the steps of the whole batch.
  algorithm.credit=min then reweights the transformed step rewards by PURE's softmin
  (algorithms/credit.py, docs/algorithms.md section 7) before they are placed.
- Oracle step PRM (reward_mode "oracle-prm", no model): the same step pipeline with r_process(q,
  p^(k)) = 1 while the response's steps are the problem's reference solution's, step for step,
  and 0 from its first differing step (`algorithms.reference_prefix_labels`): exact labels of
  the reference procedure, on the procedural arithmetic families. A shortcut that still reaches
  the answer (skipping a "*1" step) is labelled wrong from the skip on, so on chains it is
  stricter than correctness (docs/explicit_rewards.md gives the shares).
"""

from __future__ import annotations

import time

import torch

from primekit import distributed as dist
from primekit.algorithms.credit import assign_credit
from primekit.algorithms.masked import masked_mean_std
from primekit.algorithms.process_rewards import PROCESS_REWARD_TRANSFORMS, place_step_rewards
from primekit.algorithms.segmentation import reference_prefix_labels, segment_batch_texts, steps
from primekit.data.problem import Problem
from primekit.models.parallel import Placement, prepare_model
from primekit.reward_models.heads import load_reward_model
from primekit.reward_models.orm import last_token_index, orm_scores
from primekit.reward_models.prm import prm_step_scores, resolve_eta
from primekit.rollout.base import RolloutBatch

__all__ = ["ExplicitRewarder", "oracle_step_scores", "orm_token_rewards", "transform_step_rewards"]


def transform_step_rewards(
    step_probs: torch.Tensor,
    step_mask: torch.Tensor,
    transform: str,
    *,
    eta: float = 0.0,
    length_penalty: float = 0.0,
) -> torch.Tensor:
    """Gao et al.'s refinement `transform` of raw PRM step rewards. [N, S] -> [N, S].

    transform: a key of PROCESS_REWARD_TRANSFORMS ("none", "clip", "delta", "clip-delta",
    "length-norm", "length-penalty", "normed"); eta for the clip variants, length_penalty for
    "length-penalty" (r_k - k * c, k 1-based).
    """
    if transform not in PROCESS_REWARD_TRANSFORMS:
        raise ValueError(
            f"transform must be one of {sorted(PROCESS_REWARD_TRANSFORMS)}, got {transform!r}"
        )
    if transform in ("clip", "clip-delta") and not 0.0 < eta <= 1.0:
        raise ValueError(
            f"explicit.eta: Clip needs a threshold in (0, 1] on PRM probabilities, "
            f"got {eta} (eta <= 0 makes every clipped reward 0)"
        )
    fn = PROCESS_REWARD_TRANSFORMS[transform]
    if transform in ("clip", "clip-delta"):
        return fn(step_probs, step_mask, eta=eta)
    if transform == "length-penalty":
        return fn(step_probs, step_mask, penalty=length_penalty)
    return fn(step_probs, step_mask)


def orm_token_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The ORM score on the last valid token of each row, 0 elsewhere. [N], [N, T] -> [N, T]."""
    last = last_token_index(response_mask)
    out = torch.zeros(response_mask.shape, dtype=scores.dtype)  # [N, T]
    rows = torch.nonzero(last >= 0).flatten()
    out[rows, last[rows]] = scores[rows]
    return out


def oracle_step_scores(
    tokenizer, batch: RolloutBatch, problems: list[Problem], *, delimiter: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The oracle step PRM's r_process at every step: 1 while a response's steps are its
    problem's reference solution's (`Problem.solution`), step for step, else 0.

    Steps are cut at `delimiter` in the decoded text whose steps `segment_batch_texts` maps to
    tokens, so each label sits on its step's last token. Returns (step_probs [N, S] in {0, 1},
    0 on padding; step_end_positions [N, S]; step_mask [N, S]), as `prm_step_scores` does for a
    trained PRM.
    """
    if len(problems) != len(batch.responses):
        raise ValueError(f"{len(problems)} problems for {len(batch.responses)} responses")
    missing = [p.id for p in problems if not p.solution]
    if missing:
        raise ValueError(f"reward_mode=oracle-prm needs every problem's reference solution; "
                         f"{missing[0]!r} has none")
    positions, step_mask, got = segment_batch_texts(
        tokenizer, batch.response_ids, batch.response_mask, delimiter)  # [N, S], [N, S], N lists
    want = [steps(p.solution, delimiter) for p in problems]
    probs = reference_prefix_labels(got, want, step_mask.shape[1]) * step_mask  # [N, S]
    return probs, positions, step_mask


def _warn_about_eta(path: str, eta: float) -> None:
    """A warning when Clip's threshold does not suit the PRM, from the held-out step
    probabilities `primekit train-prm` stored beside it (a local directory only)."""
    from primekit.logging import console
    from primekit.reward_models.prm import eta_warning, stored_summary

    summary = stored_summary(path)
    msg = eta_warning(eta, summary) if summary is not None else None
    if msg and dist.is_main():
        console.print(f"[yellow]warning: {msg} ({path}/train_metrics.json)[/]")


class ExplicitRewarder:
    """The frozen ORM or step-level PRM at cfg.explicit.model_path, by cfg.algorithm.reward_mode
    ("explicit-orm" | "explicit-prm"), placed by `placement` (FSDP2-sharded under torchrun, as
    every other model of the loop; `primekit.factory` passes it); or, for "oracle-prm", no model:
    the step labels of `oracle_step_scores`.

    token_rewards(batch, problems) -> (dense rewards [N, T] on CPU, metrics): see the module
    docstring.
    """

    def __init__(self, cfg, tokenizer, device: str | torch.device = "cpu",
                 placement: Placement | None = None):
        reward_mode = cfg.algorithm.reward_mode
        modes = {"explicit-orm": "orm", "explicit-prm": "prm", "oracle-prm": "oracle"}
        if reward_mode not in modes:
            raise ValueError(
                "algorithm.reward_mode: ExplicitRewarder needs one of "
                f"{sorted(modes)}, got {reward_mode!r}"
            )
        mode = modes[reward_mode]
        e = cfg.explicit
        path = None if mode == "oracle" else e.model_path
        if mode != "oracle" and path is None:
            raise ValueError(
                f"explicit.model_path: reward_mode={reward_mode} needs a trained reward model "
                f"(primekit train-{mode})"
            )
        if mode == "orm" and e.transform != "none":
            raise ValueError(
                f"explicit.transform: {e.transform!r} applies to a step-level PRM, not to an ORM"
            )
        clips = mode != "orm" and e.transform in ("clip", "clip-delta")
        if clips and e.eta == "auto" and mode == "oracle":
            raise ValueError("explicit.eta=auto reads a trained PRM's held-out step "
                             "probabilities; the oracle has none: give a number in (0, 1]")
        eta = resolve_eta(e.eta, path) if clips else (0.0 if e.eta == "auto" else float(e.eta))
        if clips and e.eta == "auto" and dist.is_main():
            from primekit.logging import console

            console.print(f"explicit.eta=auto: {eta:.3f}, the PRM's step_prm/suggested_eta")
        # Check the transform's parameters now, not at the first RL step.
        transform_step_rewards(
            torch.zeros(1, 1),
            torch.ones(1, 1, dtype=torch.bool),
            e.transform,
            eta=eta,
            length_penalty=e.length_penalty,
        )
        self.mode, self.tokenizer, self.device = mode, tokenizer, torch.device(device)
        self.transform, self.eta, self.length_penalty = e.transform, eta, e.length_penalty
        self.delimiter = e.step_delimiter
        # algorithm.credit over the steps, after the transform (Clip / Delta first, then min-form)
        self.credit, self.credit_temperature = cfg.algorithm.credit, cfg.algorithm.credit_temperature
        if self.credit != "sum" and mode == "orm":
            raise ValueError(f"algorithm.credit: {self.credit!r} applies to a step-level PRM, "
                             "not to an ORM")
        self.micro_batch_size = cfg.policy.micro_batch_size
        self.model = None
        if mode == "oracle":
            return
        # A frozen model like the reference: stored in the compute dtype and, under torchrun,
        # FSDP2-sharded (placement from primekit.factory); None: whole, in float32.
        self.model = load_reward_model(
            path, device=self.device, trust_remote_code=cfg.model.trust_remote_code,
            dtype=placement.storage_dtype if placement is not None else torch.float32,
        )
        if clips and e.eta != "auto":
            _warn_about_eta(path, eta)
        if placement is not None:
            if placement.trainable:
                raise ValueError("an explicit reward model is frozen: placement.trainable=False")
            prepare_model(self.model, placement)

    @torch.no_grad()
    def token_rewards(self, batch: RolloutBatch, problems: list[Problem] | None = None,
                      ) -> tuple[torch.Tensor, dict[str, float]]:
        """Dense rewards [N, T] and metrics; `problems` (one per row) only for the oracle."""
        mask = batch.response_mask.cpu()
        kw = {"micro_batch_size": self.micro_batch_size, "device": self.device}
        # Metrics are over the responses and steps of every rank (sums all-reduced: every rank
        # calls this together under torchrun), as one process with the whole batch reports them.
        if self.mode == "orm":
            scores = orm_scores(self.model, batch, **kw)  # [N]
            mean, std = masked_mean_std(scores.double(), torch.ones_like(scores, dtype=torch.bool),
                                        dist.all_reduce_sum)
            return orm_token_rewards(scores, mask), {
                "explicit/orm_score_mean": float(mean), "explicit/orm_score_std": float(std)}
        if self.mode == "oracle":
            if problems is None:
                raise ValueError("the oracle step PRM needs the batch's problems")
            probs, positions, step_mask = oracle_step_scores(
                self.tokenizer, batch, problems, delimiter=self.delimiter)
        else:
            probs, positions, step_mask = prm_step_scores(
                self.model, self.tokenizer, batch, delimiter=self.delimiter, **kw
            )
        step_rewards = transform_step_rewards(
            probs, step_mask, self.transform, eta=self.eta, length_penalty=self.length_penalty
        )  # [N, S]
        credit_metrics = {}
        if self.credit != "sum":
            step_rewards, credit_metrics = assign_credit(
                step_rewards, step_mask, self.credit, self.credit_temperature, dist.all_reduce_sum)
        rewards = place_step_rewards(step_rewards, positions, mask.shape[1])  # [N, T]
        valid = step_mask.bool()
        # min over a row's steps: the PRM's verdict on its weakest step
        weakest = torch.where(valid, probs, torch.ones_like(probs)).min(1).values[valid.any(1)]
        sums = torch.tensor([  # [7]
            float(len(valid)), float(valid.sum()), float(step_rewards.sum()),
            float(probs[valid].sum()), float(len(weakest)), float(weakest.sum()),
            float(step_rewards[valid].sum())], dtype=torch.float64)
        rows, n_steps, returns, prob_sum, rows_with_steps, weakest_sum, reward_sum = (
            dist.all_reduce_sum(sums).tolist())
        metrics = {"explicit/steps_mean": n_steps / rows if rows else float("nan"),
                   "explicit/dense_return_mean": returns / rows if rows else float("nan")}
        if n_steps:
            metrics["explicit/prm_prob_mean"] = prob_sum / n_steps
            metrics["explicit/prm_prob_min_mean"] = weakest_sum / rows_with_steps
            metrics["explicit/step_reward_mean"] = reward_sum / n_steps
        metrics.update({k: float(v) for k, v in credit_metrics.items()})
        return rewards, metrics

    # The trainer's TokenRewarder seam (primekit.trainer.experience): a frozen model, so no
    # reference log-probs, nothing trained, nothing to checkpoint.
    reference_chunks = None
    frozen = True

    def rewards(self, batch: RolloutBatch, *, outcome_rewards: torch.Tensor,
                group_ids: torch.Tensor, ref_logprobs: torch.Tensor | None,
                problems: list[Problem] | None = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
        t0 = time.perf_counter()
        rewards, metrics = self.token_rewards(batch, problems)
        metrics["timing/explicit_rm"] = time.perf_counter() - t0
        return rewards, metrics

    def trainable(self) -> dict:
        return {}
