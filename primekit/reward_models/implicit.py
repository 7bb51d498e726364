"""PRIME's implicit process reward model as a token rewarder, updated online (arXiv 2502.01456).

The PRM is a causal LM pi_phi initialised like the policy. Its token rewards are the scaled
log-ratio against the reference, r_phi(y_t) = beta * (log pi_phi(y_t|y_<t) - log pi_ref(y_t|y_<t))
(Eq. 3), and it learns from outcome labels alone with the cross-entropy loss of Eq. 4 on
sigmoid(sum_t r_phi(y_t)) (or the DPO loss, Sec. 5.4). One call of `rewards` is one PRM phase of a
PRIME step (Algorithm 1): under "single forward" the token rewards come from the very forward
that computes the PRM loss (pre-update rewards); under "double forward" the updated PRM re-scores
the batch afterwards. With a frozen PRM there is only the scoring forward. `frozen` pauses the
updates of an online PRM (its optimiser kept), as live control does mid-run (trainer/live.py).

Notation: N rows (groups of K samples, contiguous), T response tokens.
"""

from __future__ import annotations

import time
from typing import Literal

import torch

from primekit import distributed as dist
from primekit.algorithms import (
    assign_credit,
    implicit_sequence_rewards,
    implicit_token_rewards,
    masked_mean,
    masked_mean_std,
    prm_absolute_accuracy,
    prm_ce_loss,
    prm_dpo_loss,
    prm_pairwise_counts,
)
from primekit.logging import MetricSums
from primekit.models.logprobs import batch_logprobs, micro_batch_logprobs
from primekit.models.optim import guarded_step
from primekit.rollout.base import RolloutBatch
from primekit.rollout.batching import Layout, MicroBatch, iter_layout, row_chunks


class ImplicitPRM:
    """The implicit PRM of PRIME: token rewards from a log-ratio, trained on outcomes.

    Args:
        model: the PRM, a causal LM (fp32 master weights: it is trained).
        optimizer: its optimiser, or None for a frozen PRM.
        beta: the log-ratio scale (the paper's 0.05).
        loss: "ce" (Eq. 4) or "dpo".
        forward: "single" (rewards from the update's own forward) or "double" (re-scored after).
        group_size: K; micro-batches keep whole groups (the DPO loss pairs within a group).
        mini_batch_size: rows per PRM optimiser step; micro_batch_size: rows per forward.
        grad_clip: max gradient norm per optimiser step.
        credit, credit_temperature: algorithm.credit ("sum" or PURE's "min") over each
            response's tokens, applied to the token rewards returned (`algorithms.assign_credit`).
        on_nonfinite: "abort" or "skip" an optimiser step with a non-finite gradient norm; a
            diverged update always aborts (`models.optim.guarded_step`).
        max_tokens, packed: a token budget per forward instead of micro_batch_size rows, and the
            packed layout (`primekit.rollout.batching.Layout`).

    The reference log-probs it is given must come from the micro-batches of `reference_chunks`
    (its `Layout`), so that an untouched PRM scores exactly zero.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *,
                 beta: float, loss: Literal["ce", "dpo"], forward: Literal["single", "double"],
                 group_size: int, mini_batch_size: int, micro_batch_size: int, grad_clip: float,
                 credit: Literal["sum", "min"] = "sum", credit_temperature: float = 0.1,
                 on_nonfinite: Literal["abort", "skip"] = "abort", max_tokens: int = 0,
                 packed: bool = False):
        if optimizer is None and forward == "double":
            raise ValueError("forward='double' re-scores after an update; a frozen PRM has none")
        self.model, self.optimizer = model, optimizer
        self.beta, self.loss, self.forward = beta, loss, forward
        self.group_size, self.grad_clip = group_size, grad_clip
        self.on_nonfinite = on_nonfinite  # a non-finite gradient norm (train.on_nonfinite)
        self.mini_batch_size, self.micro_batch_size = mini_batch_size, micro_batch_size
        # The micro-batches of every PRM pass, and those the reference must be scored in.
        self.layout = Layout(micro_batch_size, group_size, max_tokens, packed and max_tokens > 0)
        self.reference_chunks = self.layout
        self.frozen = False  # True: score only, no update (an online PRM paused mid-run)
        # algorithm.credit over the response's tokens, each token a unit (algorithms/credit.py)
        self.credit, self.credit_temperature = credit, credit_temperature
        if optimizer is None:
            model.eval().requires_grad_(False)

    @property
    def online(self) -> bool:
        return self.optimizer is not None and not self.frozen

    def trainable(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        return {"prm": (self.model, self.optimizer)} if self.optimizer is not None else {}

    def rewards(self, batch: RolloutBatch, *, outcome_rewards: torch.Tensor,
                group_ids: torch.Tensor, ref_logprobs: torch.Tensor | None,
                problems: list | None = None,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """Update the PRM on this batch's outcomes (online) and return token rewards [N, T].
        `problems` is not read: the implicit PRM learns from the outcomes alone."""
        if ref_logprobs is None:
            raise ValueError("the implicit PRM needs the reference log-probs")
        mask = batch.response_mask.float()  # [N, T]
        online = self.online
        t0 = time.perf_counter()
        token_rewards, metrics = self._score_and_update(batch, outcome_rewards, group_ids,
                                                        ref_logprobs)
        metrics["timing/prm_update" if online else "timing/prm_forward"] = time.perf_counter() - t0
        seq = implicit_sequence_rewards(token_rewards, mask)  # [N], the pre-update rewards
        metrics.update(_pairwise_accuracy(seq, outcome_rewards, group_ids, "prm/acc_pairwise"))
        metrics["prm/acc_abs"] = prm_absolute_accuracy(seq, outcome_rewards)
        if self.forward == "double" and online:
            t0 = time.perf_counter()
            self.model.eval()
            prm_lp = batch_logprobs(self.model, batch, *self.layout)
            token_rewards = implicit_token_rewards(prm_lp, ref_logprobs, mask, self.beta)
            metrics["timing/prm_rescore"] = time.perf_counter() - t0
            seq = implicit_sequence_rewards(token_rewards, mask)  # [N], re-scored
            metrics.update(_pairwise_accuracy(seq, outcome_rewards, group_ids,
                                              "prm/acc_pairwise_after"))
        # Over the rows and tokens of every rank (sums all-reduced), as one process would.
        metrics["reward/implicit_seq_mean"], metrics["reward/implicit_seq_std"] = masked_mean_std(
            seq, torch.ones_like(seq, dtype=torch.bool), dist.all_reduce_sum)
        metrics["reward/implicit_token_abs_mean"] = masked_mean(
            token_rewards.abs(), mask, all_reduce=dist.all_reduce_sum)
        if self.credit != "sum":  # the PRM's metrics above stay those of its own rewards
            token_rewards, credit_metrics = assign_credit(
                token_rewards, mask, self.credit, self.credit_temperature, dist.all_reduce_sum)
            metrics.update(credit_metrics)
        return token_rewards, metrics

    def _score_and_update(self, batch: RolloutBatch, outcome_rewards: torch.Tensor,
                          group_ids: torch.Tensor, ref_logprobs: torch.Tensor,
                          ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """One pass over PRM mini-batches: each micro-batch's forward gives its token rewards and
        (online) its share of the mini-batch loss, backpropagated at once to free its graph."""
        online = self.online
        token_rewards = torch.zeros(batch.response_ids.shape)  # [N, T]
        sums, rows_seen, grad_norms = MetricSums(), 0, []  # loss metrics, row-weighted
        dpo_pairs = 0.0
        self.model.train(online)
        for mini in row_chunks(len(batch.responses), self.mini_batch_size, self.group_size):
            if online:
                self.optimizer.zero_grad(set_to_none=True)
            # The mini-batch's loss is a mean over its rows (CE) or its pairs (DPO): each
            # micro-batch's mean is weighted by its share, so any layout gives the same loss.
            mini_pairs = _pair_count(outcome_rewards[mini], group_ids[mini])
            for mb in iter_layout(batch, self.layout, mini):
                loss, lm = self._micro_batch(mb, batch, token_rewards, outcome_rewards, group_ids,
                                             ref_logprobs, online)
                if loss is not None:
                    if self.loss == "dpo" and mini_pairs > 0:
                        share = _pair_count(outcome_rewards[mb.rows], group_ids[mb.rows]) / mini_pairs
                    else:
                        share = len(mb.rows) / len(mini)
                    (loss * share).backward()
                    # The loss metric weighted like the loss (in rows): the same in any layout.
                    sums.add({"prm/loss": lm["prm/loss"]}, weight=share * len(mini))
                    sums.add({"prm/reward_mean": lm["prm/reward_mean"]}, weight=len(mb.rows))
                    rows_seen += len(mb.rows)
                    dpo_pairs = dpo_pairs + lm.get("prm/dpo_pairs", 0.0)  # a count: summed
            if online:
                # Sharded (torchrun) models average their gradients over ranks in backward.
                # Clip, check the gradient norm and the updated weights: this step's token
                # rewards came from the forward before it, so a diverged update must stop the
                # run here (models/optim.py), not in a later step or after a save.
                norm, _ = guarded_step("prm", self.model, self.optimizer,
                                       grad_clip=self.grad_clip, mode=self.on_nonfinite,
                                       lr_field="prm.lr")
                grad_norms.append(norm)
        metrics: dict[str, torch.Tensor | float] = {}
        if online:
            # The loss and the loss's own mean summed reward; for DPO, its pair count.
            metrics.update(sums.means(rows_seen))
            metrics["prm/grad_norm"] = torch.stack(grad_norms).mean()
            if self.loss == "dpo":
                metrics["prm/dpo_pairs"] = dpo_pairs
        return token_rewards, metrics

    def _micro_batch(self, mb: MicroBatch, batch: RolloutBatch, token_rewards: torch.Tensor,
                     outcome_rewards: torch.Tensor, group_ids: torch.Tensor,
                     ref_logprobs: torch.Tensor, online: bool,
                     ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """PRM forward of one micro-batch: writes its token rewards; returns its loss and the
        loss's metrics (online), or (None, {})."""
        device = next(self.model.parameters()).device
        rows, t = mb.rows, mb.response_len
        with torch.set_grad_enabled(online):
            prm_lp, _ = micro_batch_logprobs(self.model, mb)
        prm_lp = prm_lp.float()  # [n, t]
        ref_lp = ref_logprobs[rows, :t].to(device)  # [n, t]
        m = batch.response_mask[rows, :t].float().to(device)  # [n, t]
        token_rewards[rows, :t] = implicit_token_rewards(prm_lp.detach(), ref_lp, m,
                                                         self.beta).cpu()
        if not online:
            return None, {}
        outcome = outcome_rewards[rows].to(device)  # [n]
        if self.loss == "ce":
            return prm_ce_loss(prm_lp, ref_lp, m, outcome, self.beta)
        return prm_dpo_loss(prm_lp, ref_lp, m, outcome, group_ids[rows].to(device), self.beta)


def _pair_count(outcome_rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Pairs in the same group with different outcomes: the DPO loss's denominator."""
    return float(prm_pairwise_counts(torch.zeros_like(outcome_rewards), outcome_rewards,
                                     group_ids)[1])


def _pairwise_accuracy(seq_rewards: torch.Tensor, outcome_rewards: torch.Tensor,
                       group_ids: torch.Tensor, key: str) -> dict[str, torch.Tensor]:
    # Pooled over the pairs of every rank. Left out (not NaN) when no group of any rank has
    # outcomes that differ: there is nothing to order.
    correct, pairs = dist.all_reduce_sum(torch.stack(
        prm_pairwise_counts(seq_rewards, outcome_rewards, group_ids)))
    return {key: correct / pairs} if pairs else {}
