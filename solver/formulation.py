"""What the ILP formulations share: the problem, its stages, the MILP, its memory rows,
and turning "which ops rerun in which stage" into a schedule."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .milp import MemoryLimit, Milp
from .problem import Problem
from .schedule import Schedule
from .stages import Stages

Terms = list[tuple[int, float]]


class Formulation:
    name = ""

    def __init__(self, problem: Problem, budget: int | None, horizon: int | None = None):
        """Memory rows bound the peak by `budget` bytes, or (None) minimise the peak."""
        self.problem = problem
        self.stages = Stages(problem, horizon)
        # Where each droppable tensor can be needed, and where each op can rerun: stage ranges.
        self.tensor_window, self.window = self.stages.windows
        self.milp = Milp()
        self.memory = MemoryLimit(self.milp, budget, max((t.bytes for t in problem.tensors), default=1))
        # Every row that sums bytes states them in memory units (a power of two bytes, so the
        # conversion is exact): byte coefficients of a GPU-size problem (1e10) beside the memory
        # rows' 1 / unit (1e-7) span more than HiGHS can handle, and it then calls feasible
        # models infeasible and stops at schedules far from the optimum as if they were optimal.
        self.unit = self.memory.unit
        if problem.update_peak is not None:  # the optimizer's step: the same under every schedule
            self.add_memory([], problem.update_peak)

    def units(self, nbytes: float) -> float:
        """Bytes as memory units (the coefficients of every running sum of bytes)."""
        return nbytes / self.unit

    def add_memory(self, terms: Terms, fixed_bytes: float) -> None:
        """Memory row `terms + fixed_bytes <= limit`: `terms` in memory units (running sums,
        or bytes already divided by `units`), `fixed_bytes` in bytes."""
        self.memory.add([(v, c * self.unit) for v, c in terms], fixed_bytes)

    def reads_if(self, t: int, k: int) -> Terms:
        """Terms equal to 1 when backward op k reads t under the chosen option ([] when always)."""
        return []

    def needed_after(self, t: int, k: int) -> Terms:
        """Terms equal to 1 when a copy of t made at stage k must outlive it ([] if never)."""
        raise NotImplementedError

    def kept_after(self, k: int, u: int, made: Terms) -> Terms:
        """Terms equal to 1 when output u, made at stage k (`made`), is still needed after the
        stage's reruns: by backward op k, or later ([] if never)."""
        if u not in self.tensor_window or k > self.tensor_window[u][1]:
            return []
        milp = self.milp
        x = milp.add_vars()
        if k in self.stages.read_at.get(u, ()):
            condition = self.reads_if(u, k)
            milp.add_row(made + condition + [(x, -1.0)], 1.0 if condition else 0.0)
        later = self.needed_after(u, k)
        if later:
            milp.add_row(made + later + [(x, -1.0)], 1.0)
        return [(x, 1.0)]

    def add_stage(self, k: int, held: Terms, candidates: list[int], ran: Callable[[int], Terms],
                  cost: Callable[[int, Terms], list[tuple[float, Terms]]]) -> None:
        """Memory rows for every moment of stage k: each candidate rerun in forward order, then
        backward op k. `held`: bytes of copies made before the stage and still needed in it;
        `ran(o)`: terms equal to 1 when o reruns here;
        `cost(op, when)`: bytes of running an op (outputs and workspace), as (constant, terms) per
        memory row that must hold. `held` and `cost`'s terms are in memory units (see `units`),
        `cost`'s constants in bytes.
        A running sum tracks the bytes this stage's reruns made: an output counts until its last
        forward reader among the candidates has run, then only if it is kept after."""
        milp, problem = self.milp, self.problem
        fixed = self.stages.backward_fixed[k]
        held_var = milp.add_vars()
        milp.add_row(held + [(held_var, -1.0)], 0.0)
        position = {o: i for i, o in enumerate(candidates)}
        releases: list[list[tuple[int, Terms, Terms]]] = [[] for _ in candidates]
        for i, o in enumerate(candidates):
            for u in problem.ops[o].outputs:
                last = max((position[c] for c in problem.readers[u] if c in position), default=i)
                releases[last].append((u, ran(o), self.kept_after(k, u, ran(o))))
        running: Terms = []
        for i, o in enumerate(candidates):
            for constant, terms in cost(o, ran(o)):
                self.add_memory([(held_var, 1.0)] + running + terms, fixed + constant)
            after = milp.add_vars()
            row = [(after, -1.0)] + running + [(v, c * self.units(problem.out_bytes(problem.ops[o])))
                                               for v, c in ran(o)]
            for u, made, kept in releases[i]:
                size = self.units(problem.tensors[u].bytes)
                row += [(v, -c * size) for v, c in made] + [(v, c * size) for v, c in kept]
            milp.add_row(row, 0.0)
            running = [(after, 1.0)]
        for constant, terms in cost(problem.backward_ops[k].id, []):
            self.add_memory([(held_var, 1.0)] + running + terms, fixed + constant)

    @property
    def fixed_time(self) -> float:
        """Seconds of step time that no decision changes: the ops without a choice, run once.
        The model's objective adds the rest (reruns, and ops whose time depends on an option)."""
        return sum(op.time for op in self.problem.ops if op.choice is None)

    def reruns(self, values: np.ndarray) -> dict[int, list[int]]:
        """Stage -> forward ops rerun just before that stage's backward op, in a solution."""
        raise NotImplementedError

    def options(self, values: np.ndarray) -> dict[str, str]:
        """Choice -> option taken, in a solution (none: every choice takes its first option)."""
        return {}

    def warm_start(self, dropped: frozenset[int], options: dict[str, str]) -> dict[int, float] | None:
        """Binary values of the first-need schedule that drops `dropped` and runs ops as `options`
        say, if this formulation has them."""
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
