"""Every way this project makes a schedule of a problem, by name, with one result type.

`STRATEGIES[name].run(problem, budget, settings)` returns a `Planned`: the
schedule, how it was found and what a schedule file records of it. Strategies that take no budget
(`budgeted` False) ignore it; `monet pareto` and the benchmark's schedule competitors both draw
from here, and the simulator judges every result alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from .baselines import chen_greedy, chen_sqrt
from .checkmate import checkmate
from .options import SolveSettings, settings_of
from .problem import Problem
from .result import Solution, SolverRecord
from .schedule import Schedule, keep_all
from .solve import solve


@dataclass(frozen=True)
class Planned:
    """A strategy's schedule and `solver`, the record of how it was made: its status ("optimal",
    "time_limit", "heuristic", ...) and proven gap (None where no bound is claimed: the baselines)."""

    schedule: Schedule
    solver: SolverRecord

    @property
    def status(self) -> str:
        return self.solver.status

    @property
    def gap(self) -> float | None:
        return self.solver.gap

    @classmethod
    def of(cls, solution: Solution, **record) -> Planned:
        """A solver's Solution; `record` adds to its SolverRecord."""
        return cls(solution.schedule, solution.record(**record))


class Strategy(NamedTuple):
    """`run(problem, budget, settings=None, *, start=None)`; `budgeted`: whether it takes a budget
    (else it runs once, with budget None). The solvers read `settings` (a SolveSettings; the
    defaults where None); the budget-blind baselines ignore it."""

    run: Callable[..., Planned]
    budgeted: bool


def _monet(implementations: bool) -> Callable[..., Planned]:
    def run(problem: Problem, budget: int, settings: SolveSettings | None = None, *,
            start: Schedule | None = None) -> Planned:
        settings = settings_of(settings, implementations=implementations)
        solution = solve(problem, budget, settings, start=start)
        return Planned.of(solution, implementations=implementations, approximate_allowed=settings.allow_approximate)
    return run


def _checkmate(problem: Problem, budget: int, settings: SolveSettings | None = None, **_) -> Planned:
    return Planned.of(checkmate(problem, budget, time_limit=settings_of(settings).time_limit))


def _baseline(name: str, build: Callable[[Problem, int | None], Schedule]) -> Callable[..., Planned]:
    def run(problem: Problem, budget: int | None = None, settings: SolveSettings | None = None, **_) -> Planned:
        return Planned(build(problem, budget), SolverRecord(name, "heuristic"))
    return run


# Budget-blind baselines ignore the budget: the caller compares the replayed peak with it.
BASELINES: dict[str, Callable[[Problem, int | None], Schedule]] = {
    "keep-all": lambda problem, budget: keep_all(problem),
    "chen-sqrt": lambda problem, budget: chen_sqrt(problem),
    "chen-greedy": chen_greedy,
}

STRATEGIES: dict[str, Strategy] = {
    "monet": Strategy(_monet(True), True),
    "monet-checkpointing": Strategy(_monet(False), True),
    "checkmate": Strategy(_checkmate, True),
    **{name: Strategy(_baseline(name, build), name == "chen-greedy") for name, build in BASELINES.items()},
}


def check_strategies(strategies) -> None:
    """Raises ValueError naming any strategy that is not in STRATEGIES."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
