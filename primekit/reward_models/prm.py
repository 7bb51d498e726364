"""Step-level process reward model (explicit PRM), trained on Math-Shepherd Monte-Carlo labels.

Gao et al. Sec. 3: L_PRM = E_{q, p^(k), y_k} [ BCE(y_k, r_process(q, p^(k))) ] where p^(k) is the
response prefix up to step k and y_k its automatic label (labeling.mc_step_labels). The PRM is the
LM with a scalar head; r_process(q, p^(k)) = sigmoid(logit at the last token of step k), a
probability in [0, 1] ("the maximum output value of a PRM is 1", Sec. 4.2).

Notation: n responses, t response tokens, S steps per response (left-aligned, -1 padded).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from primekit.algorithms.segmentation import segment_batch, steps
from primekit.config import Config, ConfigError
from primekit.reward_models.heads import batch_response_logits
from primekit.reward_models.orm import binary_metrics, fit_score_save
from primekit.rollout.base import RolloutBatch

__all__ = ["eta_warning", "gather_steps", "prm_step_loss", "prm_step_scores", "resolve_eta",
           "suggested_eta", "train_prm"]


def gather_steps(token_values: torch.Tensor, step_end_positions: torch.Tensor) -> torch.Tensor:
    """Values at each step's last token: out[i, k] = x[i, pos[i, k]], 0 where pos = -1. [n, S]."""
    if token_values.dim() != 2 or step_end_positions.dim() != 2:
        raise ValueError(
            f"token_values {tuple(token_values.shape)} must be [n, t] and "
            f"step_end_positions {tuple(step_end_positions.shape)} [n, S]"
        )
    pos = step_end_positions.to(token_values.device).long()
    if pos.numel() and int(pos.max()) >= token_values.shape[1]:
        raise ValueError(
            f"step_end_positions reach {int(pos.max())}, beyond t = {token_values.shape[1]}"
        )
    out = token_values.gather(1, pos.clamp(min=0))  # [n, S]
    return torch.where(pos >= 0, out, torch.zeros_like(out))


def prm_step_loss(
    logits: torch.Tensor,
    step_end_positions: torch.Tensor,
    step_mask: torch.Tensor,
    step_labels: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """BCE of the step-level PRM on step-end tokens (Gao et al. Sec. 3, L_PRM).

    Formula: mean over valid steps (i, k) of BCE(sigmoid(logit[i, pos_ik]), y_ik).
    Args: logits [n, t], step_end_positions [n, S], step_mask [n, S], step_labels [n, S] in [0, 1].
    Returns: (loss, {"step_prm/loss", "step_prm/acc"}) with acc at threshold 0.5 against y >= 0.5.
    """
    if step_mask.shape != step_end_positions.shape or step_labels.shape != step_mask.shape:
        raise ValueError(
            f"step_end_positions {tuple(step_end_positions.shape)}, step_mask "
            f"{tuple(step_mask.shape)} and step_labels {tuple(step_labels.shape)} "
            "must all be [n, S]"
        )
    z = gather_steps(logits, step_end_positions)  # [n, S]
    m = step_mask.to(z.device).bool()
    y = step_labels.to(z)
    bce = F.binary_cross_entropy_with_logits(z, y, reduction="none")
    loss = (bce * m).sum() / m.sum().clamp(min=1)
    acc = ((z > 0) == (y >= 0.5))[m].float().mean() if bool(m.any()) else torch.tensor(0.0)
    return loss, {"step_prm/loss": float(loss.detach()), "step_prm/acc": float(acc)}


def prm_step_scores(
    model,
    tokenizer,
    batch: RolloutBatch,
    *,
    delimiter: str,
    micro_batch_size: int,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """r_process at every step of every response (one forward per micro-batch).

    Returns (step_probs [N, S] in [0, 1], 0 on padding; step_end_positions [N, S]; step_mask [N, S]).
    """
    positions, step_mask = segment_batch(
        tokenizer, batch.response_ids, batch.response_mask, delimiter
    )
    logits = batch_response_logits(model, batch, micro_batch_size=micro_batch_size, device=device)
    probs = torch.sigmoid(gather_steps(logits, positions)) * step_mask  # [N, S]
    return probs, positions, step_mask


def _write_labels(path: Path, batch: RolloutBatch, labels, delimiter: str, probs=None) -> None:
    with open(path, "w") as f:
        for i, text in enumerate(batch.responses):
            n = int(labels.step_mask[i].sum())
            row = {
                "response": text,
                "steps": steps(text, delimiter),
                "label": labels.labels[i, :n].tolist(),
                "soft": labels.soft[i, :n].tolist(),
            }
            if probs is not None:
                row["prm_prob"] = [round(float(p), 4) for p in probs[i, :n]]
            f.write(json.dumps(row) + "\n")


def train_prm(cfg: Config) -> dict[str, float | str]:
    """`primekit train-prm`: sample, label steps by completion, fit the PRM, evaluate, save.

    Settings: cfg.step_prm. Responses come from step_prm.base (None: cfg.model.policy),
    completions from step_prm.completer (None: the same model); the PRM starts from the sampling
    model. Steps end at cfg.explicit.step_delimiter. Held-out responses on
    step_prm.num_eval_problems test problems, labelled the same way, give the step
    classification accuracy. Writes the HF directory step_prm.out_dir plus train_metrics.json,
    labels_train.jsonl and labels_heldout.jsonl (with the PRM's probabilities).
    """
    from primekit.reward_models.labeling import sampling_setup

    sp = cfg.step_prm
    start = time.perf_counter()
    delimiter = cfg.explicit.step_delimiter
    model_path = sp.base or cfg.model.policy
    setup = sampling_setup(
        cfg, model_path, seed=sp.seed, path_field="step_prm.base" if sp.base else "model.policy"
    )
    t0 = time.perf_counter()
    (train, train_y, train_labels), (heldout, _, heldout_labels) = _label_splits(cfg, setup)
    label_s = time.perf_counter() - t0
    targets = train_labels.labels if sp.label == "hard" else train_labels.soft

    def loss_fn(logits: torch.Tensor, rows: torch.Tensor, t: int):
        return prm_step_loss(
            logits,
            train_labels.step_end_positions[rows],
            train_labels.step_mask[rows],
            targets[rows],
        )

    scored: list[torch.Tensor] = []  # the held-out step probabilities, for labels_heldout.jsonl

    def evaluate(model) -> dict[str, float]:
        probs, _, _ = prm_step_scores(
            model,
            setup.tokenizer,
            heldout,
            delimiter=delimiter,
            micro_batch_size=cfg.policy.micro_batch_size,
            device=setup.device,
        )
        scored.append(probs)
        return _heldout_step_metrics(probs, heldout, heldout_labels)

    summary: dict[str, float | str] = {
        "step_prm/train_responses": float(len(train)),
        "step_prm/train_accuracy_of_samples": float(train_y.mean()),
        "step_prm/train_steps": float(train_labels.step_mask.sum()),
        "step_prm/train_step_positive_rate": float(
            train_labels.labels[train_labels.step_mask].mean()
        ),
        "step_prm/completions": float(train_labels.completions + heldout_labels.completions),
        "step_prm/label_s": label_s,
    }
    record = {"label": sp.label, "base": model_path, "completer": sp.completer or model_path,
              "n_completions": sp.n_completions, "step_delimiter": delimiter}
    out = fit_score_save(cfg, sp, setup, prefix="step_prm", base=model_path, train=train,
                         loss_fn=loss_fn, evaluate=evaluate, summary=summary, start=start,
                         record=record)
    _write_labels(out / "labels_train.jsonl", train, train_labels, delimiter)
    _write_labels(out / "labels_heldout.jsonl", heldout, heldout_labels, delimiter, scored[0])
    return summary


def _label_splits(cfg: Config, setup):
    """(batch, outcome rewards, step labels) of the training and the held-out split: responses
    sampled by `setup`, steps labelled by Monte-Carlo completions (labeling.mc_step_labels) from
    step_prm.completer (None: the sampling model). Releases the sampling engine afterwards."""
    from primekit.reward_models.labeling import HFCompleter, mc_step_labels, sample_split
    from primekit.rollout.hf import HFRolloutEngine

    sp = cfg.step_prm
    engine = setup.engine
    if sp.completer and sp.completer != (sp.base or cfg.model.policy):
        from primekit.models.hf import load_model

        completer_model = load_model(
            sp.completer, device=str(setup.device), trust_remote_code=cfg.model.trust_remote_code
        ).eval()
        engine = HFRolloutEngine(
            completer_model, setup.tokenizer, micro_batch_size=cfg.rollout.micro_batch_size,
            decode=cfg.rollout.hf_decode,
        )
    completer = HFCompleter(engine, setup.params, setup.generator)

    def labelled(split: str, n: int):
        batch, rows, outcome = sample_split(setup, split, n, sp.n_samples)
        labels = mc_step_labels(
            batch,
            rows,
            outcome,
            completer,
            setup.verifier,
            setup.tokenizer,
            delimiter=cfg.explicit.step_delimiter,
            n_completions=sp.n_completions,
        )
        return batch, outcome, labels

    splits = labelled("train", sp.num_problems), labelled("test", sp.num_eval_problems)
    setup.release()
    completer.engine = None
    return splits


def suggested_eta(probs: torch.Tensor, correct: torch.Tensor) -> float | None:
    """Clip's threshold for this PRM (docs/explicit_rewards.md section 7): halfway between the
    median probability of the held-out steps labelled wrong and that of the steps labelled right.

    Formula: eta = (median(p | y = 0) + median(p | y = 1)) / 2 (torch.quantile's median: the mean of
    the two middle values of an even count). Gao et al. Eq. 5 leave eta open.
    Args: probs [M] step probabilities, correct [M] bool labels. Returns eta, or None without
    both classes.
    """
    correct = correct.bool()
    if not bool(correct.any()) or bool(correct.all()):
        return None
    p = probs.float()
    return float((p[~correct].quantile(0.5) + p[correct].quantile(0.5)) / 2)


def eta_warning(eta: float, summary: dict) -> str | None:
    """Why Clip's threshold `eta` would do little with the PRM whose `train_prm` summary this is,
    or None. Below the lower quartile of the probabilities of held-out steps labelled wrong, Clip
    penalises fewer than a quarter of the wrong steps (with Delta: a dense reward of exactly 0
    where every step clears it); above the upper quartile of the steps labelled right, it
    penalises more than three quarters of the right ones too."""
    low = summary.get("step_prm/heldout_prob_label0_p25")
    high = summary.get("step_prm/heldout_prob_label1_p75")
    tip = summary.get("step_prm/suggested_eta")
    tip = (f"; this PRM's held-out steps suggest explicit.eta={tip:.2f} (explicit.eta=auto "
           "takes it)" if tip is not None else "")
    if low is not None and eta < low:
        return (f"explicit.eta={eta:g} is below {low:.2f}, the lower quartile of this PRM's "
                f"probabilities on held-out steps labelled wrong: Clip will penalise fewer than a "
                f"quarter of the wrong steps{tip}")
    if high is not None and eta > high:
        return (f"explicit.eta={eta:g} is above {high:.2f}, the upper quartile of this PRM's "
                f"probabilities on held-out steps labelled right: Clip will penalise more than "
                f"three quarters of the right steps{tip}")
    return None


def stored_summary(path: str) -> dict | None:
    """The `train_prm` summary stored beside a PRM (`<path>/train_metrics.json`), or None (no such
    local file, e.g. a hub id, or unreadable)."""
    import json
    from pathlib import Path

    stored = Path(path) / "train_metrics.json"
    if not stored.is_file():
        return None
    try:
        summary = json.loads(stored.read_text()).get("summary")
    except (OSError, ValueError, AttributeError):
        return None
    return summary if isinstance(summary, dict) else None


def resolve_eta(eta: float | str, path: str | None) -> float:
    """explicit.eta as a number: itself, or for "auto" the PRM's `step_prm/suggested_eta`."""
    if eta != "auto":
        return float(eta)
    summary = stored_summary(path) if path is not None else None
    value = (summary or {}).get("step_prm/suggested_eta")
    if value is None:
        raise ConfigError(
            f"explicit.eta=auto: no step_prm/suggested_eta in {path}/train_metrics.json (written "
            "by `primekit train-prm`); give a number in (0, 1] instead")
    return float(value)


def _heldout_step_metrics(probs: torch.Tensor, heldout: RolloutBatch,
                          labels) -> dict[str, float]:
    """Step classification on the held-out split: every step, the Monte-Carlo-labelled ones
    alone, and quartiles of the PRM's probabilities (the scale explicit.eta is chosen on)."""
    m = labels.step_mask
    y = labels.labels >= 0.5
    # Last steps of finished responses carry the outcome label; the others come from completions.
    counts = m.sum(1, keepdim=True)
    is_last = torch.arange(m.shape[1])[None, :] == counts - 1
    by_outcome = is_last & heldout.finished.cpu()[:, None] & m
    metrics = binary_metrics(probs[m], y[m], "step_prm/heldout")
    mid = m & ~by_outcome
    metrics.update(binary_metrics(probs[mid], y[mid], "step_prm/heldout_mc_steps"))
    for name, sel in (("all", m), ("label1", m & y), ("label0", m & ~y)):
        if bool(sel.any()):
            q = torch.quantile(probs[sel].float(), torch.tensor([0.25, 0.5, 0.75]))
            for p, v in zip((25, 50, 75), q.tolist()):
                metrics[f"step_prm/heldout_prob_{name}_p{p}"] = v
    eta = suggested_eta(probs[m], y[m])
    if eta is not None:
        metrics["step_prm/suggested_eta"] = eta
    return metrics
