"""Long arithmetic chains: the procedural arithmetic task with 5-8 steps, where one early wrong
step decides the outcome.

Same format, left-to-right evaluation, value range and grading as primekit.data.arithmetic
(prompt "3+4*2-5+6*3-9=", one chain-of-thought line "acc<op>b=result" per step, each step's
result the next step's left operand, the answer on the final "A:<integer>" line), but with 6 to 9
operands by default instead of 2 to 4. Every step after a wrong one starts from a wrong value,
so a response's outcome is settled at its first mistake: the credit for a failure belongs to one
early token range, not to the answer line, which is the situation dense process rewards are
meant for (PRIME Sec. 3). Responses are about 50 to 80 characters (= tokens for the tiny
model's character tokenizer) against 15 to 35 for the 2-4 operand task.

Splits: the arithmetic task's keyed hash of the expression (`split_of`), so train and test never
share an expression, and an expression is in the same split in both families. The random
stream is named "chains/<split>/<seed>", separate from the arithmetic family's.
"""

from __future__ import annotations

from primekit.data.arithmetic import ArithmeticTask

# 6..9 operands = 5..8 operations.
CHAIN_MIN_OPERANDS = 6
CHAIN_MAX_OPERANDS = 9


class ChainTask(ArithmeticTask):
    """`ArithmeticTask` with long chains (6..9 operands by default) and its own random stream.

    Args: as `ArithmeticTask`; problems are graded by the arithmetic verifier
    (`Problem.task == "arithmetic"`) and carry meta["family"] == "chains".
    """

    family = "chains"

    def __init__(self, min_operands: int = CHAIN_MIN_OPERANDS,
                 max_operands: int = CHAIN_MAX_OPERANDS, max_value: int = 99, **kwargs) -> None:
        super().__init__(min_operands, max_operands, max_value, **kwargs)

    def make_problem(self, expression: str, id: str):
        problem = super().make_problem(expression, id)
        problem.meta["family"] = self.family
        return problem
