"""The critic's update (estimator "ppo"): a clipped value loss towards the estimator's returns.

Kept beside rl.py, not in it: only one estimator has a critic, and the policy update is the
recipe's main line.
"""

from __future__ import annotations

import torch

from primekit import distributed as dist
from primekit.algorithms import loss_agg_count, value_loss
from primekit.config import Config
from primekit.logging import MetricSums
from primekit.models.logprobs import micro_batch_values
from primekit.models.optim import guarded_step
from primekit.rollout.batching import iter_layout, row_chunks
from primekit.trainer.experience import Experience, micro_layout


def update_critic(critic: torch.nn.Module, optimizer: torch.optim.Optimizer, exp: Experience,
                  cfg: Config, mini_batch_rows: int, device: torch.device,
                  ) -> dict[str, torch.Tensor]:
    """One pass over `exp` in the policy's mini-batches (`mini_batch_rows` per rank) and
    micro-batches: clipped value loss (`algorithms.value_loss`) against `exp.returns`, with
    `exp.values` as the old values; token-mean over each mini-batch on all ranks."""
    critic.train()
    sums = MetricSums()
    for mini in row_chunks(len(exp), mini_batch_rows):
        optimizer.zero_grad(set_to_none=True)
        local = loss_agg_count(exp.response_mask[mini], "token-mean")
        total = dist.all_reduce_sum(local)
        for mb in iter_layout(exp.batch, micro_layout(cfg.policy), rows=mini):
            rows, t = mb.rows, mb.response_len
            values = micro_batch_values(critic, mb)  # [n, t]
            m = exp.response_mask[rows, :t].to(values.device)  # [n, t]
            loss, lm = value_loss(values, exp.values[rows, :t].to(values.device),
                                  exp.returns[rows, :t].to(values.device), m,
                                  clip=cfg.critic.value_clip)
            # x world size: sharded gradients are averaged over ranks when reduced.
            (loss * loss_agg_count(m, "token-mean") * dist.world_size() / total).backward()
            # Metrics weighted like the loss (in rows of the mini-batch): the same in any layout.
            sums.add(lm, weight=loss_agg_count(m, "token-mean") / local.to(m.device) * len(mini))
        # Clip, check the gradient norm and the updated weights (train.on_nonfinite).
        guarded_step("critic", critic, optimizer, grad_clip=cfg.critic.grad_clip,
                     mode=cfg.train.on_nonfinite, lr_field="critic.lr")
    critic.eval()
    return sums.means(len(exp))
