"""load_model / load_tokenizer / save_model."""

from __future__ import annotations

import shutil

import pytest
import torch

from primekit.models.hf import load_model, load_tokenizer, save_model
from primekit.models.tiny import build_char_tokenizer


def test_load_model_dtype_and_errors(tiny_model_dir, tmp_path):
    model = load_model(str(tiny_model_dir), dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert (
        next(load_model(str(tiny_model_dir), dtype=torch.float64).parameters()).dtype
        == torch.float64
    )
    with pytest.raises(ValueError, match="dtype"):
        load_model(str(tiny_model_dir), dtype="float8")
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        load_model(str(missing))
    with pytest.raises(FileNotFoundError, match="no_such_tok"):
        load_tokenizer(str(tmp_path / "no_such_tok"))


def test_hub_failure_names_the_id(monkeypatch):
    from transformers import AutoModelForCausalLM

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to the hub")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", offline)
    with pytest.raises(OSError, match="cannot load model 'some-org/some-model'"):
        load_model("some-org/some-model")


def test_load_tokenizer_pad_fallback_and_left_padding(tmp_path):
    tok = build_char_tokenizer()
    tok.padding_side = "right"
    tok.pad_token = None
    tok.save_pretrained(tmp_path / "tok")
    loaded = load_tokenizer(str(tmp_path / "tok"))
    assert loaded.pad_token == "<eos>" and loaded.pad_token_id == loaded.eos_token_id == 1
    assert loaded.padding_side == "left"
    batch = loaded(["1", "123"], padding=True)["input_ids"]
    assert batch[0][:2] == [1, 1]  # left-padded with the eos id


def test_save_model_round_trip_and_replace(tiny_model_dir, tmp_path):
    model, tok = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    out = tmp_path / "ckpt"
    assert save_model(model, tok, out) == out
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    with torch.no_grad():
        model.model.norm.weight.fill_(2.0)
    save_model(model, tok, out)  # over an existing directory
    reloaded = load_model(str(out))
    assert torch.equal(reloaded.model.norm.weight, torch.full((128,), 2.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp/backup left


def test_crash_mid_save_leaves_old_checkpoint_intact(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    model, tok = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))

    def half_write(self, save_directory, **kwargs):
        save_directory.mkdir(parents=True, exist_ok=True)
        (save_directory / "model.safetensors").write_bytes(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(type(model), "save_pretrained", half_write)
    with pytest.raises(RuntimeError, match="disk full"):
        save_model(model, tok, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
