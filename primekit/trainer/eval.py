"""Evaluation with exactly the training verifier: greedy pass@1, sampled avg@k and unbiased pass@k."""

from __future__ import annotations

import math
import time

import torch

from primekit import distributed as dist
from primekit.data.problem import Problem
from primekit.rollout.base import SamplingParams
from primekit.verifiers.arithmetic import trace_error_counts


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, Codex paper, Eq. 1).

    pass@k = 1 - C(n - c, k) / C(n, k); equals 1 when fewer than k samples are wrong.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@torch.no_grad()
def evaluate(
    engine,
    verifier,
    problems: list[Problem],
    prompt_ids: list[list[int]],
    *,
    k: int,
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | None = None,
    batch_prompts: int = 256,
) -> dict[str, float]:
    """Greedy pass@1, plus avg@k and pass@k over k samples per problem when k > 1; under
    torchrun over the problems of every rank (each rank passes its shard; a collective).

    Metric keys: eval/pass@1_greedy, eval/avg@k, eval/pass@k, eval/response_len,
    eval/error_rate (verifier errors + timeouts), eval/wall_s, and eval/trace_error_greedy (the
    share of greedy-correct responses to arithmetic-format problems with a wrong step; present
    when there is one such response).
    """
    start = time.perf_counter()
    metrics: dict[str, float] = {}
    greedy_scores, lengths, broken = [], [], 0
    traced_correct = traced_wrong = 0
    for lo in range(0, len(problems), batch_prompts):
        chunk = slice(lo, lo + batch_prompts)
        batch = engine.generate(prompt_ids[chunk], SamplingParams(temperature=0.0,
                                max_new_tokens=max_new_tokens), generator)
        verdicts = verifier.verify_batch(batch.responses, problems[chunk])
        greedy_scores += [v.score for v in verdicts]
        correct, wrong = trace_error_counts(batch.responses, problems[chunk], verdicts)
        traced_correct, traced_wrong = traced_correct + correct, traced_wrong + wrong
        broken += sum(v.status in ("error", "timeout") for v in verdicts)
        lengths += batch.response_mask.sum(1).tolist()
    total = len(problems)
    per_problem_correct: list[int] = []
    sampled_scores: list[float] = []
    if k > 1:
        step = max(1, batch_prompts // k)
        for lo in range(0, len(problems), step):
            chunk_problems = problems[lo : lo + step]
            repeated = [ids for ids in prompt_ids[lo : lo + step] for _ in range(k)]
            batch = engine.generate(repeated, SamplingParams(temperature=temperature,
                                    max_new_tokens=max_new_tokens), generator)
            verdicts = verifier.verify_batch(batch.responses,
                                             [p for p in chunk_problems for _ in range(k)])
            broken += sum(v.status in ("error", "timeout") for v in verdicts)
            total += len(verdicts)
            for i in range(len(chunk_problems)):
                group = verdicts[i * k : (i + 1) * k]
                sampled_scores += [v.score for v in group]
                per_problem_correct.append(sum(v.status == "correct" for v in group))
    # Under torchrun each rank evaluates its shard of the problems: the sums and counts are
    # all-reduced, so the means are over every rank's problems (also for uneven shards).
    sums = dist.all_reduce_sum(torch.tensor([
        sum(greedy_scores), len(greedy_scores), sum(lengths), sum(sampled_scores),
        len(sampled_scores), sum(pass_at_k(k, c, k) for c in per_problem_correct),
        len(per_problem_correct), broken, total, traced_correct, traced_wrong],
        dtype=torch.float64)).tolist()
    (greedy, n_greedy, length, sampled, n_sampled, passed, n_passed, broken, total,
     traced_correct, traced_wrong) = sums
    # pass@1 counts a partial code score as its fraction, as the paper's code reward does.
    metrics["eval/pass@1_greedy"] = greedy / n_greedy
    metrics["eval/response_len"] = length / n_greedy
    if k > 1:
        metrics[f"eval/avg@{k}"] = sampled / n_sampled
        metrics[f"eval/pass@{k}"] = passed / n_passed
    metrics["eval/error_rate"] = broken / total
    if traced_correct:
        metrics["eval/trace_error_greedy"] = traced_wrong / traced_correct
    metrics["eval/wall_s"] = time.perf_counter() - start
    return metrics


def evaluate_checkpoint(cfg, model_path: str) -> dict[str, float]:
    """Load `model_path` and evaluate it on the configured held-out problems (rank-local shard)."""
    from primekit.data.splits import encode_prompts, load_splits, verifier_task
    from primekit.models.hf import check_model_path, load_model, load_tokenizer
    from primekit.rollout.hf import HFRolloutEngine
    from primekit.runtime import model_dtype, resolve_device, set_threads
    from primekit.validate import check_eval_model, check_eval_size
    from primekit.verifiers import build_verifier

    set_threads(cfg.train.threads)
    check_model_path(model_path, "model")
    check_eval_model(model_path)  # a model directory or a hub id, checked locally first
    _, heldout = load_splits(cfg, train=False)
    check_eval_size(cfg, heldout)  # before the model loads
    heldout = heldout[: cfg.eval.num_problems]
    device = resolve_device(cfg.train.device)
    trust = cfg.model.trust_remote_code
    tokenizer = load_tokenizer(model_path, trust_remote_code=trust)
    model = load_model(model_path, dtype=model_dtype(cfg.model.dtype), device=str(device),
                       trust_remote_code=trust).eval()
    engine = HFRolloutEngine(model, tokenizer, micro_batch_size=cfg.rollout.micro_batch_size,
                             decode=cfg.rollout.hf_decode)
    return dist.reduce_metrics(evaluate_heldout(
        engine, build_verifier(verifier_task(cfg), cfg.verifier), heldout,
        encode_prompts(tokenizer, heldout, cfg), cfg))


def evaluate_heldout(engine, verifier, problems: list[Problem], prompt_ids: list[list[int]],
                     cfg) -> dict[str, float]:
    """`evaluate` on this rank's shard of the first `eval.num_problems` held-out problems, with
    the config's sampling settings and a fixed generator (the same problems and seeds at every
    evaluation of a run). A collective under torchrun: the metrics are over every rank's shard."""
    e = cfg.eval
    shard = dist.shard(list(range(min(e.num_problems, len(problems)))))
    gen = torch.Generator().manual_seed(cfg.train.seed + 99991)
    return evaluate(engine, verifier, [problems[i] for i in shard],
                    [prompt_ids[i] for i in shard], k=e.k, temperature=e.temperature,
                    max_new_tokens=e.max_new_tokens or cfg.rollout.max_new_tokens, generator=gen)
