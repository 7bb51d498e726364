"""Per-token log-probabilities (and entropies) of response tokens under a causal LM.

Notation: N sequences, L = P + T columns, T response tokens. Rows are laid out as
[left-padding | prompt | response | right-padding]: prompts left-padded, responses right-padded,
so the response occupies the last T columns and token t of the response is predicted by the
hidden state at column L - T - 1 + t.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils.checkpoint import checkpoint

from primekit.models.parallel import SCORE_METHOD
from primekit.rollout.base import RolloutBatch
from primekit.rollout.batching import iter_micro_batches

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
    chunk_size: int = 512,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the last T = response_len tokens of each row given everything before them.

    logprobs[i, t] = log softmax(z_i(L-T-1+t) / temperature)[input_ids[i, L-T+t]] where z_i(c)
    are the logits at column c; entropy[i, t] is the entropy of that same distribution.
    position_ids come from the attention mask (cumsum - 1), so left padding does not shift
    positions. Columns whose attention_mask is 0 (response padding) get 0 in both outputs.

    The rows are one forward pass: callers chunk rows and trim padding beforehand
    (`primekit.rollout.batching.iter_micro_batches`). Memory: logits are never formed for prompt
    columns. The backbone's hidden states for the T predicting columns go through lm_head in
    chunks of chunk_size tokens; under autograd each chunk is checkpointed when there is more
    than one, so only one chunk's [n, chunk, V] logits live at a time, also in backward (at the
    price of recomputing the lm_head matmul).

    Args:
        model: a Hugging Face causal LM (decoder + lm_head).
        input_ids: [N, L] prompt + response token ids.
        attention_mask: [N, L] 1 on real tokens, 0 on padding.
        response_len: T, with 1 <= T < L.
        temperature: logits are divided by it (> 0), matching the sampling distribution.
        compute_entropy: also return per-token entropies.
        chunk_size: response tokens per lm_head chunk.

    Returns:
        logprobs [N, T] and entropy [N, T] (None unless compute_entropy), float32 or wider.
    """
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be [N, L], got {tuple(input_ids.shape)} "
            f"and {tuple(attention_mask.shape)}"
        )
    length = input_ids.shape[1]
    if not isinstance(response_len, int) or not 1 <= response_len < length:
        raise ValueError(f"response_len must be an int in [1, {length - 1}], got {response_len!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")

    runner = getattr(model, SCORE_METHOD, None)  # set by models.parallel.prepare_model
    if runner is not None:
        return runner(input_ids, attention_mask, response_len, temperature, compute_entropy,
                      chunk_size)
    return score_tokens(model, input_ids, attention_mask, response_len, temperature,
                        compute_entropy, chunk_size)


def score_tokens(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 response_len: int, temperature: float, compute_entropy: bool, chunk_size: int,
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The computation of `sequence_logprobs` (arguments checked there). It is the forward
    method `models.parallel.prepare_model` attaches to a sharded or mixed-precision model."""
    length = input_ids.shape[1]
    backbone, head, softcap = _backbone_and_head(model)
    device = next(model.parameters()).device
    ids, mask = input_ids.to(device), attention_mask.to(device).long()  # [N, L]
    T = response_len
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # [N, L]
    hidden = backbone(
        input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # [N, L, H]
    hidden = hidden[:, length - T - 1 : length - 1]  # [N, T, H], the predicting columns
    targets = ids[:, length - T :]  # [N, T]
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
    response_mask = mask[:, length - T :]  # [N, T]
    logprobs = torch.cat(lp_parts, dim=1) * response_mask  # [N, T]
    entropy = torch.cat(ent_parts, dim=1) * response_mask if compute_entropy else None  # [N, T]
    return logprobs, entropy


@torch.no_grad()
def batch_logprobs(model: PreTrainedModel, batch: RolloutBatch, micro_batch_size: int,
                   multiple: int = 1) -> torch.Tensor:
    """No-grad per-token log-probs of every response in `batch`: [N, T] float32 on the CPU.

    Compare only log-probs computed with the same (micro_batch_size, multiple): equal
    micro-batches give equal padding, so two copies of one model give bitwise-equal log-probs
    (process rewards of exactly zero at initialisation).
    """
    device = next(model.parameters()).device
    out = torch.zeros(batch.response_ids.shape)  # [N, T]
    for mb in iter_micro_batches(batch, micro_batch_size, multiple):
        lp, _ = sequence_logprobs(model, mb.input_ids.to(device), mb.attention_mask.to(device),
                                  mb.response_len)
        out[mb.rows, : mb.response_len] = lp.float().cpu()
    return out * batch.response_mask.float()


def sequence_values(critic: PreTrainedModel, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, response_len: int) -> torch.Tensor:
    """Critic values V(y_<t) for the last T = response_len tokens: [N, T] float32.

    `critic` is a Hugging Face *ForTokenClassification model with one label; the value of token
    t is read at the column that predicts it (L - T - 1 + t), like `sequence_logprobs`.
    """
    runner = getattr(critic, SCORE_METHOD, None)  # set by models.parallel.prepare_model
    if runner is not None:
        return runner(input_ids, attention_mask, response_len)
    return critic_values(critic, input_ids, attention_mask, response_len)


def critic_values(critic: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  response_len: int) -> torch.Tensor:
    """The computation of `sequence_values`; the critic's forward method under
    `models.parallel.prepare_model`."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [N, L]
    out = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    values = out.logits[..., 0]  # [N, L]
    # A copy, not a view of the forward output: FSDP2 hooks the output for the backward.
    return values[:, -response_len - 1 : -1].to(torch.float32, copy=True)


@torch.no_grad()
def batch_values(critic: PreTrainedModel, batch: RolloutBatch,
                 micro_batch_size: int) -> torch.Tensor:
    """No-grad critic values of every response token in `batch`: [N, T] on the CPU."""
    device = next(critic.parameters()).device
    out = torch.zeros(batch.response_ids.shape)  # [N, T]
    for mb in iter_micro_batches(batch, micro_batch_size):
        values = sequence_values(critic, mb.input_ids.to(device), mb.attention_mask.to(device),
                                 mb.response_len)
        out[mb.rows, : mb.response_len] = values.cpu()
    return out * batch.response_mask.float()
