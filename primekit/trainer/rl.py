"""The online RL loop: PRIME (implicit process rewards) and the outcome-only baselines.

One step, top to bottom (PRIME Algorithm 1, arXiv 2502.01456):
  sample prompts -> K rollouts each -> verify -> online filter (refill until B groups) ->
  old-policy and reference log-probs -> PRM update (its forward also yields the token rewards under
  single forward) -> token rewards -> advantages -> PPO policy update in mini-batches -> log.

Every forward pass runs once: under single forward the PRM's token rewards come from the very forward
that computes its loss; with `prm.reference=rollout` the reference log-probs are the old log-probs.
"""

from __future__ import annotations

import math
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from math import ceil
from pathlib import Path

import torch

from primekit import distributed as dist
from primekit.algorithms import (
    compute_advantages,
    entropy_loss,
    filter_groups,
    implicit_sequence_rewards,
    implicit_token_rewards,
    kl_loss,
    kl_penalty,
    masked_mean,
    ppo_clip_loss,
    prm_absolute_accuracy,
    prm_ce_loss,
    prm_dpo_loss,
    prm_pairwise_counts,
    value_loss,
)
from primekit.config import Config
from primekit.logging import MetricLogger, Progress, console
from primekit.models.hf import load_model, load_tokenizer
from primekit.models.logprobs import sequence_logprobs
from primekit.reward_models.diagnostics import reward_hacking_metrics
from primekit.rollout.base import SamplingParams, concat_batches
from primekit.trainer import checkpoint as ckpt
from primekit.trainer.common import (
    check_model_path,
    encode_prompts,
    load_splits,
    model_dtype,
    resolve_device,
    seed_everything,
    set_threads,
    verifier_task,
)
from primekit.trainer.eval import evaluate
from primekit.trainer.experience import (
    Experience,
    PromptSampler,
    batch_logprobs,
    batch_values,
    chunks,
    row_inputs,
    sequence_values,
)
from primekit.verifiers import build_verifier, verdict_stats


class RLTrainer:
    def __init__(self, cfg: Config, *, resume: bool = False):
        self.cfg = cfg
        set_threads(cfg.train.threads)
        seed_everything(cfg.train.seed + dist.rank())
        self.device = resolve_device(cfg.train.device)
        self.run_dir = Path(cfg.train.run_dir)
        m, a = cfg.model, cfg.algorithm
        self.prime = a.reward_mode == "prime"
        dtype = model_dtype(m.dtype)

        check_model_path(m.policy, "model.policy")
        self.tokenizer = load_tokenizer(m.policy)
        self.policy = load_model(m.policy, dtype=dtype, device=str(self.device),
                                 trust_remote_code=m.trust_remote_code)
        self.policy_opt = torch.optim.AdamW(self.policy.parameters(), lr=cfg.policy.lr,
                                            weight_decay=cfg.policy.weight_decay)
        # The reference is needed by the PRM (its log-ratio) and by a KL term; with
        # prm.reference=rollout the old policy log-probs play its part and no model is loaded.
        needs_ref_model = (self.prime and cfg.prm.reference == "sft") or a.kl_coef > 0
        self.ref = None
        if needs_ref_model:
            ref_path = m.ref or m.policy
            check_model_path(ref_path, "model.ref")
            self.ref = load_model(ref_path, dtype=dtype, device=str(self.device),
                                  trust_remote_code=m.trust_remote_code).eval().requires_grad_(False)
        self.prm = self.prm_opt = None
        if self.prime:
            prm_path = m.prm or m.policy
            check_model_path(prm_path, "model.prm")
            # The PRM trains in fp32 (master weights), as the reference code does.
            self.prm = load_model(prm_path, dtype=torch.float32, device=str(self.device),
                                  trust_remote_code=m.trust_remote_code)
            if cfg.prm.update == "online":
                self.prm_opt = torch.optim.AdamW(self.prm.parameters(), lr=cfg.prm.lr,
                                                 weight_decay=cfg.prm.weight_decay)
            else:
                self.prm.eval().requires_grad_(False)
        # Explicit (frozen) ORM or step-level PRM as the dense reward (Gao et al.).
        self.explicit = None
        if a.reward_mode in ("orm", "prm"):
            from primekit.reward_models.dense import ExplicitRewarder

            self.explicit = ExplicitRewarder(cfg, self.tokenizer, self.device)
        self.critic = self.critic_opt = None
        if a.estimator == "ppo":
            from transformers import AutoModelForTokenClassification

            critic_path = m.critic or m.policy
            check_model_path(critic_path, "model.critic")
            self.critic = AutoModelForTokenClassification.from_pretrained(
                critic_path, num_labels=1, torch_dtype=torch.float32,
                trust_remote_code=m.trust_remote_code).to(self.device)
            self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic.lr)

        # A second thread for phases that do not depend on each other (prm.overlap).
        self._pool = ThreadPoolExecutor(max_workers=1) if cfg.prm.overlap and self.prime else None
        self._pending_prm: Future | None = None
        # prm.score_per_round: one PRM mini-batch holds the whole step, so the PRM cannot change
        # between rollout rounds and each round can be scored as soon as it is verified.
        p = cfg.prm
        rows_per_step = ceil(cfg.train.prompts_per_step / dist.world_size()) * cfg.rollout.n_samples
        prm_mini_rows = max(cfg.rollout.n_samples,
                            p.mini_batch_size // cfg.rollout.n_samples * cfg.rollout.n_samples)
        self._round_scoring = (self.prime and p.score_per_round and p.forward == "single"
                               and prm_mini_rows >= rows_per_step)
        self.engine = self._build_engine()
        self.verifier = build_verifier(verifier_task(cfg))
        self.train_problems, self.eval_problems = load_splits(cfg)
        self.train_prompt_ids = encode_prompts(self.tokenizer, self.train_problems, cfg)
        self.eval_prompt_ids = encode_prompts(self.tokenizer, self.eval_problems, cfg)
        self.sampler = PromptSampler(len(self.train_problems), cfg.data.seed,
                                     dist.rank(), dist.world_size())
        self.rollout_gen = torch.Generator().manual_seed(cfg.train.seed * 7919 + dist.rank())
        self.step = 0
        self.history: list[dict] = []
        self.resumed_from: Path | None = None
        self._warned_unfilled = False
        if resume:
            self._resume()

    def _build_engine(self):
        if self.cfg.rollout.backend == "vllm":
            raise NotImplementedError(
                "rollout.backend=vllm arrives with the scale-out issue; use rollout.backend=hf"
            )
        from primekit.rollout.hf import HFRolloutEngine

        return HFRolloutEngine(self.policy, self.tokenizer,
                               micro_batch_size=self.cfg.rollout.micro_batch_size)

    # ------------------------------------------------------------------ the loop
    def train(self) -> list[dict]:
        cfg = self.cfg.train
        logger = MetricLogger(self.run_dir, tensorboard=cfg.tensorboard,
                              resume_step=self.step if self.resumed_from else None)
        try:
            with Progress(total=cfg.steps - self.step,
                          description=f"RL ({self.cfg.algorithm.reward_mode})") as progress:
                while self.step < cfg.steps:
                    metrics = self.train_step()
                    self.step += 1
                    if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                        metrics.update(self.evaluate())
                    metrics = dist.reduce_metrics(metrics)
                    logger.log(metrics, step=self.step)
                    self.history.append(metrics)
                    progress.update(advance=1, acc=metrics["reward/outcome_mean_sampled"],
                                    prm_acc=metrics.get("prm/acc_pairwise", "-"))
                    if cfg.save_every and self.step % cfg.save_every == 0:
                        self.save()
            final = dist.reduce_metrics(self.evaluate())
            logger.log(final, step=self.step)
            self.history.append(final)
            self.save()
        finally:
            logger.close()
        return self.history

    def train_step(self) -> dict[str, float]:
        t_step = time.perf_counter()
        timing: dict[str, float] = {}
        exp, metrics = self.collect(timing)
        if exp is None:
            metrics["timing/step"] = time.perf_counter() - t_step
            return metrics
        self.score_logprobs(exp, timing)
        if self.prime:
            metrics.update(self.update_prm(exp, timing))
        elif self.explicit is not None:
            t0 = time.perf_counter()
            exp.token_rewards, explicit_metrics = self.explicit.token_rewards(exp.batch)
            timing["explicit_rm"] = time.perf_counter() - t0
            metrics.update(explicit_metrics)
        if self.critic is not None:
            exp.values = self._timed(timing, "critic_values", batch_values, self.critic, exp.batch,
                                     self.cfg.policy.micro_batch_size, self.device)
        metrics.update(self.compute_advantages(exp, timing))
        if self.critic is not None:
            metrics.update(self._timed(timing, "critic_update", self.update_critic, exp))
        metrics.update(self._timed(timing, "policy_update", self.update_policy, exp))
        t0 = time.perf_counter()
        self._join_prm(metrics)  # an overlapped PRM step finishes alongside the policy update
        timing["prm_join_wait"] = time.perf_counter() - t0
        self.engine.sync_weights(self.policy)
        metrics.update(self.response_metrics(exp))
        hack = reward_hacking_metrics(
            exp.batch.responses, step_delimiter=self.cfg.explicit.step_delimiter,
            outcome_rewards=exp.outcome_rewards, token_rewards=exp.token_rewards,
            response_mask=exp.response_mask)
        # An undefined correlation (constant rewards) is left out, as other undefined metrics are.
        metrics.update({k: v for k, v in hack.items() if math.isfinite(v)})
        timing["step"] = time.perf_counter() - t_step
        metrics.update({f"timing/{k}": v for k, v in timing.items()})
        n_tokens = float(exp.response_mask.sum())
        metrics["throughput/rollout_tokens_per_s"] = metrics.pop("_sampled_tokens") / timing["rollout"]
        metrics["throughput/update_tokens_per_s"] = n_tokens / timing["policy_update"]
        return metrics

    # ------------------------------------------------------------------ phases
    def collect(self, timing: dict[str, float]) -> tuple[Experience | None, dict[str, float]]:
        """Sample prompts, roll out K each, verify, filter; refill until B groups are kept."""
        cfg, K = self.cfg, self.cfg.rollout.n_samples
        need = ceil(cfg.train.prompts_per_step / dist.world_size())
        params = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                max_new_tokens=cfg.rollout.max_new_tokens)
        kept_batches, kept_problems, kept_verdicts = [], [], []
        round_scores: list[tuple[int, dict]] = []  # (first row in the batch, forward handles)
        if self._round_scoring:
            self.prm.train(self.cfg.prm.update == "online")
        sampled_scores, all_verdicts, sampled_tokens = [], [], 0
        groups_seen = groups_kept = rounds = 0
        timing["rollout"] = timing["verify"] = 0.0
        while groups_kept < need and rounds < cfg.filter.max_rounds:
            rounds += 1
            missing = need - groups_kept
            n_prompts = missing
            if cfg.filter.enabled:
                # Refill rounds scale by the keep rate seen so far in this step, so a last
                # missing group or two does not cost a round each.
                rate = groups_kept / groups_seen if groups_seen else 1.0
                n_prompts = ceil(missing * cfg.filter.oversample / max(rate, 0.1))
            idx = self.sampler.take(n_prompts)
            problems = [self.train_problems[i] for i in idx for _ in range(K)]  # [n*K]
            prompt_ids = [self.train_prompt_ids[i] for i in idx for _ in range(K)]
            t0 = time.perf_counter()
            batch = self.engine.generate(prompt_ids, params, self.rollout_gen)
            timing["rollout"] += time.perf_counter() - t0
            sampled_tokens += int(batch.response_mask.sum())
            t0 = time.perf_counter()
            verdicts = self.verifier.verify_batch(batch.responses, problems)
            timing["verify"] += time.perf_counter() - t0
            scores = torch.tensor([v.score for v in verdicts])  # [n*K]
            sampled_scores.append(scores)
            all_verdicts += verdicts
            group_ids = torch.arange(len(idx)).repeat_interleave(K)  # [n*K]
            groups_seen += len(idx)
            if cfg.filter.enabled:
                keep, _ = filter_groups(scores, group_ids, lo=cfg.filter.lo, hi=cfg.filter.hi)
            else:
                keep = torch.ones(len(scores), dtype=torch.bool)
            rows = keep.nonzero().squeeze(1)[: missing * K]  # whole groups, contiguous
            if rows.numel():
                kept = batch.select(rows)
                if self._round_scoring:
                    last = groups_kept + rows.numel() // K >= need or rounds >= cfg.filter.max_rounds
                    round_scores.append((len(kept_problems), self._score_round(kept, last)))
                kept_batches.append(kept)
                kept_problems += [problems[i] for i in rows.tolist()]
                kept_verdicts += [verdicts[i] for i in rows.tolist()]
                groups_kept += rows.numel() // K
        keep_rate = groups_kept / max(groups_seen, 1)
        if dist.world_size() > 1:
            # Every rank must take the same number of optimiser steps, each ending in a gradient
            # all-reduce: all train on the smallest number of groups any rank kept (0: all skip).
            common = int(dist.reduce_metrics({"groups": groups_kept}, op="min")["groups"])
            if common < groups_kept:
                groups_kept = common
                kept_problems = kept_problems[: common * K]
                kept_verdicts = kept_verdicts[: common * K]
                for _, handles in round_scores:  # let the second thread finish with the PRM
                    for handle in handles.values():
                        if isinstance(handle, Future):
                            handle.result()
                round_scores = []  # scored rows no longer match: score the batch whole instead
                kept_batches = [concat_batches(kept_batches, pad_id=self.tokenizer.pad_token_id)
                                .select(torch.arange(common * K))] if common else []
        sampled = torch.cat(sampled_scores)
        metrics = {
            "reward/outcome_mean_sampled": float(sampled.mean()),
            "filter/keep_rate": keep_rate,
            "filter/rounds": float(rounds),
            "filter/groups_kept": float(groups_kept),
            "_sampled_tokens": float(sampled_tokens),
        }
        metrics.update(verdict_stats(all_verdicts))
        if groups_kept < need and not self._warned_unfilled:
            self._warned_unfilled = True  # once per run; filter/groups_kept tracks every step
            warnings.warn(
                f"step {self.step}: the online filter kept {groups_kept} of {need} prompt groups "
                f"after {rounds} rounds (keep rate {metrics['filter/keep_rate']:.2f}); training on "
                f"what was kept. Raise filter.max_rounds / filter.oversample, widen "
                f"filter.lo/hi, or change the data difficulty. (Shown once; see the metric "
                f"filter/groups_kept for later steps.)",
                stacklevel=2,
            )
        if groups_kept == 0:
            metrics["train/skipped"] = 1.0
            return None, metrics
        batch = concat_batches(kept_batches, pad_id=self.tokenizer.pad_token_id)
        outcome = torch.tensor([v.score for v in kept_verdicts], dtype=torch.float32)  # [N]
        exp = Experience(batch=batch, problems=kept_problems, verdicts=kept_verdicts,
                         group_ids=torch.arange(groups_kept).repeat_interleave(K),
                         outcome_rewards=outcome)
        if round_scores:
            exp.extra["round_scores"] = round_scores
        metrics["reward/outcome_mean"] = float(outcome.mean())
        metrics["train/skipped"] = 0.0
        return exp, metrics

    def _score_round(self, batch, last: bool) -> dict:
        """Reference and PRM forwards of one rollout round's kept rows (prm.score_per_round).

        Chunked exactly as `update_prm` chunks (micro-batches of whole groups, the same rows for
        both models), so an untouched PRM still scores exactly zero. With `prm.overlap` both run on
        the second thread while the next round rolls out; after the last round the PRM forward runs
        here, beside the reference forward on the other thread. Returns {"ref"?, "prm"}: each a
        Future or the value of `_forward_chunks`.
        """
        handles = {}
        if self.ref is not None:
            handles["ref"] = self._maybe_async(self._forward_chunks, self.ref, batch, False)
        handles["prm"] = self._maybe_async(self._forward_chunks, self.prm, batch,
                                           self.cfg.prm.update == "online", inline=last)
        return handles

    def _maybe_async(self, fn, *args, inline: bool = False):
        return fn(*args) if inline or self._pool is None else self._pool.submit(fn, *args)

    def _forward_chunks(self, model, batch, grad: bool) -> tuple[list, float]:
        """Per-token log-probs of `batch` in PRM micro-batches: ([(rows, t, logprobs [n, t])], s).

        With `grad` the log-probs keep their graph (the PRM's loss backpropagates through them).
        """
        t0 = time.perf_counter()
        out = []
        for rows in chunks(len(batch.responses), self.cfg.prm.micro_batch_size,
                           multiple=self.cfg.rollout.n_samples):
            ids, attn, t = row_inputs(batch, rows)
            with torch.set_grad_enabled(grad):
                lp, _ = sequence_logprobs(model, ids.to(self.device), attn.to(self.device), t)
            out.append((rows, t, lp.float() if grad else lp.float().cpu()))
        return out, time.perf_counter() - t0

    @staticmethod
    def _round_results(exp: Experience, key: str) -> tuple[list, float]:
        """The forwards of every round for `key` ("ref" or "prm"), rows offset into the batch,
        and their compute seconds (wherever they ran), waiting for any still running."""
        out, seconds = [], 0.0
        for offset, handles in exp.extra["round_scores"]:
            handle = handles[key]
            forwards, spent = handle.result() if isinstance(handle, Future) else handle
            out += [(rows + offset, t, lp) for rows, t, lp in forwards]
            seconds += spent
        return out, seconds

    def score_logprobs(self, exp: Experience, timing: dict[str, float]) -> None:
        """Old-policy log-probs (for the PPO ratio) and reference log-probs (for the PRM / KL)."""
        cfg = self.cfg
        mb = cfg.policy.micro_batch_size
        if cfg.policy.old_logprobs == "rollout":
            exp.old_logprobs = exp.batch.sampling_logprobs.float() * exp.response_mask
            timing["old_logprobs"] = 0.0
        elif self._pool is None or self.ref is None:
            exp.old_logprobs = self._timed(timing, "old_logprobs", batch_logprobs, self.policy,
                                           exp.batch, mb, self.device)
        if self.ref is not None and "round_scores" in exp.extra:
            t0 = time.perf_counter()
            forwards, timing["ref_logprobs"] = self._round_results(exp, "ref")
            timing["ref_wait"] = time.perf_counter() - t0
            exp.ref_logprobs = torch.zeros(exp.batch.response_ids.shape)  # [N, T]
            for rows, t, lp in forwards:
                exp.ref_logprobs[rows, :t] = lp
            exp.ref_logprobs *= exp.response_mask
        elif self.ref is not None:
            # Chunked like the PRM's forward, so an untouched PRM gives exactly zero rewards.
            ref_mb, multiple = mb, 1
            if self.prime:
                ref_mb, multiple = cfg.prm.micro_batch_size, cfg.rollout.n_samples
            args = (timing, "ref_logprobs", batch_logprobs, self.ref, exp.batch, ref_mb,
                    self.device, multiple)
            if self._pool is not None:
                exp.extra["ref_future"] = self._pool.submit(self._timed, *args)
            else:
                exp.ref_logprobs = self._timed(*args)
        else:
            exp.ref_logprobs = exp.old_logprobs
            timing["ref_logprobs"] = 0.0
        if exp.old_logprobs is None:  # overlapped with the reference forward just submitted
            exp.old_logprobs = self._timed(timing, "old_logprobs", batch_logprobs, self.policy,
                                           exp.batch, mb, self.device)

    def update_prm(self, exp: Experience, timing: dict[str, float]) -> dict[str, float]:
        """PRM loss on this batch's outcomes; token rewards from the same forward (single forward).

        Under double forward the token rewards are re-scored by the updated PRM afterwards; with a
        frozen PRM there is only the scoring forward. With `prm.overlap` (single forward), the last
        mini-batch's backward and optimiser step run on a second thread while the policy updates:
        they are independent, as the token rewards were already read off the forward.
        """
        cfg, p = self.cfg, self.cfg.prm
        K = cfg.rollout.n_samples
        N, T = exp.batch.response_ids.shape
        mask = exp.response_mask
        token_rewards = torch.zeros(N, T)  # [N, T]
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        online = p.update == "online"
        losses, grad_norms = [], []
        self.prm.train(online)
        per_round = "round_scores" in exp.extra  # forwards already run during collection
        minis = [] if per_round else list(chunks(N, p.mini_batch_size, multiple=K))
        if per_round:
            t1 = time.perf_counter()
            forwards, timing["prm_forward_compute"] = self._round_results(exp, "prm")
            timing["prm_forward_wait"] = time.perf_counter() - t1
            pieces = [self._prm_piece(exp, f, token_rewards, online, N) for f in forwards]
            if online:
                losses += [(float(x.detach()) * N / len(f[0]), len(f[0]))
                           for x, f in zip(pieces, forwards)]
                self.prm_opt.zero_grad(set_to_none=True)
                if p.overlap:
                    self._pending_prm = self._submit_prm_backward(sum(pieces))
                else:
                    grad_norms.append(self._prm_backward_step(sum(pieces)))
        for i, mini in enumerate(minis):
            defer = online and p.overlap and p.forward == "single" and i == len(minis) - 1
            if online:
                self.prm_opt.zero_grad(set_to_none=True)
            forwards = []
            for rows in chunks(len(mini), p.micro_batch_size, multiple=K):
                rows = mini[rows]
                ids, attn, t = row_inputs(exp.batch, rows)
                with torch.set_grad_enabled(online):
                    prm_lp, _ = sequence_logprobs(self.prm, ids.to(self.device),
                                                  attn.to(self.device), t)
                forwards.append((rows, t, prm_lp.float()))
                if not defer:  # score and backpropagate now, freeing this micro-batch's graph
                    loss = self._prm_piece(exp, forwards.pop(), token_rewards, online, len(mini))
                    if loss is not None:
                        loss.backward()
                        losses.append((float(loss.detach()) * len(mini) / len(rows), len(rows)))
            if defer:
                # The reference forward may still be running on the other thread: wait for it
                # only now, after the PRM forwards.
                pieces = [self._prm_piece(exp, f, token_rewards, True, len(mini)) for f in forwards]
                losses += [(float(x.detach()) * len(mini) / len(f[0]), len(f[0]))
                           for x, f in zip(pieces, forwards)]
                self._pending_prm = self._submit_prm_backward(sum(pieces))
            elif online:
                grad_norms.append(self._prm_backward_step(None))
        timing["prm_update" if online else "prm_forward"] = time.perf_counter() - t0
        seq_before = implicit_sequence_rewards(token_rewards, mask)  # [N]
        metrics.update(self._prm_accuracy(seq_before, exp, "prm/acc_pairwise"))
        metrics["prm/acc_abs"] = float(prm_absolute_accuracy(seq_before, exp.outcome_rewards))
        if online:
            metrics["prm/loss"] = sum(v * n for v, n in losses) / sum(n for _, n in losses)
        if grad_norms:
            metrics["prm/grad_norm"] = sum(grad_norms) / len(grad_norms)
        if online and p.forward == "double":
            self.prm.eval()
            t0 = time.perf_counter()
            prm_lp = batch_logprobs(self.prm, exp.batch, p.micro_batch_size, self.device, K)
            token_rewards = implicit_token_rewards(prm_lp, self._ref(exp), mask, p.beta)
            timing["prm_rescore"] = time.perf_counter() - t0
            seq_after = implicit_sequence_rewards(token_rewards, mask)
            metrics.update(self._prm_accuracy(seq_after, exp, "prm/acc_pairwise_after"))
        exp.token_rewards = token_rewards
        seq = seq_after if online and p.forward == "double" else seq_before  # [N]
        metrics["reward/implicit_seq_mean"] = float(seq.mean())
        metrics["reward/implicit_seq_std"] = float(seq.std()) if len(seq) > 1 else 0.0
        metrics["reward/implicit_token_abs_mean"] = float(masked_mean(token_rewards.abs(), mask))
        return metrics

    def _prm_piece(self, exp: Experience, forward, token_rewards: torch.Tensor, online: bool,
                   mini_size: int) -> torch.Tensor | None:
        """Token rewards of one micro-batch's PRM forward, and its share of the mini-batch loss."""
        p = self.cfg.prm
        rows, t, prm_lp = forward
        ref_lp = self._ref(exp)[rows, :t].to(prm_lp.device)
        m = exp.response_mask[rows, :t].to(prm_lp.device)
        token_rewards[rows, :t] = implicit_token_rewards(prm_lp.detach(), ref_lp, m, p.beta).cpu()
        if not online:
            return None
        outcome = exp.outcome_rewards[rows].to(prm_lp.device)
        if p.loss == "ce":
            loss, _ = prm_ce_loss(prm_lp, ref_lp, m, outcome, p.beta)
        else:
            loss, _ = prm_dpo_loss(prm_lp, ref_lp, m, outcome,
                                   exp.group_ids[rows].to(prm_lp.device), p.beta)
        return loss * len(rows) / mini_size

    def _submit_prm_backward(self, loss: torch.Tensor) -> Future:
        """The PRM's backward (and, in a single process, its step) on the second thread.

        With several ranks the gradient all-reduce and the step wait for `_join_prm` on the main
        thread: collectives issued from two threads could interleave in a different order on
        each rank, and gloo / NCCL match them by order.
        """
        single = dist.world_size() == 1
        return self._pool.submit(self._prm_backward_step, loss, single)

    def _prm_backward_step(self, loss: torch.Tensor | None, step: bool = True) -> float | None:
        """Backward (unless already done), then with `step` the gradient all-reduce, clipping and
        one PRM optimiser step (returns the gradient norm)."""
        if loss is not None:
            loss.backward()
        return self._prm_step() if step else None

    def _prm_step(self) -> float:
        self._sync_grads(self.prm)
        norm = float(torch.nn.utils.clip_grad_norm_(self.prm.parameters(), self.cfg.prm.grad_clip))
        self.prm_opt.step()
        return norm

    def _join_prm(self, metrics: dict[str, float] | None = None) -> None:
        """Wait for an overlapped PRM step; its gradient norm joins `metrics`."""
        if self._pending_prm is None:
            return
        norm = self._pending_prm.result()
        self._pending_prm = None
        if norm is None:  # backward only (several ranks): all-reduce and step on this thread
            norm = self._prm_step()
        if metrics is not None:
            metrics["prm/grad_norm"] = norm

    def _ref(self, exp: Experience) -> torch.Tensor:
        """Reference log-probs, waiting for the overlapped reference forward if there is one."""
        future = exp.extra.pop("ref_future", None)
        if future is not None:
            exp.ref_logprobs = future.result()
        return exp.ref_logprobs

    def _prm_accuracy(self, seq_rewards, exp: Experience, key: str) -> dict[str, float]:
        # Left out (not NaN) when no group has outcomes that differ: there is nothing to order.
        correct, pairs = prm_pairwise_counts(seq_rewards, exp.outcome_rewards, exp.group_ids)
        return {key: float(correct) / float(pairs)} if pairs else {}

    def compute_advantages(self, exp: Experience, timing: dict[str, float]) -> dict[str, float]:
        a = self.cfg.algorithm
        t0 = time.perf_counter()
        kl = None
        if a.estimator == "ppo" and a.kl_coef > 0:
            # PPO with a critic puts the KL penalty into the token rewards (Gao et al.'s setup).
            kl = kl_penalty(exp.old_logprobs, self._ref(exp), kind="k1")
        exp.advantages, exp.returns, metrics = compute_advantages(
            a.estimator,
            outcome_rewards=exp.outcome_rewards,
            response_mask=exp.response_mask,
            group_ids=exp.group_ids,
            token_rewards=exp.token_rewards,
            values=exp.values,
            gamma=a.gamma,
            lam=a.lam,
            process_coef=self.cfg.explicit.dense_coef if self.explicit else a.process_coef,
            outcome_coef=self.cfg.explicit.success_coef if self.explicit else a.outcome_coef,
            rloo_variant=a.rloo_variant,
            grpo_scale_by_std=a.grpo_scale_by_std,
            reinforce_baseline=a.reinforce_baseline,
            whiten=a.whiten,
            process_max_abs_norm=a.process_max_abs_norm,
            kl=kl,
            kl_coef=a.kl_coef if kl is not None else 0.0,
        )
        timing["advantages"] = time.perf_counter() - t0
        return metrics

    def update_policy(self, exp: Experience) -> dict[str, float]:
        """PPO clipped surrogate (PRIME Eq. 6) over mini-batches, plus optional KL and entropy."""
        cfg, a = self.cfg.policy, self.cfg.algorithm
        N = len(exp)
        # Linear warm-up, a function of the step alone (so resume needs no scheduler state).
        scale = min(1.0, (self.step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
        for group in self.policy_opt.param_groups:
            group["lr"] = cfg.lr * scale
        self.policy.train()
        sums: dict[str, float] = {}
        count = 0
        for _ in range(cfg.ppo_epochs):
            for mini in chunks(N, cfg.mini_batch_size):
                self.policy_opt.zero_grad(set_to_none=True)
                for rows in chunks(len(mini), cfg.micro_batch_size):
                    rows = mini[rows]
                    ids, attn, t = row_inputs(exp.batch, rows)
                    lp, ent = sequence_logprobs(self.policy, ids.to(self.device),
                                                attn.to(self.device), t, compute_entropy=True)
                    lp = lp.float()
                    m = exp.response_mask[rows, :t].to(lp.device)
                    loss, lm = ppo_clip_loss(
                        lp, exp.old_logprobs[rows, :t].to(lp.device),
                        exp.advantages[rows, :t].to(lp.device), m,
                        clip_low=cfg.clip_low, clip_high=cfg.clip_high, agg=cfg.loss_agg)
                    ent_loss, em = entropy_loss(ent.float(), m, agg=cfg.loss_agg)
                    if a.entropy_coef > 0:
                        loss = loss + a.entropy_coef * ent_loss
                    if a.kl_coef > 0 and a.estimator != "ppo":
                        kloss, km = kl_loss(lp, self._ref(exp)[rows, :t].to(lp.device), m,
                                            kind=a.kl_kind, agg=cfg.loss_agg)
                        loss = loss + a.kl_coef * kloss
                        lm.update(km)
                    (loss * len(rows) / len(mini)).backward()
                    for k, v in {**lm, **em}.items():
                        sums[k] = sums.get(k, 0.0) + float(v) * len(rows)
                    count += len(rows)
                self._sync_grads(self.policy)
                norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip)
                sums["policy/grad_norm"] = sums.get("policy/grad_norm", 0.0) + float(norm) * len(mini)
                self.policy_opt.step()
        self.policy.eval()
        return {**{k: v / count for k, v in sums.items()}, "policy/lr": cfg.lr * scale}

    def update_critic(self, exp: Experience) -> dict[str, float]:
        c, p = self.cfg.critic, self.cfg.policy
        N = len(exp)
        self.critic.train()
        sums: dict[str, float] = {}
        for mini in chunks(N, p.mini_batch_size):
            self.critic_opt.zero_grad(set_to_none=True)
            for rows in chunks(len(mini), p.micro_batch_size):
                rows = mini[rows]
                ids, attn, t = row_inputs(exp.batch, rows)
                values = sequence_values(self.critic, ids.to(self.device), attn.to(self.device), t)
                m = exp.response_mask[rows, :t].to(values.device)
                loss, lm = value_loss(values, exp.values[rows, :t].to(values.device),
                                      exp.returns[rows, :t].to(values.device), m, clip=c.value_clip)
                (loss * len(rows) / len(mini)).backward()
                for k, v in lm.items():
                    sums[k] = sums.get(k, 0.0) + float(v) * len(rows) / N
            self._sync_grads(self.critic)
            torch.nn.utils.clip_grad_norm_(self.critic.parameters(), c.grad_clip)
            self.critic_opt.step()
        self.critic.eval()
        return sums

    def response_metrics(self, exp: Experience) -> dict[str, float]:
        lengths = exp.batch.response_mask.sum(1).float()  # [N]
        return {
            "response/len_mean": float(lengths.mean()),
            "response/len_max": float(lengths.max()),
            "response/truncated_rate": float((~exp.batch.finished).float().mean()),
        }

    # ------------------------------------------------------------------ eval, checkpoints
    def evaluate(self) -> dict[str, float]:
        e = self.cfg.eval
        n = min(e.num_problems, len(self.eval_problems))
        shard = dist.shard(list(range(n)))
        gen = torch.Generator().manual_seed(self.cfg.train.seed + 99991)
        return evaluate(self.engine, self.verifier, [self.eval_problems[i] for i in shard],
                        [self.eval_prompt_ids[i] for i in shard], k=e.k,
                        temperature=e.temperature,
                        max_new_tokens=e.max_new_tokens or self.cfg.rollout.max_new_tokens,
                        generator=gen)

    def save(self) -> Path:
        models = {"policy": (self.policy, self.tokenizer)}
        optimizers = {"policy": self.policy_opt}
        if self.prm is not None and self.prm_opt is not None:
            models["prm"] = (self.prm, self.tokenizer)
            optimizers["prm"] = self.prm_opt
        if self.critic is not None:
            models["critic"] = (self.critic, self.tokenizer)
            optimizers["critic"] = self.critic_opt
        state = {"sampler": self.sampler.state_dict(),
                 "config": self.cfg.to_dict(), "history": self.history}
        return ckpt.save_checkpoint(self.run_dir, self.step, models=models, optimizers=optimizers,
                                    generators={"rollout": self.rollout_gen}, state=state,
                                    keep_last=self.cfg.train.keep_checkpoints)

    def _resume(self) -> None:
        path = ckpt.latest_checkpoint(self.run_dir)
        if path is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint under {self.run_dir}")
        models = {"policy": self.policy}
        optimizers = {"policy": self.policy_opt}
        if self.prm is not None and self.prm_opt is not None:
            models["prm"], optimizers["prm"] = self.prm, self.prm_opt
        if self.critic is not None:
            models["critic"], optimizers["critic"] = self.critic, self.critic_opt
        state = ckpt.load_checkpoint(path, models=models, optimizers=optimizers,
                                     generators={"rollout": self.rollout_gen})
        self.step = state["step"]
        self.sampler.load_state_dict(state["sampler"])
        self.history = state.get("history", [])
        self.engine.sync_weights(self.policy)
        self.resumed_from = path
        console.print(f"resumed from {path} at step {self.step}")

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _timed(timing: dict[str, float], name: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        timing[name] = time.perf_counter() - t0
        return out

    @staticmethod
    def _sync_grads(model) -> None:
        """Average gradients across ranks (plain all-reduce; DDP/FSDP arrive with scale-out)."""
        if dist.world_size() == 1:
            return
        import torch.distributed as tdist

        for p in model.parameters():
            if p.grad is not None:
                tdist.all_reduce(p.grad, op=tdist.ReduceOp.AVG)
