"""Rollouts with a plain Hugging Face model: our own batched decode loop over a KV cache.

Not `model.generate()`: sampling must draw from a caller-supplied torch.Generator so that a
resumed run reproduces the uninterrupted one token for token, and we want the sampling
log-probs without a second pass.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch

from primekit import distributed as dist
from primekit.rollout.base import RolloutBatch, SamplingParams, check_prompt_ids, concat_batches

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def sample_next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from logits [n, V]; returns (tokens [n], logprobs [n]).

    logprobs are log softmax(logits / temperature) at the drawn token, before top-p truncation
    (softmax(logits) for greedy, temperature 0). Top-p keeps the smallest prefix of the
    probability-sorted vocabulary whose mass reaches top_p (always at least one token).
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if params.temperature == 0:
        tokens = logits.argmax(-1)  # [n]
        logprobs = torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logprobs
    all_logprobs = torch.log_softmax(logits / params.temperature, -1)  # [n, V]
    probs = all_logprobs.exp()
    if params.top_p < 1:
        sorted_probs, order = probs.sort(-1, descending=True)
        # Drop a token when the mass strictly before it already reaches top_p.
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
    if generator is not None and generator.device != probs.device:
        tokens = torch.multinomial(probs.to(generator.device), 1, generator=generator)
        tokens = tokens.to(probs.device).squeeze(-1)  # [n]
    else:
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # [n]
    return tokens, all_logprobs.gather(-1, tokens[:, None]).squeeze(-1)


class HFRolloutEngine:
    """Batched sampling from the live policy with a KV cache.

    Rows that produced EOS stop contributing (they are dropped from the batch once enough of
    them have finished) and the loop ends when every row has finished or max_new_tokens is
    reached. The model is put in eval mode for generation and restored afterwards. Returned
    tensors live on the model's device; masks are int64 (HF attention-mask convention).

    Reproducibility: the same generator state, prompts, weights and micro_batch_size give the
    same tokens (on CPU; CUDA kernels may add nondeterminism). A different micro_batch_size
    consumes the random stream in a different order.

    Args:
        model: a Hugging Face causal LM: the policy itself, or (own_copy) the engine's own
            unsharded copy, kept in step by `sync_weights`.
        tokenizer: supplies pad/eos ids and decodes responses.
        micro_batch_size: rows decoded together; bounds KV-cache memory.
        eos_token_ids: stop tokens; default: the tokenizer's eos plus the model's
            generation_config eos ids.
        own_copy: `model` is a separate copy that `sync_weights` overwrites (the policy is
            sharded, or trained in float32 while sampling runs in a lower precision).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        micro_batch_size: int = 256,
        eos_token_ids: list[int] | None = None,
        own_copy: bool = False,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size!r}")
        self.model = model
        self.own_copy = own_copy
        self.tokenizer = tokenizer
        self.micro_batch_size = micro_batch_size
        if eos_token_ids is None:
            eos_token_ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
            gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            eos_token_ids += (
                gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos]
            )
        if not eos_token_ids:
            raise ValueError(
                "no EOS token: the tokenizer and generation_config define none; pass eos_token_ids"
            )
        self.eos_token_ids = sorted(set(eos_token_ids))
        pad = tokenizer.pad_token_id
        self.pad_id = self.eos_token_ids[0] if pad is None else pad

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Sample from `model`'s current weights from now on.

        Without `own_copy` the engine samples from the live model itself (no copy: the
        single-process float32 case). With it, `model`'s full weights (all-gathered when it is
        FSDP-sharded: every rank calls this) are copied into the engine's own unsharded model, in
        that model's dtype.
        """
        if not self.own_copy:
            self.model = model
            return
        if model is self.model:
            return
        weights = dist.full_state_dict(model)
        with torch.no_grad():
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
        tied = {k for k in missing if k.endswith("lm_head.weight")}
        if set(missing) - tied or unexpected:
            raise ValueError(f"weight sync: the engine's model does not match the policy: "
                             f"missing {sorted(set(missing) - tied)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")

    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        """One response per prompt, in input order. Reproducible given the generator's state."""
        check_prompt_ids(prompt_ids)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                batches = [
                    self._generate(prompt_ids[i : i + self.micro_batch_size], params, generator)
                    for i in range(0, len(prompt_ids), self.micro_batch_size)
                ]
        finally:
            self.model.train(was_training)
        return batches[0] if len(batches) == 1 else concat_batches(batches, self.pad_id)

    def _forward(self, ids, mask, positions, cache, cache_kwarg: str, last_only: bool = False):
        extra = {"logits_to_keep": 1} if last_only else {}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{cache_kwarg: cache},
            **extra,
        )
        return out.logits[:, -1]  # [n, V]

    def _generate(
        self, prompts: list[list[int]], params: SamplingParams, generator
    ) -> RolloutBatch:
        from transformers import DynamicCache

        # transformers 5.x renamed `past_key_values` to `cache`; accept both.
        forward_params = inspect.signature(self.model.forward).parameters
        cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        device = next(self.model.parameters()).device
        n, P, T = len(prompts), max(len(p) for p in prompts), params.max_new_tokens
        prompt_ids = torch.full((n, P), self.pad_id, dtype=torch.long)  # [n, P]
        prompt_mask = torch.zeros((n, P), dtype=torch.long)  # [n, P]
        for i, ids in enumerate(prompts):
            prompt_ids[i, P - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            prompt_mask[i, P - len(ids) :] = 1
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)

        response_ids = torch.full((n, T), self.pad_id, dtype=torch.long, device=device)  # [n, T]
        response_mask = torch.zeros((n, T), dtype=torch.long, device=device)  # [n, T]
        logprobs = torch.zeros((n, T), dtype=torch.float32, device=device)  # [n, T]
        finished = torch.zeros(n, dtype=torch.bool, device=device)  # [n]
        eos = torch.tensor(self.eos_token_ids, device=device)

        try:
            cache = DynamicCache(config=self.model.config)
        except TypeError:  # transformers < 4.56 takes no config
            cache = DynamicCache()
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [n, P]
        logits = self._forward(
            prompt_ids, prompt_mask, positions, cache, cache_kwarg, last_only=True
        )
        rows = torch.arange(n, device=device)  # rows of this micro-batch still in the cache
        attn = prompt_mask  # [len(rows), P + t]
        next_pos = positions[:, -1] + 1  # [len(rows)]
        for t in range(T):
            tokens, token_logprobs = sample_next_token(logits, params, generator)
            alive = ~finished[rows]  # [len(rows)]
            live_rows = rows[alive]
            response_ids[live_rows, t] = tokens[alive]
            response_mask[live_rows, t] = 1
            logprobs[live_rows, t] = token_logprobs[alive].float()
            finished[live_rows] = torch.isin(tokens[alive], eos)
            if t == T - 1 or bool(finished.all()):
                break
            still = ~finished[rows]  # [len(rows)]
            # Drop finished rows from the cache once they are a quarter of the batch: a gather
            # of the whole cache is not free, carrying dead rows is not either.
            if int((~still).sum()) * 4 >= len(rows):
                keep = still.nonzero().flatten()
                cache.batch_select_indices(keep)
                rows, tokens, attn, next_pos = rows[keep], tokens[keep], attn[keep], next_pos[keep]
                still = still[keep]
            attn = torch.cat([attn, still.long()[:, None]], dim=1)  # [len(rows), P + t + 1]
            logits = self._forward(tokens[:, None], attn, next_pos[:, None], cache, cache_kwarg)
            next_pos = next_pos + 1

        width = int(response_mask.sum(1).max())  # steps actually taken
        response_ids, response_mask = response_ids[:, :width], response_mask[:, :width]
        logprobs = logprobs[:, :width]
        texts = self.tokenizer.batch_decode(
            [ids[m.bool()].tolist() for ids, m in zip(response_ids.cpu(), response_mask.cpu())],
            skip_special_tokens=True,
            clean_up_tokenization_spaces=False,
        )
        return RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=response_mask,
            sampling_logprobs=logprobs,
            finished=finished,
            responses=texts,
        )
