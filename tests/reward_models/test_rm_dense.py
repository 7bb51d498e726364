"""ExplicitRewarder: where the dense rewards land and what each transform does to them."""

from __future__ import annotations

import pytest
import torch

from primekit.config import load_config
from primekit.reward_models.dense import (
    ExplicitRewarder,
    orm_token_rewards,
    transform_step_rewards,
)
from primekit.reward_models.hack_check import batch_from_texts
from primekit.reward_models.orm import last_token_index
from primekit.reward_models.prm import prm_step_scores


@pytest.fixture(scope="module")
def rm_dir(tiny_model_dir, tmp_path_factory):
    """A fixed (random-head) reward model saved like train-orm / train-prm save theirs."""
    from primekit.models.hf import load_tokenizer, save_model
    from primekit.reward_models.heads import init_reward_model

    out = tmp_path_factory.mktemp("rm") / "rm"
    save_model(init_reward_model(tiny_model_dir, seed=1), load_tokenizer(tiny_model_dir), out)
    return out


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    from primekit.models.hf import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    responses = ["3+4=7\n7*2=14\nA:14", "1+1=2\nA:2", "A:5", "9-1=8\n8-1=7\n7-1=6\nA:6"]
    prompts = [tok(p)["input_ids"] for p in ["3+4*2=", "1+1=", "5=", "9-1-1-1="]]
    return tok, batch_from_texts(tok, prompts, responses)


def _cfg(mode: str, path, *extra: str):
    return load_config(
        None, [f"algorithm.reward_mode=explicit-{mode}", f"explicit.model_path={path}", *extra]
    )


def test_transform_step_rewards_dispatch_and_eta_check():
    probs = torch.tensor([[0.9, 0.4, 0.8]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    # Clip, eta 0.5: min(r - 0.5, 0) -> [0, -0.1, 0]; Delta on that: [0 - (-0.1), -0.1, 0].
    assert torch.allclose(
        transform_step_rewards(probs, mask, "clip", eta=0.5), torch.tensor([[0.0, -0.1, 0.0]])
    )
    assert torch.allclose(
        transform_step_rewards(probs, mask, "clip-delta", eta=0.5), torch.tensor([[0.1, -0.1, 0.0]])
    )
    # length penalty c = 0.1: r_k - k c with k = 1, 2, 3
    assert torch.allclose(
        transform_step_rewards(probs, mask, "length-penalty", length_penalty=0.1),
        torch.tensor([[0.8, 0.2, 0.5]]),
    )
    for bad in (0.0, -0.2, 1.5):
        with pytest.raises(ValueError, match="explicit.eta"):
            transform_step_rewards(probs, mask, "clip", eta=bad)
    with pytest.raises(ValueError, match="transform"):
        transform_step_rewards(probs, mask, "sqrt")


def test_orm_token_rewards_on_last_valid_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    out = orm_token_rewards(torch.tensor([0.7, 0.2, 0.9]), mask)
    assert torch.equal(out, torch.tensor([[0, 0, 0.7, 0], [0.2, 0, 0, 0], [0, 0, 0, 0]]))


def test_orm_rewarder(rm_dir, batch):
    tok, b = batch
    rewarder = ExplicitRewarder(_cfg("orm", rm_dir), tok)
    rewards, metrics = rewarder.token_rewards(b)
    last = last_token_index(b.response_mask)
    nonzero = rewards.nonzero().tolist()
    assert nonzero == [[i, int(last[i])] for i in range(len(b))]
    assert torch.all((rewards > 0) & (rewards < 1) | (rewards == 0))
    assert metrics["explicit/orm_score_mean"] == pytest.approx(float(rewards.sum(1).mean()))


@pytest.mark.parametrize(
    "transform", ["none", "clip", "delta", "clip-delta", "length-norm", "length-penalty", "normed"]
)
def test_prm_rewarder_places_transformed_step_rewards(rm_dir, batch, transform):
    tok, b = batch
    cfg = _cfg(
        "prm",
        rm_dir,
        f"explicit.transform={transform}",
        "explicit.eta=0.5",
        "explicit.length_penalty=0.05",
    )
    rewards, metrics = ExplicitRewarder(cfg, tok).token_rewards(b)
    from primekit.reward_models.heads import load_reward_model

    probs, pos, step_mask = prm_step_scores(
        load_reward_model(rm_dir), tok, b, delimiter="\n",
        micro_batch_size=cfg.policy.micro_batch_size,  # the rewarder's batching, the same floats
    )
    expect = transform_step_rewards(probs, step_mask, transform, eta=0.5, length_penalty=0.05)
    # Each step's reward sits on its step's last token and nowhere else.
    for i in range(len(b)):
        for k in range(int(step_mask[i].sum())):
            assert float(rewards[i, pos[i, k]]) == pytest.approx(float(expect[i, k]), abs=1e-6)
        off = torch.ones(rewards.shape[1], dtype=torch.bool)
        off[pos[i][step_mask[i]]] = False
        assert torch.all(rewards[i, off] == 0)
    returns = rewards.sum(1)
    assert metrics["explicit/dense_return_mean"] == pytest.approx(float(returns.mean()), abs=1e-6)
    assert metrics["explicit/steps_mean"] == 2.5  # (3 + 2 + 1 + 4) / 4
    if transform in ("clip", "clip-delta"):
        assert torch.all(rewards <= 0)
    if transform in ("delta", "clip-delta"):
        # Theorem 1: the return telescopes to the (clipped) first-step reward; 0 with one step.
        base = probs if transform == "delta" else (probs - 0.5).clamp(max=0)
        k_steps = step_mask.sum(1)
        expect_ret = torch.where(k_steps >= 2, base[:, 0], torch.zeros(len(b)))
        assert torch.allclose(returns, expect_ret, atol=1e-6)


def test_rewarder_rejects_bad_setups(rm_dir, batch):
    tok, _ = batch
    with pytest.raises(ValueError, match="explicit.eta"):
        ExplicitRewarder(_cfg("prm", rm_dir, "explicit.transform=clip"), tok)
    cfg = _cfg("prm", rm_dir)
    cfg.algorithm.reward_mode = "prime"
    with pytest.raises(ValueError, match=r"algorithm.reward_mode: ExplicitRewarder needs one of "
                                         r"\['explicit-orm', 'explicit-prm', 'oracle-prm'\], "
                                         r"got 'prime'"):
        ExplicitRewarder(cfg, tok)
    cfg = _cfg("orm", rm_dir)
    cfg.explicit.model_path = None
    with pytest.raises(ValueError, match=r"explicit.model_path: reward_mode=explicit-orm needs a "
                                         r"trained reward model \(primekit train-orm\)"):
        ExplicitRewarder(cfg, tok)


def test_eta_auto_reads_the_prms_suggestion(rm_dir, batch, tmp_path):
    import json
    import shutil

    from primekit.config import ConfigError

    tok, b = batch
    prm = tmp_path / "prm"
    shutil.copytree(rm_dir, prm)
    auto = ["explicit.transform=clip", "explicit.eta=auto"]
    # no train_metrics.json beside the PRM: a configuration error naming the fix
    with pytest.raises(ConfigError, match=r"explicit.eta=auto: no step_prm/suggested_eta in "):
        ExplicitRewarder(_cfg("prm", prm, *auto), tok)
    # transforms that do not read eta do not need it
    assert ExplicitRewarder(_cfg("prm", prm, "explicit.eta=auto"), tok).eta == 0.0
    (prm / "train_metrics.json").write_text(json.dumps({"summary": {"step_prm/suggested_eta": 0.5}}))
    rewarder = ExplicitRewarder(_cfg("prm", prm, *auto), tok)
    assert rewarder.eta == 0.5
    # the same rewards as eta given as the number
    rewards, _ = rewarder.token_rewards(b)
    given, _ = ExplicitRewarder(_cfg("prm", prm, "explicit.transform=clip", "explicit.eta=0.5"),
                                tok).token_rewards(b)
    assert torch.equal(rewards, given)


def _problem(expression: str):
    from primekit.data.arithmetic import demonstration
    from primekit.data.problem import Problem

    return Problem(id=expression, prompt=expression, task="arithmetic",
                   solution=demonstration(expression))


def test_oracle_step_scores_label_each_step_against_the_reference(batch):
    from primekit.reward_models.dense import oracle_step_scores

    tok, b = batch
    # References: "3+4=7\n7*2=14\nA:14", "1+1=2\nA:2", "A:5" is not 4+1's "4+1=5\nA:5",
    # "9-1=8\n8-1=7\n7-1=6\nA:6" follows 9-1-1-2's reference for two steps, then writes
    # "7-1=6\n" where it has "7-2=5\n".
    problems = [_problem("3+4*2="), _problem("1+1="), _problem("4+1="), _problem("9-1-1-2=")]
    probs, positions, step_mask = oracle_step_scores(tok, b, problems, delimiter="\n")
    assert step_mask.sum(1).tolist() == [3, 2, 1, 4]
    expected = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    assert torch.equal(probs, expected)
    # positions are the step ends segment_batch finds: "3+4=7\n" ends on token 5 (character
    # tokenizer), "7*2=14\n" on 12, "A:14" on 16
    assert positions[0, :3].tolist() == [5, 12, 16]
    with pytest.raises(ValueError, match="reference solution"):
        oracle_step_scores(tok, b, problems[:3] + [problems[3].__class__(id="x", prompt="1=")],
                           delimiter="\n")


def test_oracle_rewarder_delta_credits_each_step_with_its_own_label(batch):
    tok, b = batch
    problems = [_problem("3+4*2="), _problem("1+1="), _problem("4+1="), _problem("9-1-1-2=")]
    cfg = load_config(None, ["algorithm.reward_mode=oracle-prm", "explicit.transform=delta"])
    rewarder = ExplicitRewarder(cfg, tok)
    assert rewarder.model is None
    rewards, metrics = rewarder.token_rewards(b, problems)
    # Delta (Gao et al. Eq. 6) of labels [1, 1, 0, 0] (row 3), K = 4: r_0 - r_1 = 0, r_1 - r_2 = 1,
    # r_2 = 0 kept at k = K-2, and the last step's dropped (the success reward covers it):
    # [0, 1, 0, 0] on the ends of "9-1=8\n" (5), "8-1=7\n" (11), "7-1=6\n" (17) and "A:6" (20),
    # so the return from any token of step k < K-1 is that step's own label.
    assert rewards[3].nonzero().flatten().tolist() == [11]
    assert rewards[3, 11] == 1.0
    # row 0, labels [1, 1, 1]: [0, 1, 0], on the end of "7*2=14\n" (12); row 2 (K = 1): nothing
    assert rewards[0].nonzero().flatten().tolist() == [12] and rewards[2].abs().sum() == 0
    # 10 steps, 3 + 2 + 0 + 2 = 7 of them labelled 1; the dense returns (rows 0-3: 1, 1 (row 1's
    # [1, 1] keeps r_0 at k = K-2), 0, 1) average 3 / 4
    assert metrics["explicit/steps_mean"] == pytest.approx(10 / 4)
    assert metrics["explicit/prm_prob_mean"] == pytest.approx(7 / 10)
    assert metrics["explicit/dense_return_mean"] == pytest.approx(3 / 4)
    with pytest.raises(ValueError, match="problems"):
        rewarder.token_rewards(b)


def test_oracle_reward_mode_checks(batch):
    from primekit.config import ConfigError

    with pytest.raises(ConfigError, match="procedural families"):
        load_config(None, ["algorithm.reward_mode=oracle-prm", "data.task_family=rgym:chain_sum"])
    with pytest.raises(ConfigError, match="explicit.eta"):
        load_config(None, ["algorithm.reward_mode=oracle-prm", "explicit.transform=clip",
                           "explicit.eta=auto"])
    # no model path needed, min-form credit allowed
    cfg = load_config(None, ["algorithm.reward_mode=oracle-prm", "algorithm.credit=min"])
    assert ExplicitRewarder(cfg, batch[0]).mode == "oracle"
