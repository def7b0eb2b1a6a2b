"""How to solve: one settings object, each default written once, taken by the solver, the API and the CLI."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SolveSettings:
    """What `solve` (and `least_peak`, `monet.solve`, the CLI, a pareto sweep) is asked to do.

    `formulation`: "compact" (each tensor rebuilt at most once; scales), "general" (any number of
    reruns; its size grows as tensors x stages) or "auto" (general for small graphs with nothing to
    choose, else compact); a list solves with each in turn (see `solve`), e.g. ["compact", "general"]
    with `horizon` ["auto", None]: the general formulation, unbounded, refines the compact one's
    schedule. `implementations` lets the solver choose how ops run (the
    problem's choices) jointly with what to keep; off, every choice takes its first option
    (checkpointing alone). Options that change gradients are only considered with
    `allow_approximate`. `options` (choice -> option) fixes some choices, whatever the other settings.
    The search stops when the predicted step time is proven within `gap` (relative) of the best
    possible in the formulation, or at `time_limit` seconds. `horizon` bounds how early an op may
    rerun, in stages (None: unbounded; "auto": as long as the problem's size allows; a list: each
    in turn, see `solve`). Same input, same `seed`: same schedule, unless the time limit cuts the
    search. `heuristic_effort` (0 to 1) is the share of HiGHS's search spent in its primal heuristics
    (HiGHS's `mip_heuristic_effort`; its default, 0.05, is the default here): more finds better
    schedules sooner on problems the time limit cuts, and proves optimality later on the others.
    `polish` (0 to below 1) is the share of `time_limit` kept, after the search, for a neighbourhood
    search in the general formulation (solver/polish.py) that improves the schedule found: on the
    largest problems it finds faster schedules than HiGHS's search of the whole ILP in the same time.
    `workers` (1 or more) is how many processes the solve may use: each one beyond the first runs
    that neighbourhood search beside the search for the whole time limit (solver/beside.py), on the
    best schedule found so far by either (HiGHS runs one solve per process, on one core); the solve
    returns the fastest. `solver_log` shows HiGHS's log.

    What belongs to one call rather than to how to solve (the budget, a starting schedule, a
    progress callback) stays an argument of the call.
    """

    formulation: str | list | tuple = "auto"
    implementations: bool = True
    allow_approximate: bool = False
    options: Mapping[str, str] | None = None
    time_limit: float = 60.0
    gap: float = 5e-3
    horizon: int | None | str | list | tuple = "auto"
    seed: int = 0
    heuristic_effort: float = 0.05
    polish: float = 0.0
    workers: int = 1
    solver_log: bool = False

    def __post_init__(self):
        if not 0 <= self.heuristic_effort <= 1:
            raise ValueError(f"heuristic_effort {self.heuristic_effort!r} must be a share from 0 to 1")
        if not 0 <= self.polish < 1:
            raise ValueError(f"polish {self.polish!r} must be a share from 0 to below 1 (of the time limit)")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers {self.workers!r} must be a whole number of processes, 1 or more")

    def but(self, **changes) -> SolveSettings:
        """These settings with `changes` (field -> value); an unknown name raises TypeError."""
        return dataclasses.replace(self, **changes) if changes else self


def settings_of(settings: SolveSettings | None = None, **changes) -> SolveSettings:
    """`settings` (default: SolveSettings()) with `changes`: how the functions that take settings also
    take them as keyword arguments (`solve(problem, budget, time_limit=10)`), defaults written once."""
    return (settings or SolveSettings()).but(**changes)
