"""The arithmetic task is learnable by the tiny model in CPU minutes (slow: ~2 min on 1 thread).

Run: pytest -m slow tests/data/test_arithmetic_learnable.py -s
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from primekit.data.arithmetic import ArithmeticTask
from primekit.rollout.base import SamplingParams
from primekit.rollout.hf import HFRolloutEngine
from primekit.verifiers.arithmetic import ArithmeticVerifier

STEPS, BATCH, LR, WARMUP = 600, 32, 3e-3, 50


def _sft_batch(tokenizer, problems):
    """prompt + solution + <eos>, right-padded; loss only on solution and <eos>."""
    rows = [
        (
            tokenizer(p.prompt)["input_ids"],
            tokenizer(p.solution)["input_ids"] + [tokenizer.eos_token_id],
        )
        for p in problems
    ]
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)  # [n, W]
    mask = torch.zeros_like(ids)  # [n, W]
    labels = torch.full_like(ids, -100)  # [n, W]
    for i, (a, b) in enumerate(rows):
        ids[i, : len(a) + len(b)] = torch.tensor(a + b)
        mask[i, : len(a) + len(b)] = 1
        labels[i, len(a) : len(a) + len(b)] = torch.tensor(b)
    return ids, mask, labels


@pytest.mark.slow
def test_tiny_model_learns_arithmetic_by_sft(tiny_model_dir):
    from primekit.models.hf import load_model, load_tokenizer

    torch.manual_seed(0)
    model, tokenizer = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    task = ArithmeticTask()
    train = task.problems(STEPS * BATCH, "train", seed=0)
    test = task.problems(256, "test", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.0)
    start = time.perf_counter()
    for step in range(STEPS):
        lr = LR * min(1.0, step / WARMUP) * 0.5 * (1 + math.cos(math.pi * step / STEPS))
        for group in opt.param_groups:
            group["lr"] = lr
        ids, mask, labels = _sft_batch(tokenizer, train[step * BATCH : (step + 1) * BATCH])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    sft_seconds = time.perf_counter() - start

    engine = HFRolloutEngine(model, tokenizer)
    prompts = [tokenizer(p.prompt)["input_ids"] for p in test]
    accuracy = {}
    for temperature in (0.0, 1.0):
        batch = engine.generate(
            prompts,
            SamplingParams(temperature=temperature, max_new_tokens=48),
            torch.Generator().manual_seed(0),
        )
        scores = [v.score for v in ArithmeticVerifier().verify_batch(batch.responses, test)]
        by_difficulty = {
            d: sum(s for s, p in zip(scores, test) if p.meta["difficulty"] == d)
            / sum(p.meta["difficulty"] == d for p in test)
            for d in (2, 3, 4)
        }
        accuracy[temperature] = (sum(scores) / len(scores), by_difficulty)
    print(
        f"\nSFT {STEPS} steps x {BATCH} in {sft_seconds:.0f}s, final loss {loss.item():.3f}; accuracy {accuracy}"
    )
    greedy, sampled = accuracy[0.0][0], accuracy[1.0][0]
    # Measured (147 s): greedy 0.56, sampled 0.45 (by difficulty 2/3/4: 0.71 / 0.41 / 0.27).
    assert greedy >= 0.3 and sampled >= 0.2
    # Room left for RL, and harder problems are harder.
    assert sampled <= 0.9
    assert accuracy[1.0][1][2] > accuracy[1.0][1][4]
