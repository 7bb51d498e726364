"""Reasoning steps of a response: where they end in the text and on which token.

A step ends at a delimiter (Gao et al., arXiv 2410.15115, Sec. 3: "reasoning steps can be parsed with rule-based
detectors"). The delimiter is a literal string ("\\n" for the arithmetic task, "\\n\\n" for a blank
line) or, prefixed with "re:", a regular expression; the text is cut right after every match and
each non-empty piece is one step, the delimiter belonging to the step it closes. A zero-width
pattern cuts before a marker: "re:(?=Step \\d+:)" makes every "Step k:" start a new step. Text after
the last delimiter is the last step (the arithmetic task's answer line "A:<n>").

Token mapping: a step's dense reward sits on its LAST token, the token that holds the step's last
character (the delimiter's last character when there is one). Special tokens (EOS) decode to
nothing and so never end a step. Two steps ending inside one token map to the same token.

Notation: N responses, T response tokens, S = max steps per response.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from functools import lru_cache

import torch

__all__ = [
    "compile_delimiter",
    "reference_prefix_labels",
    "segment_batch",
    "segment_batch_texts",
    "step_end_token_positions",
    "step_spans",
    "steps",
    "token_char_ends",
]


@lru_cache(maxsize=64)
def compile_delimiter(delimiter: str) -> re.Pattern[str]:
    """The pattern for a delimiter spec: "re:<regex>" or a literal string (escaped)."""
    if not isinstance(delimiter, str) or not delimiter:
        raise ValueError(f"step delimiter must be a non-empty string, got {delimiter!r}")
    if delimiter.startswith("re:"):
        body = delimiter[3:]
        if not body:
            raise ValueError(
                f"step delimiter {delimiter!r}: the regular expression after 're:' is empty"
            )
        try:
            return re.compile(body)
        except re.error as err:
            raise ValueError(f"step delimiter {delimiter!r} is not a valid regex: {err}") from err
    return re.compile(re.escape(delimiter))


def step_spans(text: str, delimiter: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the steps of `text`, in order; [] for empty text.

    Example (delimiter "\\n"): "3+4=7\\n7*2=14\\nA:14" -> [(0, 6), (6, 13), (13, 17)].
    """
    pattern = compile_delimiter(delimiter)
    cuts = sorted({m.end() for m in pattern.finditer(text)} | {0, len(text)})
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def steps(text: str, delimiter: str) -> list[str]:
    """The step strings of `text` (each with its closing delimiter)."""
    return [text[a:b] for a, b in step_spans(text, delimiter)]


def token_char_ends(tokenizer, token_ids: list[int]) -> list[int] | None:
    """End offset (exclusive) in `decode(token_ids)` of every token, or None if not additive.

    Decoding token by token and summing lengths is exact when the pieces concatenate to the full
    decode (character tokenizers, most BPE on ASCII). A token that is part of a multi-byte
    character decodes to a replacement char on its own, so the pieces disagree and we return None
    (the caller then searches prefix decodes).
    """
    pieces = tokenizer.batch_decode(
        [[i] for i in token_ids], skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    full = tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if "".join(pieces) != full:
        return None
    ends, total = [], 0
    for piece in pieces:
        total += len(piece)
        ends.append(total)
    return ends


def _first_token_covering(tokenizer, token_ids: list[int], text: str, char_end: int) -> int:
    """Smallest i such that decode(token_ids[: i + 1]) starts with text[:char_end] (bisection)."""
    target = text[:char_end]
    lo, hi = 0, len(token_ids) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        prefix = tokenizer.decode(
            token_ids[: mid + 1], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        if prefix.startswith(target):
            hi = mid
        else:
            lo = mid + 1
    return lo


def step_end_token_positions(tokenizer, token_ids: list[int], delimiter: str) -> list[int]:
    """Token index of the last token of every step of decode(token_ids), ascending.

    `token_ids` are the valid response tokens only (EOS may be among them; padding may not).
    Example with a character tokenizer: "3+4=7\\nA:7" + <eos> -> steps "3+4=7\\n", "A:7" -> [5, 8].
    """
    return _step_ends_and_texts(tokenizer, token_ids, delimiter)[0]


def _step_ends_and_texts(tokenizer, token_ids: list[int], delimiter: str,
                         ) -> tuple[list[int], list[str]]:
    """(`step_end_token_positions`, the step strings) of decode(token_ids), from one decode."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    spans = step_spans(text, delimiter)
    texts = [text[a:b] for a, b in spans]
    if not spans:
        return [], texts
    ends = token_char_ends(tokenizer, token_ids)
    if ends is not None:
        return [bisect_left(ends, b) for _, b in spans], texts
    return [_first_token_covering(tokenizer, token_ids, text, b) for _, b in spans], texts


def segment_batch(
    tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor, delimiter: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-end token positions of every response of a rollout batch.

    Args:
        response_ids: [N, T] right-padded response tokens.
        response_mask: [N, T] 1 on valid tokens (EOS included).
        delimiter: step delimiter spec (see `compile_delimiter`).
    Returns:
        (step_end_positions [N, S] long, -1 padded, ascending; step_mask [N, S] bool), S >= 1
        (a batch with no steps at all gets one all-padding column so shapes stay non-empty).
    """
    positions, step_mask, _ = segment_batch_texts(tokenizer, response_ids, response_mask,
                                                  delimiter)
    return positions, step_mask


def segment_batch_texts(
    tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor, delimiter: str
) -> tuple[torch.Tensor, torch.Tensor, list[list[str]]]:
    """`segment_batch` plus each row's step strings (`steps` of its decoded text), the ones its
    positions end: (step_end_positions [N, S], step_mask [N, S], N lists of step strings)."""
    if response_ids.dim() != 2 or response_mask.shape != response_ids.shape:
        raise ValueError(
            f"response_ids {tuple(response_ids.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be [N, T]"
        )
    mask = response_mask.bool().cpu()
    ids = response_ids.cpu()
    rows, texts = [], []
    for i in range(ids.shape[0]):
        cols = mask[i].nonzero().flatten()  # valid columns; a prefix under right padding
        ends, row_texts = _step_ends_and_texts(tokenizer, ids[i, cols].tolist(), delimiter)
        rows.append(cols[ends].tolist() if ends else [])
        texts.append(row_texts)
    s = max([len(r) for r in rows] + [1])
    positions = torch.full((ids.shape[0], s), -1, dtype=torch.long)  # [N, S]
    for i, r in enumerate(rows):
        if r:
            positions[i, : len(r)] = torch.tensor(r)
    return positions, positions >= 0, texts


def reference_prefix_labels(
    response_steps: list[list[str]], reference_steps: list[list[str]], width: int
) -> torch.Tensor:
    """Exact step labels against a reference solution: 1 while the response's steps are the
    reference's, step for step, and 0 from the first step that differs on.

    l[i, k] = 1 if response_steps[i][j] == reference_steps[i][j] for every j <= k, else 0
    (0 beyond the reference's last step and beyond row i's own steps).
    Where the reference solution is the only right one, l[i, k] is the probability that the
    prefix ending at step k still leads to a correct answer when completed without error: Gao et
    al.'s (arXiv 2410.15115, Sec. 3) Monte-Carlo step label with a completer that never errs.
    Where another solution also reaches the answer (on the arithmetic families, one that skips
    a "*1" step), l labels it 0 from where it leaves the reference: it is exact about the
    reference procedure, stricter than correctness.

    Args:
        response_steps: N lists of step strings (`steps(response, delimiter)`).
        reference_steps: N lists of step strings of the reference solutions, cut the same way.
        width: S >= every row's step count, the label tensor's width.
    Returns:
        labels [N, S] float32 in {0, 1}.

    Example: reference ["3+4=7\\n", "7*2=14\\n", "A:14"], response ["3+4=7\\n", "7*2=15\\n",
    "A:15"] -> [1, 0, 0]; the reference itself -> [1, 1, 1].
    """
    if len(response_steps) != len(reference_steps):
        raise ValueError(f"{len(response_steps)} responses but {len(reference_steps)} references")
    labels = torch.zeros(len(response_steps), width)  # [N, S]
    for i, (got, want) in enumerate(zip(response_steps, reference_steps)):
        if len(got) > width:
            raise ValueError(f"row {i} has {len(got)} steps, more than width {width}")
        for k, (a, b) in enumerate(zip(got, want)):
            if a != b:
                break
            labels[i, k] = 1.0
    return labels
