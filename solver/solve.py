"""One entry point for every formulation: a schedule within a budget, or the least peak."""

from __future__ import annotations

import time

import numpy as np

from .compact import Compact
from .general import General
from .heuristics import lean_options, warm_starts
from .problem import Problem
from .result import InfeasibleBudgetError, LeastPeak, Solution, SolverFailedError
from .schedule import Schedule, keep_all
from .simulate import Replay, simulate

FORMULATIONS = ("compact", "general")


def _model(problem: Problem, budget: int | None, formulation: str, implementations: bool,
           allow_approximate: bool, options: dict[str, str] | None):
    """The formulation's model, and the problem it is posed on. The general formulation does not
    choose implementations: it solves the problem as PyTorch runs it, or as `options` fix."""
    fixed = dict(options or {})
    unknown = [c for c in fixed if c not in problem.choice_named]
    if unknown:
        raise ValueError(f"unknown choices {unknown[:3]}: this problem's choices are named like "
                         f"{[c.name for c in problem.choices[:3]]}")
    for name, option in fixed.items():
        choice = problem.choice_named[name]
        if option not in choice.options:
            raise ValueError(f"choice {name!r} has no option {option!r}; its options are {list(choice.options)}")
        if option in choice.approximate and not allow_approximate:
            raise ValueError(f"option {option!r} of {name!r} changes gradients; allow approximate options to use it")
    if not implementations:
        fixed = {c.name: fixed.get(c.name, c.options[0]) for c in problem.choices}
    if formulation == "compact":
        return Compact(problem, budget, allow_approximate=allow_approximate, options=fixed), problem
    if formulation == "general":
        plain = problem.resolve(fixed)
        return General(plain, budget), plain
    raise ValueError(f"formulation {formulation!r} is not one of {', '.join(FORMULATIONS)}")


def solve(problem: Problem, budget: int, *, formulation: str = "compact", implementations: bool = True,
          allow_approximate: bool = False, options: dict[str, str] | None = None, time_limit: float = 60.0,
          seed: int = 0, verbose: bool = False) -> Solution:
    """The fastest schedule whose replayed peak stays within `budget` bytes.

    `implementations` lets the solver choose how ops run (the problem's choices) jointly with
    what to keep; off, every choice takes its first option (checkpointing alone). Options that
    change gradients are only considered with `allow_approximate`. `options` (choice -> option)
    fixes some choices, whatever the other settings.
    The solver starts from the fastest of Chen's greedy schedules that fits, with ops run as
    PyTorch runs them or in their leanest way. When it chooses implementations, it first spends
    half the time limit on checkpointing alone and starts the joint search from that schedule,
    so the joint schedule is never slower than checkpointing alone.
    Raises InfeasibleBudgetError (stating the least peak) when no schedule of the
    formulation fits, and SolverFailedError when time runs out before any schedule is found.
    `verbose` shows HiGHS's log.
    """
    start = time.perf_counter()
    options = options or {}
    baseline = keep_all(problem, options)
    baseline_replay = simulate(problem, baseline)
    if baseline_replay.peak <= budget and not (implementations and problem.choices) and not options:
        # nothing to recompute and nothing else to choose: optimal by definition
        return Solution(baseline, baseline_replay, budget, formulation, "optimal", 0.0, 0.0, 0.0,
                        time.perf_counter() - start)
    model, posed = _model(problem, budget, formulation, implementations, allow_approximate, options)
    found = warm_starts(posed, budget, _option_sets(posed, implementations, allow_approximate, options))
    starts = [found] if found else []
    if formulation == "compact" and implementations and len(options) < len(problem.choices):
        alone = _checkpointing_alone(problem, budget, options, time_limit / 2, seed)
        if alone:
            starts.append(alone)
    best = min(starts, key=lambda s: s[2].time, default=None)
    warm = model.warm_start(best[0], best[1]) if best else None
    result = model.milp.solve(time_limit=max(1.0, time_limit - (time.perf_counter() - start)), seed=seed,
                              warm=warm, verbose=verbose)
    if result.status == "infeasible":
        least = least_peak(problem, formulation=formulation, implementations=implementations,
                           allow_approximate=allow_approximate, options=options, time_limit=time_limit, seed=seed)
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


def _option_sets(posed: Problem, implementations: bool, allow_approximate: bool,
                 options: dict[str, str]) -> list[dict[str, str]]:
    """How ops run in the heuristic starting points: as fixed (else as PyTorch), and leanest."""
    sets = [options if posed.choices else {}]
    if posed.choices and implementations:
        sets.append({**lean_options(posed, allow_approximate=allow_approximate), **options})
    return sets


def _checkpointing_alone(problem: Problem, budget: int, options: dict[str, str], time_limit: float,
                         seed: int) -> tuple[frozenset[int], dict[str, str], Replay] | None:
    """The compact checkpointing-only schedule (choices at their first option, or as `options`
    fix) within `time_limit`, as a joint starting point: (dropped tensors, options, replay)."""
    model, _ = _model(problem, budget, "compact", False, True, options)
    found = warm_starts(problem, budget, [{c.name: options.get(c.name, c.options[0]) for c in problem.choices}])
    result = model.milp.solve(time_limit=time_limit, seed=seed,
                              warm=model.warm_start(found[0], found[1]) if found else None)
    if result.values is None:
        return None
    schedule = model.schedule(result.values)
    replay = simulate(problem, schedule)
    if replay.peak > budget:
        return None
    return frozenset(t for t, var in model.drop.items() if result.values[var] > 0.5), schedule.options, replay


def least_peak(problem: Problem, *, formulation: str = "compact", implementations: bool = True,
               allow_approximate: bool = False, options: dict[str, str] | None = None, time_limit: float = 60.0,
               seed: int = 0) -> LeastPeak:
    """The least budget (bytes) that the formulation can meet, as its memory rows count it."""
    model, posed = _model(problem, None, formulation, implementations, allow_approximate, options or {})
    start = warm_starts(posed, None, _option_sets(posed, implementations, allow_approximate, options or {}))
    result = model.milp.solve(time_limit=time_limit, seed=seed, warm=model.warm_start(*start[:2]) if start else None)
    if result.values is not None:
        found = model.memory.least_budget(result.values[model.memory.peak])
    elif start:  # HiGHS improved on nothing in time: the heuristic schedule's peak stands
        found = start[2].peak
    else:
        raise SolverFailedError(f"HiGHS found no schedule at any budget within {time_limit:g} s ({result.status})")
    bound = model.memory.least_budget(result.bound) if np.isfinite(result.bound) else 0
    return LeastPeak(found, found if result.status == "optimal" else min(found, bound))
