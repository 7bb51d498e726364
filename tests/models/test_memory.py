"""The memory arithmetic of `primekit plan` against tensors measured on the tiny model (CPU).

Parameters, gradients, AdamW state and the KV cache must match the measured bytes exactly.
Saved activations are measured as the bytes of the distinct storages autograd saves during a
forward (`torch.autograd.graph.saved_tensors_hooks`, parameters excluded), which is what stays
alive between forward and backward: the estimate must be within ACTIVATION_TOLERANCE of it. The
activation peak of a whole forward and backward is measured from the CPU allocator's events
(`torch.profiler` with profile_memory): within PEAK_TOLERANCE.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from primekit.models import memory as mem
from primekit.models.logprobs import sequence_logprobs

# Measured worst case over the cases below: -0.18% (packed, bf16, checkpointing: the estimate
# misses a few small tensors, e.g. the [rows, seq] int64 attention mask copy).
ACTIVATION_TOLERANCE = 0.005
# The activation peak adds approximations (the backward's gradients) to the exact saved bytes;
# measured -3.0% .. +5.4% on the cases below.
PEAK_TOLERANCE = 0.10


def _qwen2(kv_heads: int = 4, tied: bool = True, layers: int = 4):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=259, hidden_size=128, intermediate_size=512,
                         num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=kv_heads, tie_word_embeddings=tied,
                         max_window_layers=layers, use_sliding_window=False)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def _case(layout: str) -> tuple[dict, tuple[int, int, int]]:
    """One micro-batch as sequence_logprobs' inputs, with the (rows, seq, scored) that the memory
    functions take for it. "padded": 4 rows of 40 prompt and 60 response tokens, one
    left-padded (4 x 60 = 240 scored). "packed": 12 sequences of 3-12 prompt and 1-20 response
    tokens packed into r rows of C columns, K scored."""
    if layout == "padded":
        rows, prompt, response = 4, 40, 60
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(3, 99, (rows, prompt + response), generator=generator)
        mask = torch.ones_like(ids)
        mask[0, :7] = 0  # left padding, as in every real batch
        return (dict(input_ids=ids, attention_mask=mask, response_len=response),
                (rows, prompt + response, rows * response))
    from primekit.rollout.base import RolloutBatch
    from primekit.rollout.batching import packed_micro_batch

    g = torch.Generator().manual_seed(0)
    p_len, t_len = torch.randint(3, 13, (12,), generator=g), torch.randint(1, 21, (12,), generator=g)
    ar = torch.arange(20)
    prompt_mask = (ar[:12] >= 12 - p_len[:, None]).long()  # [12, 12], left-padded
    response_mask = (ar < t_len[:, None]).long()  # [12, 20], right-padded
    batch = RolloutBatch(torch.randint(3, 99, (12, 12), generator=g) * prompt_mask, prompt_mask,
                         torch.randint(3, 99, (12, 20), generator=g) * response_mask,
                         response_mask, torch.zeros(12, 20), torch.ones(12, dtype=torch.bool),
                         [""] * 12)
    mb = packed_micro_batch(batch, torch.arange(12))
    r, C = mb.input_ids.shape
    K = int((mb.predict_index >= 0).sum())
    return (dict(input_ids=mb.input_ids, attention_mask=None, response_len=mb.response_len,
                 position_ids=mb.position_ids, predict_index=mb.predict_index), (r, C, K))


def _saved_bytes(model, inputs: dict, chunk_size: int) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one sequence_logprobs."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sequence_logprobs(model, **inputs, compute_entropy=True, chunk_size=chunk_size)
    return sum(seen.values())


def test_parameter_count_matches_the_models(tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2ForTokenClassification

    tiny = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    shape = mem.shape_from_hf_config(AutoConfig.from_pretrained(tiny_model_dir))
    assert mem.model_params(shape) == sum(p.numel() for p in tiny.parameters())
    # Grouped-query attention and an untied head exercise the other branches of the formula.
    gqa = _qwen2(kv_heads=2, tied=False)
    gqa_shape = mem.shape_from_hf_config(gqa.config)
    assert gqa_shape.kv_heads == 2 and not gqa_shape.tied_embeddings
    assert mem.model_params(gqa_shape) == sum(p.numel() for p in gqa.parameters())
    config = gqa.config
    config.num_labels = 1
    critic = Qwen2ForTokenClassification(config)
    assert mem.model_params(gqa_shape, "value") == sum(p.numel() for p in critic.parameters())
    # Qwen2-7B's published size, 7,615,616,512 parameters.
    assert mem.model_params(QWEN2_7B) == 7_615_616_512


def test_trained_and_frozen_state_bytes_equal_the_tensors(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(3, 99, (2, 12))
    lp, _ = sequence_logprobs(model, ids, torch.ones_like(ids), 5)
    lp.sum().backward()
    opt.step()
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    measured = {
        "params": sum(p.numel() * p.element_size() for p in params),
        "grads": sum(p.grad.numel() * p.grad.element_size() for p in params),
        # exp_avg and exp_avg_sq; the per-parameter `step` counter is a scalar, not counted.
        "optimizer": sum(v.numel() * v.element_size() for state in opt.state.values()
                         for k, v in state.items() if k != "step"),
    }
    assert mem.trained_state_bytes(n, world=1) == measured
    assert mem.trained_state_bytes(n, world=4)["optimizer"] == measured["optimizer"] / 4
    frozen = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    assert mem.frozen_state_bytes(n, 2, world=1) == sum(
        p.numel() * p.element_size() for p in frozen.parameters())


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("chunk", [512, 16])  # one chunk (logits saved) / several (recomputed)
def test_saved_activations_match_the_estimate(dtype, checkpointing, chunk, layout):
    model = _qwen2(kv_heads=2).to(getattr(torch, dtype)).train()
    if checkpointing:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecated alias's warning
            model.gradient_checkpointing_enable()
    inputs, (rows, seq, scored) = _case(layout)
    measured = _saved_bytes(model, inputs, chunk)
    estimate = mem.saved_activation_bytes(
        mem.shape_from_hf_config(model.config), rows, seq, scored, mem.DTYPE_BYTES[dtype],
        checkpointing=checkpointing, entropy=True, chunk=chunk)
    assert abs(estimate - measured) / measured < ACTIVATION_TOLERANCE, (estimate, measured)


def _allocator_peak(model, inputs: dict, chunk_size: int) -> int:
    """Peak bytes the CPU allocator holds above its starting level during one forward and
    backward of sequence_logprobs, from the profiler's allocation and free events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        lp, ent = sequence_logprobs(model, **inputs, compute_entropy=True, chunk_size=chunk_size)
        (lp.sum() + ent.sum()).backward()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()  # negative for a free
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("chunk", [512, 16])
def test_activation_peak_brackets_the_allocator_peak(dtype, checkpointing, chunk, layout):
    """activation_peak_bytes (saved + the larger backward moment) against the allocator's peak.

    The parameter gradients are allocated before measuring (as FSDP2's sharded gradients are),
    so the peak is activations and the backward's transients only. Measured: padded -2.8% ..
    +5.4%, packed -3.0% .. +5.1%.
    """
    model = _qwen2(kv_heads=2).to(getattr(torch, dtype)).train()
    if checkpointing:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable()
    inputs, (rows, seq, scored) = _case(layout)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    # The larger of two measurements: once, in a full-suite run on a loaded machine, the
    # profiler reported 3.4 MB for the 8.3 MB this case measures every time alone (not reproduced
    # since, under load or in suite order); the larger reading guards against that low one.
    measured = max(_allocator_peak(model, inputs, chunk) for _ in range(2))
    estimate = mem.activation_peak_bytes(
        mem.shape_from_hf_config(model.config), rows, seq, scored, mem.DTYPE_BYTES[dtype],
        checkpointing=checkpointing, entropy=True, chunk=chunk)
    assert -PEAK_TOLERANCE < (estimate - measured) / measured < PEAK_TOLERANCE, (estimate, measured)


def test_kv_cache_bytes_equal_the_cache():
    from transformers import DynamicCache

    model = _qwen2(kv_heads=2).to(torch.bfloat16).eval()
    rows, seq = 3, 17
    cache = DynamicCache(config=model.config)
    # transformers 5.x renamed `past_key_values` to `cache`.
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else (
        "past_key_values")
    with torch.no_grad():
        model(input_ids=torch.randint(3, 99, (rows, seq)), use_cache=True, **{kwarg: cache})
    measured = sum(t.numel() * t.element_size() for layer in cache.layers
                   for t in (layer.keys, layer.values))
    assert mem.kv_cache_bytes(mem.shape_from_hf_config(model.config), rows, seq, 2) == measured


QWEN2_7B = mem.ModelShape(vocab=152064, hidden=3584, intermediate=18944, layers=28, heads=28,
                          kv_heads=4, head_dim=128, tied_embeddings=False, qkv_bias=True)


def test_qwen2_7b_layer_arithmetic_by_hand():
    # layer: q 3584*3584 + 3584, k and v 3584*512 + 512 each, o 3584*3584, MLP 3*3584*18944,
    # norms 2*3584 = 12,848,640 + 3,671,040 + 12,845,056 + 203,685,888 + 7,168 = 233,057,792
    assert mem.layer_params(QWEN2_7B) == 233_057_792
    # root: embedding and head 152064*3584 each, final norm 3584
    assert mem.root_params(QWEN2_7B) == 1_089_998_336
    # KV cache: 2 * 28 layers * 4 kv heads * 128 * 2 bytes = 57,344 bytes per token
    assert mem.kv_cache_bytes(QWEN2_7B, 1, 1, 2) == 57_344
    # One layer's activations per token in bf16: norms 2*(4+4)*3584 = 57,344; attention
    # 4*2*28*128 = 28,672 plus lse 4*28 = 112; MLP 4*2*18944 = 151,552; 1/rms 8 -> 237,688;
    # plus the bf16 mask 1 * 10^2 * 2 = 200 for one row of 10 tokens.
    assert mem.layer_activation_bytes(QWEN2_7B, 1, 10, 2) == 10 * 237_688 + 200
