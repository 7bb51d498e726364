"""Reward-model heads: a causal LM's backbone with a one-logit score on every token.

Both the ORM and the step-level PRM are HF `AutoModelForTokenClassification` models with
num_labels=1 (Qwen2ForTokenClassification for the tiny model): one forward gives a logit at every
position, and the logit at token t scores the prefix ending at t (the ORM's r_outcome(q, s_1:t),
the PRM's r_process(q, p^(k)) at a step's last token; Gao et al. Sec. 3). The probability
sigmoid(logit) is the reward. The saved directory loads with plain transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from primekit.models.optim import adamw, guarded_step
from primekit.rollout.base import RolloutBatch
from primekit.rollout.batching import iter_micro_batches

__all__ = [
    "batch_response_logits",
    "fit_reward_model",
    "init_reward_model",
    "load_reward_model",
    "response_logits",
    "set_trainable",
]


def init_reward_model(
    base: str | Path,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    trust_remote_code: bool = False,
):
    """A fresh reward model from a causal-LM checkpoint: its backbone plus a new scalar head.

    The LM head is dropped; the score head is initialised by transformers from the seeded RNG
    (without touching the caller's global RNG stream).
    """
    from primekit.models.hf import load_value_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = load_value_model(str(base), dtype=torch.float32,
                                 trust_remote_code=trust_remote_code)
    return model.to(device)


def load_reward_model(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    dtype: torch.dtype = torch.float32,
):
    """A trained reward model (`primekit train-orm` / `train-prm` output), frozen, in eval mode,
    its weights in `dtype`."""
    from primekit.models.hf import load_value_model

    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"reward model directory not found: {str(path)!r}")
    model = load_value_model(str(p), dtype=dtype, trust_remote_code=trust_remote_code)
    if model.config.num_labels != 1:
        raise ValueError(f"reward model {str(path)!r} has {model.config.num_labels} labels, need 1")
    return set_trainable(model.to(device), False)


def set_trainable(model, trainable: bool):
    """Train mode with gradients, or eval mode frozen; returns the model."""
    model.train(trainable)
    model.requires_grad_(trainable)
    return model


def response_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, t: int):
    """Score logits at the last t positions: logit[:, k] scores the prefix ending at response token k.

    Rows are [left padding | prompt | response | right padding]; position ids come from the
    attention mask, as for the policy. Returns [n, t] float32.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [n, L]
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return out.logits[:, -t:, 0].float()  # [n, t]


@torch.no_grad()
def batch_response_logits(
    model, batch: RolloutBatch, *, micro_batch_size: int, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """No-grad score logits of every response token of a rollout batch: [N, T] on CPU, 0 on padding."""
    N, T = batch.response_ids.shape
    out = torch.zeros(N, T)  # [N, T]
    was_training = model.training
    model.eval()
    try:
        for mb in iter_micro_batches(batch, micro_batch_size):
            t = mb.response_len
            out[mb.rows, :t] = response_logits(
                model, mb.input_ids.to(device), mb.attention_mask.to(device), t
            ).cpu()
    finally:
        model.train(was_training)
    return out * batch.response_mask.float().cpu()


# loss_fn(logits [n, t], rows [n] long, t) -> (loss, metrics of floats)
LossFn = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, dict[str, float]]]


def fit_reward_model(
    model,
    batch: RolloutBatch,
    loss_fn: LossFn,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    weight_decay: float,
    grad_clip: float,
    seed: int,
    device: str | torch.device = "cpu",
    prefix: str = "rm",
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """AdamW over shuffled mini-batches of the batch's rows for `epochs` epochs.

    Returns one metrics dict per epoch: the row-weighted mean of `loss_fn`'s metrics and of
    f"{prefix}/grad_norm" (before clipping).
    """
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(
            f"need epochs >= 1, batch_size >= 1, lr > 0; got {epochs}, {batch_size}, {lr}"
        )
    set_trainable(model, True)
    opt = adamw(model.parameters(), lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    history, step = [], 0
    for _ in range(epochs):
        order = torch.randperm(len(batch), generator=gen)
        sums: dict[str, float] = {}
        # Mini-batches are consecutive chunks of the shuffled order; each is one forward.
        for mb in iter_micro_batches(batch, batch_size, rows=order):
            rows, t = mb.rows, mb.response_len
            logits = response_logits(model, mb.input_ids.to(device), mb.attention_mask.to(device), t)
            loss, metrics = loss_fn(logits, rows, t)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            # Clip, check the gradient norm and the updated weights (models/optim.py).
            norm, _ = guarded_step(prefix, model, opt, grad_clip=grad_clip, step=step + 1)
            metrics[f"{prefix}/grad_norm"] = float(norm)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v) * len(rows)
            if on_step is not None:
                on_step(step, metrics)
            step += 1
        history.append({k: v / len(batch) for k, v in sums.items()})
    set_trainable(model, False)
    return history
