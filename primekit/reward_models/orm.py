"""Outcome reward model (ORM): the LM with a scalar head, trained on verifier labels.

Gao et al. Sec. 3: L_ORM = E_{q,s} [ sum_{t=1..T} Loss(Correct(q, s), r_outcome(q, s_1:t)) ] with
binary cross-entropy, "on the full sequence or only the last token". r_outcome = sigmoid(logit);
as an RL reward (SR+OR, Eq. 3) it is read at the last valid token of the response.

Notation: n responses, t response tokens.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from primekit.config import Config
from primekit.reward_models.heads import (
    batch_response_logits,
    fit_reward_model,
    init_reward_model,
)
from primekit.rollout.base import RolloutBatch

__all__ = [
    "ORM_TARGETS",
    "binary_metrics",
    "fit_score_save",
    "last_token_index",
    "mixed_groups",
    "orm_loss",
    "orm_scores",
    "train_orm",
]

ORM_TARGETS = ("full", "last")


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last valid token of each row, -1 for an empty row. [n, t] -> [n] long."""
    m = response_mask.bool()
    idx = torch.arange(m.shape[1], device=m.device).expand_as(m)
    return torch.where(m, idx, torch.full_like(idx, -1)).max(dim=1).values


def orm_loss(
    logits: torch.Tensor,
    outcome_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    target: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Binary cross-entropy of the ORM (Gao et al. Sec. 3, L_ORM).

    Formula ("full"): mean over all valid tokens (i, t) of BCE(sigmoid(logit_it), y_i);
             ("last"): mean over rows of BCE(sigmoid(logit_i,last), y_i), last = last valid token.
    y_i = outcome_rewards[i] in [0, 1] (soft labels allowed).
    Args: logits [n, t], outcome_rewards [n], response_mask [n, t].
    Returns: (loss, {"orm/loss", "orm/acc_last"}) with acc_last the 0.5-threshold accuracy at the
        last token against y >= 0.5.
    """
    if target not in ORM_TARGETS:
        raise ValueError(f"target must be one of {ORM_TARGETS}, got {target!r}")
    if logits.dim() != 2 or response_mask.shape != logits.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be [n, t]"
        )
    if outcome_rewards.shape != logits.shape[:1]:
        raise ValueError(
            f"outcome_rewards must be [{logits.shape[0]}], got {tuple(outcome_rewards.shape)}"
        )
    y = outcome_rewards.to(logits.dtype)
    last = last_token_index(response_mask)
    has = last >= 0
    rows = torch.arange(len(last), device=logits.device)
    last_logits = logits[rows, last.clamp(min=0)]  # [n]
    if target == "full":
        m = response_mask.to(logits.dtype)
        bce = F.binary_cross_entropy_with_logits(
            logits, y[:, None].expand_as(logits), reduction="none"
        )
        loss = (bce * m).sum() / m.sum().clamp(min=1)
    else:
        bce = F.binary_cross_entropy_with_logits(last_logits, y, reduction="none")
        loss = (bce * has).sum() / has.sum().clamp(min=1)
    acc = (
        ((last_logits > 0) == (y >= 0.5))[has].float().mean()
        if bool(has.any())
        else torch.tensor(0.0)
    )
    return loss, {"orm/loss": float(loss.detach()), "orm/acc_last": float(acc)}


def orm_scores(
    model, batch: RolloutBatch, *, micro_batch_size: int, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """r_outcome of every response: sigmoid(logit) at its last valid token. [N] on CPU, 0 if empty."""
    logits = batch_response_logits(model, batch, micro_batch_size=micro_batch_size, device=device)
    last = last_token_index(batch.response_mask.cpu())
    probs = torch.sigmoid(logits[torch.arange(len(last)), last.clamp(min=0)])  # [N]
    return torch.where(last >= 0, probs, torch.zeros_like(probs))


def _auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Probability that a random positive outscores a random negative (ties count 1/2)."""
    pos, neg = scores[labels], scores[~labels]
    if not len(pos) or not len(neg):
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float((diff > 0).float().mean() + 0.5 * (diff == 0).float().mean())


def binary_metrics(probs: torch.Tensor, labels: torch.Tensor, prefix: str) -> dict[str, float]:
    """Classification quality of probabilities against 0/1 labels (threshold 0.5).

    Keys: {prefix}/acc, {prefix}/majority_acc (always predicting the commoner class),
    {prefix}/positive_rate, {prefix}/auroc (NaN with a single class), {prefix}/count.
    """
    y = labels.bool()
    n = len(y)
    if n == 0:
        nan = float("nan")
        return {
            f"{prefix}/acc": nan,
            f"{prefix}/majority_acc": nan,
            f"{prefix}/positive_rate": nan,
            f"{prefix}/auroc": nan,
            f"{prefix}/count": 0.0,
        }
    pos = float(y.float().mean())
    return {
        f"{prefix}/acc": float(((probs > 0.5) == y).float().mean()),
        f"{prefix}/majority_acc": max(pos, 1 - pos),
        f"{prefix}/positive_rate": pos,
        f"{prefix}/auroc": _auroc(probs.float(), y),
        f"{prefix}/count": float(n),
    }


def mixed_groups(outcome_rewards: torch.Tensor, samples: int) -> torch.Tensor:
    """Rows of problems whose `samples` responses hold both a correct and a wrong one. [N] bool.

    Gao et al. Sec. 5.1 keep "those questions that have both correct and wrong answers".
    """
    correct = (outcome_rewards >= 1.0).view(-1, samples)  # [B, samples]
    keep = correct.any(1) & ~correct.all(1)  # [B]
    return keep.repeat_interleave(samples)


def train_orm(cfg: Config) -> dict[str, float | str]:
    """`primekit train-orm`: sample, label with the verifier, fit the ORM, evaluate, save.

    Settings: cfg.orm. Responses come from orm.base (None: cfg.model.policy, the SFT checkpoint),
    orm.n_samples for each of the first orm.num_problems training problems; the ORM starts from
    the same checkpoint. Held-out responses on orm.num_eval_problems test problems measure
    accuracy at the last token. Writes the HF directory orm.out_dir and its train_metrics.json;
    returns the summary.
    """
    from primekit.reward_models.labeling import sample_split, sampling_setup

    o = cfg.orm
    start = time.perf_counter()
    model_path = o.base or cfg.model.policy
    setup = sampling_setup(
        cfg, model_path, seed=o.seed, path_field="orm.base" if o.base else "model.policy"
    )
    train, _, train_y = sample_split(setup, "train", o.num_problems, o.n_samples)
    heldout, _, heldout_y = sample_split(setup, "test", o.num_eval_problems, o.n_samples)
    setup.release()
    summary: dict[str, float | str] = {
        "orm/train_responses": float(len(train)),
        "orm/train_accuracy_of_samples": float(train_y.mean()),
    }
    if o.mixed_only:
        keep = mixed_groups(train_y, o.n_samples)
        if not bool(keep.any()):
            raise ValueError(
                "orm.mixed_only: no problem has both a correct and a wrong sample; raise "
                "orm.n_samples or set orm.mixed_only=false"
            )
        train, train_y = train.select(keep), train_y[keep]
    summary["orm/train_responses_kept"] = float(len(train))
    mask = train.response_mask.float()

    def loss_fn(logits: torch.Tensor, rows: torch.Tensor, t: int):
        return orm_loss(
            logits, train_y[rows].to(logits.device), mask[rows, :t].to(logits.device),
            target=o.target,
        )

    def evaluate(model) -> dict[str, float]:
        probs = orm_scores(
            model, heldout, micro_batch_size=cfg.policy.micro_batch_size, device=setup.device
        )
        return binary_metrics(probs, heldout_y >= 1.0, "orm/heldout")

    fit_score_save(cfg, o, setup, prefix="orm", base=model_path, train=train, loss_fn=loss_fn,
                   evaluate=evaluate, summary=summary, start=start,
                   record={"target": o.target, "base": model_path})
    return summary


def fit_score_save(cfg: Config, section, setup, *, prefix: str, base: str, train: RolloutBatch,
                   loss_fn, evaluate, summary: dict[str, float | str], start: float,
                   record: dict) -> Path:
    """What train-orm and train-prm share after labelling: a fresh reward model from `base`
    (seeded by section.seed), fit on `train` with `loss_fn` and the section's optimiser settings,
    `evaluate(model)`'s metrics added to `summary` after the last epoch's, then the model and the
    sampling tokenizer saved to section.out_dir beside train_metrics.json
    ({"summary", "history", **record}). `summary` is filled in place; returns the directory.
    """
    from primekit.models.hf import save_model

    model = init_reward_model(
        base, device=setup.device, seed=section.seed, trust_remote_code=cfg.model.trust_remote_code
    )
    history = fit_reward_model(
        model,
        train,
        loss_fn,
        epochs=section.epochs,
        lr=section.lr,
        batch_size=section.batch_size,
        weight_decay=section.weight_decay,
        grad_clip=section.grad_clip,
        device=setup.device,
        seed=section.seed,
        prefix=prefix,
    )
    summary.update({f"{k}_train_last_epoch": v for k, v in history[-1].items()})
    summary.update(evaluate(model))
    summary[f"{prefix}/wall_s"] = time.perf_counter() - start
    out = save_model(model, setup.tokenizer, section.out_dir)
    summary[f"{prefix}/out_dir"] = str(out)
    (out / "train_metrics.json").write_text(
        json.dumps({"summary": summary, "history": history, **record}, indent=2)
    )
    return out
