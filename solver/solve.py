"""One entry point for every formulation: a schedule within a budget, or the least peak."""

from __future__ import annotations

import time

from .compact import Compact
from .general import General
from .heuristics import best_first_need
from .problem import Problem
from .result import InfeasibleBudgetError, LeastPeak, Solution, SolverFailedError
from .schedule import Schedule, keep_all
from .simulate import simulate

FORMULATIONS = ("compact", "general")


def _model(problem: Problem, budget: int | None, formulation: str, implementations: bool,
           allow_approximate: bool):
    """The formulation's model, and the problem it is posed on. The general formulation does not
    choose implementations: it solves the problem as PyTorch runs it."""
    if formulation == "compact":
        first = None if implementations else {c.name: c.options[0] for c in problem.choices}
        return Compact(problem, budget, allow_approximate=allow_approximate, options=first), problem
    if formulation == "general":
        plain = problem.resolve({})
        return General(plain, budget), plain
    raise ValueError(f"formulation {formulation!r} is not one of {', '.join(FORMULATIONS)}")


def solve(problem: Problem, budget: int, *, formulation: str = "compact", implementations: bool = True,
          allow_approximate: bool = False, time_limit: float = 60.0, seed: int = 0,
          verbose: bool = False) -> Solution:
    """The fastest schedule whose replayed peak stays within `budget` bytes.

    `implementations` lets the solver choose how ops run (the problem's choices) jointly with
    what to keep; off, every choice takes its first option (checkpointing alone). Options that
    change gradients are only considered with `allow_approximate`. The solver starts from the
    best of Chen's greedy schedules that fits, when one does.
    Raises InfeasibleBudgetError (stating the least peak) when no schedule of the
    formulation fits, and SolverFailedError when time runs out before any schedule is found.
    `verbose` shows HiGHS's log.
    """
    start = time.perf_counter()
    baseline = keep_all(problem)
    baseline_replay = simulate(problem, baseline)
    if baseline_replay.peak <= budget and not (implementations and problem.choices):
        # nothing to recompute and nothing else to choose: optimal by definition
        return Solution(baseline, baseline_replay, budget, formulation, "optimal", 0.0, 0.0, 0.0,
                        time.perf_counter() - start)
    model, posed = _model(problem, budget, formulation, implementations, allow_approximate)
    start_from = best_first_need(posed, budget)
    warm = model.warm_start(start_from[0]) if start_from else None
    result = model.milp.solve(time_limit=time_limit, seed=seed, warm=warm, verbose=verbose)
    if result.status == "infeasible":
        least = least_peak(problem, formulation=formulation, implementations=implementations,
                           allow_approximate=allow_approximate, time_limit=time_limit, seed=seed)
        raise InfeasibleBudgetError(budget, least, formulation)
    if result.values is None:
        raise SolverFailedError(f"HiGHS stopped ({result.status}) before finding any schedule within "
                                f"{time_limit:g} s; raise the time limit or the budget")
    schedule = Schedule.from_dict(problem, model.schedule(result.values).to_dict(posed))
    replay = simulate(problem, schedule)
    if replay.peak > budget:
        raise SolverFailedError(f"internal error: the {formulation} schedule replays to {replay.peak} bytes, "
                                f"over the budget of {budget}")
    if baseline_replay.peak <= budget and baseline_replay.time <= replay.time:
        schedule, replay = baseline, baseline_replay  # the rows' safety margin can hide an exact fit
    return Solution(schedule, replay, budget, formulation, result.status,
                    objective=result.objective / 1e3, bound=max(0.0, result.bound / 1e3), gap=result.gap,
                    solve_time=time.perf_counter() - start)


def least_peak(problem: Problem, *, formulation: str = "compact", implementations: bool = True,
               allow_approximate: bool = False, time_limit: float = 60.0, seed: int = 0) -> LeastPeak:
    """The least budget (bytes) that the formulation can meet, as its memory rows count it."""
    model, _ = _model(problem, None, formulation, implementations, allow_approximate)
    result = model.milp.solve(time_limit=time_limit, seed=seed)
    if result.values is None:
        raise SolverFailedError(f"HiGHS found no schedule at any budget within {time_limit:g} s ({result.status})")
    found = model.memory.least_budget(result.values[model.memory.peak])
    return LeastPeak(found, found if result.status == "optimal" else model.memory.least_budget(result.bound))
