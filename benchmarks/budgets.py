"""A budget a benchmark runs at: the one asked for, or 2 % over the least peak where no schedule fits it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from monet.solver import InfeasibleBudgetError

Solved = TypeVar("Solved")


def above_least(solve: Callable[[str | int], Solved], budget: str | int) -> tuple[Solved, str | int, int | None]:
    """`solve(budget)`, or where no schedule fits `budget`, `solve` at 2 % over the least peak: what `solve`
    returned, the budget it was given, and the least peak (None where `budget` fitted). Below what every schedule
    holds the error comes before any search and names no least peak: a try just above that searches for it."""
    try:
        return solve(budget), budget, None
    except InfeasibleBudgetError as exc:
        if exc.least_peak is None:
            try:
                return solve(exc.held + 1), exc.held + 1, exc.held + 1
            except InfeasibleBudgetError as searched:
                exc = searched
        return solve(int(exc.least_peak * 1.02)), int(exc.least_peak * 1.02), exc.least_peak
