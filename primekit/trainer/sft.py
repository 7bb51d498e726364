"""Supervised warm-up: next-token cross-entropy on response tokens only, then an HF checkpoint.

The demonstrations go through the same micro-batches and the same scoring code as RL's passes
(`primekit.rollout.batching`, `models.logprobs`): padded rows, or with
`sft.max_tokens_per_micro_batch` packed padding-free micro-batches, the loss and gradients the
same to float rounding; the lm_head runs on the response tokens only, in chunks.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

from primekit.config import Config, ConfigError, SFTConfig
from primekit.data.problem import Problem
from primekit.data.splits import encode_prompts, load_splits
from primekit.logging import MetricLogger, Progress
from primekit.models.hf import load_model, load_tokenizer, save_model
from primekit.models.logprobs import check_packed_attention, micro_batch_logprobs
from primekit.models.optim import NonFiniteError, adamw, guarded_step, nonfinite_weights
from primekit.rollout.base import RolloutBatch, batch_from_texts
from primekit.rollout.batching import Layout, iter_layout
from primekit.runtime import model_dtype, resolve_device, seed_everything, set_threads


def response_token_loss(logprobs: torch.Tensor, response_mask: torch.Tensor,
                        n_tokens: int) -> tuple[torch.Tensor, dict]:
    """One micro-batch's share of SFT's loss, the mean next-token cross-entropy over the batch's
    response tokens R: -1/|R| sum_{t in R_mb} log p(y_t | y_<t).

    Divided by the whole batch's |R| = n_tokens, not the micro-batch's, so the shares of a batch
    sum to its mean (and their gradients to its gradient) however it is cut into micro-batches.

    Args:
        logprobs: [n, t] log p(y_t | y_<t) of the micro-batch's response tokens.
        response_mask: [n, t] 1 (True) on response tokens.
        n_tokens: |R|, the response tokens of the whole batch.
    """
    mask = response_mask.to(logprobs.dtype)  # [n, t]
    loss = -(logprobs * mask).sum() / n_tokens
    return loss, {"sft/tokens": int(mask.sum())}


def sft_backward(model, batch: RolloutBatch, layout: Layout) -> dict:
    """Forward and backward of one SFT batch, micro-batch by micro-batch (gradients accumulate
    in the parameters' .grad): the batch's loss, response tokens, and the columns its forwards
    computed (padding included) with the share of them that is padding."""
    n_tokens, total, columns = int(batch.response_mask.sum()), None, 0
    for mb in iter_layout(batch, layout):
        logprobs, _ = micro_batch_logprobs(model, mb)  # [n, t]
        loss, _ = response_token_loss(logprobs, mb.response_mask.to(logprobs.device), n_tokens)
        loss.backward()
        columns += mb.tokens_computed
        # Summed on the model's device: one synchronisation per batch, not per micro-batch.
        total = loss.detach() if total is None else total + loss.detach()
    valid = int(batch.prompt_mask.sum() + batch.response_mask.sum())
    return {"sft/loss": total.item(), "sft/tokens": n_tokens, "sft/columns": columns,
            "sft/padding": 1 - valid / columns}


def sft_layout(section: SFTConfig) -> Layout:
    """SFT's micro-batches: the whole batch as one padded micro-batch, or, with a token budget,
    packed (or length-sorted padded) micro-batches of at most that many tokens."""
    budget = section.max_tokens_per_micro_batch
    return Layout(section.batch_size, 1, budget, budget > 0 and section.packing == "packed")


def run_sft(cfg: Config, *, log_every: int = 25) -> dict:
    """Warm up `cfg.sft.init` (or the freshly built tiny model) on the training demonstrations."""
    s = cfg.sft
    set_threads(s.threads)
    seed_everything(s.seed)
    device = resolve_device(cfg.train.device)
    out_dir = Path(s.out_dir)

    # The demonstrations first: a bad data file or batch size fails before a model is loaded.
    train, _ = load_splits(cfg)
    train = [p for p in train if p.solution]
    if not train:
        raise ConfigError("sft: the training problems carry no demonstrations (field 'solution')")
    if s.batch_size > len(train):
        raise ConfigError(f"sft.batch_size: {s.batch_size} demonstrations per batch, but only "
                          f"{len(train)} training problems carry one; lower sft.batch_size or "
                          f"add demonstrations")

    init = s.init
    if init == "tiny":
        from primekit.models.tiny import build_tiny_model

        # Beside out_dir and named after it, as its logs: two runs writing into one parent
        # never share (and race to replace) one initial model.
        init = str(build_tiny_model(out_dir.parent / f"{out_dir.name}-tiny-init", seed=s.seed))
    trust = cfg.model.trust_remote_code
    tokenizer = load_tokenizer(init, trust_remote_code=trust)
    model = load_model(init, dtype=model_dtype(cfg.model.dtype), device=str(device),
                       trust_remote_code=trust)
    model.train()

    prompt_ids = encode_prompts(tokenizer, train, cfg)

    optimizer = adamw(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    layout = sft_layout(s)
    if layout.packed:  # attention must stay inside each packed demonstration
        check_packed_attention(model, "sft")

    def lr_at(step: int) -> float:
        # Linear warm-up, then cosine decay to 10% of the peak.
        if step < s.warmup_steps:
            return s.lr * (step + 1) / s.warmup_steps
        progress = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
        return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(s.seed)
    order = torch.randperm(len(train), generator=gen).tolist()
    cursor = 0
    logs = out_dir.parent / (out_dir.name + "-logs")
    if (logs / "metrics.jsonl").is_file():
        # SFT has no resume: this run's log starts empty; the earlier run's (whose model stays in
        # out_dir until this run saves) is kept beside it, one run back.
        os.replace(logs / "metrics.jsonl", logs / "metrics.previous.jsonl")
    logger = MetricLogger(logs, report_to=cfg.train.report_to, run_config=cfg.to_dict())
    start = time.perf_counter()
    last: dict = {}
    columns = padding = 0.0  # over every step: the forwards' columns, and how many were padding
    with Progress(total=s.steps, description="SFT") as progress:
        for step in range(s.steps):
            if cursor + s.batch_size > len(order):
                order = torch.randperm(len(train), generator=gen).tolist()
                cursor = 0
            idx = order[cursor : cursor + s.batch_size]
            cursor += s.batch_size
            # Demonstrations in the rollout layout (prompts left-padded, responses and EOS
            # right-padded), so RL's micro-batches cut them.
            batch = batch_from_texts(tokenizer, [prompt_ids[i] for i in idx],
                                     [_solution(train[i]) for i in idx])
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            optimizer.zero_grad(set_to_none=True)
            metrics = sft_backward(model, batch, layout)
            columns += metrics["sft/columns"]
            padding += metrics["sft/padding"] * metrics["sft/columns"]
            # Clip, check the gradient norm and the updated weights (train.on_nonfinite).
            grad_norm, _ = guarded_step("sft", model, optimizer, grad_clip=s.grad_clip,
                                        mode=cfg.train.on_nonfinite, step=step + 1,
                                        lr_field="sft.lr")
            metrics["sft/grad_norm"] = float(grad_norm)
            metrics["sft/lr"] = lr_at(step)
            last = metrics
            if step % log_every == 0 or step == s.steps - 1:
                logger.log(metrics, step=step)
            progress.update(advance=1, loss=metrics["sft/loss"])
    logger.close()
    model.eval()
    bad = nonfinite_weights(model)
    if bad is not None:  # never saved (the guarded steps make this unreachable in practice)
        raise NonFiniteError(f"sft: weight {bad} is not finite; sft.out_dir was not written")
    save_model(model, tokenizer, out_dir)
    return {"sft/final_loss": last.get("sft/loss", float("nan")), "sft/steps": s.steps,
            "sft/wall_s": time.perf_counter() - start, "sft/out_dir": str(out_dir),
            "sft/padding": padding / columns if columns else 0.0}


def _solution(problem: Problem) -> str:
    assert problem.solution is not None
    return problem.solution
