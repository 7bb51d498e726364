"""Supervised warm-up: next-token cross-entropy on response tokens only, then an HF checkpoint."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

from primekit.config import Config, ConfigError
from primekit.data.problem import Problem
from primekit.data.splits import encode_prompts, load_splits
from primekit.logging import MetricLogger, Progress
from primekit.models.hf import load_model, load_tokenizer, save_model
from primekit.models.optim import NonFiniteError, guarded_step, nonfinite_weights
from primekit.runtime import model_dtype, resolve_device, seed_everything, set_threads


def sft_batch(tokenizer, prompt_ids: list[list[int]], responses: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response rows with labels = -100 except on response tokens (and EOS)."""
    rows, labels = [], []
    for p_ids, text in zip(prompt_ids, responses):
        r_ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p_ids + r_ids)
        labels.append([-100] * len(p_ids) + r_ids)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)  # [n, L]
    label_t = torch.full((len(rows), width), -100, dtype=torch.long)  # [n, L]
    attention = torch.zeros((len(rows), width), dtype=torch.long)  # [n, L]
    for i, (r, lab) in enumerate(zip(rows, labels)):
        input_ids[i, : len(r)] = torch.tensor(r)
        label_t[i, : len(lab)] = torch.tensor(lab)
        attention[i, : len(r)] = 1
    return {"input_ids": input_ids, "labels": label_t, "attention_mask": attention}


def response_token_loss(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Mean next-token cross-entropy over response tokens: -1/|R| sum_{t in R} log p(y_t | y_<t)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    shift_logits = logits[:, :-1].float()  # [n, L-1, V]
    shift_labels = batch["labels"][:, 1:]  # [n, L-1]
    loss = torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1), ignore_index=-100
    )
    n_tokens = int((shift_labels != -100).sum())
    return loss, {"sft/loss": loss.item(), "sft/tokens": n_tokens}


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

        init = str(build_tiny_model(out_dir.parent / "tiny-init", seed=s.seed))
    trust = cfg.model.trust_remote_code
    tokenizer = load_tokenizer(init, trust_remote_code=trust)
    model = load_model(init, dtype=model_dtype(cfg.model.dtype), device=str(device),
                       trust_remote_code=trust)
    model.train()

    prompt_ids = encode_prompts(tokenizer, train, cfg)

    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)

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
    with Progress(total=s.steps, description="SFT") as progress:
        for step in range(s.steps):
            if cursor + s.batch_size > len(order):
                order = torch.randperm(len(train), generator=gen).tolist()
                cursor = 0
            idx = order[cursor : cursor + s.batch_size]
            cursor += s.batch_size
            batch = sft_batch(tokenizer, [prompt_ids[i] for i in idx],
                              [_solution(train[i]) for i in idx])
            batch = {k: v.to(device) for k, v in batch.items()}
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            loss, metrics = response_token_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
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
            "sft/wall_s": time.perf_counter() - start, "sft/out_dir": str(out_dir)}


def _solution(problem: Problem) -> str:
    assert problem.solution is not None
    return problem.solution
