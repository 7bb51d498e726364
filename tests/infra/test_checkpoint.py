"""Checkpoint round trip (DCP), crash safety, pruning, and export to plain transformers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from primekit.trainer import checkpoint as ckpt
from primekit.trainer.checkpoint import (
    export_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


def tiny_qwen(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        hidden_size=32,
        num_hidden_layers=2,
        vocab_size=64,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **{str(d): 2 + d for d in range(10)}, "+": 12, "=": 13}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")


class Tied(torch.nn.Module):
    """A non-HF module with tied weights, like a policy with a custom head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(8, 4)
        self.head = torch.nn.Linear(4, 8, bias=False)
        self.head.weight = self.emb.weight
        self.scale = torch.nn.Parameter(torch.ones(4))


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    loss = sum((p.float() ** 2).sum() for p in model.parameters())
    opt.zero_grad()
    loss.backward()
    opt.step()


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def draws(gen: torch.Generator) -> tuple:
    return (
        random.random(),
        float(np.random.rand()),
        float(np.random.randn()),  # exercises numpy's cached-gaussian state
        torch.rand(3).tolist(),
        torch.rand(3, generator=gen).tolist(),
    )


def simple_save(run_dir: Path, step: int, model: torch.nn.Module | None = None, **kw) -> Path:
    model = model if model is not None else Tied()
    return save_checkpoint(run_dir, step, models={"policy": (model, None)}, state={"n": step}, **kw)


def test_round_trip_restores_weights_optimizer_and_rng_exactly(tmp_path):
    model = tiny_qwen(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(123)
    train_step(model, opt)
    np.random.randn()  # leaves a cached gaussian in numpy's state
    state = {"data_position": 17, "config": {"beta": 0.05, "k": 4}}

    path = save_checkpoint(
        tmp_path,
        3,
        models={"policy": (model, tiny_tokenizer())},
        optimizers={"policy": opt},
        generators={"rollout": gen},
        state=state,
    )
    assert path == tmp_path / "checkpoints" / "step_000003"
    expected_draws = draws(gen)
    saved_params = params(model)
    train_step(model, opt)
    expected_next = params(model)

    # A fresh model/optimizer and scrambled RNGs must come back to exactly the saved point.
    other = tiny_qwen(seed=1)
    opt2 = torch.optim.AdamW(other.parameters(), lr=1e-2)
    gen2 = torch.Generator().manual_seed(999)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    loaded = load_checkpoint(
        latest_checkpoint(tmp_path),
        models={"policy": other},
        optimizers={"policy": opt2},
        generators={"rollout": gen2},
    )
    assert loaded == {"step": 3, **state}
    for k, v in params(other).items():
        assert torch.equal(v, saved_params[k]), k
    assert other.lm_head.weight is other.model.embed_tokens.weight  # tie survives the load
    assert draws(gen2) == expected_draws
    # One more step from the restored state matches the uninterrupted run bit for bit, which
    # needs Adam's moments and step count.
    train_step(other, opt2)
    for k, v in params(other).items():
        assert torch.equal(v, expected_next[k]), k


def test_export_loads_with_plain_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny_qwen(seed=0)
    path = save_checkpoint(
        tmp_path, 1, models={"policy": (model, tiny_tokenizer()), "prm": (model, None)}, state={}
    )
    assert sorted(p.name for p in path.iterdir()) == ["checksums.json", "hf", "rng.pt",
                                                       "trainer_state.json", "weights"]
    assert sorted(p.name for p in (path / "hf").iterdir()) == ["policy", "prm"]
    out = export_checkpoint(path, tmp_path / "export")
    assert out == {"policy": tmp_path / "export" / "policy", "prm": tmp_path / "export" / "prm"}
    reloaded = AutoModelForCausalLM.from_pretrained(out["policy"])
    ids = torch.tensor([[2, 3, 12, 4, 13]])
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
    tok = AutoTokenizer.from_pretrained(out["policy"])
    assert tok("12+3=")["input_ids"] == [3, 4, 12, 5, 13]  # "1"->3, "2"->4, "+"->12, "3"->5
    assert not (out["prm"] / "tokenizer.json").exists()
    with pytest.raises(ValueError, match="no HF config"):
        export_checkpoint(path, tmp_path / "x", names=("critic",))


def test_crash_mid_save_keeps_previous_checkpoint_and_latest(tmp_path, monkeypatch):
    good_model = Tied()
    first = simple_save(tmp_path, 1, good_model)
    real_save = torch.save

    def crash_on_rng(obj, f, *a, **kw):
        if str(f).endswith("rng.pt"):  # the weights (DCP) are already written
            raise OSError("disk full")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(ckpt.torch, "save", crash_on_rng)
    with pytest.raises(OSError, match="disk full"):
        simple_save(tmp_path, 2)
    monkeypatch.undo()

    root = tmp_path / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_000001"
    assert not (root / "step_000002").exists()
    assert latest_checkpoint(tmp_path) == first
    restored = Tied()
    assert load_checkpoint(first, models={"policy": restored}) == {"step": 1, "n": 1}
    assert torch.equal(restored.emb.weight, good_model.emb.weight)


def test_crash_between_rename_and_pointer_update(tmp_path, monkeypatch):
    first = simple_save(tmp_path, 1)

    def crash(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "_write_latest", crash)
    with pytest.raises(KeyboardInterrupt):
        simple_save(tmp_path, 2)
    monkeypatch.undo()
    # The new directory is complete, but `latest` still names the previous one, and nothing was
    # pruned (pruning happens only after the pointer moved).
    assert (tmp_path / "checkpoints" / "step_000002" / "trainer_state.json").is_file()
    assert latest_checkpoint(tmp_path) == first
    assert simple_save(tmp_path, 3) == latest_checkpoint(tmp_path)


def test_leftover_temp_dir_from_a_killed_save_is_ignored_then_removed(tmp_path):
    first = simple_save(tmp_path, 1)
    root = tmp_path / "checkpoints"
    # What `kill -9` halfway through saving step 2 leaves behind: a temp dir with a full
    # trainer_state.json even, and a temp pointer file.
    partial = root / ".tmp-step_000002-deadbeef"
    (partial / "policy").mkdir(parents=True)
    (partial / "trainer_state.json").write_text('{"step": 2}')
    (root / ".tmp-latest-deadbeef").write_text("step_000002\n")
    assert latest_checkpoint(tmp_path) == first
    simple_save(tmp_path, 2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001", "step_000002"]


def test_pruning_keeps_last_n_after_the_new_one_is_complete(tmp_path):
    for step in range(1, 5):
        simple_save(tmp_path, step, keep_last=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000003", "step_000004"]
    assert latest_checkpoint(tmp_path) == root / "step_000004"

    all_kept = tmp_path / "all"
    for step in range(3):
        simple_save(all_kept, step, keep_last=None)
    assert len(list((all_kept / "checkpoints").glob("step_*"))) == 3


def test_resaving_an_existing_step_and_later_steps_are_left_alone(tmp_path):
    simple_save(tmp_path, 5, keep_last=1)
    simple_save(tmp_path, 9, keep_last=1)
    # Resumed from step 5 (say); the abandoned step 9 is not ours to delete, 5 is replaced.
    model = Tied()
    path = simple_save(tmp_path, 5, model, keep_last=1)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000005", "step_000009"]
    assert latest_checkpoint(tmp_path) == path
    restored = Tied()
    load_checkpoint(path, models={"policy": restored})
    assert torch.equal(restored.emb.weight, model.emb.weight)


def test_latest_falls_back_to_highest_complete_step(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    simple_save(tmp_path, 1, keep_last=None)
    simple_save(tmp_path, 2, keep_last=None)
    root = tmp_path / "checkpoints"
    (root / "latest").write_text("step_000007\n")  # names a checkpoint that does not exist
    assert latest_checkpoint(tmp_path) == root / "step_000002"
    (root / "latest").unlink()
    (root / "step_000002" / "trainer_state.json").unlink()  # no longer complete
    assert latest_checkpoint(tmp_path) == root / "step_000001"


def test_plain_module_with_tied_weights_round_trips(tmp_path):
    model = Tied()
    with torch.no_grad():
        model.scale.mul_(3.0)
    path = simple_save(tmp_path, 0, model)
    assert json.loads((path / "trainer_state.json").read_text()) == {"n": 0, "step": 0}
    restored = Tied()
    load_checkpoint(path, models={"policy": (restored, None)})
    assert torch.equal(restored.scale, torch.full((4,), 3.0))
    assert torch.equal(restored.head.weight, model.emb.weight)
    assert restored.head.weight is restored.emb.weight


def test_mismatched_weights_fail_before_touching_the_model(tmp_path):
    path = simple_save(tmp_path, 0)
    wrong = torch.nn.Linear(4, 8)
    before = params(wrong)
    with pytest.raises(ValueError, match="do not match"):
        load_checkpoint(path, models={"policy": wrong})
    assert all(torch.equal(v, before[k]) for k, v in params(wrong).items())


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="state must not contain 'step'"):
        save_checkpoint(tmp_path, 1, state={"step": 1})
    with pytest.raises(ValueError, match="JSON"):
        save_checkpoint(tmp_path, 1, state={"x": object()})
    with pytest.raises(ValueError, match="keep_last"):
        save_checkpoint(tmp_path, 1, keep_last=0)
    with pytest.raises(ValueError, match="step must be >= 0"):
        save_checkpoint(tmp_path, -1)
    assert not (tmp_path / "checkpoints").exists()  # validation happens before any write
    path = simple_save(tmp_path, 1)
    with pytest.raises(ValueError, match="'critic'.* not in checkpoint"):
        load_checkpoint(path, models={"critic": Tied()})
    with pytest.raises(ValueError, match="optimizers"):
        load_checkpoint(path, optimizers={"policy": torch.optim.SGD(Tied().parameters(), lr=1)})
    with pytest.raises(ValueError, match="generators"):
        load_checkpoint(path, generators={"rollout": torch.Generator()})
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "checkpoints" / "step_000042")
