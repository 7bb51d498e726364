"""Turning a problem's prompt into the exact text the model is conditioned on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    *,
    use_chat_template: bool = False,
    system: str | None = None,
) -> str:
    """The text to tokenize for a prompt.

    With use_chat_template: the tokenizer's chat template over [system?, user] with the
    generation prompt appended (for instruct models; ValueError if the tokenizer has no
    template). Without: the prompt itself, preceded by `system` and a blank line if given
    (for base models and the tiny model, whose prompt is the bare expression).
    """
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
    if not use_chat_template:
        return prompt if system is None else f"{system}\n\n{prompt}"
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"use_chat_template=True but tokenizer {getattr(tokenizer, 'name_or_path', '')!r} "
            "has no chat template; use plain prompts for base models"
        )
    messages = [] if system is None else [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": prompt})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
