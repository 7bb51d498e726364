"""The synthetic repetition check: variants, per-design returns, and the paper's invariants."""

from __future__ import annotations

import pytest
import torch

from primekit.data.arithmetic import ArithmeticTask
from primekit.reward_models.hack_check import (
    DESIGNS,
    VARIANTS,
    design_returns,
    make_variant,
    plot_hack_check,
    run_hack_check,
)
from primekit.verifiers.arithmetic import ArithmeticVerifier

TEXT = "3+4=7\n7*2=14\n14-5=9\nA:9"


def test_variants_of_a_response():
    kw = {"delimiter": "\n", "separator": "\n"}
    # 4 steps: the middle step before the answer is index (4-1)//2 = 1, "7*2=14\n".
    assert make_variant(TEXT, "repeat-mid", 2, **kw) == "3+4=7\n7*2=14\n7*2=14\n7*2=14\n14-5=9\nA:9"
    assert make_variant(TEXT, "nonsense", 3, **kw, nonsense=("ok", "so")) == (
        "3+4=7\n7*2=14\n14-5=9\nok\nso\nok\nA:9"
    )
    assert make_variant(TEXT, "repeat-last", 2, **kw) == "3+4=7\n7*2=14\n14-5=9\nA:9\nA:9\nA:9"
    assert make_variant("1+1=2\nA:2\n", "repeat-last", 1, **kw) == "1+1=2\nA:2\nA:2\n"
    for kind in VARIANTS:
        assert make_variant(TEXT, kind, 0, **kw) == TEXT
    with pytest.raises(ValueError, match="two steps"):
        make_variant("A:9", "nonsense", 1, **kw)
    with pytest.raises(ValueError, match="kind"):
        make_variant(TEXT, "shuffle", 1, **kw)


def test_variants_stay_correct():
    problem = ArithmeticTask().make_problem("3+4*2-5", "p")
    v = ArithmeticVerifier()
    for kind in VARIANTS:
        text = make_variant(TEXT, kind, 5, delimiter="\n", separator="\n")
        assert v.verify(text, problem).status == "correct", text


def test_design_returns_hand_computed():
    probs = torch.tensor([[0.9, 0.8, 0.9]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    r = design_returns(probs, mask, eta=0.85, length_penalty=0.1)
    assert set(r) == set(DESIGNS)
    assert float(r["PR"][0]) == pytest.approx(2.6)
    # Clip: min(r - 0.85, 0) = [0, -0.05, 0]
    assert float(r["PR-Clip"][0]) == pytest.approx(-0.05)
    # Delta: [0.9 - 0.8, 0.8, 0] -> 0.9 = r_proc of step 1 (Theorem 1)
    assert float(r["PR-Delta"][0]) == pytest.approx(0.9)
    # Clip-Delta: clipped [0, -0.05, 0] -> [0.05, -0.05, 0] -> 0 = clipped first step
    assert float(r["PR-Clip-Delta"][0]) == pytest.approx(0.0, abs=1e-7)
    assert float(r["PR-LenNorm"][0]) == pytest.approx(2.6 / 3)
    # length penalty: 2.6 - 0.1 * (1 + 2 + 3)
    assert float(r["PR-LenPenalty"][0]) == pytest.approx(2.0)


class ConstantPRM(torch.nn.Module):
    """A PRM that rates every prefix sigmoid(2) ~ 0.88: the naive RM the hack exploits."""

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        from types import SimpleNamespace

        return SimpleNamespace(logits=torch.full((*input_ids.shape, 1), 2.0))


def _setup(tiny_model_dir, n=6):
    from primekit.models.hf import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    problems = ArithmeticTask(min_operands=3, max_operands=4).problems(n, split="test", seed=0)
    prompts = [tok(p.prompt)["input_ids"] for p in problems]
    return tok, problems, prompts, [p.solution for p in problems]


def test_fixed_prm_delta_never_grows_and_clip_never_positive(tiny_model_dir, tmp_path):
    from primekit.reward_models.heads import init_reward_model

    tok, problems, prompts, responses = _setup(tiny_model_dir)
    prm = init_reward_model(tiny_model_dir, seed=0).eval()  # a fixed (random-head) PRM
    result = run_hack_check(
        prm,
        tok,
        problems,
        prompts,
        responses,
        ArithmeticVerifier(),
        delimiter="\n",
        separator="\n",
        eta=0.5,
        length_penalty=0.05,
        max_repeats=4,
        micro_batch_size=7,
    )
    R = result.returns
    assert R["PR"].shape == (len(VARIANTS), 5, len(responses))
    assert bool((result.correct == 1).all())
    # Delta: the return is r_process of the first step, which no later step can change.
    for d in ("PR-Delta", "PR-Clip-Delta"):
        assert torch.all(R[d][:, 1:] <= R[d][:, :1] + 1e-5), d
    # Clip: min(r - eta, 0) is never positive, so neither is any return.
    assert torch.all(R["PR-Clip"] <= 0) and torch.all(R["PR-Clip-Delta"] <= 0)
    # More steps, more (or equal) steps counted.
    assert torch.all(result.steps[:, 1:] > result.steps[:, :1])
    rows = result.rows
    assert rows[0]["variant"] == "original" and len(rows) == 1 + len(VARIANTS) * 4
    assert plot_hack_check(result, tmp_path / "h.png").stat().st_size > 1000


def test_constant_prm_plain_pr_is_hacked_and_clip_delta_is_not(tiny_model_dir):
    tok, problems, prompts, responses = _setup(tiny_model_dir, n=3)
    result = run_hack_check(
        ConstantPRM(),
        tok,
        problems,
        prompts,
        responses,
        ArithmeticVerifier(),
        delimiter="\n",
        separator="\n",
        eta=0.95,
        length_penalty=0.0,
        max_repeats=3,
        micro_batch_size=7,
    )
    R = result.returns
    p = torch.sigmoid(torch.tensor(2.0))
    # PR: every extra step adds p, so each variant with k repeats out-scores the original by k p.
    for k in range(4):
        assert torch.allclose(R["PR"][:, k] - R["PR"][:, 0], k * p * torch.ones(3, 3), atol=1e-5)
    gains = result.max_gain()
    assert gains["PR"] > 0 and gains["PR-LenNorm"] == pytest.approx(0.0, abs=1e-6)
    # Clip with eta above p: every step costs p - eta < 0, so repetition lowers the return.
    assert gains["PR-Clip"] < 0
    assert gains["PR-Delta"] == pytest.approx(0.0, abs=1e-6)
    assert gains["PR-Clip-Delta"] == pytest.approx(0.0, abs=1e-6)
