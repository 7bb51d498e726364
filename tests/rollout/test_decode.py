"""The written-out decode step (rollout/decode.py) against each model's own forward."""

from __future__ import annotations

import inspect

import pytest
import torch

from primekit.rollout.base import SamplingParams
from primekit.rollout.decode import decode_blocker, single_query_attention
from primekit.rollout.hf import HFRolloutEngine

# Prompts of different lengths (left padding) over a 40-token vocabulary.
PROMPTS = [[5, 9, 11], [7], [12, 3, 30, 22, 8, 6], [4, 4], [31, 17, 2, 9]]


class _Tokenizer:
    """The little of a tokenizer the engine uses: pad/eos ids and batch_decode."""

    pad_token_id, eos_token_id = 0, 1

    def batch_decode(self, rows, **kwargs):
        return [" ".join(map(str, r)) for r in rows]


def _tiny(model_type: str, dtype=torch.float64, **overrides):
    """A random 2-layer model of `model_type` with grouped-query attention (4 query heads over
    2 key/value heads), in `dtype`."""
    import transformers

    config_class = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                    "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}
    config = config_class[model_type](
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=0, eos_token_id=1, bos_token_id=1, **overrides)
    if model_type == "mistral":
        config.sliding_window = None
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(dtype)
    # Larger weights than the init's 0.02 spread, so that attention and the MLP matter.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return model.eval()


def _both(model, params, generator_seed, eos=(1,), decodes=("auto", "model")):
    """The same prompts through two decode paths (`decodes`) from one generator seed."""
    out = {}
    for decode in decodes:
        engine = HFRolloutEngine(model, _Tokenizer(), decode=decode, eos_token_ids=list(eos))
        out[decode] = engine.generate(PROMPTS, params, torch.Generator().manual_seed(generator_seed))
        out[decode + "_path"] = engine.decode_path
    return out


def _prefilled(model, capacity: int):
    """PROMPTS left-padded through the model's forward into two preallocated caches of
    `capacity` positions: (caches, mask [n, P], positions [n, P], last logits [n, V])."""
    from primekit.rollout.hf import preallocated_cache

    P = max(map(len, PROMPTS))
    device = next(model.parameters()).device
    ids = torch.tensor([[0] * (P - len(p)) + p for p in PROMPTS], device=device)  # [n, P]
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in PROMPTS],
                        device=device)  # [n, P]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    caches = [preallocated_cache(model.config, capacity) for _ in range(2)]
    # transformers 5.x renamed `past_key_values` to `cache`.
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else (
        "past_key_values")
    with torch.no_grad():
        for cache in caches:
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                           use_cache=True, logits_to_keep=1, **{kwarg: cache}).logits[:, -1]
    return caches, mask, positions, logits


def _step_logits(model, steps: int = 6):
    """Logits of `steps` decode steps after a left-padded prefill, through the model's forward
    and through `decode_step`, each over its own preallocated cache, fed the same tokens (the
    model path's argmax): ([steps, n, V], [steps, n, V])."""
    from primekit.rollout.decode import decode_step, decode_weights, rotary_table

    n, P = len(PROMPTS), max(map(len, PROMPTS))
    device = next(model.parameters()).device
    caches, mask, positions, logits = _prefilled(model, P + steps)
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else (
        "past_key_values")
    with torch.no_grad():
        attn = torch.cat([mask, mask.new_ones(n, steps)], 1).bool()  # [n, P+steps]
        bias = torch.zeros(attn.shape, dtype=model.dtype, device=device).masked_fill(
            ~attn, float("-inf"))
        pos, out = positions[:, -1] + 1, ([], [])
        for t in range(steps):
            tokens = logits.argmax(-1)  # [n]
            logits = model(input_ids=tokens[:, None], attention_mask=attn[:, None, None, :P + t + 1],
                           position_ids=pos[:, None], use_cache=True,
                           **{kwarg: caches[0]}).logits[:, -1]
            # The rotary table as `prepare_decode` builds it (the per-step call where the
            # rope type forbids one).
            written = decode_step(rotary_table(decode_weights(model), P + steps), caches[1],
                                  tokens, pos, bias[:, :P + t + 1])
            out[0].append(logits)
            out[1].append(written)
            pos = pos + 1
    return torch.stack(out[0]), torch.stack(out[1])


# Llama with biases everywhere, and with Llama 3's rope scaling (the step takes cos and sin from
# the model's own rotary module, whatever its rope type).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
# Dynamic NTK scaling: frequencies that change with the length seen, so no table.
DYNAMIC_ROPE = {"rope_type": "dynamic", "factor": 2.0}
CASES = [("llama", {}), ("llama", {"attention_bias": True, "mlp_bias": True}),
         ("llama", {"rope_scaling": LLAMA3_ROPE}), ("llama", {"rope_scaling": DYNAMIC_ROPE}),
         ("mistral", {}), ("qwen2", {}), ("qwen3", {})]


@pytest.mark.parametrize(("model_type", "overrides"), CASES)
def test_written_out_step_equals_the_model_forward_float64(model_type, overrides):
    # float64: the two paths differ only in summation order, so the logits of every step agree
    # to 1e-12 (they are O(1-10)) ...
    model = _tiny(model_type, **overrides)
    reference, written = _step_logits(model)
    assert reference.abs().max() > 1  # logits that say something
    torch.testing.assert_close(written, reference, rtol=0, atol=1e-12)
    # ... and the engine samples the same tokens from one generator seed either way, with the
    # same log-probs (stored in float32). Tokens 1 and 2 end a row, so rows finish at different
    # steps and leave the cache on the way.
    for temperature in (0.0, 1.0):
        out = _both(model, SamplingParams(temperature=temperature, max_new_tokens=12), 3,
                    eos=(1, 2))
        assert out["auto_path"] == "written-out"
        assert out["model_path"] == "model forward (decode=model)"
        assert torch.equal(out["auto"].response_ids, out["model"].response_ids)
        assert torch.equal(out["auto"].response_mask, out["model"].response_mask)
        torch.testing.assert_close(out["auto"].sampling_logprobs, out["model"].sampling_logprobs,
                                   rtol=0, atol=1e-6)
    # Some rows ended early and some ran to the end: the row removal was exercised.
    lengths = out["auto"].response_mask.sum(1)
    assert lengths.min() < 12 and lengths.max() == 12


def test_written_out_step_float32_agrees_to_rounding():
    model = _tiny("qwen2", dtype=torch.float32)
    out = _both(model, SamplingParams(temperature=1.0, max_new_tokens=16), 5)
    assert torch.equal(out["auto"].response_ids, out["model"].response_ids)
    torch.testing.assert_close(out["auto"].sampling_logprobs, out["model"].sampling_logprobs,
                               rtol=0, atol=1e-5)


def test_attention_span_is_the_next_of_two_sizes_per_doubling():
    from primekit.rollout.decode import attention_span

    # 32, then per doubling 3/4 of the next power of two and that power: 48, 64, 96, 128, ...
    cases = {1: 32, 31: 32, 32: 32, 33: 48, 48: 48, 49: 64, 64: 64, 65: 96, 96: 96, 97: 128,
             129: 192, 193: 256, 1000: 1024, 1025: 1536, 1537: 2048}
    assert {n: attention_span(n) for n in cases} == cases


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_static_step_equals_the_written_out_step_float64(model_type):
    # The compiled path's step, run eager: keys and values written at a slot of views that span
    # more positions than are written, the rest masked, against `decode_step` over the
    # written positions alone. float64: the same logits to 1e-12 at every step, across the
    # spans 32 -> 48 (P = 6 prompt positions + 36 steps), and the same cache.
    from primekit.rollout.decode import (
        attention_span,
        decode_step,
        prepare_decode,
        static_decode_step,
    )
    model = _tiny(model_type)
    n, P, steps = len(PROMPTS), max(map(len, PROMPTS)), 36
    capacity = attention_span(P + steps)
    assert capacity == 48
    caches, mask, positions, logits = _prefilled(model, capacity)
    bias = torch.full((n, capacity), float("-inf"), dtype=torch.float64)
    bias[:, :P].masked_fill_(mask.bool(), 0.0)
    with torch.no_grad():
        w = prepare_decode(model, caches[0])[0]
        pos, spans = positions[:, -1] + 1, set()
        for t in range(steps):
            tokens = logits.argmax(-1)  # [n]
            bias[:, P + t] = 0.0
            logits = decode_step(w, caches[0], tokens, pos, bias[:, :P + t + 1])
            span = attention_span(P + t + 1)
            spans.add(span)
            static = static_decode_step(
                w, [layer.key_buffer[:, :, :span] for layer in caches[1].layers],
                [layer.value_buffer[:, :, :span] for layer in caches[1].layers], tokens, pos,
                torch.tensor([P + t]), bias[:, :span])
            torch.testing.assert_close(static, logits, rtol=0, atol=1e-12)
            pos = pos + 1
    assert spans == {32, 48}
    for a, b in zip(caches[0].layers, caches[1].layers):
        torch.testing.assert_close(b.key_buffer, a.key_buffer, rtol=0, atol=1e-12)
        torch.testing.assert_close(b.value_buffer, a.value_buffer, rtol=0, atol=1e-12)


@pytest.mark.slow  # compiles: about 25 s with an empty cache, most of it torch.compile's start
def test_compiled_engine_samples_what_the_eager_engine_samples():
    # rollout.hf_decode=compiled against auto, float64, one generator seed: the same tokens
    # and masks, log-probs to 1e-5 (the norms run in float32, as the models' own, and the
    # compiled kernels round them in another order), while rows finish at different steps
    # (tokens 1 and 2 end a row). One span of 32 positions (6 prompt positions + 25 fed back),
    # so one graph compiled; the static step across spans is checked eager above.
    model = _tiny("qwen2")
    params = SamplingParams(temperature=1.0, max_new_tokens=26)
    out = _both(model, params, 14, eos=(1, 2), decodes=("auto", "compiled"))
    assert out["compiled_path"] == "written-out, compiled"
    assert torch.equal(out["compiled"].response_ids, out["auto"].response_ids)
    assert torch.equal(out["compiled"].response_mask, out["auto"].response_mask)
    torch.testing.assert_close(out["compiled"].sampling_logprobs, out["auto"].sampling_logprobs,
                               rtol=0, atol=1e-5)
    # Rows of 2, 2, 12, 20 and 26 tokens: rows leave the compiled steps' batch as they finish,
    # and the last row runs its final 6 steps alone (through the eager step).
    assert sorted(out["auto"].response_mask.sum(1).tolist()) == [2, 2, 12, 20, 26]


def test_compiled_decode_without_a_cxx_compiler_is_refused_at_construction(monkeypatch):
    import torch._inductor.cpp_builder as cpp_builder

    def no_compiler():
        raise RuntimeError("No working C++ compiler found in torch._inductor.config.cpp.cxx")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    with pytest.raises(ValueError, match=r"rollout.hf_decode=compiled needs a C\+\+ compiler .*"
                                         r"No working.*or turn it off"):
        HFRolloutEngine(_tiny("qwen2"), _Tokenizer(), decode="compiled")


def test_single_query_attention_equals_a_loop_over_heads():
    # Grouped-query attention: 6 query heads over 2 key/value heads (query head h reads
    # key/value head h // 3), positions masked per row by -inf in the bias.
    torch.manual_seed(1)
    m, H, G, L, d = 3, 6, 2, 5, 4
    q, keys, values = torch.randn(m, H, d), torch.randn(m, G, L, d), torch.randn(m, G, L, d)
    bias = torch.zeros(m, L)
    bias[0, :2] = float("-inf")  # row 0 is left-padded by 2
    bias[2, 3] = float("-inf")
    out = single_query_attention(q, keys, values, bias, scale=0.5)  # [m, H*d]
    expected = torch.zeros(m, H, d)
    for i in range(m):
        for h in range(H):
            g = h // 3
            scores = [0.5 * float(q[i, h] @ keys[i, g, j]) + float(bias[i, j]) for j in range(L)]
            w = torch.tensor(scores).softmax(0)
            expected[i, h] = sum(w[j] * values[i, g, j] for j in range(L))
    torch.testing.assert_close(out, expected.reshape(m, H * d), rtol=0, atol=1e-6)


def test_blockers_fall_back_to_the_model_forward():
    from primekit.rollout.hf import preallocated_cache

    model = _tiny("qwen2")
    cache = preallocated_cache(model.config, 8)
    assert decode_blocker(model, cache) is None
    # A forward hook (offloading, adapters, FSDP) would be bypassed: not written out.
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *a: None)
    assert "hooks on model.layers.1.mlp" in decode_blocker(model, cache)
    out = _both(model, SamplingParams(temperature=0.0, max_new_tokens=4), 0)
    assert out["auto_path"].startswith("model forward (hooks on")
    handle.remove()
    # A projection of another kind than nn.Linear: a subclass (bitsandbytes' Linear4bit is one)
    # or a wrapper that holds the plain Linear inside and adds to its output (peft's LoRA).
    class Subclass(torch.nn.Linear):
        pass

    class LoRA(torch.nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base_layer, self.weight, self.bias = base, base.weight, base.bias

    attn = model.model.layers[0].self_attn
    proj = attn.q_proj
    attn.q_proj = Subclass(proj.in_features, proj.out_features)
    assert decode_blocker(model, cache) == (
        "model.layers.0.self_attn.q_proj is a Subclass, not a plain Linear")
    attn.q_proj = LoRA(proj)
    assert decode_blocker(model, cache) == (
        "model.layers.0.self_attn.q_proj is a LoRA, not a plain Linear")
    attn.q_proj = proj
    assert decode_blocker(model, cache) is None
    # Sliding-window attention: transformers' own cache layers, the model's forward.
    sliding = _tiny("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    out = _both(sliding, SamplingParams(temperature=0.0, max_new_tokens=6), 0)
    assert out["auto_path"].startswith("model forward (")
    assert torch.equal(out["auto"].response_ids, out["model"].response_ids)
    # Mistral's own default: a 4096-position sliding window, even where it would not bind.
    mistral = _tiny("mistral")
    mistral.config.sliding_window = 4096
    assert decode_blocker(mistral, preallocated_cache(mistral.config, 8)) is not None
    with pytest.raises(ValueError, match="decode must be"):
        HFRolloutEngine(model, _Tokenizer(), decode="fast")


def test_unsupported_architecture_is_named():
    import transformers

    config = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2,
                                     n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    assert "model type 'gpt2'" in decode_blocker(model, None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_written_out_step_on_cuda(dtype):
    _compare_on("cuda", dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_step_on_cuda(dtype):
    # rollout.hf_decode=compiled on a GPU (Triton kernels): greedy rows of different lengths,
    # the same tokens as the eager written-out step in float32, and in bfloat16 the first
    # tokens (later ones may part where two logits round alike).
    model = _tiny("qwen2", dtype=dtype).to("cuda")
    params = SamplingParams(temperature=0.0, max_new_tokens=20)
    out = _both(model, params, 0, eos=(1, 2), decodes=("auto", "compiled"))
    assert out["compiled_path"] == "written-out, compiled"
    got, want = out["compiled"].response_ids, out["auto"].response_ids
    assert torch.equal(got if dtype == torch.float32 else got[:, :2],
                       want if dtype == torch.float32 else want[:, :2])


def _compare_on(device: str, dtype: torch.dtype) -> None:
    """The comparison on `device` in `dtype` (bf16: what a user's sampler copy runs in): logits
    within the dtype's rounding of the model forward's, relative to their scale, over 6 steps."""
    model = _tiny("qwen2", dtype=dtype).to(device)
    reference, written = _step_logits(model)
    assert written.device.type == device and written.dtype == dtype
    scale = reference.float().abs().max()
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 5e-2}[dtype] * scale
    assert (written.float() - reference.float()).abs().max() <= tolerance
    out = _both(model, SamplingParams(temperature=0.0, max_new_tokens=8), 0)
    assert out["auto_path"] == "written-out"
    if dtype == torch.float32:
        assert torch.equal(out["auto"].response_ids, out["model"].response_ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sampling_on_cuda_reads_the_device_once_per_step():
    # Every host read of a device value (a boolean mask's index, `bool(t.any())`, a copy from
    # ordinary host memory) stops the host until the device has caught up; in a decode loop
    # bound by kernel launches that idles the device once per read. The loop reads one value per
    # step (how many rows are still live). Counted with torch's sync debug mode as the
    # difference between 24 and 8 forced steps (EOS never drawn), so the reads before and after
    # the loop cancel: at most one per step.
    import warnings

    model = _tiny("qwen2", dtype=torch.float32).to("cuda")
    engine = HFRolloutEngine(model, _Tokenizer(), eos_token_ids=[10**6])

    def syncs(steps: int) -> int:
        params = SamplingParams(temperature=1.0, max_new_tokens=steps)
        engine.generate(PROMPTS, params, torch.Generator().manual_seed(0))  # warm (allocators)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                engine.generate(PROMPTS, params, torch.Generator().manual_seed(1))
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    few, many = syncs(8), syncs(24)
    assert engine.decode_path == "written-out"
    assert many - few <= 24 - 8, (few, many)


@pytest.mark.parametrize(("model_type", "overrides"), CASES)
def test_rotary_table_is_the_rotary_module_bit_for_bit(model_type, overrides):
    # The table holds, for each position p < capacity, exactly what the module returns for p
    # (cos, and sin with its first half negated); dynamic NTK gets no table.
    from primekit.rollout.decode import _signed_sin, decode_weights, rotary_table

    model = _tiny(model_type, dtype=torch.float32, **overrides)
    w = rotary_table(decode_weights(model), 40)
    if overrides.get("rope_scaling") is DYNAMIC_ROPE:
        assert w.cos is None and w.sin is None
        return
    assert w.cos.shape == w.sin.shape == (40, model.model.layers[0].self_attn.head_dim)
    positions = torch.tensor([[0, 7, 39, 3]])  # any positions, any order
    h = w.embed[:4][None]  # [1, 4, D]: the module reads only its dtype and device
    cos, sin = w.rotary(h, positions)
    assert torch.equal(w.cos[positions[0]], cos[0])
    assert torch.equal(w.sin[positions[0]], _signed_sin(sin)[0])
