"""Token heatmaps: the colours are the implicit rewards the algorithm functions compute."""

from __future__ import annotations

import re

import pytest
import torch

from primekit.algorithms.implicit_prm import implicit_token_rewards
from primekit.models.logprobs import sequence_logprobs
from primekit.rollout.base import RolloutBatch
from primekit.viz.heatmap import (
    NEGATIVE,
    POSITIVE,
    draw_png,
    reward_color,
    rows_of,
    write_html,
    write_png,
)
from primekit.viz.scoring import Scored, decode_tokens, token_rewards_for


def test_reward_color_scale():
    assert reward_color(0.0, 1.0) == "#ffffff"
    assert reward_color(1.0, 1.0) == "#{:02x}{:02x}{:02x}".format(*POSITIVE)
    assert reward_color(-5.0, 1.0) == "#{:02x}{:02x}{:02x}".format(*NEGATIVE)  # saturates
    # half-way to green (26, 158, 59): 255 + (26 - 255) / 2 = 140.5 -> 140 = 0x8c (round half
    # to even), 255 + (158 - 255) / 2 = 206.5 -> 206 = 0xce, 255 + (59 - 255) / 2 = 157 = 0x9d
    assert reward_color(0.5, 1.0) == "#8cce9d"


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    """The tiny model as reference, and a copy with perturbed weights as the 'trained' PRM."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prm = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in prm.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return ref, prm, AutoTokenizer.from_pretrained(tiny_model_dir)


def test_heatmap_colours_match_the_implicit_rewards(models, tmp_path):
    ref, prm, tok = models
    prompts = [tok("12+3=")["input_ids"], tok("7*8-1=")["input_ids"]]
    responses = [tok("15\nA:15")["input_ids"], tok("55\nA:55")["input_ids"][:4]]
    P, T = max(map(len, prompts)), max(map(len, responses))
    pad = tok.pad_token_id
    prompt_ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])  # [2, P] left-padded
    prompt_mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    response_ids = torch.tensor([r + [pad] * (T - len(r)) for r in responses])  # [2, T]
    response_mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in responses])
    batch = RolloutBatch(prompt_ids, prompt_mask, response_ids, response_mask,
                         torch.zeros(2, T), torch.ones(2, dtype=torch.bool),
                         [tok.decode(r) for r in responses])
    rewards = token_rewards_for(prm, ref, batch, beta=0.5, micro_batch_size=8)

    # The same rewards straight from the algorithm functions, one row at a time, no padding.
    for i in range(2):
        ids = torch.tensor([prompts[i] + responses[i]])
        lp = [sequence_logprobs(m, ids, torch.ones_like(ids), len(responses[i]))[0]
              for m in (prm, ref)]
        mask = torch.ones(1, len(responses[i]))
        expected = implicit_token_rewards(lp[0].detach(), lp[1].detach(), mask, 0.5)[0]
        assert rewards[i, : len(responses[i])] == pytest.approx(expected, abs=1e-5)
        assert (rewards[i, len(responses[i]):] == 0).all()
    assert rewards.abs().max() > 1e-3  # the perturbed PRM does give non-zero rewards

    problems = [type("P", (), {"prompt": "12+3="})(), type("P", (), {"prompt": "7*8-1="})()]
    scored = Scored(problems=problems, responses=batch.responses,
                    tokens=decode_tokens(tok, response_ids, response_mask),
                    scores=torch.tensor([1.0, 0.0]), statuses=["correct", "incorrect"],
                    token_rewards=rewards, response_mask=response_mask.float(), k=1, beta=0.5)
    rows = rows_of(scored)
    html = write_html(rows, tmp_path / "h.html", "test", scale=0.01).read_text()
    spans = re.findall(r'background:(#[0-9a-f]{6})" data-reward="([^"]+)"', html)
    flat = [float(r) for i in range(2) for r in rewards[i, : len(responses[i])]]
    assert len(spans) == len(flat) == len(responses[0]) + len(responses[1])
    for (colour, shown), r in zip(spans, flat):
        assert colour == reward_color(r, 0.01)
        assert float(shown) == pytest.approx(r, rel=1e-5, abs=1e-9)
        # green for positive rewards, red for negative: the sign is visible
        red, green = int(colour[1:3], 16), int(colour[3:5], 16)
        assert (green > red) if r > 1e-3 else (red > green) if r < -1e-3 else True
    assert "correct (score 1.00)" in html and "incorrect (score 0.00)" in html
    png = write_png(rows, tmp_path / "h.png", "test")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_png_lays_characters_out_as_the_text_reads():
    # "13" must read "13", not "1 3": each line is one string in a monospace font, and the cell
    # behind character x spans [x, x + 1) in units of the font's own glyph advance.
    import matplotlib.pyplot as plt

    row = {"prompt": "Q:6+7=", "tokens": ["13", "\n", "A", ":", "13"],
           "rewards": [0.5, 0.0, -0.2, 0.0, 0.5], "score": 1.0, "status": "correct"}
    fig = draw_png([row], "t", width=20)
    try:
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        texts = {t.get_text(): t for t in ax.texts}
        line = texts["13\u23ceA:13"]  # the response's characters, one string
        unit = ax.transData.transform((1, 0))[0] - ax.transData.transform((0, 0))[0]  # px
        n = 100
        advance = renderer.get_text_width_height_descent("0" * n, line.get_fontproperties(),
                                                         ismath=False)[0] / n
        assert unit == pytest.approx(advance, rel=1e-6)  # a cell is one glyph advance wide
        box = line.get_window_extent(renderer)
        assert box.width == pytest.approx(7 * unit, rel=0.02)  # 7 characters, no gaps
        assert box.x0 == pytest.approx(ax.transData.transform((0, 0))[0], abs=1)
        # The cells: one per coloured character, at x = 0, 1, 3, 5, 6 (the "\n" and ":" are 0).
        cells = sorted((round(p.get_x()), p.get_facecolor()) for p in ax.patches)
        assert [x for x, _ in cells] == [0, 1, 3, 5, 6]
        assert "13\u23ceA:13" in texts and any(t.startswith("OK Q:6+7=") for t in texts)
    finally:
        plt.close(fig)
