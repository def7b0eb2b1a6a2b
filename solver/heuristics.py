"""Schedules without a solver: rerun dropped tensors at their first need, and a greedy keep set.

`recompute_at_first_need` is the schedule class of the compact formulation,
so a keep set found here is a valid starting point (warm start) for it.
"""

from __future__ import annotations

from .problem import Problem
from .schedule import DROPPABLE_ROLES, Schedule, keep_all
from .simulate import Replay, simulate
from .stages import Stages


def recompute_at_first_need(problem: Problem, dropped: set[int] | frozenset[int]) -> Schedule:
    """Keep every droppable forward tensor except `dropped`; rebuild each dropped one once,
    right before the first backward op that needs it, from whatever is kept or rebuilt."""
    tensors = problem.tensors
    rebuilt: set[int] = set()
    seq: list[int] = []

    def ensure(t: int) -> None:
        tensor = tensors[t]
        if tensor.role not in DROPPABLE_ROLES or t not in dropped or tensor.producer in rebuilt:
            return
        op = problem.ops[tensor.producer]
        if not op.recomputable:
            raise ValueError(f"tensor {tensor.name!r} cannot be dropped: its op {op.name!r} cannot rerun")
        for u in op.inputs:
            ensure(u)
        rebuilt.add(op.id)
        seq.append(op.id)

    for op in problem.backward_ops:
        for t in op.inputs:
            ensure(t)
        seq.append(op.id)
    return Schedule.from_backward(problem, seq)


def greedy_keep_set(problem: Problem, budget: int) -> tuple[frozenset[int], Replay] | None:
    """Drop tensors held at the peak, most bytes per second of rerun first, until the
    first-need schedule fits `budget`. None if it never does."""
    stages = Stages(problem)
    tensor_win, op_win = stages.windows
    droppable = {t for t in tensor_win if problem.tensors[t].producer in op_win}
    dropped = set(stages.never_worth_keeping & droppable)
    replay = simulate(problem, recompute_at_first_need(problem, dropped))
    while replay.peak > budget:
        candidates = [t for t in replay.peak_live & droppable if t not in dropped]
        if not candidates:
            return None
        best = max(candidates, key=lambda t: problem.tensors[t].bytes / (problem.ops[problem.tensors[t].producer].time + 1e-9))
        dropped.add(best)
        replay = simulate(problem, recompute_at_first_need(problem, dropped))
    return frozenset(dropped), replay


__all__ = ["greedy_keep_set", "keep_all", "recompute_at_first_need"]
