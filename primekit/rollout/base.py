"""The rollout seam: sampling parameters, the batch a rollout returns, and the engine Protocol.

Notation: N sequences (B prompts x K samples), P prompt columns, T response columns.
Layout of a row: [left-padding | prompt | response | right-padding], so
`input_ids = cat(prompt_ids, response_ids)` is directly what `sequence_logprobs` expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class SamplingParams:
    """How to sample responses.

    temperature: softmax temperature; 0 means greedy (argmax).
    top_p: nucleus sampling: sample only from the smallest set of tokens whose (temperature-
        scaled) probability mass reaches top_p, renormalised. 1.0 disables it.
    max_new_tokens: response length limit (EOS included).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")


@dataclass
class RolloutBatch:
    """N sampled responses with their prompts, masks and sampling log-probs.

    prompt_ids: [N, P] left-padded with the pad id; prompt_mask [N, P] 1 on prompt tokens.
    response_ids: [N, T] right-padded with the pad id; response_mask [N, T] 1 on generated
        tokens, the EOS token included when one was produced.
    sampling_logprobs: [N, T] log-prob of each sampled token under the temperature-scaled
        distribution softmax(z / temperature), BEFORE top-p truncation (so with top_p < 1 they
        are not the exact log-probs of the truncated sampler; they match what
        `sequence_logprobs(..., temperature=temperature)` recomputes). With temperature 0
        (greedy) they are under softmax(z). 0 on padding.
    finished: [N] bool, True where EOS was produced within max_new_tokens.
    responses: the N decoded responses, special tokens (EOS) removed.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    finished: torch.Tensor
    responses: list[str]

    def __post_init__(self) -> None:
        n, t = self.response_ids.shape
        if self.prompt_ids.shape[0] != n or self.prompt_ids.shape != self.prompt_mask.shape:
            raise ValueError(
                f"prompt_ids {tuple(self.prompt_ids.shape)} and prompt_mask "
                f"{tuple(self.prompt_mask.shape)} must be [N={n}, P]"
            )
        for name in ("response_mask", "sampling_logprobs"):
            if getattr(self, name).shape != (n, t):
                raise ValueError(
                    f"{name} must be [N, T] = {(n, t)}, got {tuple(getattr(self, name).shape)}"
                )
        if self.finished.shape != (n,) or len(self.responses) != n:
            raise ValueError(
                f"finished {tuple(self.finished.shape)} and responses ({len(self.responses)}) must have N = {n} rows"
            )

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)  # [N, P + T]

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)  # [N, P + T]

    @property
    def response_len(self) -> int:
        return self.response_ids.shape[1]

    def select(self, index: torch.Tensor) -> RolloutBatch:
        """The rows at `index` (a 1-D long tensor of row numbers or a [N] bool mask), in order."""
        index = torch.as_tensor(index)
        if index.dtype == torch.bool:
            index = index.nonzero().flatten()
        idx = index.to(self.response_ids.device)
        return RolloutBatch(
            prompt_ids=self.prompt_ids[idx],
            prompt_mask=self.prompt_mask[idx],
            response_ids=self.response_ids[idx],
            response_mask=self.response_mask[idx],
            sampling_logprobs=self.sampling_logprobs[idx],
            finished=self.finished[idx],
            responses=[self.responses[i] for i in index.tolist()],
        )


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Stack batches row-wise, re-padding prompts on the left to the largest P and responses on
    the right to the largest T (pad id, mask 0, log-prob 0)."""
    if not batches:
        raise ValueError("concat_batches needs at least one batch, got an empty list")
    P = max(b.prompt_ids.shape[1] for b in batches)
    T = max(b.response_len for b in batches)

    def left(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    return RolloutBatch(
        prompt_ids=torch.cat([left(b.prompt_ids, P, pad_id) for b in batches]),  # [N, P]
        prompt_mask=torch.cat([left(b.prompt_mask, P, 0) for b in batches]),  # [N, P]
        response_ids=torch.cat([right(b.response_ids, T, pad_id) for b in batches]),  # [N, T]
        response_mask=torch.cat([right(b.response_mask, T, 0) for b in batches]),  # [N, T]
        sampling_logprobs=torch.cat([right(b.sampling_logprobs, T, 0.0) for b in batches]),
        finished=torch.cat([b.finished for b in batches]),  # [N]
        responses=[r for b in batches for r in b.responses],
    )


def batch_from_texts(tokenizer, prompt_ids: list[list[int]], responses: list[str]) -> RolloutBatch:
    """A RolloutBatch of given responses, each tokenised and closed with EOS (a finished response)."""
    if len(prompt_ids) != len(responses) or not responses:
        raise ValueError(
            f"need one prompt per response and at least one, got {len(prompt_ids)} "
            f"prompts and {len(responses)} responses"
        )
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = [tokenizer(r, add_special_tokens=False)["input_ids"] + [eos] for r in responses]
    n, P, T = len(rows), max(len(p) for p in prompt_ids), max(len(r) for r in rows)
    prompt = torch.full((n, P), pad, dtype=torch.long)  # [n, P]
    prompt_mask = torch.zeros((n, P), dtype=torch.long)  # [n, P]
    resp = torch.full((n, T), pad, dtype=torch.long)  # [n, T]
    resp_mask = torch.zeros((n, T), dtype=torch.long)  # [n, T]
    for i, (p, r) in enumerate(zip(prompt_ids, rows)):
        prompt[i, P - len(p) :], prompt_mask[i, P - len(p) :] = torch.tensor(p), 1
        resp[i, : len(r)], resp_mask[i, : len(r)] = torch.tensor(r), 1
    return RolloutBatch(
        prompt,
        prompt_mask,
        resp,
        resp_mask,
        torch.zeros(n, T),
        torch.ones(n, dtype=torch.bool),
        list(responses),
    )


def check_prompt_ids(prompt_ids: list[list[int]]) -> None:
    """The input every engine's `generate` accepts: at least one prompt, none of them empty."""
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one prompt, got an empty list")
    for i, ids in enumerate(prompt_ids):
        if len(ids) == 0:
            raise ValueError(f"prompt_ids[{i}] is empty; every prompt needs at least one token")


class RolloutEngine(Protocol):
    """Samples responses from the current policy (HF decode loop today, vLLM later)."""

    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        """One response per prompt (repeat a prompt K times for K samples), in input order."""
        ...

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Make subsequent generate() calls sample from `model`'s current weights."""
        ...
