"""What every solver returns, and how it fails.

Messages and notes for people name the settings that would help as SolveSettings fields in
backticks (`time_limit`, `formulation='general'`), so that the CLI can say them as its flags."""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
    """The budget is below the least peak any schedule of this formulation reaches. `least_peak` is the
    least peak found, or None where no search ran: the budget is below `held`, what every schedule holds."""

    def __init__(self, budget: int, least: LeastPeak | None, formulation: str, floor: int | None = None,
                 update_peak: int | None = None):
        """`floor`: the bytes no schedule frees (Problem.floor), which the message names as part of the peak;
        `least` None: `budget` is below `floor` or the optimizer step's peak (`update_peak`), said at once."""
        self.budget = budget
        self.least_peak = None if least is None else least.found
        self.floor = floor
        self.held = max(floor or 0, update_peak or 0)
        if least is None:
            super().__init__(_below_held(budget, floor or 0, update_peak))
            return
        within = "" if least.horizon is None else f" with reruns at most {least.horizon} stages ahead of their use"
        if least.found <= least.bound:
            detail = f"is below the least feasible peak {format_bytes(least.found)} ({least.found} bytes){within}"
        else:
            detail = f"cannot be met: the least peak found is {format_bytes(least.found)} ({least.found} bytes)"
            if least.bound > 0:
                detail += f", and no schedule{within} peaks below {format_bytes(least.bound)}"
        sure = ""
        if least.sure is not None and least.sure > least.found:
            sure = (f" (from {format_bytes(least.sure)} up a heuristic schedule fits, which the search starts "
                    "from, so a schedule is sure there)")
        held = ""
        if floor:
            held = (f" (of it, {format_bytes(floor)} is parameters, their gradients, buffers and inputs, which no "
                    "schedule frees)")
        raise_to = f"raise the budget to at least {format_bytes(least.found)}"
        message = f"budget {format_bytes(budget)} {detail}{held}; {raise_to}{sure}"
        if formulation == "compact":  # settings that may reach a lower peak
            message += " or try `formulation='general'`, which recomputes more than once"
            if least.horizon is not None:
                message += ", or a longer `horizon`"
        super().__init__(message)


def _below_held(budget: int, floor: int, update_peak: int | None) -> str:
    held = f"{format_bytes(floor)} of parameters, their gradients, buffers and inputs, which no schedule frees"
    lower = floor
    if update_peak is not None and update_peak > floor:
        held += f", and the optimizer's step peaks at {format_bytes(update_peak)} under any schedule"
        lower = update_peak
    return (f"budget {format_bytes(budget)} is below what every schedule holds: {held}; raise the budget above "
            f"{format_bytes(lower)} ({lower} bytes), or ask for budget 'least' to find the least peak")


class SolverFailedError(MonetError, RuntimeError):
    """The solver stopped without a usable schedule; `least`, where a least-peak search ran, is what it
    found (the lowest peak reached, with its schedule: a longer search can start from it)."""

    def __init__(self, message: str, least: LeastPeak | None = None):
        super().__init__(message)
        self.least = least


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

    def record(self, **extra) -> SolverRecord:
        """How this solution was found, as a schedule file records it; `extra` adds the settings
        that shaped it (SolverRecord's fields)."""
        return SolverRecord(self.formulation, self.status, self.horizon, self.objective, self.bound, self.gap,
                            self.solve_time, self.note or None, self.warnings, **extra)


@dataclass(frozen=True)
class SolverRecord:
    """What made the schedule: the formulation or strategy, how its search ended, and (for the ILP)
    its objective, bound, gap, time, notes and the settings that shaped it."""

    formulation: str
    status: str
    horizon: int | str | None = None
    objective_s: float | None = None
    bound_s: float | None = None
    gap: float | None = None
    solve_time_s: float | None = None
    note: str | None = None
    warnings: tuple[str, ...] = ()
    implementations: bool | None = None
    approximate_allowed: bool | None = None
    problem: str | None = None  # digest of the problem file it was solved from
    least: bool | None = None  # solved at budget 'least': the least peak its search found

    def to_dict(self) -> dict:
        """The fields that say something (None and empty ones are left out)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()
                if v is not None and v != ()}

    @classmethod
    def from_dict(cls, data: dict) -> SolverRecord:
        return cls(**{**data, "warnings": tuple(data.get("warnings", ()))})


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
