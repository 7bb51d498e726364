"""The embedded tiny model and its character tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from primekit.models.tiny import CHARACTERS, build_char_tokenizer, build_tiny_model


def test_tokenizer_one_token_per_ascii_char_and_exact_round_trip():
    tok = build_char_tokenizer()
    text = "3+4=7\n7*2=14\nA:14  x , . ; ' \" ~"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no bos/eos added
    assert tok.decode(ids) == text  # no spaces inserted, no clean-up of " ," etc.
    # The ASCII ids are the documented ones: 3 = "\n", 4 = " ", then printable ASCII in order.
    assert tok("\n")["input_ids"] == [3]
    assert tok(" ")["input_ids"] == [4]
    assert tok("0")["input_ids"] == [3 + 1 + (ord("0") - 32)]
    assert len({tuple(tok(c)["input_ids"]) for c in CHARACTERS}) == len(CHARACTERS) == 96


def test_tokenizer_special_tokens_and_non_ascii():
    tok = build_char_tokenizer()
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert tok.bos_token_id == tok.eos_token_id
    assert len(tok) == 259
    assert tok.padding_side == "left"
    # Specials are whole tokens when spelled out, and skipped on request.
    assert tok("1<eos>")["input_ids"] == [tok("1")["input_ids"][0], 1]
    assert tok.decode([0, 20, 1], skip_special_tokens=True) == tok.decode([20])
    # Non-ASCII text is kept as UTF-8 bytes: "é" is 2 tokens, "☃" 3, and both round-trip.
    for text, n in [("é", 2), ("☃", 3), ("\t", 1)]:
        ids = tok(text)["input_ids"]
        assert len(ids) == n and min(ids) >= 99
        assert tok.decode(ids) == text


def test_tiny_model_size_and_reproducible_init(tmp_path):
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=3))
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=3))
    c = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "c", seed=4))
    n_params = sum(p.numel() for p in a.parameters())
    # 259*128 embeddings (tied) + 4 layers * (3*128*128 + 3*128 qkv, 128*128 o, 3*128*512 mlp,
    # 2*128 norms) + 128 final norm = 33152 + 4*262784 + 128 = 1084416.
    assert n_params == 1_084_416
    assert a.config.model_type == "qwen2"
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(
        sa["model.layers.0.mlp.up_proj.weight"], sc["model.layers.0.mlp.up_proj.weight"]
    )


def test_build_tiny_model_rejects_bad_sizes(tmp_path):
    with pytest.raises(ValueError, match="num_heads"):
        build_tiny_model(tmp_path / "m", hidden_size=100, num_heads=3)
    with pytest.raises(ValueError, match="num_layers"):
        build_tiny_model(tmp_path / "m", num_layers=0)


_PLAIN_LOAD = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(path)
tok = AutoTokenizer.from_pretrained(path)
text = "12-3=9\\n9*4=36\\nA:36"
ids = tok(text)["input_ids"]
out = model.generate(
    __import__("torch").tensor([tok("5+5=")["input_ids"]]), max_new_tokens=3, do_sample=False
)
print(json.dumps({
    "ids": ids, "decoded": tok.decode(ids), "eos": tok.eos_token_id, "pad": tok.pad_token_id,
    "gen_eos": model.generation_config.eos_token_id, "gen_pad": model.generation_config.pad_token_id,
    "gen_len": out.shape[1], "modules": sorted(m for m in sys.modules if m.startswith("primekit")),
}))
"""


def test_plain_transformers_loads_the_saved_directory(tiny_model_dir):
    # A fresh interpreter with no primekit import: exactly what a user of the directory gets.
    proc = subprocess.run(
        [sys.executable, "-c", _PLAIN_LOAD, str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["modules"] == []
    assert got["decoded"] == "12-3=9\n9*4=36\nA:36"
    assert got["ids"] == build_char_tokenizer()("12-3=9\n9*4=36\nA:36")["input_ids"]
    assert (got["eos"], got["pad"], got["gen_eos"], got["gen_pad"]) == (1, 0, 1, 0)
    assert got["gen_len"] in (5, 6, 7)  # 4 prompt tokens + up to 3 new ones (fewer if eos)
