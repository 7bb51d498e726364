import pytest
import torch

from primekit.algorithms.process_rewards import (
    PROCESS_REWARD_TRANSFORMS,
    clip_delta_step_rewards,
    clip_step_rewards,
    delta_step_rewards,
    length_normalised_step_rewards,
    length_penalty_step_rewards,
    normed_step_rewards,
    place_step_rewards,
    step_end_positions_from_mask,
    step_returns,
)

D = torch.float64


def left_mask(lengths, S):
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]


def random_steps(seed, n=8, S=7, lo=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, S + 1, (n,), generator=g).tolist()
    return torch.rand(n, S, generator=g, dtype=D), left_mask(lengths, S), lengths


def test_place_step_rewards_and_positions_roundtrip():
    end = torch.tensor([[0, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    pos, sm = step_end_positions_from_mask(end)
    assert pos.tolist() == [[1, 4], [0, -1], [-1, -1]]
    assert sm.tolist() == [[True, True], [True, False], [False, False]]
    r = torch.tensor([[0.3, 0.9], [0.5, 7.0], [1.0, 1.0]], dtype=D)
    dense = place_step_rewards(r, pos, T=6)
    expected = torch.zeros(3, 6, dtype=D)
    expected[0, 1], expected[0, 4], expected[1, 0] = 0.3, 0.9, 0.5
    assert torch.equal(dense, expected)
    with pytest.raises(ValueError, match="step_end_positions"):
        place_step_rewards(r, torch.tensor([[1, 6], [0, -1], [-1, -1]]), T=6)


def test_clip_hand_and_never_positive():
    r = torch.tensor([[0.9, 0.3, 0.7, 0.2]], dtype=D)
    m = left_mask([3], 4)
    # min(r - 0.5, 0): 0.4 -> 0, -0.2, 0.2 -> 0; padding 0
    assert torch.allclose(
        clip_step_rewards(r, m, eta=0.5), torch.tensor([[0.0, -0.2, 0.0, 0.0]], dtype=D)
    )
    for seed in range(5):
        rr, mm, _ = random_steps(seed)
        for eta in (-0.5, 0.0, 0.3):
            assert torch.all(clip_step_rewards(rr, mm, eta) <= 0)


def test_delta_hand():
    r = torch.tensor([[0.9, 0.3, 0.7, 0.8], [0.6, 0.2, 0.0, 0.0], [0.4, 0.0, 0.0, 0.0]], dtype=D)
    m = left_mask([4, 2, 1], 4)
    d = delta_step_rewards(r, m)
    # K=4: [0.9-0.3, 0.3-0.7, 0.7 (k = K-2 keeps its reward), 0 (last step dropped)]
    # K=2: [0.6, 0]; K=1: [0]
    expected = torch.tensor(
        [[0.6, -0.4, 0.7, 0.0], [0.6, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=D
    )
    assert torch.allclose(d, expected)
    # returns from each step: [0.9, 0.3, 0.7, 0] = r_proc_k for k <= K-2, 0 at the last step
    assert torch.allclose(step_returns(d, m)[0], torch.tensor([0.9, 0.3, 0.7, 0.0], dtype=D))


def test_clip_delta_hand():
    r = torch.tensor([[0.9, 0.3, 0.7, 0.8]], dtype=D)
    m = torch.ones(1, 4, dtype=torch.bool)
    # clip(eta = 0.5): [0, -0.2, 0, 0]; delta: [0 - (-0.2), -0.2 - 0, 0, 0]
    got = clip_delta_step_rewards(r, m, eta=0.5)
    assert torch.allclose(got, torch.tensor([[0.2, -0.2, 0.0, 0.0]], dtype=D))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_delta_return_equals_gao_theorem_1(seed, alpha):
    # Return from step k (0-based, success reward on the final step) =
    #   alpha * r_proc_k + Correct for k <= K-2, Correct for the last step (Gao et al. Thm. 1)
    r, m, lengths = random_steps(seed)
    correct = torch.randint(0, 2, (r.shape[0],), generator=torch.Generator().manual_seed(seed)).to(
        D
    )
    dense = alpha * delta_step_rewards(r, m)
    dense = (
        dense
        + torch.nn.functional.one_hot(torch.tensor(lengths) - 1, r.shape[1]).to(D)
        * correct[:, None]
    )
    ret = step_returns(dense, m)
    for i, K in enumerate(lengths):
        for k in range(K):
            want = alpha * r[i, k] + correct[i] if k < K - 1 else correct[i]
            assert ret[i, k].item() == pytest.approx(want.item(), abs=1e-12)


def _duplicate(row, K, j):
    steps = row[:K].tolist()
    return steps[: j + 1] + [steps[j]] + steps[j + 1 :]


def _first_return(transform, steps, **kw):
    r = torch.tensor([steps], dtype=D)
    m = torch.ones_like(r, dtype=torch.bool)
    return step_returns(transform(r, m, **kw), m)[0, 0].item()


@pytest.mark.parametrize("seed", range(5))
def test_repeating_a_step_never_raises_the_delta_return(seed):
    r, _, lengths = random_steps(seed, lo=1)
    for i, K in enumerate(lengths):
        for j in range(K):
            orig, dup = r[i, :K].tolist(), _duplicate(r[i], K, j)
            # Clip-Delta: never higher, for any K (clipped rewards are <= 0)
            assert (
                _first_return(clip_delta_step_rewards, dup, eta=0.5)
                <= _first_return(clip_delta_step_rewards, orig, eta=0.5) + 1e-12
            )
            if K >= 2:
                # Delta with K >= 2: the return from the first step is r_proc_0 either way
                assert _first_return(delta_step_rewards, dup) == pytest.approx(
                    _first_return(delta_step_rewards, orig), abs=1e-12
                )
            # raw PR: a repeated step adds its (positive) reward: the hack Gao et al. describe
            assert _first_return(PROCESS_REWARD_TRANSFORMS["none"], dup) > _first_return(
                PROCESS_REWARD_TRANSFORMS["none"], orig
            )


def test_delta_single_step_exception_is_bounded():
    # K = 1: the only step is the last, so Delta gives return 0; duplicating it makes K = 2 and the
    # return r_proc_0. Delta alone can rise here (bounded by max PRM score); Clip-Delta cannot.
    assert _first_return(delta_step_rewards, [0.8]) == 0.0
    assert _first_return(delta_step_rewards, [0.8, 0.8]) == pytest.approx(0.8)
    assert _first_return(clip_delta_step_rewards, [0.8, 0.8], eta=0.9) == pytest.approx(-0.1)


def test_length_norm_and_penalty_hand():
    r = torch.tensor([[0.5, 0.5, 0.5, 9.0], [0.6, 0.2, 9.0, 9.0]], dtype=D)
    m = left_mask([3, 2], 4)
    # r / K: K = 3 and 2
    assert torch.allclose(
        length_normalised_step_rewards(r, m),
        torch.tensor([[0.5 / 3, 0.5 / 3, 0.5 / 3, 0.0], [0.3, 0.1, 0.0, 0.0]], dtype=D),
    )
    # r_k - k * c with 1-based k, c = 0.1: [0.4, 0.3, 0.2], [0.5, 0.0]
    assert torch.allclose(
        length_penalty_step_rewards(r, m, 0.1),
        torch.tensor([[0.4, 0.3, 0.2, 0.0], [0.5, 0.0, 0.0, 0.0]], dtype=D),
    )


def test_normed_batch_and_group():
    r = torch.tensor([[1.0, 3.0], [5.0, 9.0]], dtype=D)
    m = left_mask([2, 1], 2)
    # batch: valid 1, 3, 5: mean 3, population std sqrt(8/3)
    s = (8 / 3) ** 0.5
    got = normed_step_rewards(r, m, eps=0.0)
    assert torch.allclose(got, torch.tensor([[-2 / s, 0.0], [2 / s, 0.0]], dtype=D))
    # per group (each row its own group): row 1 -> [-1, 1]; row 2 has one step -> 0
    got_g = normed_step_rewards(r, m, eps=1e-12, group_ids=torch.tensor([4, 2]))
    assert torch.allclose(got_g, torch.tensor([[-1.0, 1.0], [0.0, 0.0]], dtype=D))
    rr, mm, _ = random_steps(1, n=10)
    z = normed_step_rewards(rr, mm)[mm]
    assert z.mean().abs().item() < 1e-10 and z.std(unbiased=False).item() == pytest.approx(
        1.0, abs=1e-6
    )


def test_transforms_dict_and_mask_validation():
    assert set(PROCESS_REWARD_TRANSFORMS) == {
        "none",
        "clip",
        "delta",
        "clip-delta",
        "length-norm",
        "length-penalty",
        "normed",
    }
    with pytest.raises(ValueError, match="left-aligned"):
        delta_step_rewards(torch.zeros(1, 3), torch.tensor([[1, 0, 1]]))
