"""What the ILP formulations share: the problem, its stages, the MILP, its memory rows,
and turning "which ops rerun in which stage" into a schedule."""

from __future__ import annotations

import numpy as np

from .milp import MemoryLimit, Milp
from .problem import Problem
from .schedule import Schedule
from .stages import Stages


class Formulation:
    def __init__(self, problem: Problem, budget: int | None):
        """Memory rows bound the peak by `budget` bytes, or (None) minimise the peak."""
        self.problem = problem
        self.stages = Stages(problem)
        self.milp = Milp()
        self.memory = MemoryLimit(self.milp, budget)

    def reruns(self, values: np.ndarray) -> dict[int, list[int]]:
        """Stage -> forward ops rerun just before that stage's backward op, in a solution."""
        raise NotImplementedError

    def options(self, values: np.ndarray) -> dict[str, str]:
        """Choice -> option taken, in a solution (none: every choice takes its first option)."""
        return {}

    def warm_start(self, dropped: frozenset[int]) -> dict[int, float] | None:
        """Binary values of the first-need schedule that drops `dropped`, if this formulation has them."""
        return None

    def schedule(self, values: np.ndarray) -> Schedule:
        by_stage = self.reruns(values)
        options = self.options(values)
        seq: list[int] = []
        for k, op in enumerate(self.problem.backward_ops):
            seq.extend(sorted(by_stage.get(k, [])))
            if op.impl(self.problem.option_index(op, options)).runs:
                seq.append(op.id)
        return Schedule.from_backward(self.problem, seq, options)
