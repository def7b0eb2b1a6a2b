"""What every solver returns, and how it fails."""

from __future__ import annotations

from dataclasses import dataclass

from monet.errors import MonetError

from .schedule import Schedule
from .simulate import Replay


@dataclass(frozen=True)
class LeastPeak:
    """The least budget a formulation meets: `found` works (`schedule` peaks there, when
    there is one to give); none below `bound` can (equal when proven), among schedules whose
    reruns fall within `horizon` stages of their use (None: any). From `sure` up (when known) a
    heuristic schedule fits, which `solve` starts from: it returns a schedule at any such budget."""

    found: int
    bound: int
    schedule: Schedule | None = None
    horizon: int | None = None
    sure: int | None = None


class InfeasibleBudgetError(MonetError, ValueError):
    """The budget is below the least peak any schedule of this formulation reaches."""

    def __init__(self, budget: int, least: LeastPeak, formulation: str):
        self.budget = budget
        self.least_peak = least.found
        within = "" if least.horizon is None else f" with reruns at most {least.horizon} stages ahead of their use"
        if least.found <= least.bound:
            detail = f"is below the least feasible peak {format_bytes(least.found)} ({least.found} bytes){within}"
        else:
            detail = f"cannot be met: the least peak found is {format_bytes(least.found)} ({least.found} bytes)"
            if least.bound > 0:
                detail += f", and no schedule{within} peaks below {format_bytes(least.bound)}"
        # settings that may reach a lower peak (SolveSettings fields), said as HINTS says them
        self.alternatives = (("formulation", "horizon") if least.horizon is not None else ("formulation",)) \
            if formulation == "compact" else ()
        sure = ""
        if least.sure is not None and least.sure > least.found:
            sure = (f" (from {format_bytes(least.sure)} up a heuristic schedule fits, which the search starts "
                    "from, so a schedule is sure there)")
        self.reason = f"budget {format_bytes(budget)} {detail}; raise the budget to at least that{sure}"
        super().__init__(self.message(self.HINTS))

    # how the library says each alternative; the CLI says them as its flags
    HINTS = {"formulation": "the general formulation (formulation='general'), which recomputes more than once",
             "horizon": "a longer horizon"}

    def message(self, hints: dict[str, str]) -> str:
        """The error, with the alternatives said as `hints` (setting -> words) say them."""
        if not self.alternatives:
            return self.reason
        return f"{self.reason} or try " + ", or ".join(hints[name] for name in self.alternatives)


class SolverFailedError(MonetError, RuntimeError):
    """The solver stopped without a usable schedule."""


@dataclass(frozen=True)
class Solution:
    """A schedule with its replay and how the solver got there (times in seconds)."""

    schedule: Schedule
    replay: Replay
    budget: int
    formulation: str
    # "optimal" (within the gap asked for), "time_limit" (the best schedule found when time ran out),
    # "heuristic" (the starting schedule, where the formulation found none, or none the simulator
    # confirms) or "unverified" (HiGHS's schedule fits, but the simulator contradicts what HiGHS
    # said of it: see `warnings`)
    status: str
    objective: float  # predicted step time, as the formulation prices it
    bound: float  # proven lower bound on the step time of any schedule of the formulation
    gap: float  # (objective - bound) / objective
    solve_time: float
    horizon: int | None = None  # how early ops may rerun, in stages (None: unbounded)
    note: str = ""  # for people: what a "heuristic" result is, and what would help
    # for people: where HiGHS contradicted itself or the simulator (which judges peaks and times);
    # the solution then never claims "optimal"
    warnings: tuple[str, ...] = ()

    @property
    def peak(self) -> int:
        return self.replay.peak

    def summary(self) -> dict:
        return {
            "formulation": self.formulation,
            "status": self.status,
            "horizon": self.horizon,
            "objective_s": self.objective,
            "bound_s": self.bound,
            "gap": self.gap,
            "solve_time_s": self.solve_time,
            **({"note": self.note} if self.note else {}),
            **({"warnings": list(self.warnings)} if self.warnings else {}),
        }


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
