"""How to solve: one settings object, each default written once, taken by the solver, the API and the CLI."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SolveSettings:
    """What `solve` (and `least_peak`, `monet.solve`, the CLI, a pareto sweep) is asked to do.

    `formulation`: "compact" (each tensor rebuilt at most once; scales), "general" (any number of
    reruns; small graphs, no implementation choices) or "auto" (general for small graphs with
    nothing to choose, else compact). `implementations` lets the solver choose how ops run (the
    problem's choices) jointly with what to keep; off, every choice takes its first option
    (checkpointing alone). Options that change gradients are only considered with
    `allow_approximate`. `options` (choice -> option) fixes some choices, whatever the other settings.
    The search stops when the predicted step time is proven within `gap` (relative) of the best
    possible in the formulation, or at `time_limit` seconds. `horizon` bounds how early an op may
    rerun, in stages (None: unbounded; "auto": as long as the problem's size allows; a list: each
    in turn, see `solve`). Same input, same `seed`: same schedule, unless the time limit cuts the
    search. `solver_log` shows HiGHS's log.

    What belongs to one call rather than to how to solve (the budget, a starting schedule, a
    progress callback) stays an argument of the call.
    """

    formulation: str = "auto"
    implementations: bool = True
    allow_approximate: bool = False
    options: Mapping[str, str] | None = None
    time_limit: float = 60.0
    gap: float = 5e-3
    horizon: int | None | str | list | tuple = "auto"
    seed: int = 0
    solver_log: bool = False

    def but(self, **changes) -> SolveSettings:
        """These settings with `changes` (field -> value); an unknown name raises TypeError."""
        return dataclasses.replace(self, **changes) if changes else self


def settings_of(settings: SolveSettings | None = None, **changes) -> SolveSettings:
    """`settings` (default: SolveSettings()) with `changes`: how the functions that take settings also
    take them as keyword arguments (`solve(problem, budget, time_limit=10)`), defaults written once."""
    return (settings or SolveSettings()).but(**changes)
