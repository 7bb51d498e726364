"""Training data for explicit reward models: sampled responses with verifier and Monte-Carlo labels.

ORM labels (Gao et al. Sec. 3/5.1): sample responses from a model, label each with the verifier's
Correct(q, s).

Step labels, Math-Shepherd style (Wang et al. 2024, as Gao et al. Sec. 5.1 use it): for the prefix
p^(k) ending at step k, a completer samples n continuations (n = 8 in the paper); the hard label is
1 if ANY completed response is correct, the soft label the fraction that are. Two choices of ours:
- the last step of a response that ended with EOS is labelled with the response's own outcome, with
  no completions (continuing a finished response only re-samples its end; this saves a batch);
- rows whose prompt and prefix tokens are identical (common among the K samples of one prompt)
  share one set of completions: the label is a property of the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from primekit.algorithms.segmentation import segment_batch
from primekit.data.problem import Problem
from primekit.rollout.base import RolloutBatch, SamplingParams

__all__ = [
    "Completer",
    "HFCompleter",
    "SamplingSetup",
    "StepLabels",
    "mc_step_labels",
    "sample_responses",
    "sample_split",
    "sampling_setup",
]


class Completer(Protocol):
    """Continues token prefixes: n sampled completion texts per prefix (EOS stripped)."""

    def complete(self, prefix_ids: list[list[int]], n: int) -> list[list[str]]: ...


class HFCompleter:
    """A `Completer` over any rollout engine (the HF engine on CPU)."""

    def __init__(
        self,
        engine,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        *,
        chunk: int = 1024,
    ):
        self.engine, self.params, self.generator, self.chunk = engine, params, generator, chunk

    def complete(self, prefix_ids: list[list[int]], n: int) -> list[list[str]]:
        repeated = [ids for ids in prefix_ids for _ in range(n)]
        texts: list[str] = []
        for lo in range(0, len(repeated), self.chunk):
            texts += self.engine.generate(
                repeated[lo : lo + self.chunk], self.params, self.generator
            ).responses
        return [texts[i * n : (i + 1) * n] for i in range(len(prefix_ids))]


def sample_responses(
    engine,
    problems: list[Problem],
    prompt_ids: list[list[int]],
    verifier,
    *,
    samples: int,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> tuple[RolloutBatch, list[Problem], torch.Tensor]:
    """`samples` responses per problem, verified.

    Returns (batch of N = len(problems) * samples rows, grouped by problem; the problem of each
    row [N]; outcome_rewards [N] = verdict scores).
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if len(problems) != len(prompt_ids) or not problems:
        raise ValueError(
            f"need one prompt per problem and at least one problem, got "
            f"{len(problems)} problems and {len(prompt_ids)} prompts"
        )
    rows = [p for p in problems for _ in range(samples)]
    batch = engine.generate([ids for ids in prompt_ids for _ in range(samples)], params, generator)
    verdicts = verifier.verify_batch(batch.responses, rows)
    outcome = torch.tensor([v.score for v in verdicts], dtype=torch.float32)  # [N]
    return batch, rows, outcome


@dataclass
class StepLabels:
    """Per-step training targets for a batch of N responses with at most S steps.

    step_end_positions [N, S] long (-1 = no step), step_mask [N, S] bool, labels [N, S] hard 0/1,
    soft [N, S] fraction of correct completions (the outcome score for outcome-labelled steps),
    completions: how many completions were sampled in all.
    """

    step_end_positions: torch.Tensor
    step_mask: torch.Tensor
    labels: torch.Tensor
    soft: torch.Tensor
    completions: int


def mc_step_labels(
    batch: RolloutBatch,
    problems: list[Problem],
    outcome_rewards: torch.Tensor,
    completer: Completer,
    verifier,
    tokenizer,
    *,
    delimiter: str,
    n_completions: int = 8,
) -> StepLabels:
    """Math-Shepherd hard/soft step labels by completion from each step's prefix.

    Formula: soft_k = (1/n) sum_j Correct(q, p^(k) + c_j), c_j ~ completer(q, p^(k)), j = 1..n;
    label_k = 1[soft_k's numerator > 0] ("any completion correct"). For the last step of a
    finished response: label = 1[outcome == 1], soft = outcome.
    Args:
        batch: N responses; problems: [N] the problem of each row; outcome_rewards: [N].
        completer: continues prefix token ids; verifier: grades prefix text + completion.
        delimiter: step delimiter spec; n_completions: n (paper: 8).
    """
    if n_completions < 1:
        raise ValueError(f"n_completions must be >= 1, got {n_completions}")
    n_rows = len(batch)
    if len(problems) != n_rows or outcome_rewards.shape != (n_rows,):
        raise ValueError(
            f"need one problem and one outcome per row ({n_rows}), got "
            f"{len(problems)} problems and outcome_rewards {tuple(outcome_rewards.shape)}"
        )
    positions, step_mask = segment_batch(
        tokenizer, batch.response_ids, batch.response_mask, delimiter
    )
    labels = torch.zeros(positions.shape, dtype=torch.float32)  # [N, S]
    soft = torch.zeros(positions.shape, dtype=torch.float32)  # [N, S]
    prompt_ids, prompt_mask = batch.prompt_ids.cpu(), batch.prompt_mask.cpu().bool()
    response_ids = batch.response_ids.cpu()
    finished = batch.finished.cpu()
    counts = step_mask.sum(1).tolist()

    # prefix key -> (token ids, text of the response prefix, problem, [(row, step), ...])
    pending: dict[tuple, tuple[list[int], str, Problem, list[tuple[int, int]]]] = {}
    for i in range(n_rows):
        for k in range(counts[i]):
            if k == counts[i] - 1 and bool(finished[i]):
                score = float(outcome_rewards[i])
                labels[i, k], soft[i, k] = float(score >= 1.0), score
                continue
            pos = int(positions[i, k])
            prefix = prompt_ids[i][prompt_mask[i]].tolist() + response_ids[i, : pos + 1].tolist()
            key = (problems[i].id, tuple(prefix))
            if key not in pending:
                text = tokenizer.decode(
                    response_ids[i, : pos + 1].tolist(),
                    skip_special_tokens=True,
                    clean_up_tokenization_spaces=False,
                )
                pending[key] = (prefix, text, problems[i], [])
            pending[key][3].append((i, k))

    entries = list(pending.values())
    if entries:
        completions = completer.complete([e[0] for e in entries], n_completions)
        texts = [e[1] + c for e, cs in zip(entries, completions) for c in cs]
        probs = [e[2] for e in entries for _ in range(n_completions)]
        scores = torch.tensor([v.score for v in verifier.verify_batch(texts, probs)])
        scores = scores.view(len(entries), n_completions)  # [prefixes, n]
        for (_, _, _, slots), row in zip(entries, scores):
            hard = float((row >= 1.0).any())
            for i, k in slots:
                labels[i, k], soft[i, k] = hard, float(row.mean())
    return StepLabels(positions, step_mask, labels, soft, len(entries) * n_completions)


@dataclass
class SamplingSetup:
    """What the train-orm / train-prm / hack-check commands sample with: one model, its engine."""

    cfg: Any  # primekit.config.Config
    tokenizer: Any
    policy: Any
    engine: Any
    verifier: Any
    device: torch.device
    params: SamplingParams
    generator: torch.Generator

    def release(self) -> None:
        """Drop the sampling model (the reward model is trained after sampling is done)."""
        self.policy = self.engine = None


def sampling_setup(cfg, model_path: str, *, seed: int, path_field: str) -> SamplingSetup:
    """Load `model_path` as the sampler, with the configured verifier and sampling parameters.

    path_field: the config field that holds model_path (e.g. "orm.base"), named in errors.
    """
    from primekit.data.splits import verifier_task
    from primekit.models.hf import check_model_path, load_model, load_tokenizer
    from primekit.rollout.hf import HFRolloutEngine
    from primekit.runtime import model_dtype, resolve_device, seed_everything, set_threads
    from primekit.verifiers import build_verifier

    set_threads(cfg.train.threads)
    seed_everything(seed)
    check_model_path(model_path, path_field)
    device = resolve_device(cfg.train.device)
    tokenizer = load_tokenizer(model_path, trust_remote_code=cfg.model.trust_remote_code)
    policy = load_model(
        model_path,
        dtype=model_dtype(cfg.model.dtype),
        device=str(device),
        trust_remote_code=cfg.model.trust_remote_code,
    ).eval()
    engine = HFRolloutEngine(policy, tokenizer, micro_batch_size=cfg.rollout.micro_batch_size,
                             decode=cfg.rollout.hf_decode)
    r = cfg.rollout
    params = SamplingParams(
        temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens
    )
    return SamplingSetup(
        cfg,
        tokenizer,
        policy,
        engine,
        build_verifier(verifier_task(cfg), cfg.verifier),
        device,
        params,
        torch.Generator().manual_seed(seed),
    )


def split_problems(cfg, split: str, n: int) -> list[Problem]:
    """The first n problems of the configured train or held-out ("test") split."""
    from primekit.data.splits import load_splits

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    train, heldout = load_splits(cfg)
    problems = (train if split == "train" else heldout)[:n]
    if not problems:
        raise ValueError(f"no {split} problems to sample from (asked for {n})")
    return problems


def sample_split(
    setup: SamplingSetup, split: str, n_problems: int, samples: int
) -> tuple[RolloutBatch, list[Problem], torch.Tensor]:
    """`samples` verified responses for each of the first n_problems of a split (see sample_responses)."""
    from primekit.data.splits import encode_prompts

    problems = split_problems(setup.cfg, split, n_problems)
    prompt_ids = encode_prompts(setup.tokenizer, problems, setup.cfg)
    return sample_responses(
        setup.engine,
        problems,
        prompt_ids,
        setup.verifier,
        samples=samples,
        params=setup.params,
        generator=setup.generator,
    )
