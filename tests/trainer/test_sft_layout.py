"""SFT's loss through RL's micro-batches (trainer/sft.py): padded, packed and token-budget layouts
give the loss and gradients of the plain full-logits cross-entropy (fp32, within 1e-6)."""

from __future__ import annotations

import pytest
import torch

from primekit.config import SFTConfig
from primekit.rollout.base import batch_from_texts
from primekit.rollout.batching import iter_layout
from primekit.trainer.sft import response_token_loss, sft_backward, sft_layout


class CharTokenizer:
    """ord(c) per character; EOS 1, pad 0 (ids stay below the tiny model's vocabulary)."""

    eos_token_id, pad_token_id = 1, 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) % 90 + 3 for c in text]}


PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]
RESPONSES = ["1+2=3", "4*5=20\nA:20", "x", "7-3=4\n4+1=5"]


def _reference_loss(model, tokenizer) -> torch.Tensor:
    """The textbook SFT loss on right-padded rows: logits at every column, labels -100 on the
    prompt and padding, mean cross-entropy over the next-token targets."""
    rows, labels = [], []
    for p, text in zip(PROMPTS, RESPONSES):
        r = tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p + r)
        labels.append([-100] * len(p) + r)
    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    lab = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, la) in enumerate(zip(rows, labels)):
        ids[i, : len(r)], lab[i, : len(la)], mask[i, : len(r)] = torch.tensor(r), torch.tensor(la), 1
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # [n, L-1, V]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             lab[:, 1:].reshape(-1), ignore_index=-100)


def _layout_loss(model, tokenizer, max_tokens: int, packing: str) -> tuple[float, int]:
    """run_sft's forward and backward (`sft_backward`) in one layout: the loss, micro-batches."""
    batch = batch_from_texts(tokenizer, PROMPTS, RESPONSES)
    layout = sft_layout(SFTConfig(batch_size=4, max_tokens_per_micro_batch=max_tokens,
                                  packing=packing))
    metrics = sft_backward(model, batch, layout)
    assert metrics["sft/tokens"] == (5 + 11 + 1 + 11) + 4  # the responses' characters, 4 EOS
    return metrics["sft/loss"], len(list(iter_layout(batch, layout)))


def test_demonstrations_in_rollout_layout():
    batch = batch_from_texts(CharTokenizer(), [[5, 6], [7]], ["ab", "c"])
    # Prompts left-padded, responses (the text's ids, then EOS 1) right-padded with 0.
    assert batch.prompt_ids.tolist() == [[5, 6], [0, 7]]
    assert batch.prompt_mask.tolist() == [[1, 1], [0, 1]]
    a, b, c = (ord(ch) % 90 + 3 for ch in "abc")
    assert batch.response_ids.tolist() == [[a, b, 1], [c, 1, 0]]
    assert batch.response_mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def test_response_token_loss_by_hand():
    # Two micro-batches of a batch with 4 response tokens: log-probs -1, -2, -3 (the 0 at a
    # masked position is ignored) and -6. Shares (1 + 2 + 3) / 4 = 1.5 and 6 / 4 = 1.5, summing
    # to the batch mean 12 / 4 = 3.
    lp = torch.tensor([[-1.0, -2.0], [-3.0, -5.0]])
    loss, metrics = response_token_loss(lp, torch.tensor([[1, 1], [1, 0]]), 4)
    assert loss.item() == pytest.approx(1.5) and metrics["sft/tokens"] == 3
    loss, _ = response_token_loss(torch.tensor([[-6.0]]), torch.tensor([[True]]), 4)
    assert loss.item() == pytest.approx(1.5)


@pytest.mark.parametrize("max_tokens,packing,micro", [
    (0, "packed", 1),      # no budget: the whole batch one padded micro-batch
    (64, "packed", 1),     # packed, one micro-batch
    (16, "packed", 3),     # packed, gradients accumulated over several
    (16, "sorted", 4),     # length-sorted padded rows, several
])
def test_sft_layouts_match_full_logits_loss(tiny_model_dir, max_tokens, packing, micro):
    from primekit.models.hf import load_model

    tokenizer = CharTokenizer()
    model = load_model(str(tiny_model_dir), dtype=torch.float32, device="cpu")
    ref = _reference_loss(model, tokenizer)
    ref.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    loss, n_micro = _layout_loss(model, tokenizer, max_tokens, packing)
    assert n_micro == micro
    assert loss == pytest.approx(ref.item(), abs=1e-6)
    for g, r in zip((p.grad for p in model.parameters()), ref_grads):
        assert torch.allclose(g, r, atol=1e-6, rtol=0)


def test_runs_into_one_parent_build_their_own_initial_models(tmp_path):
    """Each `primekit sft` from the tiny model builds its random init beside its own out_dir
    (`<name>-tiny-init`, as `<name>-logs`): two runs writing into one directory, with different
    seeds, never replace (or load) each other's initial model."""
    from safetensors.torch import load_file

    from primekit.config import CONFIG_DIR, load_config
    from primekit.trainer.sft import run_sft

    for name, seed in (("a", 0), ("b", 1)):
        run_sft(load_config(CONFIG_DIR / "tiny.yaml", [
            f"sft.out_dir={tmp_path / name}", f"sft.seed={seed}", "sft.steps=0",
            "data.num_train=64", "train.report_to=[]"]))
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert names == ["a", "a-logs", "a-tiny-init", "b", "b-logs", "b-tiny-init"]
    init_a = load_file(tmp_path / "a-tiny-init" / "model.safetensors")
    init_b = load_file(tmp_path / "b-tiny-init" / "model.safetensors")
    key = "model.embed_tokens.weight"
    assert not torch.equal(init_a[key], init_b[key])  # seeds 0 and 1
    # sft.steps=0 saves the initial model as it was built.
    assert torch.equal(load_file(tmp_path / "a" / "model.safetensors")[key], init_a[key])


@pytest.mark.parametrize("max_tokens,columns", [(0, 68), (64, 48)])
def test_sft_reports_the_padding_it_computes(tiny_model_dir, max_tokens, columns):
    # Prompt + response (EOS included) lengths 3 + 6, 1 + 12, 5 + 2 and 2 + 12: 43 tokens.
    # One padded micro-batch: 4 rows x (5 + 12) = 68 columns, 25 of them padding. Packed: rows of
    # 24 columns (1x-2x the longest, 14, whichever computes fewest), [14 | 9] and [13 | 7]: 48
    # columns, 5 of them padding.
    from primekit.models.hf import load_model

    model = load_model(str(tiny_model_dir), dtype=torch.float32, device="cpu")
    batch = batch_from_texts(CharTokenizer(), PROMPTS, RESPONSES)
    layout = sft_layout(SFTConfig(batch_size=4, max_tokens_per_micro_batch=max_tokens))
    metrics = sft_backward(model, batch, layout)
    assert metrics["sft/columns"] == columns
    assert metrics["sft/padding"] == pytest.approx(1 - 43 / columns)
