"""render_prompt: plain text for base models, the chat template for instruct models."""

from __future__ import annotations

import pytest

from primekit.data.prompts import render_prompt
from primekit.models.tiny import build_char_tokenizer


def test_plain_prompt_and_system():
    tok = build_char_tokenizer()
    assert render_prompt(tok, "3+4=") == "3+4="
    assert render_prompt(tok, "3+4=", system="Add.") == "Add.\n\n3+4="


def test_chat_template():
    tok = build_char_tokenizer()
    with pytest.raises(ValueError, match="no chat template"):
        render_prompt(tok, "3+4=", use_chat_template=True)
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    assert render_prompt(tok, "3+4=", use_chat_template=True) == "[user]3+4=\n[assistant]"
    assert (
        render_prompt(tok, "3+4=", use_chat_template=True, system="Be brief.")
        == "[system]Be brief.\n[user]3+4=\n[assistant]"
    )
