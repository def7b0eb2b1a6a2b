"""The blocks' step solved as one: on one process, or on one rank under FSDP2."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .fsdp import sharded
from .options import SolveSettings, settings_of
from .result import InfeasibleBudgetError, LeastPeak, Solution, SolverFailedError, format_bytes
from .schedule import Schedule, keep_all
from .simulate import Replay, simulate
from .solve import solve
from .stack import Stacked, join, split


@dataclass(frozen=True)
class StepSolution:
    """The blocks' step solved as one: the ILP's `solution`, each block's schedule, and the replays
    of the step as the blocks run those (`replay`) and keeping everything (`unconstrained`): on one
    process, or on one rank under FSDP2."""

    solution: Solution
    schedules: tuple[Schedule, ...]
    replay: Replay
    unconstrained: Replay


def step_unconstrained(stacked: Stacked, world: int = 1) -> Replay:
    """The blocks' step keeping everything, on one process (`world` 1) or one rank under FSDP2."""
    if world == 1:
        return simulate(stacked.problem, keep_all(stacked.problem))
    return sharded(stacked, world).replay(split(stacked, keep_all(stacked.problem)))


def solve_step(stacked: Stacked, budget: int, settings: SolveSettings | None = None, *, world: int = 1,
               unconstrained: Replay | None = None, progress=None, **changes) -> StepSolution:
    """Each block's schedule, solved as one step within `budget` bytes (monet.solver.solve's settings).
    Under FSDP2 (`world` > 1) the ILP solves `sharded`'s problem, where each block's parameters are
    gathered when first needed; FSDP2 gathers them when the block's backward begins and prefetches the
    block before's, so the ILP gets `budget` less two blocks' gathered parameters, and the step as
    FSDP2 runs it is replayed: where it still exceeds `budget`, the ILP's budget drops by the excess
    (twice at most). `unconstrained`, step_unconstrained's replay where the caller has it, spares
    replaying it again."""
    settings = settings_of(settings, **changes)
    unconstrained = unconstrained or step_unconstrained(stacked, world)
    if world == 1:
        solution = solve(stacked.problem, budget, settings, progress=progress, unconstrained=unconstrained)
        own = tuple(split(stacked, solution.schedule))
        return StepSolution(solution, own, simulate(stacked.problem, join(stacked, own)), unconstrained)
    step = sharded(stacked, world)
    margin = 2 * max(step.gathered)
    target = budget - margin
    for _ in range(3):
        try:
            solution = solve(step.problem, target, settings, progress=progress)
        except InfeasibleBudgetError as exc:
            if exc.least_peak is None:  # below what every schedule holds, and FSDP2 gathers two blocks on top
                raise InfeasibleBudgetError(budget, None, settings.formulation, exc.floor + margin) from None
            least = LeastPeak(exc.least_peak + budget - target, 0)  # the ILP's least, with the margin back
            raise InfeasibleBudgetError(budget, least, settings.formulation, exc.floor) from None
        own = tuple(step.split(solution.schedule))
        replay = step.replay(own)
        if replay.peak <= budget:
            return StepSolution(dataclasses.replace(solution, budget=budget), own, replay, unconstrained)
        target -= replay.peak - budget
    raise SolverFailedError(f"under FSDP2 the blocks' step peaks at {format_bytes(replay.peak)}, over the budget "
                            f"{format_bytes(budget)} though the ILP had {format_bytes(budget - target)} less; "
                            "raise the budget")
