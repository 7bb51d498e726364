"""Per-GPU memory of a run, from the model's dimensions: the arithmetic behind `primekit plan`.

Pure functions of integers; nothing here touches a tensor. Notation: V vocabulary, h hidden size,
i MLP intermediate size, L decoder layers, a attention heads, g key/value heads, d head dim,
W world size (GPUs), b rows in a micro-batch, s = p + T tokens per row (prompt + response),
c_b bytes of the compute dtype (model.dtype: 4 for float32, 2 for bfloat16/float16).

The memory model is the FSDP2 one of docs/scale_out.md ("Memory plan"): every model is sharded
with `fully_shard` per decoder layer, then the root (embeddings, final norm, output head); trained
models keep fp32 master weights, fp32 gradients and fp32 AdamW moments, sharded 1/W; frozen models
keep their weights in the compute dtype, sharded 1/W; during a forward/backward the running
model's root and up to two layers are all-gathered in the compute dtype.

Activations: what autograd saves for one Hugging Face Qwen2/Llama-style decoder layer with the
"sdpa" attention of transformers and a padded batch, counted from the layer's code and checked
tensor by tensor against `torch.autograd.graph.saved_tensors_hooks` on the tiny model
(tests/models/test_memory.py). It is Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models", arXiv 2205.05198, Sec. 4.1, sbh(34 + 5as/h) bytes per layer for a
GPT layer in 16 bits) adapted to this layer: RMSNorm instead of LayerNorm (it saves an fp32 copy
of its input), no dropout masks, a SwiGLU MLP of width i instead of a GeLU MLP of width 4h, and
fused attention that keeps no [a, s, s] probabilities but does keep a [b, 1, s, s] mask.
The backward adds the larger of two moments (`backward_moments`): the output head's logits of
one chunk, or one layer's gradients (and, under checkpointing, its recomputed activations); that
peak is checked against the CPU allocator's peak on the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
FP32 = 4  # master weights, gradients, AdamW moments, log-prob logits
ADAM_MOMENTS = 2  # AdamW keeps exp_avg and exp_avg_sq per parameter
GIB = 2**30


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only causal LM that memory depends on."""

    vocab: int  # V
    hidden: int  # h
    intermediate: int  # i
    layers: int  # L
    heads: int  # a
    kv_heads: int  # g
    head_dim: int  # d
    tied_embeddings: bool  # output head shares the input embedding
    qkv_bias: bool  # q/k/v projections have a bias (Qwen2: yes; Llama: attention_bias)
    mlp_bias: bool = False
    context: int | None = None  # the longest sequence it takes (max_position_embeddings), if said


def shape_from_hf_config(config: Any) -> ModelShape:
    """A ModelShape from a transformers `PretrainedConfig` of a Llama/Qwen2-style model."""
    get = getattr
    heads = config.num_attention_heads
    head_dim = get(config, "head_dim", None) or config.hidden_size // heads
    model_type = get(config, "model_type", "")
    return ModelShape(
        vocab=config.vocab_size,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        layers=config.num_hidden_layers,
        heads=heads,
        kv_heads=get(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        tied_embeddings=bool(get(config, "tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(get(config, "attention_bias", False)),
        mlp_bias=bool(get(config, "mlp_bias", False)),
        context=get(config, "max_position_embeddings", None) or get(config, "n_positions", None),
    )


# ---------------------------------------------------------------- parameters
def layer_params(s: ModelShape) -> int:
    """Parameters of one decoder layer.

    q: h*a*d (+a*d bias), k and v: h*g*d each (+g*d bias each), o: a*d*h; MLP gate, up, down:
    3*h*i (+2i + h biases); two RMSNorm weights: 2h.
    """
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attn = s.hidden * (q + 2 * kv) + q * s.hidden + (q + 2 * kv if s.qkv_bias else 0)
    mlp = 3 * s.hidden * s.intermediate + (2 * s.intermediate + s.hidden if s.mlp_bias else 0)
    return attn + mlp + 2 * s.hidden


def root_params(s: ModelShape, head: str = "lm") -> int:
    """Parameters outside the decoder layers, which FSDP2's root unit holds.

    Embedding V*h, final norm h, and the head: lm: V*h unless tied to the embedding; value
    (the critic, a *ForTokenClassification with one label): h + 1 (weight and bias).
    """
    out = (0 if s.tied_embeddings else s.vocab * s.hidden) if head == "lm" else s.hidden + 1
    return s.vocab * s.hidden + s.hidden + out


def model_params(s: ModelShape, head: str = "lm") -> int:
    """All parameters: L * layer_params + root_params (Qwen2-7B: 7,615,616,512)."""
    return s.layers * layer_params(s) + root_params(s, head)


# ---------------------------------------------------------------- model states
def trained_state_bytes(params: int, world: int) -> dict[str, float]:
    """Per-GPU bytes of a trained model's sharded states: fp32 master weights 4P/W, fp32
    gradients 4P/W, fp32 AdamW moments 2*4P/W. (FSDP2 pads each tensor's dim 0 to a multiple of
    W, at most W-1 rows per tensor: ignored.)"""
    return {"params": FP32 * params / world, "grads": FP32 * params / world,
            "optimizer": ADAM_MOMENTS * FP32 * params / world}


def frozen_state_bytes(params: int, compute_bytes: int, world: int) -> float:
    """Per-GPU bytes of a forward-only model sharded in the compute dtype: c_b * P / W."""
    return compute_bytes * params / world


def gathered_bytes(s: ModelShape, compute_bytes: int, trained: bool, head: str = "lm") -> float:
    """FSDP2's all-gather working set while one model runs, on every GPU.

    The root stays unsharded from forward through backward (FSDP2 does not reshard the root after
    forward) and two layers are unsharded at a time with prefetch: (root + 2 layers) * c_b. A
    trained model adds the unsharded gradients of the root and of one layer in fp32 (reduced in
    fp32): (root + layer) * 4.
    """
    gathered = (root_params(s, head) + 2 * layer_params(s)) * compute_bytes
    if trained:
        gathered += (root_params(s, head) + layer_params(s)) * FP32
    return gathered


# ---------------------------------------------------------------- activations
def layer_activation_bytes(s: ModelShape, rows: int, seq: int, compute_bytes: int) -> int:
    """Bytes autograd saves in one decoder layer's forward (HF sdpa attention, padded batch).

    Per token (n = rows * seq tokens):
      two RMSNorms, each: an fp32 copy of the input 4h, the normalised c_b*h, the output c_b*h
      attention: q, k, v, output, c_b*a*d each (k and v are repeated to a heads: transformers'
          sdpa path calls repeat_kv whenever a padding mask is present), the o_proj input being a
          view of the output; plus the fp32 log-sum-exp 4a
      MLP: gate, silu(gate), up, silu(gate)*up: 4*c_b*i
      the RMSNorms' 1/rms: 2 * 4
    and per row the attention mask, converted to the compute dtype in every layer: c_b * s^2.
    bytes = n * (2(4 + 2c_b)h + 4c_b*a*d + 4a + 4c_b*i + 8) + rows * seq^2 * c_b
    """
    h, q = s.hidden, s.heads * s.head_dim
    per_token = (2 * (FP32 + 2 * compute_bytes) * h + 4 * compute_bytes * q + FP32 * s.heads
                 + 4 * compute_bytes * s.intermediate + 2 * FP32)
    return rows * seq * per_token + rows * seq * seq * compute_bytes


def saved_activation_bytes(s: ModelShape, rows: int, seq: int, scored: int, compute_bytes: int,
                           *, checkpointing: bool, entropy: bool, chunk: int,
                           head: str = "lm") -> int:
    """Bytes autograd keeps after the forward of `primekit.models.logprobs.sequence_logprobs`
    (rows x seq columns, of which `scored` tokens in all are scored), before the backward starts.

    The layers see rows x seq columns (n = rows*seq; packed micro-batches are rows of their
    packed width, `primekit.plan.pass_shape`); the output head sees only the K = `scored` valid
    response tokens, gathered into one row and cut into chunks of `chunk` tokens.

    layers: L * layer_activation_bytes, or with activation checkpointing per layer only each
        layer's input, L * n * c_b * h
    rotary cos and sin (not under checkpointing): 2 * n * c_b * d
    final RMSNorm: n * (4h + c_b*h + 4)
    head: the gathered hidden states K*c_b*h (the lm_head input, or the checkpointed chunks'),
        and with one chunk (K <= chunk) the fp32 logits K*V*4 (twice with entropy: softmax)
    integer ids (positions, targets, gather index) and the fp32 logsumexp: n*8 + K*(8+4)
    With head="value" (the critic's one-label head, over every column) the head keeps only its
    input, n*c_b*h.
    """
    n, k, h = rows * seq, scored, s.hidden
    if checkpointing:
        total = s.layers * n * compute_bytes * h
    else:
        total = s.layers * layer_activation_bytes(s, rows, seq, compute_bytes)
        total += 2 * n * compute_bytes * s.head_dim
    total += n * (FP32 * h + compute_bytes * h + FP32)
    if head == "value":
        return total + n * compute_bytes * h + n * 8
    total += k * compute_bytes * h
    if k <= chunk:
        total += k * s.vocab * FP32 * (2 if entropy else 1)
    return total + n * 8 + k * (8 + FP32)


def layer_backward_bytes(s: ModelShape, rows: int, seq: int, compute_bytes: int) -> int:
    """Gradients alive inside one layer's backward, approximately n * c_b * (h + 2i): the gradient
    of the residual stream and, in the MLP's backward (its widest point), the gradient of the
    product silu(gate)*up and of one of its factors at a time. An approximation read off the
    MLP's backward, not a count; the whole activation peak is checked against the CPU
    allocator's peak on the tiny model (tests/models/test_memory.py)."""
    return rows * seq * compute_bytes * (s.hidden + 2 * s.intermediate)


def head_saved_bytes(s: ModelShape, scored: int, compute_bytes: int, *,
                     entropy: bool, chunk: int, head: str = "lm") -> int:
    """The part of `saved_activation_bytes` that the output head's backward frees before the
    layers' backward starts: with one chunk, the lm_head input and the fp32 logits (and
    softmax); with more chunks (checkpointed) or a value head, nothing worth counting."""
    if head != "lm" or scored > chunk:
        return 0
    return scored * compute_bytes * s.hidden + scored * s.vocab * FP32 * (2 if entropy else 1)


def logits_backward_bytes(s: ModelShape, scored: int, compute_bytes: int, *,
                          entropy: bool, chunk: int) -> int:
    """The output head's extra memory in the backward, over one chunk of c = min(K, chunk) of
    the K = `scored` tokens (counted from sequence_logprobs).

    The gradient of the logits in fp32 and in the compute dtype: c*V*(4 + c_b); with more than
    one chunk the chunk is recomputed first, adding its fp32 logits (and softmax with entropy):
    c*V*4 (*2). The logits [c, V] are the largest tensors of a step: for V = 152064 and c = 512
    one fp32 copy is 0.3 GB (unchunked, 8 responses of 3072 tokens would be 15 GB).
    """
    c = min(scored, chunk)
    extra = c * s.vocab * (FP32 + compute_bytes)
    if scored > chunk:
        extra += c * s.vocab * FP32 * (2 if entropy else 1)
    return extra


def backward_moments(s: ModelShape, rows: int, seq: int, scored: int, compute_bytes: int, *,
                     checkpointing: bool, entropy: bool, chunk: int,
                     head: str = "lm") -> dict[str, int]:
    """Memory on top of the saved activations at the two high points of the backward.

    "logits": first, the output head's backward (logits_backward_bytes; 0 for a value head).
    "layer": then each layer's backward: its gradients (layer_backward_bytes) and, under
    checkpointing, its recomputed activations, less what the head's backward has freed.
    The activation peak is the saved activations plus the larger of the two.
    """
    layer = layer_backward_bytes(s, rows, seq, compute_bytes)
    if checkpointing:
        layer += layer_activation_bytes(s, rows, seq, compute_bytes)
    layer -= head_saved_bytes(s, scored, compute_bytes, entropy=entropy, chunk=chunk, head=head)
    logits = (logits_backward_bytes(s, scored, compute_bytes, entropy=entropy, chunk=chunk)
              if head == "lm" else 0)
    return {"logits": logits, "layer": max(layer, 0)}


def activation_peak_bytes(s: ModelShape, rows: int, seq: int, scored: int, compute_bytes: int,
                          *, checkpointing: bool, entropy: bool, chunk: int,
                          head: str = "lm") -> int:
    """Activation memory at its peak: saved activations + the larger backward moment."""
    kw = dict(checkpointing=checkpointing, entropy=entropy, chunk=chunk, head=head)
    saved = saved_activation_bytes(s, rows, seq, scored, compute_bytes, **kw)
    return saved + max(backward_moments(s, rows, seq, scored, compute_bytes, **kw).values())


def forward_working_bytes(s: ModelShape, rows: int, seq: int, compute_bytes: int) -> int:
    """No-grad forward of `rows` x `seq` tokens: the largest live set inside one layer, the MLP
    (residual, normalised input, silu(gate), up, their product): n * c_b * (2h + 3i), plus the
    attention mask rows * seq^2 * c_b. Used for rollout prefill and reference/PRM scoring."""
    n = rows * seq
    mask = rows * seq * seq * compute_bytes
    return n * compute_bytes * (2 * s.hidden + 3 * s.intermediate) + mask


def kv_cache_bytes(s: ModelShape, rows: int, seq: int, compute_bytes: int) -> int:
    """Key/value cache of `rows` sequences of `seq` tokens: 2 (k, v) * L * g * d * c_b * rows * seq
    (Qwen2-7B, bf16: 57,344 bytes per token)."""
    return 2 * s.layers * s.kv_heads * s.head_dim * compute_bytes * rows * seq
