"""Sample responses from a policy and score every token with the implicit PRM (heatmap, rerank).

The token reward is PRIME's implicit reward (Eq. 3), computed with the project's own functions:
`batch_logprobs` (primekit.models.logprobs) for log pi_prm and log pi_ref over the same
micro-batches, then `implicit_token_rewards` (primekit.algorithms.implicit_prm),
    r_t = beta * (log pi_prm(y_t | y_<t) - log pi_ref(y_t | y_<t)).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from primekit.config import Config, ConfigError


@dataclass
class Scored:
    """N = P problems x K samples, rows grouped by problem (problem p: rows p*K .. p*K+K-1)."""

    problems: list  # [N] Problem
    responses: list[str]  # [N]
    tokens: list[list[str]]  # [N][T_i] each valid response token, decoded alone
    scores: torch.Tensor  # [N] verifier outcome in [0, 1]
    statuses: list[str]  # [N] verdict status
    token_rewards: torch.Tensor  # [N, T], 0 off the mask
    response_mask: torch.Tensor  # [N, T]
    k: int
    beta: float
    ref: str = ""  # the reference the token rewards were scored against, as resolved


def decode_tokens(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor,
                  ) -> list[list[str]]:
    """Each valid token of each row decoded on its own (special tokens shown by name)."""
    out = []
    for ids, mask in zip(response_ids.tolist(), response_mask.bool().tolist()):
        valid = [i for i, m in zip(ids, mask) if m]
        out.append([tokenizer.decode([i]) for i in valid])
    return out


def token_rewards_for(prm, ref, batch, beta: float, micro_batch_size: int) -> torch.Tensor:
    """Implicit token rewards [N, T] of `batch`'s responses (PRIME Eq. 3)."""
    from primekit.algorithms.implicit_prm import implicit_token_rewards
    from primekit.models.logprobs import batch_logprobs

    prm_lp = batch_logprobs(prm, batch, micro_batch_size)  # [N, T]
    ref_lp = batch_logprobs(ref, batch, micro_batch_size)  # [N, T]
    return implicit_token_rewards(prm_lp, ref_lp, batch.response_mask.float(), beta)


def trained_reference(prm: str) -> str | None:
    """The reference the implicit PRM in `prm` was trained against, when `prm` is one a run
    wrote: RUN/final/prm (the run's newest checkpoint) or RUN/export/step_NNNNNN/prm (`primekit
    export`, that checkpoint). It is the checkpoint's model.ref, or its model.policy where
    model.ref was unset (PRIME's default: the policy's initial model). None for any other
    directory, a run whose checkpoint is gone, or one trained against the rollout policy
    (prm.reference=rollout: no fixed reference). A recorded local path that is no longer there
    is a ConfigError: scoring against another model would colour every token wrongly."""
    from primekit.trainer import checkpoint as ckpt
    from primekit.validate import cached_hub_model

    path = Path(prm)
    if path.name != "prm":
        return None
    if path.parent.name == "final":
        where = ckpt.latest_checkpoint(path.parent.parent)
    elif path.parent.parent.name == "export":
        where = path.parent.parent.parent / ckpt.CHECKPOINTS / path.parent.name
    else:
        return None
    try:
        cfg = ckpt.read_state(where)["config"]
        model, reference = cfg["model"], cfg["prm"]["reference"]
    except (TypeError, OSError, ValueError, KeyError):
        return None
    ref = model.get("ref") or model.get("policy")
    if reference == "rollout" or not ref:
        return None
    # A hub id is "name" or "org/name"; anything else with a path's shape was a local path,
    # relative to where that run started (a copied or moved run's reference is elsewhere).
    local = (ref.startswith((".", "/", "~")) or ref.count("/") > 1
             or Path(ref).parent.is_dir())
    if local and not Path(ref).expanduser().exists() and not cached_hub_model(ref):
        raise ConfigError(f"--ref: the run that trained --prm {prm} scored against {ref} (its "
                          f"model.ref or model.policy, relative to where that run started), "
                          f"which is not here; give --ref")
    return ref


def sample_and_score(cfg: Config, *, model: str, prm: str, ref: str | None, num_problems: int,
                     k: int, temperature: float, seed: int) -> Scored:
    """K samples of `model` on the first `num_problems` held-out problems, verified and scored
    token by token by the implicit PRM `prm` against `ref` (default: the reference `prm` was
    trained against where its run recorded one, `trained_reference`; else `model`)."""
    from primekit.data.splits import encode_prompts, load_splits, verifier_task
    from primekit.models.hf import load_model, load_tokenizer
    from primekit.rollout.base import SamplingParams
    from primekit.rollout.hf import HFRolloutEngine
    from primekit.runtime import model_dtype, resolve_device, set_threads
    from primekit.validate import check_model_dir
    from primekit.verifiers import build_verifier

    set_threads(cfg.train.threads)
    if ref is None:
        ref = trained_reference(prm)
        if ref is not None:
            from primekit.logging import console

            console.print(f"reference: {ref} (the PRM's, from its run; --ref for another)",
                          markup=False, highlight=False)
    ref = ref or model
    for path, field in ((model, "--model"), (prm, "--prm"), (ref, "--ref")):
        check_model_dir(path, field, tokenizer=field == "--model", kind="lm")
    device = str(resolve_device(cfg.train.device))
    dtype = model_dtype(cfg.model.dtype)
    trust = cfg.model.trust_remote_code
    tokenizer = load_tokenizer(model, trust_remote_code=trust)
    policy, prm_model, ref_model = (load_model(p, dtype=dtype, device=device,
                                               trust_remote_code=trust).eval()
                                    for p in (model, prm, ref))
    _, heldout = load_splits(cfg, train=False)
    problems = [p for p in heldout[:num_problems] for _ in range(k)]  # [N]
    prompt_ids = encode_prompts(tokenizer, problems, cfg)
    engine = HFRolloutEngine(policy, tokenizer, micro_batch_size=cfg.rollout.micro_batch_size,
                             decode=cfg.rollout.hf_decode)
    params = SamplingParams(temperature=temperature, max_new_tokens=cfg.rollout.max_new_tokens)
    batch = engine.generate(prompt_ids, params, torch.Generator().manual_seed(seed))
    verdicts = build_verifier(verifier_task(cfg), cfg.verifier).verify_batch(batch.responses,
                                                                            problems)
    rewards = token_rewards_for(prm_model, ref_model, batch, cfg.prm.beta,
                                cfg.prm.micro_batch_size)
    return Scored(problems=problems, responses=batch.responses,
                  tokens=decode_tokens(tokenizer, batch.response_ids, batch.response_mask),
                  scores=torch.tensor([v.score for v in verdicts]),
                  statuses=[v.status for v in verdicts], token_rewards=rewards,
                  response_mask=batch.response_mask.float(), k=k, beta=cfg.prm.beta, ref=ref)
