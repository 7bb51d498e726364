"""Best-of-N with the implicit PRM (`primekit rerank`): the test-time use of the PRM.

For each held-out problem the policy samples M = max(N) responses. For each N and each problem,
subsets of N of those responses are drawn (all M singletons for N = 1; `rerank_draws` random
subsets for 1 < N < M; the whole set for N = M) and each strategy picks one response of the subset;
its verifier score is averaged over subsets, then problems.

Strategies (a plain dict, STRATEGIES, from name to function):
  prm-sum / prm-mean / prm-min: the response with the largest sum / mean / min of its implicit
      token rewards r_t = beta * log(pi_prm / pi_ref) (ties: the mean score of the tied ones);
  majority: the most common final answer (ties: the mean score of the tied answers' responses;
      responses without an answer vote for nothing unless none has one);
  random: a uniformly random response (its expected score, exactly: the subset's mean score);
  oracle: the best response (the subset's max score), an upper bound for every strategy.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

Pick = Callable[[dict, list[int]], float]  # (per-problem arrays, subset indices) -> score


def _best_by(key: str) -> Pick:
    def pick(p: dict, idx: list[int]) -> float:
        vals = np.asarray(p[key])[idx]
        best = np.flatnonzero(vals == vals.max())
        return float(np.asarray(p["scores"])[idx][best].mean())
    return pick


def majority(p: dict, idx: list[int]) -> float:
    answers = [p["answers"][i] for i in idx]
    scores = np.asarray(p["scores"])[idx]
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return float(scores.mean())
    top = max(votes.values())
    winners = {a for a, c in votes.items() if c == top}
    return float(np.mean([s for a, s in zip(answers, scores) if a in winners]))


def random_choice(p: dict, idx: list[int]) -> float:
    return float(np.asarray(p["scores"])[idx].mean())


def oracle(p: dict, idx: list[int]) -> float:
    return float(np.asarray(p["scores"])[idx].max())


STRATEGIES: dict[str, Pick] = {
    "prm-sum": _best_by("sum"), "prm-mean": _best_by("mean"), "prm-min": _best_by("min"),
    "majority": majority, "random": random_choice, "oracle": oracle,
}


def subsets(m: int, n: int, draws: int, rng: random.Random) -> list[list[int]]:
    if n > m:
        raise ValueError(f"N = {n} exceeds the {m} samples per problem")
    if n == 1:
        return [[i] for i in range(m)]
    if n == m:
        return [list(range(m))]
    return [sorted(rng.sample(range(m), n)) for _ in range(draws)]


def rerank_table(problems: list[dict], ns: list[int], draws: int, seed: int = 0) -> list[dict]:
    """Mean score of each strategy at each N. `problems`: one dict per problem with lists over
    its M samples: scores, answers, and the PRM statistics sum, mean, min."""
    rng = random.Random(seed)
    rows = []
    for n in ns:
        totals = dict.fromkeys(STRATEGIES, 0.0)
        for p in problems:
            subs = subsets(len(p["scores"]), n, draws, rng)
            for name, pick in STRATEGIES.items():
                totals[name] += sum(pick(p, s) for s in subs) / len(subs)
        rows.append({"N": n, **{k: v / len(problems) for k, v in totals.items()}})
    return rows


def answer_key(response: str, task: str) -> str | None:
    """What majority vote counts: the arithmetic task's final answer, else the last non-empty
    line (a stand-in for an extracted final answer, stated in docs/viz.md)."""
    if task == "arithmetic":
        from primekit.verifiers.arithmetic import extract_final_answer

        return extract_final_answer(response)
    lines = [x.strip() for x in response.strip().splitlines() if x.strip()]
    return lines[-1] if lines else None


def problems_of(scored, task: str) -> list[dict]:
    """Per-problem arrays from primekit.viz.scoring.Scored (rows grouped by problem)."""
    mask = scored.response_mask
    sums = scored.token_rewards.sum(1)  # [N]
    lengths = mask.sum(1).clamp(min=1)  # [N]
    means = sums / lengths
    mins = scored.token_rewards.masked_fill(mask == 0, float("inf")).min(1).values  # [N]
    mins = mins.masked_fill(mask.sum(1) == 0, 0.0)
    out = []
    for start in range(0, len(scored.responses), scored.k):
        rows = range(start, start + scored.k)
        out.append({"scores": [float(scored.scores[i]) for i in rows],
                    "answers": [answer_key(scored.responses[i], task) for i in rows],
                    "sum": [float(sums[i]) for i in rows], "mean": [float(means[i]) for i in rows],
                    "min": [float(mins[i]) for i in rows]})
    return out


def pairwise_of(scored) -> tuple[float, float]:
    """(pairs ordered like their scores, pairs) over pairs of one problem's samples with different
    verifier scores, by the summed implicit reward: the training metric prm/acc_pairwise, here on
    whatever policy sampled (`algorithms.prm_pairwise_counts`; ties count one half)."""
    from primekit.algorithms import prm_pairwise_counts

    sums = (scored.token_rewards * scored.response_mask).sum(1)  # [N]
    groups = torch.arange(len(scored.responses)) // scored.k  # [N], k samples per problem
    correct, pairs = prm_pairwise_counts(sums, torch.as_tensor(scored.scores, dtype=sums.dtype),
                                         groups)
    return float(correct), float(pairs)


def plot(rows: list[dict], out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2), constrained_layout=True)
    ns = [r["N"] for r in rows]
    for name in STRATEGIES:
        style = "--" if name in ("random", "oracle") else "-"
        ax.plot(ns, [r[name] for r in rows], style, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("N (samples per problem)")
    ax.set_ylabel("mean verifier score of the pick")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_rerank(cfg, *, model: str, prm: str, ref: str | None, num_problems: int) -> list[dict]:
    """`primekit rerank`: sample max(N) per problem, score, print and save table + plot."""
    import json

    from primekit.data.splits import verifier_task
    from primekit.logging import print_table
    from primekit.viz.scoring import sample_and_score

    v = cfg.viz
    ns = sorted(set(v.rerank_ns))
    scored = sample_and_score(cfg, model=model, prm=prm, ref=ref, num_problems=num_problems,
                              k=ns[-1], temperature=v.temperature, seed=v.seed)
    rows = rerank_table(problems_of(scored, verifier_task(cfg)), ns, v.rerank_draws, v.seed)
    title = f"best-of-N on {num_problems} held-out problems: PRM {prm}"
    print_table(title, rows)
    correct, pairs = pairwise_of(scored)
    if pairs:
        print(f"PRM pairwise accuracy on these samples: {correct / pairs:.3f} over {pairs:.0f} "
              f"pairs of one problem's samples with different scores (0.5: no better than "
              f"chance)")
    else:
        print("PRM pairwise accuracy on these samples: n/a (no problem has samples with "
              "different scores)")
    out = Path(v.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rerank.json").write_text(json.dumps({"model": model, "prm": prm, "ref": scored.ref,
                                                 "num_problems": num_problems, "rows": rows,
                                                 "pairwise": {"correct": correct, "pairs": pairs}},
                                                indent=1))
    plot(rows, out / "rerank.png", title)
    print(f"table: {out / 'rerank.json'}  plot: {out / 'rerank.png'}")
    return rows
