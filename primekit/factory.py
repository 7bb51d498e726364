"""Build the RL trainer's collaborators from a config: the one place that knows them all.

`RLTrainer` is given its models, rollout engine, verifier and token rewarder; this module reads
the config and makes them, in a fixed order (the seed is set first, so a run is reproducible).
Tests and other callers pass their own `verifier`, `engine` or `rewarder` to replace the default.
"""

from __future__ import annotations

import torch

from primekit import distributed as dist
from primekit.config import Config, ConfigError
from primekit.data.splits import verifier_task
from primekit.models.hf import check_model_path, load_model
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
    if cfg.rollout.backend != "hf" and engine is None:
        raise ConfigError(f"rollout.backend: {cfg.rollout.backend!r} is not available yet; "
                          f"use rollout.backend=hf")
    # Model directories, data and device first: a bad input fails before any model loads.
    inputs = validated_inputs(cfg, roles=model_roles(cfg))
    set_threads(cfg.train.threads)
    seed_everything(cfg.train.seed + dist.rank())
    device = resolve_device(cfg.train.device)
    m, a = cfg.model, cfg.algorithm
    tokenizer = inputs.tokenizer
    policy = load_model(m.policy, dtype=model_dtype(m.dtype), device=str(device),
                        trust_remote_code=m.trust_remote_code)
    ref = None
    # The implicit PRM's log-ratio and a KL term need a reference; with prm.reference=rollout
    # the old-policy log-probs play its part and no model is loaded.
    if (a.reward_mode == "prime" and cfg.prm.reference == "sft") or a.kl_coef > 0:
        check_model_path(m.ref or m.policy, "model.ref")
        ref = load_model(m.ref or m.policy, dtype=model_dtype(m.dtype), device=str(device),
                         trust_remote_code=m.trust_remote_code).eval().requires_grad_(False)
    if rewarder is None and a.reward_mode != "outcome":
        rewarder = build_rewarder(cfg, tokenizer, device)
    critic = build_critic(cfg, device) if a.estimator == "ppo" else None
    if engine is None:
        from primekit.rollout.hf import HFRolloutEngine

        engine = HFRolloutEngine(policy, tokenizer, micro_batch_size=cfg.rollout.micro_batch_size)
    if verifier is None:
        verifier = build_verifier(verifier_task(cfg), cfg.verifier)
    trainer = RLTrainer(cfg, policy=policy, tokenizer=tokenizer, engine=engine, verifier=verifier,
                        train_problems=inputs.train_problems, eval_problems=inputs.eval_problems,
                        rewarder=rewarder, ref=ref, critic=critic)
    if resume:
        trainer.resume()
    return trainer


def build_rewarder(cfg: Config, tokenizer, device: torch.device) -> TokenRewarder:
    """The token rewarder of `algorithm.reward_mode`: the implicit PRM or an explicit RM."""
    if cfg.algorithm.reward_mode != "prime":
        from primekit.reward_models.dense import ExplicitRewarder

        return ExplicitRewarder(cfg, tokenizer, device)
    from primekit.reward_models.implicit import ImplicitPRM

    m, p = cfg.model, cfg.prm
    check_model_path(m.prm or m.policy, "model.prm")
    # The PRM trains in fp32 (master weights), as the reference code does.
    model = load_model(m.prm or m.policy, dtype=torch.float32, device=str(device),
                       trust_remote_code=m.trust_remote_code)
    optimizer = None
    if p.update == "online":
        optimizer = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=p.weight_decay)
    return ImplicitPRM(model, optimizer, beta=p.beta, loss=p.loss, forward=p.forward,
                       group_size=cfg.rollout.n_samples, mini_batch_size=p.mini_batch_size,
                       micro_batch_size=p.micro_batch_size, grad_clip=p.grad_clip)


def build_critic(cfg: Config, device: torch.device) -> torch.nn.Module:
    """A value model: the critic checkpoint (default: the policy's) with a fresh scalar head."""
    from transformers import AutoModelForTokenClassification

    path = cfg.model.critic or cfg.model.policy
    check_model_path(path, "model.critic")
    return AutoModelForTokenClassification.from_pretrained(
        path, num_labels=1, torch_dtype=torch.float32,
        trust_remote_code=cfg.model.trust_remote_code).to(device)
