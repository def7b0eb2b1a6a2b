"""One entry point for every formulation: a schedule within a budget, or the least peak."""

from __future__ import annotations

import time

from .compact import Compact
from .general import General
from .heuristics import best_first_need
from .problem import Problem
from .result import InfeasibleBudgetError, LeastPeak, Solution, SolverFailedError
from .schedule import keep_all
from .simulate import simulate

FORMULATIONS = {"compact": Compact, "general": General}


def _formulation(name: str):
    if name not in FORMULATIONS:
        raise ValueError(f"formulation {name!r} is not one of {', '.join(FORMULATIONS)}")
    return FORMULATIONS[name]


def solve(problem: Problem, budget: int, *, formulation: str = "compact", time_limit: float = 60.0,
          seed: int = 0, verbose: bool = False) -> Solution:
    """The least-recompute-time schedule whose replayed peak stays within `budget` bytes.

    The solver starts from the best of Chen's greedy schedules that fits, when one does.
    Raises InfeasibleBudgetError (stating the least peak) when no schedule of the
    formulation fits, and SolverFailedError when time runs out before any schedule is found.
    `verbose` shows HiGHS's log.
    """
    start = time.perf_counter()
    build = _formulation(formulation)
    baseline = keep_all(problem)
    replay = simulate(problem, baseline)
    if replay.peak <= budget:  # nothing to recompute: optimal by definition
        return Solution(baseline, replay, budget, formulation, "optimal", 0.0, 0.0, 0.0,
                        time.perf_counter() - start)
    model = build(problem, budget)
    start_from = best_first_need(problem, budget)
    warm = model.warm_start(start_from[0]) if start_from else None
    result = model.milp.solve(time_limit=time_limit, seed=seed, warm=warm, verbose=verbose)
    if result.status == "infeasible":
        least = least_peak(problem, formulation=formulation, time_limit=time_limit, seed=seed)
        raise InfeasibleBudgetError(budget, least, formulation)
    if result.values is None:
        raise SolverFailedError(f"HiGHS stopped ({result.status}) before finding any schedule within "
                                f"{time_limit:g} s; raise the time limit or the budget")
    schedule = model.schedule(result.values)
    replay = simulate(problem, schedule)
    if replay.peak > budget:
        raise SolverFailedError(f"internal error: the {formulation} schedule replays to {replay.peak} bytes, "
                                f"over the budget of {budget}")
    return Solution(schedule, replay, budget, formulation, result.status,
                    objective=result.objective / 1e3, bound=max(0.0, result.bound / 1e3), gap=result.gap,
                    solve_time=time.perf_counter() - start)


def least_peak(problem: Problem, *, formulation: str = "compact", time_limit: float = 60.0,
               seed: int = 0) -> LeastPeak:
    """The least budget (bytes) that the formulation can meet, as its memory rows count it."""
    model = _formulation(formulation)(problem, None)
    result = model.milp.solve(time_limit=time_limit, seed=seed)
    if result.values is None:
        raise SolverFailedError(f"HiGHS found no schedule at any budget within {time_limit:g} s ({result.status})")
    found = model.memory.least_budget(result.values[model.memory.peak])
    return LeastPeak(found, found if result.status == "optimal" else model.memory.least_budget(result.bound))
