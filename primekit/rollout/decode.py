"""A written-out decode step for Llama-family causal LMs (Llama, Mistral, Qwen2, Qwen3).

The HF engine (`rollout/hf.py`) runs the prompt through the model's own forward (the prefill)
and then, where `prepare_decode` finds nothing in the way, feeds each new token through
`decode_step` instead of the model's forward. The step computes what the model's modules
compute, from the same parameters, with two differences of method and none of math:

- no module calls, no mask building and no cache bookkeeping of transformers per step: the new
  keys and values go straight into the engine's preallocated cache (`PreallocatedLayer`);
- attention for one query per row as two batched matrix products over the cached positions
  (softmax in float32 at least, as transformers' eager attention), where transformers calls
  SDPA, whose CPU kernel is tiled for long queries. Query heads share their key/value head
  without copying it (grouped-query attention).

Logits agree with the model's forward to rounding (float32: ~1e-6 relative; float64: ~1e-15),
not bit for bit: the attention sums in another order (tests/rollout/test_decode.py). The model's
own forward stays the path for every other architecture and whenever the model's parameters are
not plain tensors the step can read (FSDP-sharded, LoRA-wrapped, quantised, offloaded, hooked).

`compiled_decode_step` is the same step under `torch.compile` (`rollout.hf_decode=compiled`),
written for static sizes (`static_decode_step`): attention over spans of a few fixed lengths,
the positions not yet written masked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

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


def grouped_bias(bias: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """bias [m, L] -> [m * groups, 1, L] in `dtype`: row i * groups + g is bias[i], the layout
    of `single_query_attention`'s batched products (one batch entry per row and key/value head)."""
    m, L = bias.shape
    return bias[:, None, None, :].expand(m, groups, 1, L).reshape(m * groups, 1, L).to(dtype)


def single_query_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v for one query per row, grouped-query heads.

    q [m, H, d]; keys, values [m, G, L, d] (G key/value heads, H = G * r query heads; query head
    h reads key/value head h // r, as transformers' `repeat_kv`); bias [m, L] (0 where a position
    is attended, -inf where not; every row attends at least one position), or that bias already
    as `grouped_bias(bias, G, q.dtype)` (the decode step makes it once for all its layers).
    Returns [m, H * d]. The softmax in float32 at least, the products in the inputs' dtype.
    """
    m, H, d = q.shape
    G, L = keys.shape[1], keys.shape[2]
    r = H // G
    if bias.dim() == 2:
        bias = grouped_bias(bias, G, q.dtype)  # [m*G, 1, L]
    qg = q.reshape(m * G, r, d)  # [m*G, r, d]
    k = keys.reshape(m * G, L, d)  # [m*G, L, d] (a view of the cache when its rows are whole)
    v = values.reshape(m * G, L, values.shape[-1])  # [m*G, L, dv]
    scores = torch.baddbmm(bias, qg, k.transpose(1, 2), alpha=scale)  # [m*G, r, L]
    probs = scores.softmax(-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    return torch.bmm(probs, v).reshape(m, H * values.shape[-1])  # [m, H*dv]


def prepare_decode(model, cache) -> tuple[DecodeWeights | None, str | None]:
    """(`model`'s parameters for `decode_step`, None) where the step can stand in for `model`'s
    forward over `cache`; (None, why not) where it cannot.

    It can for the supported architectures with full attention in every layer (the cache made
    every layer a preallocated one), every projection a plain `torch.nn.Linear` (not a LoRA or
    quantised wrapper) with ordinary tensors (not DTensors or meta tensors) and no hooks on any
    module.
    """
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return None, (f"model type {config.model_type!r} "
                      f"(written out: {sorted(SUPPORTED_MODEL_TYPES)})")
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return None, f"{type(model).__name__} is not a *ForCausalLM with .model.layers"
    if any(not hasattr(layer, "move_rows") for layer in getattr(cache, "layers", [None])):
        return None, "a layer without a preallocated cache (sliding-window or other attention)"
    if config.model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return None, "Mistral with a sliding window"
    for layer in inner.layers:
        if getattr(layer.self_attn, "sliding_window", None) is not None:
            return None, "a sliding-window attention layer"
    try:
        weights = decode_weights(model)
    except AttributeError as e:  # an older transformers' modules name things otherwise
        return None, f"its modules lack what the step reads ({e})"
    weights = rotary_table(weights, cache.layers[0].capacity)
    # Every module whose weights the step reads must be exactly what it assumes: a LoRA or
    # quantised wrapper (peft, bitsandbytes) computes something else from the same names.
    read = {"model.embed_tokens": (inner.embed_tokens, torch.nn.Embedding),
            "lm_head": (model.lm_head, torch.nn.Linear)}
    for i, layer in enumerate(inner.layers):
        for part, names in (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
                            ("mlp", ("gate_proj", "up_proj", "down_proj"))):
            for name in names:
                read[f"model.layers.{i}.{part}.{name}"] = (
                    getattr(getattr(layer, part), name), torch.nn.Linear)
    for name, (module, kind) in read.items():
        if type(module) is not kind:
            return None, f"{name} is a {type(module).__name__}, not a plain {kind.__name__}"
    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook"):
            return None, f"hooks on {name or 'the model'} (offloading, sharding or adapters)"
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed support has no DTensors either
        DTensor = ()  # noqa: N806
    for name, p in model.named_parameters():
        if isinstance(p, DTensor) or p.is_meta:
            kind = "a DTensor" if isinstance(p, DTensor) else "on meta"
            return None, f"parameter {name} is {kind}"
    return weights, None


def decode_blocker(model, cache) -> str | None:
    """Why `decode_step` cannot stand in for `model`'s forward over `cache`; None when it can
    (`prepare_decode`'s reason)."""
    return prepare_decode(model, cache)[1]


class LayerWeights(NamedTuple):
    """One decoder layer's parameters as the written-out step reads them (biases may be None;
    q_norm / k_norm only for Qwen3)."""

    norm1: torch.Tensor
    eps1: float
    q: torch.Tensor
    q_bias: torch.Tensor | None
    k: torch.Tensor
    k_bias: torch.Tensor | None
    v: torch.Tensor
    v_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    qk_eps: float
    head_dim: int
    scale: float
    norm2: torch.Tensor
    eps2: float
    gate: torch.Tensor
    gate_bias: torch.Tensor | None
    up: torch.Tensor
    up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    act: Callable[[torch.Tensor], torch.Tensor]


class DecodeWeights(NamedTuple):
    """The model's parameters for `decode_step`, read once per `generate` (the tensors
    themselves, not copies: an update between calls is seen by the next call)."""

    embed: torch.Tensor  # [V, D]
    rotary: Callable  # the model's rotary embedding module: (x, position_ids) -> (cos, sin)
    layers: list[LayerWeights]
    norm: torch.Tensor  # [D]
    eps: float
    head: torch.Tensor  # [V, D]
    head_bias: torch.Tensor | None
    # The rotary module's cos and sin for every position of the cache, [capacity, d], sin in the
    # signed form the step applies (`rotary_table`); None: `rotary` is called every step.
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None


def decode_weights(model) -> DecodeWeights:
    """`model`'s parameters for `decode_step` (`prepare_decode` checks the model first)."""
    inner = model.model
    layers = []
    for layer in inner.layers:
        a, mlp = layer.self_attn, layer.mlp
        n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
        qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        layers.append(LayerWeights(
            n1.weight, n1.variance_epsilon, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight,
            a.k_proj.bias, a.v_proj.weight, a.v_proj.bias, a.o_proj.weight, a.o_proj.bias,
            None if qn is None else qn.weight, None if kn is None else kn.weight,
            0.0 if qn is None else qn.variance_epsilon, a.head_dim, a.scaling, n2.weight,
            n2.variance_epsilon, mlp.gate_proj.weight, mlp.gate_proj.bias, mlp.up_proj.weight,
            mlp.up_proj.bias, mlp.down_proj.weight, mlp.down_proj.bias, mlp.act_fn))
    return DecodeWeights(inner.embed_tokens.weight, inner.rotary_emb, layers, inner.norm.weight,
                         inner.norm.variance_epsilon, model.lm_head.weight, model.lm_head.bias)


# Rope types whose frequencies depend on the sequence length seen so far (transformers'
# `dynamic_rope_update`): their cos and sin cannot be tabulated ahead.
_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin [..., d] as [-sin_1, sin_2] (its first half negated): rotate_half(x) * sin ==
    roll(x, d/2) * [-sin_1, sin_2] exactly (a sign moved), so the step rotates q and k with one
    kernel instead of slices, a negation and a cat."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), -1)


def rotary_table(w: DecodeWeights, capacity: int) -> DecodeWeights:
    """`w` with the rotary module's cos and sin for positions 0 .. capacity-1 ([capacity, d]),
    computed once, so that a decode step looks its rows' positions up instead of calling the
    module (a dozen small operations per step). Bit-identical to the per-step call: every entry
    is the cos or sin of position * inv_freq, elementwise. Rope types whose frequencies depend
    on the length so far (dynamic NTK, LongRoPE) keep the per-step call (`w` unchanged)."""
    if any(kind in str(getattr(w.rotary, "rope_type", "default"))
           for kind in _LENGTH_DEPENDENT_ROPE):
        return w
    positions = torch.arange(capacity, device=w.embed.device)[None]  # [1, capacity]
    cos, sin = w.rotary(w.embed[:1], positions)  # [1, capacity, d] each, the embedding's dtype
    return w._replace(cos=cos[0], sin=_signed_sin(sin[0]))


def decode_step(
    w: DecodeWeights, cache, tokens: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """Logits of the next token after one new token per row, the model's forward written out.

    For each decoder layer (pre-norm residual blocks, Llama / Qwen):
        h <- h + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),  n = norm1(h)
        h <- h + down_proj(act(gate_proj(n)) * up_proj(n)),                         n = norm2(h)
    (Qwen3 normalises q and k per head before the rotary embedding), then logits =
    lm_head(norm(h)). The new keys and values are appended to `cache`'s preallocated layers.

    w: `prepare_decode`'s weights (`decode_weights(model)` calls the rotary module every step
    instead of reading its table); tokens [m] (the rows of the cache, in its order), positions
    [m] (their position ids), bias [m, L] (L = cached positions + 1: 0 attended, -inf not).
    Returns logits [m, V].
    """
    # Attention covers the positions written so far (views of the cache that grow by one).
    return _decode(w, tokens, positions, bias,
                   lambda i, k, v: cache.layers[i].append(k, v))


def static_decode_step(
    w: DecodeWeights, keys: list[torch.Tensor], values: list[torch.Tensor],
    tokens: torch.Tensor, positions: torch.Tensor, slot: torch.Tensor, bias: torch.Tensor,
) -> torch.Tensor:
    """`decode_step` with shapes that do not change from step to step, for `torch.compile`.

    The new keys and values are written at position `slot` of views of the cache that cover
    S positions, S from a short list of sizes (`attention_span`), and attention covers all S,
    the ones not yet written (and the prompts' padding) masked by -inf in `bias`: the same
    softmax as over the written positions alone, since exp(-inf) = 0. Only the row count m
    changes from step to step within a span (as rows finish), which the engine marks dynamic,
    so one compiled graph serves every step of a span.

    keys, values: per layer [m, G, S, d] (views of the first m rows and S positions of the
    preallocated buffers, written in place); tokens, positions [m]; slot [1] (int64, the
    position written, < S, the same for every row: the prompts are left-padded to one length);
    bias [m, S]. Returns logits [m, V].
    """

    def write(i: int, k: torch.Tensor, v: torch.Tensor):
        keys[i].index_copy_(2, slot, k[:, :, None])  # [m, G, S, d]
        values[i].index_copy_(2, slot, v[:, :, None])
        return keys[i], values[i]

    return _decode(w, tokens, positions, bias, write)


# Graphs the compiled step may keep (one per cache capacity, attention span and model shape);
# dynamo's own default, 8, is meant for one function of one model, not one graph per shape.
RECOMPILE_LIMIT = 64
_compiled: Callable | None = None


def attention_span(length: int) -> int:
    """The positions the compiled step attends over when `length` are written: the smallest of
    32, 48, 64, 96, 128, 192, ... (two sizes per doubling) that is at least `length`. Static
    sizes from a short list: a handful of compiled graphs serve every length, and attention
    covers at most 1.5x the written positions (the rest masked)."""
    span = 32
    while span < length:
        span *= 2
    three_quarters = span * 3 // 4
    return three_quarters if length <= three_quarters and three_quarters >= 32 else span


def compiled_decode_step(
    w: DecodeWeights, keys: list[torch.Tensor], values: list[torch.Tensor],
    tokens: torch.Tensor, positions: torch.Tensor, slot: torch.Tensor, bias: torch.Tensor,
) -> torch.Tensor:
    """`static_decode_step` under `torch.compile` (the same arguments and result).

    Built once per process; the row count m is marked dynamic (one graph for every m > 1:
    the engine runs a single row through the eager step, which dynamo would specialise), every
    other size is static: a graph per cache capacity, attention span (`attention_span`) and
    model shape. Static sizes are what makes it fast on a CPU: compiled with every size dynamic
    the step ran 2x slower than eager, with only the row count dynamic as fast as with none
    (docs/performance.md, "The compiled decode step"). Runs compiled even inside the HF
    engine's `set_stance("force_eager")`, which keeps the training layers that `train.compile`
    compiled eager during sampling.
    """
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(static_decode_step, fullgraph=True, dynamic=False)
    for x in (tokens, positions, bias, *keys, *values):
        torch._dynamo.maybe_mark_dynamic(x, 0)
    with (torch.compiler.set_stance("default"),
          torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT)):
        return _compiled(w, keys, values, tokens, positions, slot, bias)


def _decode(w: DecodeWeights, tokens: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor,
            write: Callable) -> torch.Tensor:
    """The written-out forward of one new token per row (`decode_step`); `write(layer, k, v)`
    stores the new keys and values [m, G, d] and returns the keys and values attention covers,
    [m, G, L, d] each."""
    h = F.embedding(tokens, w.embed)  # [m, D]
    m = h.shape[0]
    if w.cos is not None:  # the table of every cache position
        cos, sin = w.cos[positions][:, None], w.sin[positions][:, None]  # [m, 1, d] each
    else:
        cos, sin = w.rotary(h[:, None], positions[:, None])  # [m, 1, d] each
        sin = _signed_sin(sin)
    half = cos.shape[-1] // 2
    # Every layer has the same key/value heads and masks the same positions: the bias in the
    # attention's layout once per step, not once per layer.
    G = w.layers[0].k.shape[0] // w.layers[0].head_dim  # noqa: N806
    bias = grouped_bias(bias, G, h.dtype)  # [m*G, 1, L]
    for i, lw in enumerate(w.layers):
        n = rms_norm(h, lw.norm1, lw.eps1)  # [m, D]
        d = lw.head_dim
        q = F.linear(n, lw.q, lw.q_bias).view(m, -1, d)  # [m, H, d]
        k = F.linear(n, lw.k, lw.k_bias).view(m, -1, d)  # [m, G, d]
        v = F.linear(n, lw.v, lw.v_bias).view(m, -1, d)  # [m, G, d]
        if lw.q_norm is not None:  # Qwen3
            q = rms_norm(q, lw.q_norm, lw.qk_eps)
            k = rms_norm(k, lw.k_norm, lw.qk_eps)
        q = q * cos + q.roll(half, -1) * sin
        k = k * cos + k.roll(half, -1) * sin
        keys, values = write(i, k, v)  # [m, G, L, d] each, views of the cache
        o = single_query_attention(q, keys, values, bias, lw.scale)  # [m, H*d]
        h = h + F.linear(o, lw.o, lw.o_bias)
        n = rms_norm(h, lw.norm2, lw.eps2)
        gate = lw.act(F.linear(n, lw.gate, lw.gate_bias))  # [m, I]
        h = h + F.linear(gate * F.linear(n, lw.up, lw.up_bias), lw.down, lw.down_bias)
    h = rms_norm(h, w.norm, w.eps)
    return F.linear(h, w.head, w.head_bias)  # [m, V]
