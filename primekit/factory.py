"""Build the RL trainer's collaborators from a config: the one place that knows them all.

`RLTrainer` is given its models, rollout engine, verifier and token rewarder; this module reads
the config and makes them, in a fixed order (the seed is set first, so a run is reproducible).
Tests and other callers pass their own `verifier`, `engine` or `rewarder` to replace the default.
"""

from __future__ import annotations

from functools import partial

import torch

from primekit import distributed as dist
from primekit.algorithms import ESTIMATORS
from primekit.config import Config, ConfigError
from primekit.data.splits import verifier_task
from primekit.models.hf import (
    check_model_path,
    load_model,
    load_model_config,
    load_value_model,
    stop_token_ids,
)
from primekit.models.logprobs import check_packed_attention, critic_values, score_tokens
from primekit.models.optim import adamw
from primekit.models.parallel import Placement, is_sharded, prepare_model
from primekit.rollout.base import RolloutEngine
from primekit.runtime import model_dtype, resolve_device, seed_everything, set_threads
from primekit.trainer.experience import TokenRewarder
from primekit.trainer.rl import RLTrainer
from primekit.validate import model_roles, validated_inputs
from primekit.verifiers import Verifier, build_verifier


def build_rl_trainer(cfg: Config, *, resume: bool = False, verifier: Verifier | None = None,
                     engine: RolloutEngine | None = None,
                     rewarder: TokenRewarder | None = None) -> RLTrainer:
    """An `RLTrainer` for `cfg`, resumed from its run directory's latest checkpoint if `resume`."""
    r = cfg.rollout
    if r.backend == "vllm" and engine is None:
        if dist.world_size() > 1:
            raise ConfigError("rollout.backend: 'vllm' runs one engine in a single process; "
                              "use rollout.backend=hf with torchrun")
        from primekit.rollout.vllm import require_vllm

        require_vllm()  # before any model is loaded: a missing extra fails in seconds
    # Model directories, data and device first: a bad input fails before any model loads.
    inputs = validated_inputs(cfg, roles=model_roles(cfg))
    set_threads(cfg.train.threads)
    seed_everything(cfg.train.seed + dist.rank())
    device = resolve_device(cfg.train.device)
    m, a = cfg.model, cfg.algorithm
    tokenizer = inputs.tokenizer
    policy = load_placed(cfg, m.policy, device, trainable=True)
    check_packing(cfg, policy, "policy")
    ref = None
    # The implicit PRM's log-ratio and a KL term need a reference; with prm.reference=rollout
    # the old-policy log-probs play its part and no model is loaded.
    if (a.reward_mode == "prime" and cfg.prm.reference == "sft") or a.kl_coef > 0:
        check_model_path(m.ref or m.policy, "model.ref")
        ref = load_placed(cfg, m.ref or m.policy, device, trainable=False)
        # PRIME scores the reference in the PRM's micro-batches, anything else in the policy's.
        check_packing(cfg, ref, "prm" if a.reward_mode == "prime" else "policy")
    if rewarder is None and a.reward_mode != "outcome":
        rewarder = build_rewarder(cfg, tokenizer, device)
    critic = build_critic(cfg, device) if ESTIMATORS[a.estimator].critic else None
    if engine is None and r.backend == "vllm":
        from primekit.rollout.vllm import VLLMRolloutEngine

        # vLLM loads the policy's checkpoint itself; a resumed run syncs its weights after.
        engine = VLLMRolloutEngine(m.policy, tokenizer, dtype=m.dtype, seed=cfg.train.seed,
                                   eos_token_ids=stop_token_ids(m.policy, tokenizer),
                                   kv_cache_gib=r.vllm_kv_cache_gib,
                                   gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                                   max_model_len=r.vllm_max_model_len,
                                   weight_sync=r.vllm_weight_sync,
                                   sync_bucket_mb=r.vllm_sync_bucket_mb,
                                   trust_remote_code=m.trust_remote_code)
    if engine is None:
        from primekit.rollout.hf import HFRolloutEngine

        # A sharded or fp32-master policy cannot sample as it is: the engine keeps its own full
        # copy in the compute dtype, refreshed by sync_weights after every update.
        own_copy = is_sharded(policy) or model_dtype(m.dtype) != torch.float32
        sampler = (load_model(m.policy, dtype=model_dtype(m.dtype), device=str(device),
                              trust_remote_code=m.trust_remote_code).eval().requires_grad_(False)
                   if own_copy else policy)
        engine = HFRolloutEngine(sampler, tokenizer, micro_batch_size=r.micro_batch_size,
                                 own_copy=own_copy, decode=r.hf_decode)
    if verifier is None:
        verifier = build_verifier(verifier_task(cfg), cfg.verifier)
    if cfg.live.enabled:  # counts the sampled responses that carry the shortcut (live.py)
        from primekit.trainer.live import PatternCounter

        verifier = PatternCounter(verifier, cfg.live.pattern)
    trainer = RLTrainer(cfg, policy=policy, tokenizer=tokenizer, engine=engine, verifier=verifier,
                        train_problems=inputs.train_problems, eval_problems=inputs.eval_problems,
                        rewarder=rewarder, ref=ref, critic=critic,
                        prompt_ids=(inputs.train_prompt_ids, inputs.eval_prompt_ids))
    if resume:
        trainer.resume()
    if cfg.live.enabled:  # RUN_DIR/control.json applied before every step (trainer/live.py)
        from primekit.trainer.live import LiveControl

        trainer.run_step = partial(LiveControl(trainer, verifier).step, trainer.train_step)
    return trainer


def build_rewarder(cfg: Config, tokenizer, device: torch.device) -> TokenRewarder:
    """The token rewarder of `algorithm.reward_mode`: the implicit PRM or an explicit RM."""
    if cfg.algorithm.reward_mode != "prime":
        from primekit.reward_models.dense import ExplicitRewarder

        return ExplicitRewarder(cfg, tokenizer, device, placement(cfg, trainable=False))
    from primekit.reward_models.implicit import ImplicitPRM

    m, p = cfg.model, cfg.prm
    check_model_path(m.prm or m.policy, "model.prm")
    if cfg.algorithm.estimator == "grpo" and cfg.algorithm.grpo_scale_by_std and dist.is_main():
        from primekit.logging import console

        console.print("[yellow]warning: PRIME with algorithm.estimator=grpo divides token rewards "
                      "by the group std of response-averaged rewards (App. B.3); it collapsed "
                      "training in every seed of docs/experiments/estimators.md. rloo is the "
                      "paper's choice. Normalising over the group's tokens "
                      "(algorithm.grpo_process_norm=tokens) collapsed too "
                      "(docs/experiments/grpo-process-norm.md).[/]")
    # An online PRM trains with fp32 master weights, as the reference code does.
    model = load_placed(cfg, m.prm or m.policy, device, trainable=p.update == "online")
    check_packing(cfg, model, "prm")
    optimizer = None
    if p.update == "online":
        optimizer = adamw(model.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    return ImplicitPRM(model, optimizer, beta=p.beta, loss=p.loss, forward=p.forward,
                       group_size=cfg.rollout.n_samples,
                       mini_batch_size=dist.per_rank(p.mini_batch_size, "prm.mini_batch_size"),
                       micro_batch_size=p.micro_batch_size, grad_clip=p.grad_clip,
                       credit=cfg.algorithm.credit,
                       credit_temperature=cfg.algorithm.credit_temperature,
                       on_nonfinite=cfg.train.on_nonfinite,
                       max_tokens=p.max_tokens_per_micro_batch, packed=p.packing == "packed")


def build_critic(cfg: Config, device: torch.device) -> torch.nn.Module:
    """A value model: the critic checkpoint (default: the policy's) with a fresh scalar head.

    Without dropout: transformers' token-classification heads drop 10% of the hidden state in
    training by default (`classifier_dropout`), so the values the critic trains on were noisy
    while the old values they are clipped against (eval mode) were not, and the update depended
    on the random masks: measured, one process with policy.micro_batch_size 4 instead of 8 changed
    the critic's 2-step update by 16-22% in norm (1.8e-6 without dropout), and 2 ranks by as much.
    TRL's trainers likewise disable dropout in their models (`disable_dropout_in_model`).
    """
    path = cfg.model.critic or cfg.model.policy
    check_model_path(path, "model.critic")
    trust = cfg.model.trust_remote_code
    config = load_model_config(path, num_labels=1, trust_remote_code=trust)
    config.classifier_dropout = 0.0
    critic = load_value_model(path, config=config, dtype=torch.float32, device=device,
                              trust_remote_code=trust)
    critic = prepare_model(critic, placement(cfg, trainable=True), critic_values)
    check_packing(cfg, critic, "policy", head="value")  # the critic uses the policy's layout
    return critic


def check_packing(cfg: Config, model: torch.nn.Module, section: str, head: str = "lm") -> None:
    """Where `section` (policy, prm, sft) packs its micro-batches, a ConfigError before training
    unless `model` keeps attention inside each packed sequence (`check_packed_attention`)."""
    sec = getattr(cfg, section)
    if sec.max_tokens_per_micro_batch > 0 and sec.packing == "packed":
        check_packed_attention(model, section, head)


def placement(cfg: Config, *, trainable: bool) -> Placement:
    """Where and how a model of the loop lives: sharded under torchrun, fp32 master weights for
    trained models, `model.dtype` compute (see primekit/models/parallel.py)."""
    par = cfg.parallel
    return Placement(compute_dtype=model_dtype(cfg.model.dtype), trainable=trainable,
                     shard=dist.world_size() > 1,
                     activation_checkpointing=par.activation_checkpointing and trainable,
                     cpu_offload=par.cpu_offload and trainable, compile=cfg.train.compile)


def load_placed(cfg: Config, path: str, device: torch.device, *, trainable: bool,
                ) -> torch.nn.Module:
    """A causal LM from `path`, placed for the loop (`placement`); frozen ones in eval mode."""
    place = placement(cfg, trainable=trainable)
    model = load_model(path, dtype=place.storage_dtype, device=str(device),
                       trust_remote_code=cfg.model.trust_remote_code)
    if not trainable:
        model.eval()
    return prepare_model(model, place, score_tokens)
