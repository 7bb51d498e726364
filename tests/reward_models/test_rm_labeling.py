"""Math-Shepherd Monte-Carlo step labels on a toy completer whose outcomes are known."""

from __future__ import annotations

import pytest
import torch

from primekit.data.arithmetic import ArithmeticTask, parse_expression
from primekit.models.tiny import build_char_tokenizer
from primekit.reward_models.hack_check import batch_from_texts
from primekit.reward_models.labeling import HFCompleter, mc_step_labels
from primekit.rollout.base import SamplingParams
from primekit.verifiers.arithmetic import ArithmeticVerifier

PROBLEM = ArithmeticTask().make_problem("3+4*2", "p0")  # 3+4=7, 7*2=14, answer 14


class ToyCompleter:
    """Continues a prefix correctly from the value on its last line, once out of n tries.

    Completion j < n-1 is the wrong "A:0"; completion n-1 applies the remaining operators to the
    last written value. So a prefix's hard label is 1 exactly when its last value is right, and
    its soft label is then 1/n.
    """

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def complete(self, prefix_ids: list[list[int]], n: int) -> list[list[str]]:
        self.calls.append(len(prefix_ids))
        out = []
        for ids in prefix_ids:
            text = self.tok.decode(ids)
            prompt, response = text.split("=", 1)
            operands, operators = parse_expression(prompt)
            lines = [line for line in response.split("\n")[:-1] if "=" in line]
            acc = int(lines[-1].split("=")[1])
            completion = ""
            for op, b in zip(operators[len(lines) :], operands[len(lines) + 1 :]):
                new = {"+": acc + b, "-": acc - b, "*": acc * b}[op]
                completion += f"{acc}{op}{b}={new}\n"
                acc = new
            out.append(["A:0"] * (n - 1) + [completion + f"A:{acc}"])
        return out


def _labels(responses, finished=None, n=4):
    tok = build_char_tokenizer()
    prompt = tok(PROBLEM.prompt)["input_ids"]
    batch = batch_from_texts(tok, [prompt] * len(responses), responses)
    if finished is not None:
        batch.finished = torch.tensor(finished)
    verifier = ArithmeticVerifier()
    outcome = torch.tensor(
        [v.score for v in verifier.verify_batch(responses, [PROBLEM] * len(responses))]
    )
    completer = ToyCompleter(tok)
    labels = mc_step_labels(
        batch,
        [PROBLEM] * len(responses),
        outcome,
        completer,
        verifier,
        tok,
        delimiter="\n",
        n_completions=n,
    )
    return labels, completer


def test_mc_labels_match_known_outcomes():
    responses = [
        "3+4=7\n7*2=14\nA:14",  # all right
        "3+4=8\n8*2=16\nA:16",  # wrong from the first step
        "3+4=7\n7*2=15\nA:15",  # wrong from the second step
    ]
    labels, completer = _labels(responses, n=4)
    assert labels.step_mask.tolist() == [[True] * 3] * 3
    # Intermediate steps: label 1 iff the step's value is right (a correct continuation exists);
    # last steps of finished responses: the outcome.
    assert labels.labels.tolist() == [[1, 1, 1], [0, 0, 0], [1, 0, 0]]
    # Soft: 1 of 4 completions is right after a correct step; outcome-labelled last steps 1 or 0.
    assert labels.soft.tolist() == [[0.25, 0.25, 1.0], [0.0, 0.0, 0.0], [0.25, 0.0, 0.0]]
    # Unique prefixes: "3+4=7\n" (rows 0 and 2 share it), "3+4=7\n7*2=14\n", "3+4=8\n",
    # "3+4=8\n8*2=16\n", "3+4=7\n7*2=15\n" -> 5 prefixes x 4 completions, in one call.
    assert completer.calls == [5]
    assert labels.completions == 20
    # Step ends land on the delimiter tokens: "3+4=7\n" -> index 5, "7*2=14\n" -> 12.
    assert labels.step_end_positions[0].tolist() == [5, 12, 16]


def test_unfinished_last_step_is_labelled_by_completion():
    # Truncated after two steps (no EOS): its last step "7*2=14\n" is completed, not read off
    # the (wrong: no answer) outcome.
    labels, _ = _labels(["3+4=7\n7*2=14\n"], finished=[False], n=2)
    assert labels.labels.tolist() == [[1.0, 1.0]]
    assert labels.soft.tolist() == [[0.5, 0.5]]


def test_hard_label_is_any_correct_not_majority():
    # n = 8: only 1 of 8 completions is right, still label 1 (Math-Shepherd "hard estimation").
    labels, _ = _labels(["3+4=7\n7*2=15\nA:15"], n=8)
    assert labels.labels[0, 0] == 1.0 and labels.soft[0, 0] == pytest.approx(1 / 8)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_completions"):
        _labels(["3+4=7\nA:7"], n=0)


def test_hf_completer_returns_n_texts_per_prefix(tiny_model_dir):
    from primekit.models.hf import load_model, load_tokenizer
    from primekit.rollout.hf import HFRolloutEngine

    tok = load_tokenizer(tiny_model_dir)
    engine = HFRolloutEngine(load_model(tiny_model_dir), tok)
    completer = HFCompleter(
        engine, SamplingParams(max_new_tokens=4), torch.Generator().manual_seed(0), chunk=5
    )
    out = completer.complete([tok("1+2=")["input_ids"], tok("3=")["input_ids"]], 3)
    assert [len(c) for c in out] == [3, 3]
    assert all(isinstance(c, str) and len(c) <= 4 for cs in out for c in cs)
