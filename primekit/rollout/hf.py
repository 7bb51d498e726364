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
from primekit.runtime import check_compiler

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def sample_next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from logits [n, V]; returns (tokens [n], logprobs [n]).

    logprobs are log softmax(logits / temperature) at the drawn token, before top-p truncation
    (softmax(logits) for greedy, temperature 0). Top-p keeps the smallest prefix of the
    probability-sorted vocabulary whose mass reaches top_p (always at least one token).

    Sampling is by inverse CDF: one uniform u ~ U[0, 1) per row from `generator`, and the token
    is the first index whose cumulative probability exceeds u * (total mass), i.e. token i with
    probability p_i / sum(p). That is the distribution `torch.multinomial` draws from, for one
    random number per row instead of one exponential per row and vocabulary entry (what
    multinomial's exponential-race kernel draws). The same generator state gives the same tokens.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if params.temperature == 0:
        tokens = logits.argmax(-1)  # [n]
        logprobs = torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logprobs
    scaled = logits if params.temperature == 1 else logits / params.temperature  # [n, V]
    all_logprobs = torch.log_softmax(scaled, -1)  # [n, V]
    probs = all_logprobs.exp()  # [n, V]
    order = None
    if params.top_p < 1:
        probs, order = probs.sort(-1, descending=True)  # [n, V] sorted, most probable first
        # Drop a token when the mass strictly before it already reaches top_p.
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= params.top_p, 0.0)
    cdf = probs.cumsum(-1)  # [n, V]
    total = cdf[:, -1]  # [n]
    u = _uniform(probs.shape[0], cdf.dtype, probs.device, generator)  # [n]
    # Rounding can make u * total equal to the total, past every token: x is kept below it, so
    # the search lands on the last token whose probability adds to the mass (> 0). Clamping in
    # place of testing for that case keeps the step free of a host-device synchronisation.
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # [n]
    tokens = torch.searchsorted(cdf, x[:, None], right=True).squeeze(-1)  # [n]
    if order is not None:
        tokens = order.gather(-1, tokens[:, None]).squeeze(-1)  # back to vocabulary ids
    return tokens, all_logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def _uniform(n: int, dtype: torch.dtype, device: torch.device,
             generator: torch.Generator | None) -> torch.Tensor:
    """n draws of U[0, 1) from `generator` (the global generator when None), on `device`.

    The trainer's generators live on the CPU (a resumed run restores their state). Sampling on
    a GPU then copies the draws over: from pinned memory and without blocking, since a copy from
    ordinary host memory waits for all the work queued on the device, once per decode step.
    """
    source = generator.device if generator is not None else device
    u = torch.rand(n, generator=generator, device=source, dtype=dtype)  # [n]
    if u.device == device:
        return u
    if device.type == "cuda":
        return u.pin_memory().to(device, non_blocking=True)
    return u.to(device)


def preallocated_cache(config, capacity: int):
    """A transformers DynamicCache whose full-attention layers write into preallocated
    [batch, heads, capacity, head_dim] buffers in place (instead of `torch.cat` per step) and
    hand the model a view of the filled positions, like transformers' StaticCache but without
    StaticCache's attention over all `capacity` positions at every step.

    Layers of other kinds (sliding-window, linear attention) stay as transformers makes them;
    a transformers without per-layer caches (< 4.56) gets the plain DynamicCache.
    """
    from transformers import DynamicCache

    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # transformers < 4.56: no per-layer cache classes
        return DynamicCache()
    cache = DynamicCache(config=config)
    layer_class = _preallocated_layer_class(DynamicLayer)
    cache.layers = [
        layer_class(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache


def _fill_holes(still: torch.Tensor, m_new: int) -> torch.Tensor:
    """The slot order after dropping finished rows: still [m] bool, m_new = still.sum() ->
    order [m_new], order[j] = the old slot of new slot j. Live rows below m_new stay where they
    are; the live rows at m_new and beyond fill the finished slots below m_new, in order."""
    order = torch.arange(m_new, device=still.device)
    holes = (~still[:m_new]).nonzero().flatten()  # finished slots that must be filled
    order[holes] = m_new + still[m_new:].nonzero().flatten()  # as many live rows beyond m'
    return order


_LAYER_CLASSES: dict[type, type] = {}


def _preallocated_layer_class(base: type) -> type:
    """The preallocated subclass of transformers' DynamicLayer (built once, on first use, so
    that importing this module does not import transformers)."""
    if base in _LAYER_CLASSES:
        return _LAYER_CLASSES[base]

    class PreallocatedLayer(base):
        """keys/values are views [b, h, length, d] of buffers [B, h, capacity, d]."""

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity = capacity
            self.length = 0
            self.is_initialized = False  # transformers 4.56's DynamicLayer has no such flag

        def lazy_initialization(self, key_states, value_states) -> None:
            self.device = key_states.device
            b, h = key_states.shape[:2]
            # [B, h, capacity, d]: keys and values may differ in head size.
            self.key_buffer = key_states.new_zeros((b, h, self.capacity, key_states.shape[-1]))
            self.value_buffer = value_states.new_zeros((b, h, self.capacity,
                                                        value_states.shape[-1]))
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            b, new = key_states.shape[0], key_states.shape[-2]
            end = self.length + new
            if end > self.capacity:
                raise RuntimeError(f"KV cache full: {end} positions > capacity {self.capacity}")
            self.key_buffer[:b, :, self.length : end] = key_states
            self.value_buffer[:b, :, self.length : end] = value_states
            self.length = end
            self.keys = self.key_buffer[:b, :, :end]  # [b, h, end, d], a view
            self.values = self.value_buffer[:b, :, :end]
            return self.keys, self.values

        def append(self, key: torch.Tensor, value: torch.Tensor):
            """One new position for rows [0, m): key, value [m, h, d] -> the filled views
            (keys, values) [m, h, length, d] (the written-out decode step, rollout/decode.py)."""
            m, end = key.shape[0], self.length + 1
            if end > self.capacity:
                raise RuntimeError(f"KV cache full: {end} positions > capacity {self.capacity}")
            self.key_buffer[:m, :, self.length] = key
            self.value_buffer[:m, :, self.length] = value
            self.length = end
            self.keys = self.key_buffer[:m, :, :end]
            self.values = self.value_buffer[:m, :, :end]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            # Gather the filled positions of the kept rows to the front of the buffers.
            b = len(indices)
            self.key_buffer[:b, :, : self.length] = self.key_buffer[indices, :, : self.length]
            self.value_buffer[:b, :, : self.length] = self.value_buffer[indices, :, : self.length]
            self.keys = self.key_buffer[:b, :, : self.length]
            self.values = self.value_buffer[:b, :, : self.length]

        def move_rows(self, src: torch.Tensor, dst: torch.Tensor, size: int) -> None:
            """Copy rows `src` to rows `dst` (filled positions only) and keep rows [0, size)."""
            end = self.length
            self.key_buffer[dst, :, :end] = self.key_buffer[src, :, :end]
            self.value_buffer[dst, :, :end] = self.value_buffer[src, :, :end]
            self.keys = self.key_buffer[:size, :, :end]
            self.values = self.value_buffer[:size, :, :end]

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("the rollout cache is never cropped")

        def batch_repeat_interleave(self, repeats: int) -> None:
            raise NotImplementedError("the rollout cache is never repeated")

    _LAYER_CLASSES[base] = PreallocatedLayer
    return PreallocatedLayer


class HFRolloutEngine:
    """Batched sampling from the live policy with a KV cache.

    Rows that produced EOS leave the batch at the step they finish, and the loop ends when
    every row has finished or max_new_tokens is reached. The model is put in eval mode for generation and restored afterwards. Returned
    tensors are on the CPU, whatever the model's device (as vLLM's engine returns them: the
    trainer's log-prob passes move each micro-batch to their model's device); masks are int64
    (HF attention-mask convention).

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
        decode: "auto": after the prompt (the model's own forward), each new token goes through
            the written-out step of `rollout/decode.py` where `prepare_decode` allows it
            (Llama-family models with plain weights), the model's forward otherwise; "model":
            always the model's forward (bit-identical to transformers' own decode steps);
            "compiled": as "auto", with the written-out step under `torch.compile`
            (`decode.compiled_decode_step`: static shapes but the row count, attention over
            spans of a few fixed sizes; a graph per span, compiled at first use, about 10 s
            each on a CPU). `decode_path` says which the last `generate` took.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        micro_batch_size: int = 256,
        eos_token_ids: list[int] | None = None,
        own_copy: bool = False,
        decode: str = "auto",
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size!r}")
        if decode not in ("auto", "model", "compiled"):
            raise ValueError(f"decode must be 'auto', 'model' or 'compiled', got {decode!r}")
        if decode == "compiled" and next(model.parameters()).device.type == "cpu":
            check_compiler("rollout.hf_decode=compiled")
        self.decode = decode
        self.decode_path: str | None = None  # "written-out[, compiled]" or "model forward (<why>)"
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
            # Inference mode, not only no_grad: no version counters or view tracking for the
            # few hundred small ops of every decode step. Eager even where the model's layers
            # are compiled for training (train.compile): the cache grows every step.
            with torch.compiler.set_stance("force_eager"), torch.inference_mode():
                batches = [
                    self._generate(prompt_ids[i : i + self.micro_batch_size], params, generator)
                    for i in range(0, len(prompt_ids), self.micro_batch_size)
                ]
        finally:
            self.model.train(was_training)
        # Ordinary tensors again (copies made outside inference mode), so that the trainer may
        # use them in autograd (masks and old log-probs enter the loss); on the CPU, like every
        # engine's batch.
        batches = [RolloutBatch(*(
            x.to("cpu", copy=True) if isinstance(x, torch.Tensor) else x for x in (
                b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                b.sampling_logprobs, b.finished, b.responses))) for b in batches]
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

        # The KV cache and the attention mask are allocated once for P + T - 1 positions (the
        # last sampled token is never fed back) and filled in place; the model sees views of
        # the filled part, so attention covers only the positions written so far. The compiled
        # step attends over spans of a few fixed sizes instead (static shapes), so its cache
        # has the size of the largest span it needs (the views' strides are fixed with it).
        capacity = P + T - 1
        if self.decode == "compiled":
            from primekit.rollout.decode import attention_span

            capacity = attention_span(capacity)
        cache = preallocated_cache(self.model.config, capacity)
        attn_buf = torch.zeros((n, P + T - 1), dtype=torch.long, device=device)  # [n, P+T-1]
        attn_buf[:, :P] = prompt_mask
        # With SDPA the decode steps pass the 4-D boolean mask [m, 1, 1, kv] themselves (what
        # transformers would build from the 2-D mask: one query per row, no causal part), which
        # transformers returns as is, instead of rebuilding it from the 2-D mask every step.
        # Only where every layer attends to all cached positions: a sliding-window layer keeps
        # fewer keys, and transformers must build its mask.
        mask_4d = getattr(self.model.config, "_attn_implementation", None) == "sdpa" and all(
            hasattr(layer, "move_rows") for layer in getattr(cache, "layers", [None]))
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [n, P]
        logits = self._forward(
            prompt_ids, prompt_mask, positions, cache, cache_kwarg, last_only=True
        )
        if self.decode == "model":
            weights, blocker = None, "decode=model"
        else:
            from primekit.rollout.decode import compiled_decode_step, decode_step, prepare_decode

            weights, blocker = prepare_decode(self.model, cache)
        compiled = self.decode == "compiled" and blocker is None
        self.decode_path = ("written-out, compiled" if compiled else "written-out"
                            if blocker is None else f"model forward ({blocker})")
        if blocker is None:
            # The mask as an additive bias [n, capacity] (0 attended, -inf not), in attn_buf's
            # place; the positions past P + T - 1 (the compiled step's rounding) never attended.
            bias_buf = torch.full((n, capacity), float("-inf"), dtype=weights.embed.dtype,
                                  device=device)
            bias_buf[:, :P].masked_fill_(prompt_mask.bool(), 0.0)
        if compiled:  # attention_span was imported with the capacity above
            slots = torch.arange(capacity, device=device)  # [capacity], the step's write slot
        # The mask the decode steps read, and its value for an attended position.
        mask_buf, attended = (attn_buf, 1) if blocker is not None else (bias_buf, 0)
        rows = torch.arange(n, device=device)  # rows of this micro-batch still in the cache
        m = n  # mask_buf[:m] are the rows in the cache, in the order of `rows`
        next_pos = positions[:, -1] + 1  # [m]
        for t in range(T):
            # Every row in the cache is live: finished rows leave it at the step they finish.
            tokens, token_logprobs = sample_next_token(logits, params, generator)  # [m], [m]
            response_ids[rows, t] = tokens
            response_mask[rows, t] = 1
            logprobs[rows, t] = token_logprobs.float()
            still = ~torch.isin(tokens, eos)  # [m]
            finished[rows] = ~still
            if t == T - 1:
                break
            live = int(still.sum())  # the step's one read of a device value on the host
            if live == 0:
                break
            # Drop finished rows as soon as there are any: the live rows beyond the new batch
            # size move into the finished rows' slots below it (a copy of as many rows as
            # finished, not of the whole cache), so no forward carries a finished row.
            if live < m:
                order = _fill_holes(still, live)  # [m'] the old slot of each new slot
                m = len(order)
                moved = (order != torch.arange(m, device=device)).nonzero().flatten()
                for layer in cache.layers:
                    if hasattr(layer, "move_rows"):
                        layer.move_rows(order[moved], moved, m)
                    else:  # a layer of transformers' own (sliding window ...)
                        layer.batch_select_indices(order)
                mask_buf[moved] = mask_buf[order[moved]]
                rows, tokens, next_pos = rows[order], tokens[order], next_pos[order]
            # Every row left in the cache is live and attends its new position.
            mask_buf[:m, P + t] = attended
            if compiled and m > 1:
                span = attention_span(P + t + 1)  # [m, G, span, d] views, the last one written
                logits = compiled_decode_step(
                    weights, [layer.key_buffer[:m, :, :span] for layer in cache.layers],
                    [layer.value_buffer[:m, :, :span] for layer in cache.layers], tokens,
                    next_pos, slots[P + t : P + t + 1], bias_buf[:m, :span])
                for layer in cache.layers:  # what `append` counts in the eager step
                    layer.length += 1
            elif blocker is None:
                logits = decode_step(weights, cache, tokens, next_pos, bias_buf[:m, : P + t + 1])
            else:
                attn = attn_buf[:m, : P + t + 1]  # [m, P + t + 1], a view
                if mask_4d:
                    attn = attn.bool()[:, None, None, :]  # [m, 1, 1, P + t + 1]
                logits = self._forward(
                    tokens[:, None], attn, next_pos[:, None], cache, cache_kwarg)
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
