"""sequence_logprobs against a naive full-logits computation."""

from __future__ import annotations

import pytest
import torch

from primekit.models.logprobs import sequence_logprobs

# Rows of [left pad | prompt | response | right pad] with ragged prompt and response lengths.
PROMPT_LENS = [7, 3, 5, 1, 7, 2]
RESPONSE_LENS = [5, 2, 0, 5, 1, 3]
P, T = 7, 5


@pytest.fixture(scope="module")
def model64(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).double().eval()


def _ragged_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 99, (len(PROMPT_LENS), P + T), generator=g)  # [N, L]
    mask = torch.ones_like(ids)  # [N, L]
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        ids[i, : P - p], mask[i, : P - p] = 0, 0
        ids[i, P + r :], mask[i, P + r :] = 0, 0
    return ids, mask


def _naive(model, ids, temperature=1.0):
    """Each row alone, unpadded, full logits: log softmax(z / temp) at each response token."""
    logprobs = torch.zeros(len(PROMPT_LENS), T, dtype=torch.float64)
    entropy = torch.zeros(len(PROMPT_LENS), T, dtype=torch.float64)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        seq = ids[i, P - p : P + r]
        logp = torch.log_softmax(model(seq[None]).logits[0] / temperature, -1)  # [p + r, V]
        for t in range(r):
            # Response token t sits at index p + t and is predicted by index p + t - 1.
            logprobs[i, t] = logp[p - 1 + t, seq[p + t]]
            entropy[i, t] = -(logp[p - 1 + t].exp() * logp[p - 1 + t]).sum()
    return logprobs, entropy


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"chunk_size": 2}, {"chunk_size": 1}],
)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_naive_full_logits(model64, kwargs, temperature):
    ids, mask = _ragged_batch()
    with torch.no_grad():
        ref_lp, ref_ent = _naive(model64, ids, temperature)
        lp, ent = sequence_logprobs(
            model64, ids, mask, T, temperature=temperature, compute_entropy=True, **kwargs
        )
    assert lp.shape == ent.shape == (6, T) and lp.dtype == torch.float64
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-10)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-10)
    # Padding columns are exactly zero; real tokens have strictly negative log-probs.
    response_mask = mask[:, P:].bool()
    assert (lp[~response_mask] == 0).all() and (lp[response_mask] < 0).all()


def test_float32_close_to_float64(tiny_model_dir, model64):
    from transformers import AutoModelForCausalLM

    model32 = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids, mask = _ragged_batch(1)
    with torch.no_grad():
        lp32, ent = sequence_logprobs(model32, ids, mask, T)
        lp64, _ = sequence_logprobs(model64, ids, mask, T)
    assert lp32.dtype == torch.float32 and ent is None
    torch.testing.assert_close(lp32.double(), lp64, rtol=0, atol=1e-5)


def test_gradients_equal_with_and_without_chunking(model64):
    ids, mask = _ragged_batch(2)
    weights = torch.randn(6, T, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    grads = []
    for kwargs in [{}, {"chunk_size": 2}]:
        model64.zero_grad()
        lp, ent = sequence_logprobs(model64, ids, mask, T, compute_entropy=True, **kwargs)
        ((lp * weights).sum() + ent.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model64.named_parameters()})
    model64.zero_grad()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-9, atol=1e-12)
    assert grads[0]["model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0


def test_only_valid_response_tokens_reach_lm_head(model64):
    # The 5 + 2 + 0 + 5 + 1 + 3 = 16 valid response tokens, in chunks of chunk_size tokens in all:
    # never a prompt or padding column (the memory bound the trainer relies on). By default one
    # chunk holds max(512, 2^26 // 259) tokens: all 16.
    from primekit.models.logprobs import head_chunk_tokens

    seen = []
    hook = model64.lm_head.register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    try:
        ids, mask = _ragged_batch()
        with torch.no_grad():
            sequence_logprobs(model64, ids, mask, T, chunk_size=6)
            sequence_logprobs(model64, ids, mask, T)
    finally:
        hook.remove()
    assert seen == [(1, 6, 259), (1, 6, 259), (1, 4, 259), (1, 16, 259)]
    # 2^26 // 259 = 259,107 tokens; 2^26 // 152,064 = 441, raised to 512.
    assert head_chunk_tokens(259) == 259_107 and head_chunk_tokens(152_064) == 512


def test_bad_arguments(model64):
    ids, mask = _ragged_batch()
    with pytest.raises(ValueError, match="response_len"):
        sequence_logprobs(model64, ids, mask, P + T)
    with pytest.raises(ValueError, match="temperature"):
        sequence_logprobs(model64, ids, mask, T, temperature=0.0)
    with pytest.raises(ValueError, match="attention_mask"):
        sequence_logprobs(model64, ids, mask[:, 1:], T)
    with pytest.raises(ValueError, match="chunk_size"):
        sequence_logprobs(model64, ids, mask, T, chunk_size=0)
