"""The synthetic repetition check of Gao et al. (Sec. 4.1-4.2, Appendix C), as `primekit hack-check`.

Take correct responses, make variants that (a) repeat a middle step, (b) add nonsense steps before
the final answer, (c) repeat the last sentence (the answer line), each 1..R times, and compute the
dense return sum_k r_k every reward design gives to the original and to each variant, from the
same PRM step probabilities. The paper's finding: plain PR pays more for the padded variants than
for the original (the RL hack); Clip's returns are never positive and fall with every added weak
step; Delta's return is r_process of the first step whatever follows (Theorem 1), so repetition
cannot raise it.

The variants stay correct (the verifier reads the first answer line), so the success reward is the
same for all of them and is left out of the returns. PR-Normed is left out: it standardises over a
batch, so a response's return depends on what else is in the batch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from primekit.algorithms.segmentation import steps
from primekit.config import Config, ConfigError
from primekit.reward_models.dense import transform_step_rewards
from primekit.reward_models.prm import prm_step_scores, resolve_eta
from primekit.rollout.base import batch_from_texts

__all__ = [
    "DESIGNS",
    "NONSENSE_STEPS",
    "VARIANTS",
    "HackCheckResult",
    "batch_from_texts",
    "design_returns",
    "hack_check",
    "make_variant",
    "plot_hack_check",
    "run_hack_check",
]

VARIANTS = ("repeat-mid", "nonsense", "repeat-last")
# design name -> PROCESS_REWARD_TRANSFORMS key
DESIGNS: dict[str, str] = {
    "PR": "none",
    "PR-Clip": "clip",
    "PR-Delta": "delta",
    "PR-Clip-Delta": "clip-delta",
    "PR-LenNorm": "length-norm",
    "PR-LenPenalty": "length-penalty",
}
# Short, contentless steps in the spirit of the paper's "Step done." / "Step end." / "Step show.".
NONSENSE_STEPS = ("done", "ok", "end", "so", "next")


def make_variant(
    text: str,
    kind: str,
    repeats: int,
    *,
    delimiter: str,
    separator: str,
    nonsense: tuple[str, ...] = NONSENSE_STEPS,
) -> str:
    """One synthetic variant of a response (steps cut at `delimiter`, new steps end with `separator`).

    "repeat-mid": the middle step before the last one, (K-1)//2 (0-based), appears 1 + repeats times.
    "nonsense": `repeats` nonsense steps inserted before the last step.
    "repeat-last": the last step (the answer line) repeated `repeats` more times at the end.
    repeats = 0 gives the original text.
    """
    if kind not in VARIANTS:
        raise ValueError(f"kind must be one of {VARIANTS}, got {kind!r}")
    if repeats < 0:
        raise ValueError(f"repeats must be >= 0, got {repeats}")
    parts = steps(text, delimiter)
    if len(parts) < 2:
        raise ValueError(
            f"a response needs at least two steps for the variants, got {len(parts)}: {text!r}"
        )
    if repeats == 0:
        return text
    body, last = parts[:-1], parts[-1]
    if kind == "repeat-mid":
        k = (len(parts) - 1) // 2
        body = body[: k + 1] + [body[k]] * repeats + body[k + 1 :]
    elif kind == "nonsense":
        body = body + [nonsense[j % len(nonsense)] + separator for j in range(repeats)]
    else:
        closed = last if last.endswith(separator) else last + separator
        return "".join(body) + closed * repeats + last
    return "".join(body) + last


def design_returns(
    step_probs: torch.Tensor, step_mask: torch.Tensor, *, eta: float, length_penalty: float
) -> dict[str, torch.Tensor]:
    """Dense return sum_k r_k of every design in DESIGNS from raw PRM step probabilities.

    Args: step_probs [N, S] in [0, 1], step_mask [N, S]. Returns: design -> [N].
    """
    return {
        name: transform_step_rewards(
            step_probs, step_mask, t, eta=eta, length_penalty=length_penalty
        ).sum(1)
        for name, t in DESIGNS.items()
    }


@dataclass
class HackCheckResult:
    """rows: one per (variant, repeats), mean return per design over the responses; returns:
    design -> [V, R+1, N] per-response returns (V variants, repeats 0..R); correct: [V, R+1, N]."""

    rows: list[dict] = field(default_factory=list)
    returns: dict[str, torch.Tensor] = field(default_factory=dict)
    correct: torch.Tensor | None = None
    steps: torch.Tensor | None = None
    eta: float = 0.0  # Clip's threshold the returns were computed with

    def max_gain(self) -> dict[str, float]:
        """Per design: the largest (variant return - original return) over responses and variants."""
        return {d: float((r[:, 1:] - r[:, :1]).max()) for d, r in self.returns.items()}


def run_hack_check(
    model,
    tokenizer,
    problems,
    prompt_ids: list[list[int]],
    responses: list[str],
    verifier,
    *,
    delimiter: str,
    separator: str,
    eta: float,
    length_penalty: float,
    max_repeats: int,
    micro_batch_size: int,
    device: str | torch.device = "cpu",
) -> HackCheckResult:
    """Score the originals and all variants with the PRM `model`; see the module docstring."""
    if max_repeats < 1:
        raise ValueError(f"max_repeats must be >= 1, got {max_repeats}")
    n, R, V = len(responses), max_repeats, len(VARIANTS)
    texts = [
        make_variant(r, kind, k, delimiter=delimiter, separator=separator)
        for kind in VARIANTS
        for k in range(R + 1)
        for r in responses
    ]  # [V * (R+1) * n]
    rows_prompt = [prompt_ids[i] for _ in range(V * (R + 1)) for i in range(n)]
    rows_problem = [problems[i] for _ in range(V * (R + 1)) for i in range(n)]
    batch = batch_from_texts(tokenizer, rows_prompt, texts)
    probs, _, step_mask = prm_step_scores(
        model,
        tokenizer,
        batch,
        delimiter=delimiter,
        micro_batch_size=micro_batch_size,
        device=device,
    )
    returns = {
        d: r.view(V, R + 1, n)
        for d, r in design_returns(probs, step_mask, eta=eta, length_penalty=length_penalty).items()
    }
    correct = torch.tensor([v.score for v in verifier.verify_batch(texts, rows_problem)]).view(
        V, R + 1, n
    )
    n_steps = step_mask.sum(1).float().view(V, R + 1, n)
    result = HackCheckResult(returns=returns, correct=correct, steps=n_steps, eta=eta)
    for v, kind in enumerate(VARIANTS):
        for k in range(R + 1):
            if k == 0 and v > 0:
                continue  # the original is the same for every variant kind
            row = {
                "variant": "original" if k == 0 else kind,
                "repeats": k,
                "steps": float(n_steps[v, k].mean()),
                "correct": float(correct[v, k].mean()),
            }
            row.update({d: float(r[v, k].mean()) for d, r in returns.items()})
            result.rows.append(row)
    return result


def plot_hack_check(result: HackCheckResult, path: Path) -> Path:
    """Mean return against repeats, one panel per variant, one line per design (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(5 * len(VARIANTS), 4), sharey=True)
    for v, (ax, kind) in enumerate(zip(axes, VARIANTS)):
        for design, r in result.returns.items():
            mean = r[v].mean(-1)  # [R+1]
            ax.plot(range(len(mean)), mean.tolist(), marker="o", ms=3, label=design)
        ax.axhline(0.0, color="grey", lw=0.5)
        ax.set_title(kind)
        ax.set_xlabel("repeats (0 = original)")
    axes[0].set_ylabel("mean dense return")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def hack_check(cfg: Config) -> HackCheckResult:
    """`primekit hack-check`: print the table, write hack_check.json and hack_check.png.

    Settings: cfg.hack_check. Responses: held-out problems' demonstrations (source "demos"), or
    correct responses sampled from cfg.model.policy (source "sampled", one per problem, the first
    hack_check.num_responses found). The PRM is cfg.explicit.model_path; eta and the length
    penalty come from cfg.explicit.
    """
    from primekit.data.splits import encode_prompts, verifier_task
    from primekit.reward_models.heads import load_reward_model
    from primekit.runtime import resolve_device
    from primekit.verifiers import build_verifier

    e, h = cfg.explicit, cfg.hack_check
    prm_path, separator = _checked_settings(cfg)
    eta = resolve_eta(cfg.explicit.eta, prm_path)
    start = time.perf_counter()
    device = resolve_device(cfg.train.device)
    verifier = build_verifier(verifier_task(cfg), cfg.verifier)
    tokenizer, problems, responses = _correct_responses(cfg, prm_path)
    model = load_reward_model(
        prm_path, device=device, trust_remote_code=cfg.model.trust_remote_code
    )
    result = run_hack_check(
        model,
        tokenizer,
        problems,
        encode_prompts(tokenizer, problems, cfg),
        responses,
        verifier,
        delimiter=e.step_delimiter,
        separator=separator,
        eta=eta,
        length_penalty=e.length_penalty,
        max_repeats=h.max_repeats,
        micro_batch_size=cfg.policy.micro_batch_size,
        device=device,
    )
    _report(cfg, result, responses, prm_path, separator, start)
    return result


def _checked_settings(cfg: Config) -> tuple[str, str]:
    """The step-level PRM's path and the separator of inserted steps, or a ConfigError naming
    the setting that cannot work (before anything is loaded)."""
    from primekit.validate import check_model_dir

    e = cfg.explicit
    separator = cfg.hack_check.separator
    if separator is None:
        if e.step_delimiter.startswith("re:"):
            raise ConfigError(
                f"hack_check.separator: explicit.step_delimiter {e.step_delimiter!r} is a "
                "pattern; set the text that ends an inserted step"
            )
        separator = e.step_delimiter
    if e.model_path is None:
        raise ConfigError("explicit.model_path: hack-check needs a step-level PRM "
                          "(primekit train-prm)")
    if cfg.algorithm.reward_mode == "explicit-orm":
        raise ConfigError("algorithm.reward_mode: hack-check scores steps with a step-level PRM, "
                          "but reward_mode=explicit-orm makes explicit.model_path an ORM")
    check_model_dir(e.model_path, "explicit.model_path", kind="prm")
    return e.model_path, separator


def _correct_responses(cfg: Config, prm_path: str):
    """(tokenizer, problems, responses): correct responses of at least two steps, from the
    held-out demonstrations (source "demos", the PRM's tokenizer) or sampled from
    cfg.model.policy (source "sampled", its tokenizer)."""
    from primekit.data.splits import load_splits

    h, delimiter = cfg.hack_check, cfg.explicit.step_delimiter
    if h.source == "demos":
        from primekit.models.hf import load_tokenizer

        tokenizer = load_tokenizer(prm_path, trust_remote_code=cfg.model.trust_remote_code)
        problems = [p for p in load_splits(cfg, train=False)[1] if p.solution][:h.num_responses]
        responses = [p.solution for p in problems]
    else:
        from primekit.reward_models.labeling import sample_split, sampling_setup

        setup = sampling_setup(cfg, cfg.model.policy, seed=h.seed, path_field="model.policy")
        tokenizer = setup.tokenizer
        batch, rows, outcome = sample_split(setup, "test", 4 * h.num_responses, 1)
        picked = [i for i in range(len(rows)) if outcome[i] >= 1.0][:h.num_responses]
        problems, responses = [rows[i] for i in picked], [batch.responses[i] for i in picked]
        setup.release()
    responses_ok = [len(steps(r, delimiter)) >= 2 for r in responses]
    problems = [p for p, ok in zip(problems, responses_ok) if ok]
    responses = [r for r, ok in zip(responses, responses_ok) if ok]
    if not responses:
        raise ValueError(f"hack-check: no correct responses with at least two steps ({h.source})")
    return tokenizer, problems, responses


def _report(cfg: Config, result: HackCheckResult, responses: list[str], prm_path: str,
            separator: str, start: float) -> None:
    """Print the two tables; write hack_check.json (with one example of each variant) and
    hack_check.png to hack_check.out_dir."""
    from rich.console import Console

    from primekit.logging import print_table

    e, h = cfg.explicit, cfg.hack_check
    out = Path(h.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wide = Console(width=160)  # the table is wider than a default 80-column pipe
    print_table(
        f"hack-check: mean dense return over {len(responses)} correct responses "
        f"(eta={result.eta:g}, length_penalty={e.length_penalty})",
        result.rows,
        console=wide,
    )
    gains = result.max_gain()
    print_table(
        "largest gain of a variant over its original (> 0: the design can be hacked)",
        [{"design": d, "max_gain": g} for d, g in gains.items()],
        console=wide,
    )
    (out / "hack_check.json").write_text(
        json.dumps(
            {
                "prm": str(prm_path),
                "source": h.source,
                "responses": len(responses),
                "eta": result.eta,
                "length_penalty": e.length_penalty,
                "rows": result.rows,
                "max_gain": gains,
                "examples": {
                    kind: make_variant(
                        responses[0], kind, 2, delimiter=e.step_delimiter, separator=separator
                    )
                    for kind in VARIANTS
                },
                "wall_s": time.perf_counter() - start,
            },
            indent=2,
        )
    )
    plot_hack_check(result, out / "hack_check.png")
    print(f"wrote {out / 'hack_check.json'} and {out / 'hack_check.png'}")
