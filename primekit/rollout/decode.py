"""A written-out decode step for Llama-family causal LMs (Llama, Mistral, Qwen2, Qwen3).

The HF engine (`rollout/hf.py`) runs the prompt through the model's own forward (the prefill)
and then, where `decode_blocker` finds nothing in the way, feeds each new token through
`decode_step` instead of the model's forward. The step computes what the model's modules
compute, from the same parameters, with two differences of method and none of math:

- no module calls, no mask building and no cache bookkeeping of transformers per step: the new
  keys and values go straight into the engine's preallocated cache (`PreallocatedLayer`);
- attention for one query per row as two batched matrix products over the cached positions
  (softmax in float32 at least, as transformers' eager attention), where transformers calls SDPA, whose
  CPU kernel is tiled for long queries. Query heads share their key/value head without copying
  it (grouped-query attention).

Logits agree with the model's forward to rounding (float32: ~1e-6 relative; float64: ~1e-15),
not bit for bit: the attention sums in another order (tests/rollout/test_decode.py). The model's
own forward stays the path for every other architecture and whenever the model's parameters are
not plain tensors the step can read (FSDP-sharded, LoRA-wrapped, quantised, offloaded, hooked).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Checked one by one against the model's forward (tests/rollout/test_decode.py).
SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as Llama and Qwen compute it: weight * (x / sqrt(mean(x^2) + eps)), the
    normalisation in float32 and the result cast back before the weight. x [..., D] -> [..., D]."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dimension (rotary embeddings, RoFormer Eq. 34)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def single_query_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v for one query per row, grouped-query heads.

    q [m, H, d]; keys, values [m, G, L, d] (G key/value heads, H = G * r query heads; query head
    h reads key/value head h // r, as transformers' `repeat_kv`); bias [m, L] (0 where a position
    is attended, -inf where not; every row attends at least one position). Returns [m, H * d].
    The softmax in float32 at least, the products in the inputs' dtype.
    """
    m, H, d = q.shape
    G, L = keys.shape[1], keys.shape[2]
    r = H // G
    qg = q.reshape(m * G, r, d)  # [m*G, r, d]
    k = keys.reshape(m * G, L, d)  # [m*G, L, d] (a view of the cache when its rows are whole)
    v = values.reshape(m * G, L, values.shape[-1])  # [m*G, L, dv]
    scores = torch.baddbmm(
        bias[:, None, None, :].expand(m, G, 1, L).reshape(m * G, 1, L).to(q.dtype),
        qg, k.transpose(1, 2), alpha=scale,
    )  # [m*G, r, L]
    probs = scores.softmax(-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    return torch.bmm(probs, v).reshape(m, H * values.shape[-1])  # [m, H*dv]


def decode_blocker(model, cache) -> str | None:
    """Why `decode_step` cannot stand in for `model`'s forward over `cache`; None when it can.

    It can for the supported architectures with full attention in every layer (the cache made
    every layer a preallocated one), every projection a plain `torch.nn.Linear` with ordinary
    tensors (not DTensors or meta tensors) and no hooks on any module.
    """
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {config.model_type!r} (written out: {sorted(SUPPORTED_MODEL_TYPES)})"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return f"{type(model).__name__} is not a *ForCausalLM with .model.layers"
    if any(not hasattr(layer, "move_rows") for layer in getattr(cache, "layers", [None])):
        return "a layer without a preallocated cache (sliding-window or other attention)"
    if config.model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return "Mistral with a sliding window"
    for layer in inner.layers:
        if getattr(layer.self_attn, "sliding_window", None) is not None:
            return "a sliding-window attention layer"
    from torch.distributed.tensor import DTensor

    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook"):
            return f"hooks on {name or 'the model'} (offloading, sharding or adapters)"
        if isinstance(module, torch.nn.Linear) and type(module) is not torch.nn.Linear:
            return f"{name} is a {type(module).__name__}, not a plain Linear"
    for name, p in model.named_parameters():
        if isinstance(p, DTensor) or p.is_meta:
            return f"parameter {name} is {'a DTensor' if isinstance(p, DTensor) else 'on meta'}"
    return None


def decode_step(
    model, cache, tokens: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """Logits of the next token after one new token per row, the model's forward written out.

    For each decoder layer (pre-norm residual blocks, Llama / Qwen):
        h <- h + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),  n = norm1(h)
        h <- h + down_proj(act(gate_proj(n)) * up_proj(n)),                         n = norm2(h)
    (Qwen3 normalises q and k per head before the rotary embedding), then logits =
    lm_head(norm(h)). The new keys and values are appended to `cache`'s preallocated layers.

    tokens [m] (the rows of the cache, in its order), positions [m] (their position ids),
    bias [m, L] (L = cached positions + 1: 0 attended, -inf not). Returns logits [m, V].
    Check `decode_blocker(model, cache)` first.
    """
    inner = model.model
    h = inner.embed_tokens(tokens)  # [m, D]
    m = h.shape[0]
    cos, sin = inner.rotary_emb(h[:, None], positions[:, None])  # [m, 1, d] each
    for layer, kv in zip(inner.layers, cache.layers):
        attn, mlp = layer.self_attn, layer.mlp
        norm = layer.input_layernorm
        n = rms_norm(h, norm.weight, norm.variance_epsilon)  # [m, D]
        d = attn.head_dim
        q = F.linear(n, attn.q_proj.weight, attn.q_proj.bias).view(m, -1, d)  # [m, H, d]
        k = F.linear(n, attn.k_proj.weight, attn.k_proj.bias).view(m, -1, d)  # [m, G, d]
        v = F.linear(n, attn.v_proj.weight, attn.v_proj.bias).view(m, -1, d)  # [m, G, d]
        if hasattr(attn, "q_norm"):  # Qwen3
            q = rms_norm(q, attn.q_norm.weight, attn.q_norm.variance_epsilon)
            k = rms_norm(k, attn.k_norm.weight, attn.k_norm.variance_epsilon)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys, values = kv.append(k, v)  # [m, G, L, d] each, views of the cache
        o = single_query_attention(q, keys, values, bias, attn.scaling)  # [m, H*d]
        h = h + F.linear(o, attn.o_proj.weight, attn.o_proj.bias)
        norm = layer.post_attention_layernorm
        n = rms_norm(h, norm.weight, norm.variance_epsilon)
        gate = mlp.act_fn(F.linear(n, mlp.gate_proj.weight, mlp.gate_proj.bias))  # [m, I]
        up = F.linear(n, mlp.up_proj.weight, mlp.up_proj.bias)  # [m, I]
        h = h + F.linear(gate * up, mlp.down_proj.weight, mlp.down_proj.bias)
    h = rms_norm(h, inner.norm.weight, inner.norm.variance_epsilon)
    return F.linear(h, model.lm_head.weight, model.lm_head.bias)  # [m, V]
