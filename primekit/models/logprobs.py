"""Per-token log-probabilities (and entropies) of response tokens under a causal LM.

Notation: N sequences, L = P + T columns, T response tokens. Rows are laid out as
[left-padding | prompt | response | right-padding]: prompts left-padded, responses right-padded,
so the response occupies the last T columns and token t of the response is predicted by the
hidden state at column L - T - 1 + t. The packed layout of `primekit.rollout.batching` has no
padding inside a sequence: the predicting columns are given explicitly (`predict_index`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils.checkpoint import checkpoint

from primekit.config import ConfigError
from primekit.models.parallel import SCORE_METHOD, is_sharded
from primekit.rollout.base import RolloutBatch
from primekit.rollout.batching import Layout, MicroBatch, iter_layout

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _token_logprobs_and_entropy(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head: torch.nn.Module,
    temperature: float,
    softcap: float | None,
    compute_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(z / temperature)[target] and the entropy of softmax(z / temperature),
    z = lm_head(hidden). Computed in at least float32."""
    logits = lm_head(hidden)  # [n, c, V]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if softcap is not None:  # Gemma-2 style final-logit soft-capping, applied before temperature
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)  # [n, c]
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm  # [n, c]
    if compute_entropy:
        # H = logsumexp(z) - sum_v softmax(z)_v z_v
        entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)  # [n, c]
    else:
        entropy = torch.zeros_like(logprobs)
    return logprobs, entropy


def _backbone_and_head(
    model: PreTrainedModel,
) -> tuple[torch.nn.Module, torch.nn.Module, float | None]:
    head = model.get_output_embeddings()
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else None
    if head is None or backbone is None or backbone is model:
        raise ValueError(
            f"sequence_logprobs needs a causal LM with a separate decoder and lm_head; "
            f"{type(model).__name__} does not expose them"
        )
    config = model.config
    if getattr(config, "logit_scale", None) not in (None, 1.0):
        # Cohere-style scaled logits: not handled, refuse rather than silently differ.
        raise ValueError(f"{type(model).__name__} scales its logits (logit_scale); not supported")
    return backbone, head, getattr(config, "final_logit_softcapping", None)


def sequence_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    chunk_size: int | None = None,
    position_ids: torch.Tensor | None = None,
    predict_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the last T = response_len tokens of each row given everything before them.

    logprobs[i, t] = log softmax(z_i(L-T-1+t) / temperature)[input_ids[i, L-T+t]] where z_i(c)
    are the logits at column c; entropy[i, t] is the entropy of that same distribution.
    position_ids come from the attention mask (cumsum - 1), so left padding does not shift
    positions. Columns whose attention_mask is 0 (response padding) get 0 in both outputs.

    The rows are one forward pass: callers chunk rows and trim padding beforehand
    (`primekit.rollout.batching.iter_micro_batches`). Memory: logits are formed only for the K
    valid response tokens, never for prompt or padding columns: their predicting hidden states
    [K, H] go through lm_head in chunks of chunk_size tokens (in all, not per row); under
    autograd each chunk is checkpointed when there is more than one, so only one chunk's
    [chunk, V] logits live at a time, also in backward (at the price of recomputing the lm_head
    matmul).

    Args:
        model: a Hugging Face causal LM (decoder + lm_head).
        input_ids: [N, L] prompt + response token ids.
        attention_mask: [N, L] 1 on real tokens, 0 on padding.
        response_len: T, with 1 <= T < L.
        temperature: logits are divided by it (> 0), matching the sampling distribution.
        compute_entropy: also return per-token entropies.
        chunk_size: scored tokens per lm_head chunk; default `head_chunk_tokens(V)`, about 2^26
            logits (512 tokens for a 150k vocabulary, one chunk for the tiny model's 259).
        position_ids, predict_index: the packed layout (`primekit.rollout.batching`): input_ids
            and position_ids [R, C] are packed rows (positions restart at 0 for each sequence,
            attention_mask None, so attention stays inside each sequence), and predict_index
            [n, T] is the flat column of R*C predicting response token t of sequence i (-1 on
            padding). Only those n*T (valid) columns go through the lm_head.

    Returns:
        logprobs [N, T] and entropy [N, T] (None unless compute_entropy), float32 or wider;
        [n, T] in the packed layout.
    """
    if predict_index is not None:
        if attention_mask is not None or position_ids is None or \
                position_ids.shape != input_ids.shape or predict_index.dim() != 2:
            raise ValueError("the packed layout needs attention_mask=None, position_ids shaped "
                             "like input_ids and a 2-D predict_index")
    elif input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be [N, L], got {tuple(input_ids.shape)} "
            f"and {tuple(attention_mask.shape)}"
        )
    length = input_ids.shape[1]
    if predict_index is None and (not isinstance(response_len, int)
                                  or not 1 <= response_len < length):
        raise ValueError(f"response_len must be an int in [1, {length - 1}], got {response_len!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")

    runner = getattr(model, SCORE_METHOD, None)  # set by models.parallel.prepare_model
    if runner is not None:
        return runner(input_ids, attention_mask, response_len, temperature, compute_entropy,
                      chunk_size, position_ids, predict_index)
    return score_tokens(model, input_ids, attention_mask, response_len, temperature,
                        compute_entropy, chunk_size, position_ids, predict_index)


# Logits per lm_head chunk: 2^26 of them are 256 MiB in fp32, and the backward holds a few such
# copies (`primekit.models.memory.logits_backward_bytes`); about 512 tokens of a 131k-152k
# vocabulary, and never fewer than 512 tokens.
HEAD_CHUNK_LOGITS = 2**26
MIN_HEAD_CHUNK = 512


def head_chunk_tokens(vocab: int) -> int:
    """Scored tokens per lm_head chunk for a vocabulary of `vocab`: max(512, 2^26 // vocab)."""
    return max(MIN_HEAD_CHUNK, HEAD_CHUNK_LOGITS // vocab)


def _head_chunks(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                 temperature: float, softcap: float | None, compute_entropy: bool,
                 chunk_size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`_token_logprobs_and_entropy` over dim 1 of hidden [n, T, H] in chunks of chunk_size
    (default `head_chunk_tokens`), each checkpointed under autograd when there is more than one:
    [n, T] twice."""
    if chunk_size is None:
        chunk_size = head_chunk_tokens(getattr(head, "out_features", None) or head.weight.shape[0])
    T = hidden.shape[1]
    chunks = range(0, T, chunk_size)
    use_ckpt = torch.is_grad_enabled() and len(chunks) > 1
    lp_parts, ent_parts = [], []
    for c in chunks:
        args = (hidden[:, c : c + chunk_size], targets[:, c : c + chunk_size], head)
        args += (temperature, softcap, compute_entropy)
        if use_ckpt:
            lp, ent = checkpoint(_token_logprobs_and_entropy, *args, use_reentrant=False)
        else:
            lp, ent = _token_logprobs_and_entropy(*args)
        lp_parts.append(lp)
        ent_parts.append(ent)
    return torch.cat(lp_parts, dim=1), torch.cat(ent_parts, dim=1)


def _flat_for_flash(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows as one row [1, R*C] for flash attention, whose packed-sequence path
    (varlen, from the position ids) exists only for a batch of one; otherwise unchanged. The flat
    column indices (predict_index) are the same either way: every row starts a new segment."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or ""
    if "flash" in impl and input_ids.shape[0] > 1:
        return input_ids.reshape(1, -1), position_ids.reshape(1, -1)
    return input_ids, position_ids


def _valid_columns(predict_index: torch.Tensor, device: torch.device,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed layout's valid response positions [n, T] (bool) and their flat predicting
    columns [K], both on `device`. Selected where predict_index lives (the CPU, as the layout
    builds it), so that a GPU never waits for a data-dependent size (K) mid-pass."""
    valid = predict_index >= 0  # [n, T]
    flat = predict_index[valid]  # [K]
    return valid.to(device), flat.to(device)


def _score_packed(model: PreTrainedModel, input_ids: torch.Tensor, position_ids: torch.Tensor,
                  predict_index: torch.Tensor, temperature: float, compute_entropy: bool,
                  chunk_size: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`score_tokens` on packed rows: one backbone forward over [R, C] with no attention mask
    (transformers builds the block-diagonal causal mask from the restarting position ids), then
    the lm_head on the K valid predicting columns only, scattered back to [n, T]."""
    backbone, head, softcap = _backbone_and_head(model)
    device = next(model.parameters()).device
    ids, pos = _flat_for_flash(model, input_ids.to(device), position_ids.to(device))
    valid, flat = _valid_columns(predict_index, device)  # [n, T], [K]
    hidden = backbone(input_ids=ids, attention_mask=None, position_ids=pos,
                      use_cache=False).last_hidden_state  # [R, C, H]
    hidden = hidden.reshape(-1, hidden.shape[-1])[flat]  # [K, H]
    targets = ids.reshape(-1)[flat + 1]  # [K]
    lp, ent = _head_chunks(hidden[None], targets[None], head, temperature, softcap,
                           compute_entropy, chunk_size)  # [1, K]
    logprobs = lp.new_zeros(valid.shape).masked_scatter(valid, lp[0])  # [n, T]
    entropy = ent.new_zeros(valid.shape).masked_scatter(valid, ent[0]) if compute_entropy else None
    return logprobs, entropy


def score_tokens(model: PreTrainedModel, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None, response_len: int, temperature: float,
                 compute_entropy: bool, chunk_size: int | None,
                 position_ids: torch.Tensor | None = None,
                 predict_index: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The computation of `sequence_logprobs` (arguments checked there). It is the forward
    method `models.parallel.prepare_model` attaches to a sharded or mixed-precision model."""
    if predict_index is not None:
        return _score_packed(model, input_ids, position_ids, predict_index, temperature,
                             compute_entropy, chunk_size)
    length = input_ids.shape[1]
    backbone, head, softcap = _backbone_and_head(model)
    device = next(model.parameters()).device
    T = response_len
    # The valid response tokens, selected where the mask lives (the CPU, as the layout builds
    # it), so that a GPU never waits for their number mid-pass.
    valid = attention_mask[:, length - T :].bool()  # [N, T]
    row, t = valid.nonzero(as_tuple=True)  # [K] each
    # Response token t of row i sits at column L - T + t, predicted by the one before: flat
    # indices into the N*L columns, as the packed layout's predict_index.
    flat = (row * length + length - T - 1 + t).to(device)  # [K]
    valid = valid.to(device)
    ids, mask = input_ids.to(device), attention_mask.to(device).long()  # [N, L]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # [N, L]
    hidden = backbone(
        input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # [N, L, H]
    hidden = hidden.reshape(-1, hidden.shape[-1])[flat]  # [K, H], the predicting columns
    targets = ids.reshape(-1)[flat + 1]  # [K]
    lp, ent = _head_chunks(hidden[None], targets[None], head, temperature, softcap,
                           compute_entropy, chunk_size)  # [1, K]
    logprobs = lp.new_zeros(valid.shape).masked_scatter(valid, lp[0])  # [N, T]
    entropy = ent.new_zeros(valid.shape).masked_scatter(valid, ent[0]) if compute_entropy else None
    return logprobs, entropy


def micro_batch_logprobs(model: PreTrainedModel, mb: MicroBatch, *, compute_entropy: bool = False,
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sequence_logprobs` of one micro-batch, padded or packed: [n, t] (0 on padding)."""
    device = next(model.parameters()).device
    if mb.packed:
        return sequence_logprobs(model, mb.input_ids.to(device), None, mb.response_len,
                                 compute_entropy=compute_entropy,
                                 position_ids=mb.position_ids.to(device),
                                 predict_index=mb.predict_index)
    # The padded rows stay where the layout built them (the CPU): score_tokens selects their
    # valid tokens there and moves the rest, so a GPU never waits on that selection.
    return sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.response_len,
                             compute_entropy=compute_entropy)


@torch.no_grad()
def batch_logprobs(model: PreTrainedModel, batch: RolloutBatch, micro_batch_size: int,
                   multiple: int = 1, max_tokens: int = 0, packed: bool = False) -> torch.Tensor:
    """No-grad per-token log-probs of every response in `batch`: [N, T] float32 on the CPU.

    The arguments after `batch` are a `Layout` (`batch_logprobs(model, batch, *layout)`).
    Compare only log-probs computed with the same layout: equal micro-batches give equal
    padding, so two copies of one model give bitwise-equal log-probs (process rewards of exactly
    zero at initialisation).
    """
    layout = Layout(micro_batch_size, multiple, max_tokens, packed)
    out = torch.zeros(batch.response_ids.shape)  # [N, T]
    for mb in iter_layout(batch, layout):
        lp, _ = micro_batch_logprobs(model, mb)
        out[mb.rows, : mb.response_len] = lp.float().cpu()
    return out * batch.response_mask.float().cpu()  # a batch may live on any device


def sequence_values(critic: PreTrainedModel, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor | None, response_len: int,
                    position_ids: torch.Tensor | None = None,
                    predict_index: torch.Tensor | None = None) -> torch.Tensor:
    """Critic values V(y_<t) for the last T = response_len tokens: [N, T] float32.

    `critic` is a Hugging Face *ForTokenClassification model with one label; the value of token
    t is read at the column that predicts it (L - T - 1 + t), like `sequence_logprobs`; in the
    packed layout (position_ids and predict_index, as there) at predict_index, 0 on padding.
    """
    runner = getattr(critic, SCORE_METHOD, None)  # set by models.parallel.prepare_model
    if runner is not None:
        return runner(input_ids, attention_mask, response_len, position_ids, predict_index)
    return critic_values(critic, input_ids, attention_mask, response_len, position_ids,
                         predict_index)


def critic_values(critic: PreTrainedModel, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor | None, response_len: int,
                  position_ids: torch.Tensor | None = None,
                  predict_index: torch.Tensor | None = None) -> torch.Tensor:
    """The computation of `sequence_values`; the critic's forward method under
    `models.parallel.prepare_model`."""
    if predict_index is not None:  # packed: no mask, positions restart per sequence
        input_ids, position_ids = _flat_for_flash(critic, input_ids, position_ids)
        # use_cache=False: with a cache, transformers does not look for packed sequences.
        out = critic(input_ids=input_ids, attention_mask=None, position_ids=position_ids,
                     use_cache=False)
        values = out.logits[..., 0].reshape(-1)  # [R*C]
        valid, flat = _valid_columns(predict_index, values.device)  # [n, T], [K]
        picked = values[flat].to(torch.float32)  # [K]
        return picked.new_zeros(valid.shape).masked_scatter(valid, picked)  # [n, T]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [N, L]
    out = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    values = out.logits[..., 0]  # [N, L]
    # A copy, not a view of the forward output: FSDP2 hooks the output for the backward.
    return values[:, -response_len - 1 : -1].to(torch.float32, copy=True)


def micro_batch_values(critic: PreTrainedModel, mb: MicroBatch) -> torch.Tensor:
    """`sequence_values` of one micro-batch, padded or packed: [n, t] float32."""
    device = next(critic.parameters()).device
    if mb.packed:
        return sequence_values(critic, mb.input_ids.to(device), None, mb.response_len,
                               mb.position_ids.to(device), mb.predict_index)
    return sequence_values(critic, mb.input_ids.to(device), mb.attention_mask.to(device),
                           mb.response_len)


@torch.no_grad()
def batch_values(critic: PreTrainedModel, batch: RolloutBatch, micro_batch_size: int,
                 multiple: int = 1, max_tokens: int = 0, packed: bool = False) -> torch.Tensor:
    """No-grad critic values of every response token in `batch`: [N, T] on the CPU; the
    arguments after `batch` are a `Layout`."""
    out = torch.zeros(batch.response_ids.shape)  # [N, T]
    for mb in iter_layout(batch, Layout(micro_batch_size, multiple, max_tokens, packed)):
        out[mb.rows, : mb.response_len] = micro_batch_values(critic, mb).cpu()
    return out * batch.response_mask.float().cpu()  # a batch may live on any device


# A packed sequence's scores may move by at most this (nats, or value units) when the sequence
# before it in its packed row changes. Where attention stays inside each sequence they move by
# rounding only (measured on the CPU: 0 for the tiny model at init in fp32 and bf16, 1e-6 and 2e-6
# for the demo's SFT model with sdpa and eager attention); where it crosses, by the effect of
# another sequence's tokens (0.78 nats on the demo's SFT model with the position ids dropped).
PACKED_LEAK_TOLERANCE = 1e-3


@torch.no_grad()
def packed_attention_leak(model: torch.nn.Module, head: str = "lm") -> float:
    """How far the scores of a packed sequence move when the sequence packed before it changes.

    Two packed rows of one forward, [A | B] and [A' | B] (A, A' 12 different random tokens, B 8
    tokens, positions restarting at B): B's last 5 tokens are scored in both rows (log-probs, or
    values for head="value"), and the largest absolute difference is returned. 0 when the model
    confines attention to each packed sequence, as the packed layout assumes (transformers derives
    a block-diagonal mask from the restarting position ids); a model that ignores them attends
    from B to A, and B's scores then depend on A. Runs as any scoring pass does (sharded models
    included: every rank must call it; resharded after), in eval mode, without gradients.
    """
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    first = torch.randint(0, vocab, (2, 12), generator=g)  # [2, 12], A and A'
    while torch.equal(first[0], first[1]):  # pragma: no cover - a tiny vocabulary's draw
        first[1] = torch.randint(0, vocab, (12,), generator=g)
    second = torch.randint(0, vocab, (1, 8), generator=g).expand(2, 8)  # [2, 8], B twice
    input_ids = torch.cat([first, second], 1)  # [2, 20]
    position_ids = torch.cat([torch.arange(12), torch.arange(8)]).expand(2, 20)  # [2, 20]
    # B's response tokens 3..7 sit at columns 15..19 of each row, predicted by columns 14..18;
    # flat indices into the 2 x 20 columns.
    predict_index = torch.arange(14, 19) + torch.tensor([[0], [20]])  # [2, 5]
    was_training = model.training
    model.eval()
    try:
        if head == "value":
            out = sequence_values(model, input_ids, None, 5, position_ids, predict_index)
        else:
            out, _ = sequence_logprobs(model, input_ids, None, 5, position_ids=position_ids,
                                       predict_index=predict_index)
    finally:
        model.train(was_training)
        if is_sharded(model):
            # FSDP2 keeps a trained model's root gathered after a forward, for the backward that
            # a probe never runs: shard it again, or an optimiser built next would hold the
            # gathered tensors instead of the shards.
            model.reshard()
    return float((out[0] - out[1]).abs().max())  # [5] -> the largest move


def check_packed_attention(model: torch.nn.Module, field: str, head: str = "lm") -> None:
    """A ConfigError naming `field` (the config section whose packed layout scores `model`, e.g.
    "policy") unless `packed_attention_leak` finds attention confined to each packed sequence:
    with a model that lets it cross, packed micro-batches would silently score every sequence
    partly on its neighbours."""
    name = type(getattr(model, "module", model)).__name__
    fix = (f"set {field}.max_tokens_per_micro_batch=0 (padded rows) or {field}.packing=sorted "
           "(length-sorted padded rows)")
    try:
        leak = packed_attention_leak(model, head)
    except (TypeError, ValueError, RuntimeError, IndexError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{field}.packing=packed: {name} cannot score packed sequences "
                          f"({first}); {fix}") from None
    if not leak <= PACKED_LEAK_TOLERANCE:
        raise ConfigError(f"{field}.packing=packed: {name} lets attention cross packed sequences "
                          f"(a sequence's scores moved by {leak:.3g} when the one packed before "
                          f"it changed); {fix}")
