"""HFRolloutEngine: greedy vs a naive loop, log-probs vs recomputation, reproducibility, EOS."""

from __future__ import annotations

import inspect

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


def _reference_greedy(model, tokenizer, prompts: list[list[int]], max_new_tokens: int):
    """The engine's greedy decode loop as it was before the preallocated cache (a DynamicCache
    grown by concatenation, the 2-D mask grown by `torch.cat`, finished rows dropped once they
    are a quarter of the batch): (response_ids [n, T], logprobs [n, T]), T = steps taken."""
    from transformers import DynamicCache

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    n, P, T = len(prompts), max(map(len, prompts)), max_new_tokens
    ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])  # [n, P]
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])  # [n, P]
    out = torch.full((n, T), pad)
    out_mask = torch.zeros((n, T), dtype=torch.long)
    logprobs = torch.zeros((n, T))
    finished = torch.zeros(n, dtype=torch.bool)
    cache = DynamicCache(config=model.config)
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else (
        "past_key_values")
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                       use_cache=True, logits_to_keep=1, **{cache_kwarg: cache}).logits[:, -1]
        rows, attn, next_pos = torch.arange(n), mask, positions[:, -1] + 1
        for t in range(T):
            tokens = logits.argmax(-1)
            lp = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None]).squeeze(-1)
            alive = ~finished[rows]
            out[rows[alive], t], out_mask[rows[alive], t] = tokens[alive], 1
            logprobs[rows[alive], t] = lp[alive]
            finished[rows[alive]] = tokens[alive] == eos
            if t == T - 1 or bool(finished.all()):
                break
            still = ~finished[rows]
            if int((~still).sum()) * 4 >= len(rows):
                keep = still.nonzero().flatten()
                cache.batch_select_indices(keep)
                rows, tokens, attn, next_pos = rows[keep], tokens[keep], attn[keep], next_pos[keep]
                still = still[keep]
            attn = torch.cat([attn, still.long()[:, None]], dim=1)
            logits = model(input_ids=tokens[:, None], attention_mask=attn,
                           position_ids=next_pos[:, None], use_cache=True,
                           **{cache_kwarg: cache}).logits[:, -1]
            next_pos = next_pos + 1
    width = int(out_mask.sum(1).max())
    return out[:, :width], logprobs[:, :width]


@pytest.mark.parametrize("which", ["random", "eos"])
def test_greedy_bit_identical_to_the_concatenating_loop(which, model, eos_model, tokenizer):
    # The preallocated cache and mask, the 4-D mask and the new sampler change no greedy bit:
    # tokens and log-probs equal exactly (torch.equal), with prompts of different lengths, rows
    # finishing at different steps (the eos model) and rows dropped from the cache on the way.
    m = {"random": model, "eos": eos_model}[which]
    prompts = _ids(tokenizer, PROMPTS + ["a=", "qqqb=", "xa=", "b=", "zb=", "yya="])
    # With the model's own forward at every step (decode="model"). The written-out decode step
    # (decode="auto", rollout/decode.py) sums attention in another order: the same tokens, and
    # log-probs equal to float32 rounding.
    ref_ids, ref_lp = _reference_greedy(m, tokenizer, prompts, 24)
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    engine = HFRolloutEngine(m, tokenizer, decode="model")
    batch = engine.generate(prompts, params)
    assert torch.equal(batch.response_ids, ref_ids)
    assert torch.equal(batch.sampling_logprobs, ref_lp)
    if which == "eos":  # rows finished at different steps and were dropped: "1<eos>", "123<eos>"
        assert sorted(set(batch.response_mask.sum(1).tolist())) == [2, 4]
    written_out = HFRolloutEngine(m, tokenizer)
    fast = written_out.generate(prompts, params)
    assert written_out.decode_path == "written-out"
    assert torch.equal(fast.response_ids, ref_ids)
    torch.testing.assert_close(fast.sampling_logprobs, ref_lp, rtol=0, atol=1e-5)


def test_sampler_draws_the_softmax_distribution():
    # 40000 draws from one fixed 6-token distribution; the counts must fit the probabilities:
    # Pearson's chi-square over 6 cells has 5 degrees of freedom, P(chi2_5 > 20.5) = 0.001.
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    logits = probs.log().repeat(40000, 1)
    for top_p, p in [(1.0, probs), (0.75, torch.tensor([0.4, 0.25, 0.15, 0, 0, 0]) / 0.8)]:
        # top_p 0.75: the mass before token 2 is 0.65 < 0.75 (kept), before token 3 0.8 (not).
        tokens, _ = sample_next_token(logits, SamplingParams(top_p=top_p),
                                      torch.Generator().manual_seed(0))
        counts = torch.bincount(tokens, minlength=6).double()
        expected = 40000 * p.double()
        assert (counts[p == 0] == 0).all()
        chi2 = ((counts - expected)[p > 0] ** 2 / expected[p > 0]).sum()
        assert chi2 < 20.5, (counts.tolist(), chi2)


def test_sampler_rounding_guard_takes_the_last_possible_token(monkeypatch):
    # u * total can round up to the total (index V after the search): the guard must take the
    # last token of probability > 0, never a zero-probability one. Force u = 1.0 to reach it.
    logits = torch.tensor([[0.0, 1.0, -float("inf"), 0.5, -float("inf")]])
    monkeypatch.setattr(torch, "rand", lambda n, **kw: torch.ones(n, dtype=kw["dtype"]))
    tokens, _ = sample_next_token(logits, SamplingParams(), None)
    assert tokens.tolist() == [3]
    # Under top-p the vocabulary is sorted (1, 3, 0, ...); top_p 0.7 keeps tokens 1 and 3
    # (p = 0.51, 0.31; the mass before token 0 is 0.82 >= 0.7), so the last kept is token 3.
    tokens, _ = sample_next_token(logits, SamplingParams(top_p=0.7), None)
    assert tokens.tolist() == [3]


def test_engine_samples_the_models_distribution(model, tokenizer):
    # The first response token of 6000 copies of one prompt, against the model's own softmax
    # at that position: Pearson's chi-square over the cells expected to hold >= 20 draws plus
    # one cell pooling the rest, df = cells - 1 (about 190 for the random tiny model: its
    # distribution is nearly flat). chi2_df has mean df and sd sqrt(2 df); the bound
    # df + 5 sd is exceeded with probability ~1e-5 (seeds 0-2 gave 183-227 at df 191, and
    # torch.multinomial 160-192). A sampler off by a few percent of mass fails it.
    prompt = _ids(tokenizer, ["3+4*2="])[0]
    engine = HFRolloutEngine(model, tokenizer, micro_batch_size=2000)
    batch = engine.generate([prompt] * 6000, SamplingParams(max_new_tokens=1),
                            torch.Generator().manual_seed(5))
    with torch.no_grad():
        p = model(torch.tensor([prompt])).logits[0, -1].double().softmax(-1)  # [V]
    counts = torch.bincount(batch.response_ids[:, 0], minlength=len(p)).double()
    expected = 6000 * p
    big = expected >= 20
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    df = len(obs) - 1
    assert df >= 10  # a spread-out distribution (the random tiny model), not one token
    chi2 = ((obs - exp) ** 2 / exp).sum()
    assert chi2 < df + 5 * (2 * df) ** 0.5, (chi2, df)
