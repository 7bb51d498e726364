"""HFRolloutEngine: greedy vs a naive loop, log-probs vs recomputation, reproducibility, EOS."""

from __future__ import annotations

import pytest
import torch

from primekit.models.logprobs import sequence_logprobs
from primekit.rollout.base import SamplingParams
from primekit.rollout.hf import HFRolloutEngine, sample_next_token

PROMPTS = ["3+4*2=", "7-1=", "9*9-8+1=", "1=", "5+5+5=", "8*2="]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from primekit.models.hf import load_tokenizer

    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from primekit.models.hf import load_model

    return load_model(str(tiny_model_dir))


@pytest.fixture(scope="module")
def eos_model(tiny_model_dir, tokenizer):
    """The tiny model trained for a moment to answer "...a=" with "1<eos>" and "...b=" with
    "123<eos>", so that rows finish at known, different steps."""
    from primekit.models.hf import load_model

    model = load_model(str(tiny_model_dir))
    texts = ["a=1", "xa=1", "yya=1", "b=123", "zb=123", "qqqb=123"]
    rows = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = (torch.arange(width) < torch.tensor([len(r) for r in rows])[:, None]).long()
    labels = ids.masked_fill(mask == 0, -100)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(100):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def _ids(tokenizer, prompts):
    return [tokenizer(p)["input_ids"] for p in prompts]


def _naive_greedy(model, prompt: list[int], max_new_tokens: int, eos: int) -> list[int]:
    """No cache, no padding: re-run the whole sequence and take the argmax, one token at a time."""
    seq, out = list(prompt), []
    for _ in range(max_new_tokens):
        token = int(model(torch.tensor([seq])).logits[0, -1].argmax())
        out.append(token)
        seq.append(token)
        if token == eos:
            break
    return out


def test_greedy_equals_naive_argmax_loop(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    # float64 so that cached vs uncached rounding cannot flip a near-tie.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).double()
    engine = HFRolloutEngine(model, tokenizer, micro_batch_size=4)  # 2 micro-batches
    prompts = _ids(tokenizer, PROMPTS)
    batch = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=12))
    for i, prompt in enumerate(prompts):
        expected = _naive_greedy(model, prompt, 12, tokenizer.eos_token_id)
        row = batch.response_ids[i][batch.response_mask[i].bool()].tolist()
        assert row == expected
        assert batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist() == prompt
        assert batch.responses[i] == tokenizer.decode(expected, skip_special_tokens=True)
    # Greedy log-probs are under the untempered softmax.
    lp, _ = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_len)
    torch.testing.assert_close(batch.sampling_logprobs.double(), lp, rtol=0, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_match_recomputation(model, tokenizer, temperature):
    engine = HFRolloutEngine(model, tokenizer, micro_batch_size=16)
    prompts = _ids(tokenizer, PROMPTS) * 8  # 48 rows, 3 micro-batches
    params = SamplingParams(temperature=temperature, max_new_tokens=40)
    batch = engine.generate(prompts, params, torch.Generator().manual_seed(1))
    with torch.no_grad():
        lp, _ = sequence_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.response_len,
            temperature=temperature,
        )
    mask = batch.response_mask.bool()
    assert mask.any(1).all()
    torch.testing.assert_close(batch.sampling_logprobs, lp, rtol=0, atol=2e-5)
    assert (batch.sampling_logprobs[~mask] == 0).all()


def test_reproducible_from_generator(model, tokenizer):
    engine = HFRolloutEngine(model, tokenizer)
    prompts = _ids(tokenizer, PROMPTS) * 4
    params = SamplingParams(max_new_tokens=20)
    a = engine.generate(prompts, params, torch.Generator().manual_seed(7))
    b = engine.generate(prompts, params, torch.Generator().manual_seed(7))
    c = engine.generate(prompts, params, torch.Generator().manual_seed(8))
    assert torch.equal(a.response_ids, b.response_ids) and a.responses == b.responses
    assert torch.equal(a.sampling_logprobs, b.sampling_logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)
    # Resuming from a saved generator state continues the same stream.
    g = torch.Generator().manual_seed(3)
    engine.generate(prompts, params, g)
    state = g.get_state()
    second = engine.generate(prompts, params, g)
    resumed = torch.Generator()
    resumed.set_state(state)
    assert torch.equal(engine.generate(prompts, params, resumed).response_ids, second.response_ids)


def test_eos_handling_and_masks(eos_model, tokenizer):
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    engine = HFRolloutEngine(eos_model, tokenizer)
    prompts = _ids(tokenizer, ["a=", "qqqb=", "xa=", "b="])
    batch = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=10))
    # The loop stops when every row has finished: "123<eos>" is the longest, 4 tokens.
    assert batch.response_len == 4
    assert batch.responses == ["1", "123", "1", "123"]
    assert batch.finished.tolist() == [True] * 4
    one, three = tokenizer("1")["input_ids"][0], tokenizer("123")["input_ids"]
    assert batch.response_ids.tolist() == [
        [one, eos, pad, pad],
        [*three, eos],
        [one, eos, pad, pad],
        [*three, eos],
    ]
    # The mask covers the EOS token and nothing after it; padding has log-prob 0.
    assert batch.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]] * 2
    assert (batch.sampling_logprobs[batch.response_mask == 0] == 0).all()
    # Cut off before EOS: not finished, no EOS in the response.
    short = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=2))
    assert short.finished.tolist() == [True, False, True, False]
    assert short.responses == ["1", "12", "1", "12"]
    assert short.response_mask.tolist() == [[1, 1], [1, 1]] * 2


def test_restores_train_mode_and_syncs_weights(model, tokenizer, eos_model):
    engine = HFRolloutEngine(model, tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    model.train()
    engine.generate(_ids(tokenizer, ["a="]), params)
    assert model.training
    model.eval()
    engine.generate(_ids(tokenizer, ["a="]), params)
    assert not model.training
    engine.sync_weights(eos_model)
    assert engine.generate(_ids(tokenizer, ["a="]), params).responses == ["1"]


def test_bad_inputs(model, tokenizer):
    engine = HFRolloutEngine(model, tokenizer)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[5], []], SamplingParams())
    with pytest.raises(ValueError, match="at least one prompt"):
        engine.generate([], SamplingParams())
    with pytest.raises(ValueError, match="micro_batch_size"):
        HFRolloutEngine(model, tokenizer, micro_batch_size=0)


def test_top_p_truncates_but_logprobs_do_not():
    # probs [0.5, 0.3, 0.2], top_p = 0.6: the mass before token 1 is 0.5 < 0.6 (kept), before
    # token 2 it is 0.8 >= 0.6 (dropped). Sampling is then 5:3 between tokens 0 and 1.
    logits = torch.tensor([0.5, 0.3, 0.2]).log().repeat(4000, 1)
    tokens, logprobs = sample_next_token(
        logits, SamplingParams(top_p=0.6), torch.Generator().manual_seed(0)
    )
    counts = torch.bincount(tokens, minlength=3).tolist()
    assert counts[2] == 0
    assert abs(counts[0] / 4000 - 0.625) < 0.03  # 0.5 / 0.8
    # Reported log-probs are of the untruncated distribution: log 0.5 and log 0.3.
    expected = torch.tensor([0.5, 0.3, 0.2]).log()[tokens]
    torch.testing.assert_close(logprobs, expected)
    # top_p below the largest probability is greedy.
    tokens, _ = sample_next_token(logits[:50], SamplingParams(top_p=0.1), torch.Generator())
    assert (tokens == 0).all()


def test_temperature_sharpens_sampling():
    # Two tokens with logits 0 and log 3: p(1) = 3/4 at T=1; at T=0.5, 9/10.
    logits = torch.tensor([0.0, torch.tensor(3.0).log().item()]).repeat(4000, 1)
    for temperature, p1 in [(1.0, 0.75), (0.5, 0.9)]:
        tokens, logprobs = sample_next_token(
            logits, SamplingParams(temperature=temperature), torch.Generator().manual_seed(0)
        )
        assert abs(tokens.float().mean().item() - p1) < 0.02
        torch.testing.assert_close(logprobs[tokens == 1][0], torch.tensor(p1).log())
