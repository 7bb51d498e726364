"""The one model/tokenizer builder (models/hf.py): load_model, load_tokenizer, load_value_model,
load_model_config, load_generation_config, save_model; and that every command uses it."""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import primekit
from primekit.models.hf import (
    load_generation_config,
    load_model,
    load_model_config,
    load_tokenizer,
    load_value_model,
    save_model,
    stop_token_ids,
)
from primekit.models.tiny import build_char_tokenizer

CONFIG = Path(primekit.__file__).parent / "configs" / "tiny.yaml"


def test_a_value_model_from_a_causal_lm_loads_without_a_report(tiny_model_dir, tmp_path,
                                                                capfd, recwarn):
    # transformers prints a LOAD REPORT table for the new score head on every such load (a
    # walkthrough saw it at each tiny-explicit run); that head is new by design, so nothing is
    # said. A checkpoint short of a layer's weight is still said, in one warning.
    model = load_value_model(str(tiny_model_dir))
    assert model.config.num_labels == 1
    assert "LOAD REPORT" not in "".join(capfd.readouterr()) and not recwarn.list
    from safetensors.torch import load_file, save_file

    short = tmp_path / "short"
    shutil.copytree(tiny_model_dir, short)
    weights = load_file(short / "model.safetensors")
    name = next(k for k in weights if k.endswith("layers.0.mlp.up_proj.weight"))
    del weights[name]
    save_file(weights, short / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(UserWarning, match="weights not in the checkpoint \\(initialised\\): "
                      "model.layers.0.mlp.up_proj.weight"):
        load_value_model(str(short))
    assert "LOAD REPORT" not in "".join(capfd.readouterr())


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
    # every file as the umask makes it (safetensors alone writes its weights 0600)
    mask = os.umask(0)
    os.umask(mask)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        p.name: 0o666 & ~mask for p in out.iterdir()}


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


# --- the one builder: every command loads through hf.py, with model.trust_remote_code ----------

ROOT = Path(primekit.__file__).parent
# The builder's loaders and the reward-model wrappers over them (reward_models/heads.py).
LOADERS = {"load_model", "load_tokenizer", "load_value_model", "load_model_config",
           "init_reward_model", "load_reward_model"}


def _calls(attr: str | None = None):
    """(file:line, node) of every `.from_pretrained` attribute (attr) or LOADERS call in primekit/."""
    for path in sorted(ROOT.rglob("*.py")):
        where = path.relative_to(ROOT.parent)
        for node in ast.walk(ast.parse(path.read_text())):
            if attr is not None and isinstance(node, ast.Attribute) and node.attr == attr:
                yield f"{where}:{node.lineno}", node
            elif attr is None and isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in LOADERS:
                    yield f"{where}:{node.lineno}", node


def test_the_builder_is_primekits_only_caller_of_from_pretrained():
    callers = [where for where, _ in _calls("from_pretrained")]
    assert callers and all(w.startswith("primekit/models/hf.py:") for w in callers), callers


def test_every_load_in_primekit_passes_trust_remote_code():
    calls = list(_calls())
    missing = [where for where, node in calls
               if not any(k.arg == "trust_remote_code" for k in node.keywords)]
    assert missing == []
    # The scan sees the commands' loads (factory, eval, sft, labeling, prm, orm, hack-check,
    # scoring, validate, plan, export, the reward-model heads), not nothing.
    files = {where.rsplit(":", 1)[0] for where, _ in calls}
    assert {"primekit/trainer/eval.py", "primekit/trainer/sft.py", "primekit/viz/scoring.py",
            "primekit/factory.py", "primekit/reward_models/labeling.py",
            "primekit/validate.py", "primekit/trainer/checkpoint.py"} <= files, files


@pytest.fixture
def from_pretrained_spy(monkeypatch):
    """Records (class name, trust_remote_code) of every transformers from_pretrained call."""
    import transformers

    calls: list[tuple[str, object]] = []
    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM,
                transformers.AutoConfig, transformers.AutoModelForTokenClassification):
        def spy(*args, _orig=cls.from_pretrained, _name=cls.__name__, **kwargs):
            calls.append((_name, kwargs.get("trust_remote_code")))
            return _orig(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    return calls


def _small(tiny_model_dir, tmp_path, *extra):
    from primekit.config import load_config

    return load_config(CONFIG, [f"model.policy={tiny_model_dir}", "model.trust_remote_code=true",
                                "train.report_to=[]", "data.num_train=40", "data.num_eval=2",
                                "eval.num_problems=2", "eval.k=1", "rollout.max_new_tokens=4",
                                f"sft.out_dir={tmp_path / 'sft'}", *extra])


@pytest.mark.parametrize("command", ["eval", "sft", "heatmap"])
def test_commands_pass_trust_remote_code_to_model_and_tokenizer(command, tiny_model_dir, tmp_path,
                                                                from_pretrained_spy):
    # Before the one builder, these three loaded the model without model.trust_remote_code and
    # every command loaded the tokenizer without it.
    if command == "eval":
        from primekit.trainer.eval import evaluate_checkpoint

        evaluate_checkpoint(_small(tiny_model_dir, tmp_path), str(tiny_model_dir))
    elif command == "sft":
        from primekit.trainer.sft import run_sft

        run_sft(_small(tiny_model_dir, tmp_path, f"sft.init={tiny_model_dir}", "sft.steps=1",
                       "sft.batch_size=2", "sft.warmup_steps=0"))
    else:
        from primekit.viz.scoring import sample_and_score

        sample_and_score(_small(tiny_model_dir, tmp_path), model=str(tiny_model_dir),
                         prm=str(tiny_model_dir), ref=None, num_problems=1, k=1,
                         temperature=1.0, seed=0)
    loaded = {name for name, _ in from_pretrained_spy}
    assert {"AutoTokenizer", "AutoModelForCausalLM"} <= loaded, from_pretrained_spy
    assert all(trust is True for _, trust in from_pretrained_spy), from_pretrained_spy


def test_value_model_and_config_loaders(tiny_model_dir, from_pretrained_spy):
    config = load_model_config(tiny_model_dir, num_labels=1, trust_remote_code=True)
    config.classifier_dropout = 0.0
    model = load_value_model(str(tiny_model_dir), config=config, dtype=torch.float32,
                             trust_remote_code=True)
    assert model.config.num_labels == 1 and model.config.classifier_dropout == 0.0
    assert model.score.out_features == 1  # a fresh scalar head on the causal LM's backbone
    assert load_value_model(str(tiny_model_dir)).config.num_labels == 1
    assert from_pretrained_spy == [
        ("AutoConfig", True), ("AutoModelForTokenClassification", True),
        # The default (False), and transformers reading the config inside the second load.
        ("AutoModelForTokenClassification", False), ("AutoConfig", False)]


def test_generation_config_or_none(tiny_model_dir, tmp_path):
    # The tiny model writes a generation_config.json (eos 1, pad 0); a directory without one: None.
    generation = load_generation_config(tiny_model_dir)
    assert (generation.eos_token_id, generation.pad_token_id) == (1, 0)
    assert load_generation_config(tmp_path) is None


def test_stop_token_ids_add_the_generation_configs_eos(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir)
    assert stop_token_ids(tiny_model_dir, tok) == [1]  # tokenizer eos 1, generation eos 1
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "generation_config.json").read_text())
    config["eos_token_id"] = [1, 7]  # a chat model's second stop token
    (model_dir / "generation_config.json").write_text(json.dumps(config))
    assert stop_token_ids(model_dir, tok) == [1, 7]
    (model_dir / "generation_config.json").unlink()
    assert stop_token_ids(model_dir, tok) == [1]
