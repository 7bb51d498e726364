"""Numeric guards: a non-finite reward, log-prob, advantage, loss or gradient stops the update.

One NaN in an outcome reward or a gradient spreads through whitening and AdamW into every weight
within a step, and the run then trains garbage to the end. The trainer checks each quantity where
it is made (`RLTrainer.train_step`, `update_policy`); `train.on_nonfinite` chooses what happens:

  "abort"  raise `NonFiniteError` naming the quantity and the step; nothing of the step is saved,
           so the run directory's latest checkpoint is the last good one (`--resume` from it).
  "skip"   drop the update (the whole step when the quantity comes before the policy update, that
           optimiser step for a gradient norm) and go on; `train/nonfinite_skipped` counts them.
           If a model's weights themselves are already non-finite there is nothing to skip to,
           and the run aborts as above.
"""

from __future__ import annotations

import torch

# The one guarded optimiser step of every trained model lives below the trainer (the reward
# models' fits use it too); its error is this module's.
from primekit.models.optim import NonFiniteError, at_step, guarded_step, nonfinite_weights

__all__ = ["NonFiniteError", "at_step", "check_weights", "guarded_step", "is_finite", "nonfinite_weights"]


def is_finite(quantity: str, value: torch.Tensor, *, step: int, mode: str,
              mask: torch.Tensor | None = None) -> bool:
    """True if every (masked-in) element of `value` is finite; otherwise False under `mode`
    "skip", and `NonFiniteError` under "abort".

    Args:
        quantity: the metric-style name shown to the user ("reward/outcome", "policy/grad_norm").
        value: any shape; `mask` (same shape, 1 = real token) selects the elements that count.
        step: the 1-based step being computed, for the message.
    """
    values = value.detach()
    if mask is not None:
        values = values[mask.to(values.device).bool()]
    finite = torch.isfinite(values)
    if bool(finite.all()):
        return True
    if mode == "skip":
        return False
    bad = values[~finite].flatten()
    raise NonFiniteError(
        f"step {step}: {quantity} is not finite ({bad.numel()} of {values.numel()} values, e.g. "
        f"{bad[0].item()}); stopped without saving this step (train.on_nonfinite=abort)")


def check_weights(models: dict[str, torch.nn.Module], *, step: int) -> None:
    """Raise `NonFiniteError` if any parameter of `models` is non-finite: a step cannot be skipped
    once a model's own weights are corrupt."""
    for name, model in models.items():
        key = nonfinite_weights(model)
        if key is not None:
            raise NonFiniteError(
                f"step {step}: {name} weight {key} is not finite; the step cannot be skipped, "
                f"stopped without saving it")
