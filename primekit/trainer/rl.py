"""The online RL loop: PRIME (implicit process rewards), explicit reward models, outcome-only RL.

One step (PRIME Algorithm 1, arXiv 2502.01456) is `RLTrainer.train_step`, which reads top to
bottom as a sequence of synchronous phases, each with explicit inputs and outputs:

  collect     sample prompts, K rollouts each, verify, online filter; refill until B groups
  score       old-policy log-probs (for the PPO ratio) and reference log-probs (PRM, KL)
  reward      the token rewarder: the implicit PRM's online update and its token rewards
              (Eq. 3; under single forward from the update's own forward), or an explicit RM
  values      critic values (an estimator with a critic: "ppo")
  consistency with filter.consistency_drop (PROF): drop the samples of each group on which the
              dense reward and the verifier disagree most (collect.consistency_select)
  advantages  the estimator (Eq. 5 for RLOO), coefficients, KL, whitening
  update      critic, then policy (PPO clip, Eq. 6) in mini-batches
  sync        the new policy weights into the rollout engine

No forward pass runs twice: the old log-probs can come from the sampler, the reference log-probs
stand in for nothing else, and the PRM's single forward both trains it and scores the batch.
Between phases a non-finite reward, log-prob, advantage or gradient norm stops the step
(`train.on_nonfinite`: abort or skip). The trainer is given its collaborators (models, possibly
FSDP2-sharded under torchrun, rollout engine, verifier, token rewarder);
`primekit.factory.build_rl_trainer` builds them from a config.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from math import ceil
from pathlib import Path

import torch

from primekit import distributed as dist
from primekit.algorithms import (
    ESTIMATORS,
    compute_advantages,
    entropy_loss,
    kl_loss,
    kl_penalty,
    loss_agg_count,
    masked_mean,
    normalize_by_max_abs_return,
    ppo_clip_loss,
)
from primekit.config import Config
from primekit.data.problem import Problem
from primekit.data.splits import encode_prompts
from primekit.logging import (
    SAMPLES,
    MetricLogger,
    MetricSums,
    Progress,
    append_samples,
    console,
    timed,
)
from primekit.models.logprobs import batch_logprobs, batch_values, micro_batch_logprobs
from primekit.models.optim import adamw
from primekit.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from primekit.rollout.batching import iter_layout, row_chunks
from primekit.trainer import checkpoint as ckpt
from primekit.trainer import guards, signals
from primekit.trainer.collect import (
    IDLE_WARN_STEPS,
    GroupCarry,
    collect_groups,
    consistency_select,
    warn_idle,
    warn_unfilled,
)
from primekit.trainer.critic import update_critic
from primekit.trainer.eval import evaluate_heldout
from primekit.trainer.experience import (
    Experience,
    PromptSampler,
    TokenRewarder,
    batch_metrics,
    correct_for_sampler,
    micro_layout,
    sample_rows,
)
from primekit.trainer.watch import AccuracyWatch
from primekit.verifiers import Verifier


class RLTrainer:
    """Online RL of `policy` on verified rollouts; see the module docstring for one step.

    Args:
        cfg: the run's config (its `train`, `rollout`, `filter`, `algorithm`, `policy`,
            `critic`, `prm` and `eval` sections are read here).
        policy, tokenizer: the model trained (on its device) and its tokenizer.
        engine: samples from the policy (`sync_weights` after every update).
        verifier: grades responses against problems.
        train_problems, eval_problems: the prompt pool and the held-out problems.
        rewarder: dense token rewards (implicit PRM or explicit RM); None: outcome only.
        ref: the frozen reference model, if the rewarder or a KL term needs one; without it the
            old-policy log-probs stand in for the reference (`prm.reference=rollout`).
        critic: a value model (an estimator whose ESTIMATORS entry has `critic`: "ppo").
        prompt_ids: the token ids of train_problems' and eval_problems' prompts, when the caller
            has them (`primekit.validate` tokenises them for its length check); None: encoded here.
    """

    def __init__(self, cfg: Config, *, policy: torch.nn.Module, tokenizer, engine: RolloutEngine,
                 verifier: Verifier, train_problems: list[Problem], eval_problems: list[Problem],
                 rewarder: TokenRewarder | None = None, ref: torch.nn.Module | None = None,
                 critic: torch.nn.Module | None = None,
                 prompt_ids: tuple[list[list[int]], list[list[int]]] | None = None):
        self.cfg = cfg
        self.policy, self.tokenizer, self.engine, self.verifier = policy, tokenizer, engine, verifier
        self.rewarder, self.ref, self.critic = rewarder, ref, critic
        self.device = next(policy.parameters()).device
        self.policy_opt = adamw(policy.parameters(), lr=cfg.policy.lr,
                                weight_decay=cfg.policy.weight_decay)
        self.critic_opt = (adamw(critic.parameters(), lr=cfg.critic.lr)
                           if critic is not None else None)
        self.train_problems, self.eval_problems = train_problems, eval_problems
        self.mixed_tasks = len({p.task for p in train_problems}) > 1  # per-task reward metrics
        self.train_prompt_ids, self.eval_prompt_ids = prompt_ids or (
            encode_prompts(tokenizer, train_problems, cfg),
            encode_prompts(tokenizer, eval_problems, cfg))
        self.sampler = PromptSampler(len(train_problems), cfg.data.seed, dist.rank(),
                                     dist.world_size())
        self.rollout_gen = torch.Generator().manual_seed(cfg.train.seed * 7919 + dist.rank())
        # policy.mini_batch_size counts sequences over all ranks; each rank takes its share.
        self.mini_batch_rows = dist.per_rank(cfg.policy.mini_batch_size, "policy.mini_batch_size")
        # Micro-batches of the policy's passes (old log-probs, update, critic): rows or tokens.
        self.layout = micro_layout(cfg.policy)
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.resumed_from: Path | None = None
        self._warned_unfilled = False
        self._idle_steps = 0  # steps in a row that trained on nothing (`warn_idle`)
        self._step_verdicts: list = []  # this step's verdicts, every round
        # Surplus filtered groups kept for later steps and the filter's pass rate (collect.py).
        self.carry = GroupCarry(max_age=cfg.filter.carry_steps)
        self.last_experience: Experience | None = None  # the last update's batch (samples)
        # Sizes and SHA-256 of the model and data files the run starts from, saved with every
        # checkpoint: `--resume` refuses them changed (rundir.check_resume).
        from primekit.trainer.rundir import input_fingerprint

        self.inputs = input_fingerprint(cfg) if dist.is_main() else {}
        # The step the loop runs: train_step, or a wrapper of it that the factory installs
        # (live control with live.enabled, trainer/live.py).
        self.run_step: Callable[[], dict[str, float]] = self.train_step

    # ------------------------------------------------------------------ the loop
    def train(self) -> list[dict[str, float]]:
        """Run steps until `train.steps`, then evaluate and save; returns the metric history."""
        cfg = self.cfg.train
        logger = MetricLogger(Path(cfg.run_dir), report_to=cfg.report_to,
                              resume_step=self.step if self.resumed_from else None,
                              run_config=self.cfg.to_dict())
        if self.resumed_from and dist.is_main():  # metrics.jsonl: MetricLogger's resume_step
            from primekit.trainer.rundir import drop_rows_after

            drop_rows_after(Path(cfg.run_dir) / SAMPLES, self.step)
        if dist.is_main():  # what policy.old_logprobs (auto by default) was resolved to
            how = {"rollout": "reused from the sampler"}.get(self.cfg.policy.old_logprobs,
                                                             "recomputed by the trainer")
            console.print(f"policy.old_logprobs={self.cfg.policy.old_logprobs}: old log-probs {how}")
        announced = False  # the HF engine's decode path, printed once
        watch = AccuracyWatch(self.cfg.viz)  # a line when the accuracy light changes colour
        for row in self.history:  # a resumed run's rows so far, where it has them
            watch.update(row.get("reward/outcome_mean_sampled"), 0)
        try:
            with Progress(total=cfg.steps, start=self.step,
                          description=f"RL ({self.cfg.algorithm.reward_mode})") as progress:
                while self.step < cfg.steps:
                    signals.stop_if_requested(self.step, Path(cfg.run_dir), self.save)
                    guards.at_step(self.step + 1)  # the step that the optimiser guards name
                    metrics = self.run_step()
                    self.step += 1
                    decode_path = getattr(self.engine, "decode_path", None)
                    if decode_path and not announced and dist.is_main():  # after the first rollout
                        console.print(f"HF engine decode steps: {decode_path} "
                                      f"(rollout.hf_decode={self.cfg.rollout.hf_decode})")
                        announced = True
                    if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                        metrics.update(self.evaluate())
                    metrics = dist.reduce_metrics(metrics)
                    logger.log(metrics, step=self.step)
                    append_samples(Path(cfg.run_dir), self.step, self._sample_rows())
                    self.history.append(metrics)
                    progress.update(advance=1, acc=metrics["reward/outcome_mean_sampled"],
                                    prm_acc=metrics.get("prm/acc_pairwise", "-"))
                    note = watch.update(metrics.get("reward/outcome_mean_sampled"), self.step)
                    if note and dist.is_main():
                        console.print(note)
                    if cfg.save_every and self.step % cfg.save_every == 0:
                        self.save()
            self._finish(logger)
        finally:
            logger.close()
        return self.history

    def _finish(self, logger: MetricLogger) -> None:
        """After the last step: save it first (a stop or a kill from here on loses no step),
        then the final evaluation, then the export to `final/`, with a pending SIGINT/SIGTERM
        honoured before each phase and after the last (`signals.Stopped`, exit 130/143). A run
        resumed at `train.steps` whose checkpoint records its final evaluation does not run it
        again (nor log a second row)."""
        run_dir = Path(self.cfg.train.run_dir)
        signals.stop_if_requested(self.step, run_dir, self.save)  # saves, then raises
        path = ckpt.latest_checkpoint(run_dir)
        if path != ckpt.checkpoint_dir(run_dir, self.step):
            path = self.save()
        final = ckpt.read_final_eval(path)
        try:
            if final is None:
                final = dist.reduce_metrics(self.evaluate())
                logger.log(final, step=self.step)
                if dist.is_main():
                    ckpt.write_final_eval(path, final)
            else:
                console.print(f"the final evaluation of step {self.step} is recorded in {path}; "
                              f"not run again")
            self.history.append(final)
            signals.stop_if_requested(self.step, run_dir, self.save)
            if self.cfg.train.export_final and dist.is_main():  # one process reads the shards
                out = export_final(path, run_dir / "final")
                console.print(f"final models: {', '.join(str(p) for p in out.values())}")
        except signals.Abandoned as e:  # a second signal: the checkpoint is complete
            e.note = (f"checkpoint {path} of the last step is complete; "
                      f"{'the final evaluation' if final is None else 'the export to final/'} "
                      f"was abandoned (final/ not written)")
            raise
        dist.barrier()
        signals.stop_if_requested(self.step, run_dir, self.save)

    def train_step(self) -> dict[str, float]:
        """One RL step, phase by phase; returns its metrics as floats."""
        timing: dict[str, float] = {}
        t_step = time.perf_counter()
        exp, metrics = self.collect(timing)
        metrics["train/nonfinite_skipped"] = 0
        if exp is None:  # the filter kept nothing: no update this step
            self._idle_steps += 1
            if self._idle_steps == IDLE_WARN_STEPS and dist.is_main():
                warn_idle(self._idle_steps, self._step_verdicts, self.cfg.filter)
            metrics["timing/step"] = time.perf_counter() - t_step
            return {k: float(v) for k, v in metrics.items()}
        self._idle_steps = 0
        if not self._finite("reward/outcome", exp.outcome_rewards):
            return self._skipped(metrics, t_step)
        with timed(timing, "old_logprobs"):
            exp.old_logprobs = self.old_logprobs(exp.batch, exp.age)
        with timed(timing, "ref_logprobs"):
            exp.ref_logprobs = self.ref_logprobs(exp.batch, exp.old_logprobs)
        if not (self._finite("old_logprobs", exp.old_logprobs, exp.response_mask)
                and self._finite("ref_logprobs", exp.ref_logprobs, exp.response_mask)):
            return self._skipped(metrics, t_step)
        if self.rewarder is not None:  # times itself: PRM update, forward and re-score
            exp.token_rewards, reward_metrics = self.rewarder.rewards(
                exp.batch, outcome_rewards=exp.outcome_rewards, group_ids=exp.group_ids,
                ref_logprobs=exp.ref_logprobs, problems=exp.problems)
            metrics.update(reward_metrics)
            if not self._finite("reward/token", exp.token_rewards, exp.response_mask):
                return self._skipped(metrics, t_step)
        if self.critic is not None:
            with timed(timing, "critic_values"):
                exp.values = batch_values(self.critic, exp.batch, *self.layout)
        scored = exp  # every scored row: the hacking diagnostics and samples describe them all
        if self.cfg.filter.consistency_drop:  # PROF: keep where dense reward and verifier agree
            exp, consistency_metrics = consistency_select(exp, self.cfg.filter.consistency_drop)
            metrics.update(consistency_metrics)
        with timed(timing, "advantages"):
            exp.advantages, exp.returns, adv_metrics = self.advantages(exp)
        metrics.update(adv_metrics)
        exp.advantages, sampler_metrics = correct_for_sampler(exp, self.cfg.policy)  # TIS
        metrics.update(sampler_metrics)  # the sampler's log-prob mismatch, TIS weights
        if not self._finite("advantages", exp.advantages, exp.response_mask):
            return self._skipped(metrics, t_step)
        if self.critic is not None:
            with timed(timing, "critic_update"):
                metrics.update(update_critic(self.critic, self.critic_opt, exp, self.cfg,
                                             self.mini_batch_rows, self.device))
        with timed(timing, "policy_update"):
            metrics.update(self.update_policy(exp))
        metrics["train/nonfinite_skipped"] = metrics.pop("policy/nonfinite_skipped")
        with timed(timing, "weight_sync"):
            self.engine.sync_weights(self.policy)
        metrics.update(batch_metrics(scored, self.cfg.explicit.step_delimiter, self.tokenizer))
        self.last_experience = scored
        timing["step"] = time.perf_counter() - t_step
        metrics.update({f"timing/{k}": v for k, v in timing.items()})
        metrics["throughput/update_tokens_per_s"] = exp.response_mask.sum() / timing["policy_update"]
        return {k: float(v) for k, v in metrics.items()}

    def _finite(self, quantity: str, value: torch.Tensor, mask: torch.Tensor | None = None) -> bool:
        """train.on_nonfinite: False to skip the step, NonFiniteError to abort (guards.py)."""
        return guards.is_finite(quantity, value, step=self.step + 1,
                                mode=self.cfg.train.on_nonfinite, mask=mask)

    def _skipped(self, metrics: dict, t_step: float) -> dict[str, float]:
        """A step dropped by the numeric guard: no policy update; the weights must be sound."""
        guards.check_weights({k: m for k, (m, _) in self.trainable().items()}, step=self.step + 1)
        metrics.update({"train/skipped": 1, "train/nonfinite_skipped": 1,
                        "timing/step": time.perf_counter() - t_step})
        return {k: float(v) for k, v in metrics.items()}

    # ------------------------------------------------------------------ collect
    def collect(self, timing: dict[str, float]) -> tuple[Experience | None, dict]:
        """Sample, roll out K each, verify and filter, in rounds until B groups are kept."""
        need = ceil(self.cfg.train.prompts_per_step / dist.world_size())
        timing["rollout"] = timing["verify"] = 0.0
        self._step_verdicts = []
        exp, metrics = collect_groups(lambda n: self.rollout_round(n, timing), need=need,
                                      group_size=self.cfg.rollout.n_samples, filt=self.cfg.filter,
                                      pad_id=self.tokenizer.pad_token_id,
                                      per_task=self.mixed_tasks, carry=self.carry)
        tokens = metrics.pop("sampled_tokens")
        if timing["rollout"] > 0:  # 0: carried groups filled the batch, nothing sampled
            metrics["throughput/rollout_tokens_per_s"] = tokens / timing["rollout"]
        if metrics["filter/groups_kept"] < need and not self._warned_unfilled:
            self._warned_unfilled = True
            warn_unfilled(self.step, metrics, need)
        return exp, metrics

    def rollout_round(self, n_prompts: int, timing: dict[str, float],
                      ) -> tuple[RolloutBatch, list[Problem], list]:
        """K samples for each of `n_prompts` fresh prompts, and their verdicts; rows [n*K]."""
        cfg, K = self.cfg.rollout, self.cfg.rollout.n_samples
        idx = self.sampler.take(n_prompts)
        problems = [self.train_problems[i] for i in idx for _ in range(K)]  # [n*K]
        prompt_ids = [self.train_prompt_ids[i] for i in idx for _ in range(K)]
        params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                                max_new_tokens=cfg.max_new_tokens)
        with timed(timing, "rollout"):
            batch = self.engine.generate(prompt_ids, params, self.rollout_gen)
        with timed(timing, "verify"):
            verdicts = self.verifier.verify_batch(batch.responses, problems)
        self._step_verdicts += verdicts
        return batch, problems, verdicts

    # ------------------------------------------------------------------ score
    def old_logprobs(self, batch: RolloutBatch, age: torch.Tensor | None = None) -> torch.Tensor:
        """Log-probs of the sampled tokens under the policy before this step's update: [N, T].

        With policy.old_logprobs=rollout the sampler's own log-probs are those, except for rows
        carried from an earlier step (age > 0): an older policy sampled them, so theirs are
        recomputed under the current one (the carried groups' drift from their sampler is then
        left uncorrected, as for any recomputed row; policy.rollout_correction=tis corrects it).
        """
        if self.cfg.policy.old_logprobs == "rollout":  # exact for the HF engine at T=1, top-p 1
            old = batch.sampling_logprobs.float() * batch.response_mask.float()
            age = age if age is not None else torch.zeros(len(batch.responses), dtype=torch.long)
            stale = (age > 0).nonzero().flatten()  # whole groups: a group has one age
            rows = stale
            if dist.world_size() > 1:
                # A sharded policy's forward is a collective: every rank scores as many rows
                # as the rank with the most carried ones, its own carried rows first, then as
                # many fresh groups as it takes (scored and discarded).
                most = int(dist.all_reduce_max(torch.tensor(stale.numel())))
                fresh = (age == 0).nonzero().flatten()
                rows = torch.cat([stale, fresh[: most - stale.numel()]])
            if rows.numel():
                recomputed = batch_logprobs(self.policy, batch.select(rows), *self.layout)
                old = old.clone()
                old[stale.to(old.device)] = recomputed[: stale.numel()].to(old.device, old.dtype)
            return old
        return batch_logprobs(self.policy, batch, *self.layout)

    def ref_logprobs(self, batch: RolloutBatch, old_logprobs: torch.Tensor) -> torch.Tensor:
        """Reference log-probs [N, T]; without a reference model, the old log-probs stand in."""
        if self.ref is None:
            return old_logprobs
        if self.rewarder is not None and self.rewarder.reference_chunks is not None:
            # The rewarder's own micro-batches, so that an untouched PRM scores exactly zero.
            return batch_logprobs(self.ref, batch, *self.rewarder.reference_chunks)
        return batch_logprobs(self.ref, batch, *self.layout)

    # ------------------------------------------------------------------ advantages
    def advantages(self, exp: Experience) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
        """Per-token advantages [N, T] of the configured estimator, and critic targets (PPO)."""
        a = self.cfg.algorithm
        token_rewards = exp.token_rewards
        if token_rewards is not None and a.process_max_abs_norm:  # a reference-code option
            token_rewards = normalize_by_max_abs_return(token_rewards, exp.response_mask,
                                                        all_reduce_max=dist.all_reduce_max)
        estimator = ESTIMATORS[a.estimator]
        parts = estimator.fn(outcome_rewards=exp.outcome_rewards, response_mask=exp.response_mask,
                             token_rewards=token_rewards, gamma=a.gamma,
                             **estimator.options(a, exp.group_ids, exp.values))
        kl, kl_metrics = None, {}
        if estimator.critic and a.kl_coef > 0:
            # PPO with a critic puts the KL penalty into the token rewards (Gao et al.'s setup);
            # the other estimators add it to the loss (update_policy).
            kl = kl_penalty(exp.old_logprobs, exp.ref_logprobs, kind="k1")  # [N, T]
            kl_metrics["policy/kl"] = masked_mean(kl, exp.response_mask,
                                                  all_reduce=dist.all_reduce_sum)
        adv, returns, metrics = compute_advantages(
            parts, response_mask=exp.response_mask, process_coef=a.process_coef,
            outcome_coef=a.outcome_coef, kl=kl, kl_coef=a.kl_coef if kl is not None else 0.0,
            whiten=a.whiten, all_reduce=dist.all_reduce_sum)
        return adv, returns, {**metrics, **kl_metrics}

    # ------------------------------------------------------------------ updates
    def update_policy(self, exp: Experience) -> dict[str, torch.Tensor]:
        """PPO clipped surrogate (PRIME Eq. 6) over mini-batches, plus optional KL and entropy."""
        cfg, a = self.cfg.policy, self.cfg.algorithm
        # Linear warm-up, a function of the step alone (so resume needs no scheduler state).
        lr = cfg.lr * (min(1.0, (self.step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0)
        for group in self.policy_opt.param_groups:
            group["lr"] = lr
        self.policy.train()
        sums, count, skipped = MetricSums(), 0, 0
        columns = 0  # the micro-batches' columns, padding included
        for _ in range(cfg.ppo_epochs):
            for mini in row_chunks(len(exp), self.mini_batch_rows):
                self.policy_opt.zero_grad(set_to_none=True)
                # The mini-batch's loss denominator over all ranks (tokens or sequences), so that
                # micro-batches and ranks add up to the loss of the whole mini-batch.
                local = loss_agg_count(exp.response_mask[mini], cfg.loss_agg)
                total = dist.all_reduce_sum(local)
                for mb in iter_layout(exp.batch, self.layout, rows=mini):
                    rows, t = mb.rows, mb.response_len
                    columns += mb.tokens_computed
                    lp, ent = micro_batch_logprobs(self.policy, mb, compute_entropy=True)
                    lp = lp.float()  # [n, t]
                    m = exp.response_mask[rows, :t].to(lp.device)  # [n, t]
                    loss, lm = ppo_clip_loss(
                        lp, exp.old_logprobs[rows, :t].to(lp.device),
                        exp.advantages[rows, :t].to(lp.device), m,
                        clip_low=cfg.clip_low, clip_high=cfg.clip_high, agg=cfg.loss_agg)
                    ent_loss, em = entropy_loss(ent.float(), m, agg=cfg.loss_agg)
                    if a.entropy_coef > 0:
                        loss = loss + a.entropy_coef * ent_loss
                    if a.kl_coef > 0 and not ESTIMATORS[a.estimator].critic:  # else in rewards
                        kloss, km = kl_loss(lp, exp.ref_logprobs[rows, :t].to(lp.device), m,
                                            kind=a.kl_kind, agg=cfg.loss_agg)
                        loss = loss + a.kl_coef * kloss
                        lm.update(km)
                    # x world size: sharded gradients are averaged over ranks when reduced.
                    share = loss_agg_count(m, cfg.loss_agg) * dist.world_size() / total
                    (loss * share).backward()
                    # Metrics weighted like the loss (this rank's share of the mini-batch's
                    # denominator, in rows), so they too are the same in any layout.
                    weight = loss_agg_count(m, cfg.loss_agg) / local.to(m.device) * len(mini)
                    sums.add({**lm, **em}, weight=weight)
                    count += weight
                # Clip, check the gradient norm and the updated weights (guards.guarded_step).
                norm, stepped = guards.guarded_step(
                    "policy", self.policy, self.policy_opt, grad_clip=cfg.grad_clip,
                    mode=self.cfg.train.on_nonfinite, step=self.step + 1, lr_field="policy.lr")
                if not stepped:  # a non-finite gradient norm under on_nonfinite=skip
                    skipped += 1
                    continue
                sums.add({"policy/grad_norm": norm}, weight=len(mini))
        self.policy.eval()
        # Over all ranks: the share of the columns the update's forwards computed that is
        # padding (padded rows' prompt and response padding, packed rows' trailing columns).
        # Every row is in one micro-batch per epoch: its real tokens count once per epoch.
        valid = cfg.ppo_epochs * int(exp.batch.prompt_mask.sum() + exp.batch.response_mask.sum())
        columns, valid = dist.all_reduce_sum(torch.tensor([columns, valid], dtype=torch.float64))
        padding = {"throughput/update_padding": 1 - valid / columns} if columns > 0 else {}
        return {**sums.means(count), "policy/lr": lr, "policy/nonfinite_skipped": skipped,
                **padding}

    def _sample_rows(self) -> list[dict]:
        """samples.jsonl rows of the last update's batch ([] after a skipped step)."""
        exp, self.last_experience = self.last_experience, None
        n = self.cfg.viz.samples_per_step
        return [] if exp is None or n == 0 else sample_rows(exp, self.tokenizer, n)

    # ------------------------------------------------------------------ eval, checkpoints
    def evaluate(self) -> dict[str, float]:
        return evaluate_heldout(self.engine, self.verifier, self.eval_problems,
                                self.eval_prompt_ids, self.cfg)

    def trainable(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
        """The trained models and their optimisers, by name (what a checkpoint holds)."""
        out = {"policy": (self.policy, self.policy_opt)}
        if self.rewarder is not None:
            out.update(self.rewarder.trainable())
        if self.critic is not None:
            out["critic"] = (self.critic, self.critic_opt)
        return out

    def save(self) -> Path:
        trainable = self.trainable()
        # Carried filter groups do not cross a checkpoint (every save drops them, so the run
        # resumed from it trains on what this run trains on); the pass rate does.
        self.carry.clear()
        state = {"sampler": self.sampler.state_dict(), "config": self.cfg.to_dict(),
                 "history": self.history, "collect": self.carry.state_dict(),
                 "inputs": self.inputs}
        return ckpt.save_checkpoint(
            Path(self.cfg.train.run_dir), self.step,
            models={k: (m, self.tokenizer) for k, (m, _) in trainable.items()},
            optimizers={k: o for k, (_, o) in trainable.items()},
            generators={"rollout": self.rollout_gen}, state=state,
            keep_last=self.cfg.train.keep_checkpoints)

    def resume(self) -> None:
        """Continue from the run directory's latest complete checkpoint, exactly."""
        # The newest intact checkpoint (checksums verified on the main rank; a damaged newer
        # one is skipped with a warning naming the damage).
        run_dir = Path(self.cfg.train.run_dir)
        path = dist.broadcast_object(ckpt.intact_checkpoint(run_dir) if dist.is_main() else None)
        if path is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint under {self.cfg.train.run_dir}")
        trainable = self.trainable()
        state = ckpt.load_checkpoint(path, models={k: m for k, (m, _) in trainable.items()},
                                     optimizers={k: o for k, (_, o) in trainable.items()},
                                     generators={"rollout": self.rollout_gen})
        self.step = state["step"]
        self.sampler.load_state_dict(state["sampler"])
        self.carry.load_state_dict(state.get("collect", {}))
        self.history = state.get("history", [])
        self.engine.sync_weights(self.policy)
        self.resumed_from = path
        if dist.is_main():  # once, not once per rank
            console.print(f"resumed from {path} at step {self.step}")


def export_final(path: Path, out: Path) -> dict[str, Path]:
    """`checkpoint.export_checkpoint` of the last checkpoint to `final/` (atomic: a complete
    `final/` or none); a failed write is one line that says what is left (`rundir.write_errors`)."""
    from primekit.trainer.rundir import write_errors

    step = int(path.name.removeprefix("step_"))
    again = f"primekit export {path.parent.parent} --step {step} --out {out}"
    with write_errors(out.parent, what="final/",
                      intact=f"{path} is complete and {out} was not written; `{again}` writes it"):
        return ckpt.export_checkpoint(path, out)

