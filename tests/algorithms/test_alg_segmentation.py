"""Step segmentation: character spans, token positions (fast path and prefix search), batches."""

from __future__ import annotations

import random

import pytest
import torch

from primekit.algorithms.segmentation import (
    segment_batch,
    step_end_token_positions,
    step_spans,
    steps,
    token_char_ends,
)
from primekit.models.tiny import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def ids_of(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_arithmetic_response_steps_and_last_step():
    text = "3+4=7\n7*2=14\nA:14"
    # "3+4=7\n" is chars 0..5, "7*2=14\n" 6..12, the answer line "A:14" (no delimiter) 13..16.
    assert step_spans(text, "\n") == [(0, 6), (6, 13), (13, 17)]
    assert steps(text, "\n") == ["3+4=7\n", "7*2=14\n", "A:14"]
    # A trailing delimiter closes the last step; no empty step after it.
    assert steps("a\nb\n", "\n") == ["a\n", "b\n"]
    assert step_spans("", "\n") == []
    assert steps("no delimiter", "\n") == ["no delimiter"]


def test_blank_lines_literal_and_regex_delimiters():
    # With "\n" a blank line is a (whitespace-only) step of its own; with "\n\n" it is the cut.
    assert steps("a\n\nb", "\n") == ["a\n", "\n", "b"]
    assert steps("a\nb\n\nc", "\n\n") == ["a\nb\n\n", "c"]
    # Zero-width pattern: every "Step k:" starts a step; the preamble is a step too.
    text = "Intro\nStep 1: x=2\nStep 2: y=3\nThe answer is 5"
    assert steps(text, r"re:(?=Step \d+:)") == [
        "Intro\n",
        "Step 1: x=2\n",
        "Step 2: y=3\nThe answer is 5",
    ]
    assert steps("Step 1: a Step 2: b", r"re:(?=Step \d+:)") == ["Step 1: a ", "Step 2: b"]
    with pytest.raises(ValueError, match="delimiter"):
        steps("x", "")
    with pytest.raises(ValueError, match="regex"):
        steps("x", "re:(")


def test_token_positions_char_tokenizer(tok):
    ids = ids_of(tok, "3+4=7\nA:7") + [tok.eos_token_id]
    # Tokens: 3 + 4 = 7 \n A : 7 <eos>; step 1 ends on "\n" (index 5), the answer on "7" (index 8),
    # never on EOS (it decodes to nothing).
    assert step_end_token_positions(tok, ids, "\n") == [5, 8]
    assert token_char_ends(tok, ids) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 9]


def test_token_positions_multibyte_falls_back_to_prefix_search(tok):
    # "é" is two byte tokens; decoded one at a time they are replacement chars, so the fast path
    # is refused and the prefix search runs. Tokens: a, é1, é2, b, c.
    ids = ids_of(tok, "aébc")
    assert len(ids) == 5
    assert token_char_ends(tok, ids) is None
    # Delimiter "é": steps "aé" (ends on é's second byte, index 2) and "bc" (index 4).
    assert step_end_token_positions(tok, ids, "é") == [2, 4]
    # Tokens x, é1, é2, \n, y: step "xé\n" ends on "\n" (index 3), "y" on index 4.
    assert step_end_token_positions(tok, ids_of(tok, "xé\ny"), "\n") == [3, 4]


def _bpe_tokenizer():
    """A byte-level BPE with real merges (multi-character tokens, some containing newlines)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    rng = random.Random(0)
    corpus = ["".join(rng.choice("ab=\n12") for _ in range(40)) for _ in range(300)]
    backend.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<eos>")


def test_token_positions_with_merged_tokens_match_prefix_decodes():
    tok = _bpe_tokenizer()
    rng = random.Random(1)
    multi = 0
    for _ in range(50):
        text = "".join(rng.choice("ab=\n12é") for _ in range(rng.randint(1, 30)))
        ids = ids_of(tok, text)
        multi += any(len(tok.decode([i])) > 1 for i in ids)
        spans = step_spans(text, "\n")
        positions = step_end_token_positions(tok, ids, "\n")
        assert len(positions) == len(spans)
        for (_, end), p in zip(spans, positions):
            # The step's last character is inside token p: the prefix through p covers it, the
            # prefix before p does not.
            assert tok.decode(ids[: p + 1]).startswith(text[:end])
            assert not tok.decode(ids[:p]).startswith(text[:end])
    assert multi > 0  # the merges really produced multi-character tokens


def test_segment_batch_padding_and_empty_rows(tok):
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows = [ids_of(tok, "1+1=2\nA:2") + [eos], ids_of(tok, "A:5"), [eos]]
    T = max(len(r) for r in rows)
    response_ids = torch.full((3, T), pad)
    response_mask = torch.zeros(3, T, dtype=torch.long)
    for i, r in enumerate(rows):
        response_ids[i, : len(r)] = torch.tensor(r)
        response_mask[i, : len(r)] = 1
    positions, step_mask = segment_batch(tok, response_ids, response_mask, "\n")
    # Row 0: "1+1=2\n" ends at 5, "A:2" at 8. Row 1 (truncated, no EOS): "A:5" ends at 2.
    # Row 2: only EOS, no text, no step.
    assert positions.tolist() == [[5, 8], [2, -1], [-1, -1]]
    assert step_mask.tolist() == [[True, True], [True, False], [False, False]]
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        segment_batch(tok, response_ids, response_mask[:, :-1], "\n")


def test_reference_prefix_labels_hand_computed():
    from primekit.algorithms import reference_prefix_labels

    ref = ["3+4=7\n", "7*2=14\n", "A:14"]
    rows = [ref,                                   # the reference itself: 1, 1, 1
            ["3+4=7\n", "7*2=15\n", "A:15"],       # wrong at step 2: 1, 0, 0
            ["3+4=8\n", "8*2=16\n", "A:16"],       # wrong at step 1: all 0
            ["3+4=7\n", "7*2=14\n", "A:14", "\n"],  # an extra step after the answer: 0 there
            ["3+4=7\n"],                           # stopped early: 1, then padding
            []]                                    # empty response
    labels = reference_prefix_labels(rows, [ref] * len(rows), 4)
    assert labels.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0],
                               [1, 0, 0, 0], [0, 0, 0, 0]]
    # a later step equal to the reference's does not count once an earlier one differed
    assert reference_prefix_labels([["x\n", "7*2=14\n"]], [ref], 2).tolist() == [[0, 0]]
    # exact about the reference, not about correctness: 3*1+4 solved without its "*1" step
    # reaches the right answer and is labelled 0 from the skip on
    one = ["3*1=3\n", "3+4=7\n", "A:7"]
    assert reference_prefix_labels([["3+4=7\n", "A:7"]], [one], 2).tolist() == [[0, 0]]
    with pytest.raises(ValueError, match="width"):
        reference_prefix_labels([ref], [ref], 2)
    with pytest.raises(ValueError, match="references"):
        reference_prefix_labels([ref], [], 3)
