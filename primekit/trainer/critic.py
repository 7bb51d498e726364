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
from primekit.models.logprobs import sequence_values
from primekit.rollout.batching import iter_micro_batches, row_chunks
from primekit.trainer.experience import Experience


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
        total = dist.all_reduce_sum(loss_agg_count(exp.response_mask[mini], "token-mean"))
        for mb in iter_micro_batches(exp.batch, cfg.policy.micro_batch_size, rows=mini):
            rows, t = mb.rows, mb.response_len
            values = sequence_values(critic, mb.input_ids.to(device),
                                     mb.attention_mask.to(device), t)  # [n, t]
            m = exp.response_mask[rows, :t].to(values.device)  # [n, t]
            loss, lm = value_loss(values, exp.values[rows, :t].to(values.device),
                                  exp.returns[rows, :t].to(values.device), m,
                                  clip=cfg.critic.value_clip)
            # x world size: sharded gradients are averaged over ranks when reduced.
            (loss * loss_agg_count(m, "token-mean") * dist.world_size() / total).backward()
            sums.add(lm, weight=len(rows))
        torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.critic.grad_clip)
        optimizer.step()
    critic.eval()
    return sums.means(len(exp))
