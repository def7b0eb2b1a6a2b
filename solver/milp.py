"""A small builder for mixed binary programs, solved by HiGHS.

Formulations add variables and rows `sum(coef * var) <= rhs` by index; `solve` hands them to
HiGHS (highspy) as one sparse column-wise matrix, so building stays linear in the number of
nonzeros. HiGHS runs in a thread of its own (highspy's startSolve) while this one watches it:
Ctrl-C reaches Python at once and cancels the run (highspy's cancelSolve), and `progress` hears
the best solution and bound found so far.
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

TICK = 0.1  # seconds between looks at a running HiGHS: progress, and Ctrl-C
GRACE = 0.5  # seconds a cancelled HiGHS gets to stop before KeyboardInterrupt is raised anyway


@dataclass(frozen=True)
class MilpResult:
    status: str  # "optimal", "time_limit", "target" (a solution reached `target`), "infeasible", or HiGHS's own words
    values: np.ndarray | None  # every variable by index, or None without a solution
    objective: float
    bound: float
    gap: float
    seconds: float
    # the warm start: None (none given), "accepted" (the ILP with its binaries fixed was feasible, and
    # HiGHS started from that solution) or "rejected" (it was not: the start is no solution of this ILP)
    warm: str | None = None
    warm_objective: float = np.inf  # the accepted warm start's cost


class Milp:
    """Variables (binary or continuous, each with bounds) and rows sum(coef * var) <= rhs."""

    def __init__(self):
        self._binary: list[bool] = []
        self._lower: list[float] = []
        self._upper: list[float] = []
        self._cost: dict[int, float] = {}
        self._rows: list[int] = []
        self._cols: list[int] = []
        self._vals: list[float] = []
        self._rhs: list[float] = []

    @property
    def size(self) -> int:
        return len(self._binary)

    def add_vars(self, count: int = 1, *, binary: bool = False, lower: float = 0.0,
                 upper: float = np.inf) -> int:
        """Index of the first of `count` new variables."""
        first = len(self._binary)
        self._binary += [binary] * count
        self._lower += [lower] * count
        self._upper += [1.0 if binary else upper] * count
        return first

    def fix(self, var: int, value: float) -> None:
        self._lower[var] = self._upper[var] = value

    def upper(self, var: int) -> float:
        return self._upper[var]

    def add_cost(self, var: int, coef: float) -> None:
        self._cost[var] = self._cost.get(var, 0.0) + coef

    def add_row(self, terms: list[tuple[int, float]], rhs: float) -> None:
        row = len(self._rhs)
        for col, val in terms:
            self._rows.append(row)
            self._cols.append(col)
            self._vals.append(val)
        self._rhs.append(rhs)

    def solve(self, *, time_limit: float, seed: int = 0, mip_rel_gap: float = 1e-4, abs_gap: float = 0.0,
              heuristic_effort: float = 0.05, warm: dict[int, float] | None = None, verbose: bool = False,
              relax: bool = False, target: float | None = None, fixed: dict[int, float] | None = None,
              progress: Callable[[float, float], None] | None = None,
              incumbent: Callable[[np.ndarray], None] | None = None, stall: float | None = None,
              stall_above: float = 0.0) -> MilpResult:
        """Minimise the cost; stop when proven within `mip_rel_gap` (relative) or `abs_gap` (in
        cost units) of the optimum. `warm` fixes binaries to a known solution first (an LP, quick);
        if that solution is feasible HiGHS starts from it, so the time limit returns at least it.
        `heuristic_effort` is HiGHS's `mip_heuristic_effort` (0 to 1, see SolveSettings).
        `relax` solves the LP relaxation instead (binaries anywhere in [0, 1]). `target` stops
        the search at the first solution that costs at most that (HiGHS's `objective_target`).
        `fixed` holds variables at values for this run only (a neighbourhood of a solution).
        `progress(objective, bound)` is called every TICK seconds while HiGHS runs, from this
        thread, with the cost of the best solution found so far (inf before the first) and the
        proven lower bound (-inf before the first); `incumbent(values)` likewise with each better solution
        HiGHS finds (every variable by index; at most one call per TICK, with the newest). `stall`
        stops the search, as its time limit would, where it has a solution (the warm start counts) and
        has found no better one for that many seconds (HiGHS sees the stop at its next interrupt check:
        not within its root node's cut rounds), while its gap (objective less bound, cost units) exceeds
        `stall_above`: a search closing in on its proof goes on. Ctrl-C
        (KeyboardInterrupt) cancels HiGHS and is raised again within GRACE seconds, whether or not
        HiGHS has stopped yet (see `stopping`)."""
        import highspy  # loaded only when something is solved

        start = time.perf_counter()  # the time limit counts from here: building HiGHS's model takes seconds too
        binary = np.array(self._binary, dtype=bool)
        lower, upper = np.array(self._lower), np.array(self._upper)
        for var_index, value in (fixed or {}).items():
            lower[var_index] = upper[var_index] = value
        cost = np.zeros(self.size)
        for var_index, coef in self._cost.items():
            cost[var_index] = coef
        matrix = sp.csc_matrix((np.array(self._vals, dtype=float),
                                (np.array(self._rows, dtype=int), np.array(self._cols, dtype=int))),
                               shape=(len(self._rhs), self.size))
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = self.size, len(self._rhs)
        lp.col_cost_ = cost
        lp.row_lower_ = np.full(len(self._rhs), -highspy.kHighsInf)
        lp.row_upper_ = np.array(self._rhs, dtype=float)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = matrix.indptr
        lp.a_matrix_.index_ = matrix.indices
        lp.a_matrix_.value_ = matrix.data
        if binary.any() and not relax:
            lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous
                               for b in binary]

        def run(col_lower: np.ndarray, col_upper: np.ndarray, solution=None, target: float = -np.inf):
            """One HiGHS run within what is left of the time limit, from `solution` if given."""
            lp.col_lower_, lp.col_upper_ = col_lower, col_upper
            highs = highspy.Highs()
            highs.setOptionValue("log_to_console", verbose)
            for name, value in (("time_limit", max(1.0, time_limit - (time.perf_counter() - start))),
                                ("random_seed", int(seed)), ("mip_rel_gap", float(mip_rel_gap)),
                                ("mip_abs_gap", float(abs_gap)),
                                ("mip_heuristic_effort", float(heuristic_effort)),
                                ("objective_target", float(target))):
                highs.setOptionValue(name, value)
            highs.passModel(lp)
            best = _Best()
            if solution is not None:
                highs.setSolution(solution)
                best.objective = float(cost @ np.asarray(solution.col_value))
            _run(highs, best, progress, incumbent, stall, stall_above)
            return highs, best

        seeded, warm_state, warm_objective = None, None, np.inf
        if warm and binary.any():
            at_start = lower.copy()
            for var_index, value in warm.items():  # where the model fixes a variable, its fix stands
                at_start[var_index] = min(max(value, lower[var_index]), upper[var_index])
            col_lower, col_upper = lower.copy(), upper.copy()
            col_lower[binary] = col_upper[binary] = at_start[binary]
            first, _ = run(col_lower, col_upper)
            warm_state = "rejected"
            if first.getModelStatus() == highspy.HighsModelStatus.kOptimal:
                seeded, warm_state = first.getSolution(), "accepted"
                warm_objective = float(cost @ np.asarray(seeded.col_value))
        highs, best = run(lower, upper, seeded, -np.inf if target is None else target)
        seconds = time.perf_counter() - start
        status = highs.getModelStatus()
        name = _STATUS_NAMES.get(status.name, highs.modelStatusToString(status).lower())
        info, solution = highs.getInfo(), highs.getSolution()
        if name == "infeasible":
            return MilpResult("infeasible", None, np.inf, np.inf, np.inf, seconds, warm_state, warm_objective)
        objective_value = float(info.objective_function_value)
        if (not solution.value_valid or info.primal_solution_status != highspy.kSolutionStatusFeasible
                or not np.isfinite(objective_value)):  # stopped before any solution
            bound = min(float(info.mip_dual_bound), best.bound)  # (see below)
            return MilpResult(name, None, np.inf, bound if np.isfinite(bound) else -np.inf, np.inf, seconds, warm_state,
                              warm_objective)
        values = np.asarray(solution.col_value, dtype=float)
        bound = float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else objective_value
        gap = float(info.mip_gap) if np.isfinite(info.mip_gap) else 0.0
        if name != "optimal":  # stopped early (in presolve, say), HiGHS's info can state a bound it never proved
            bound = min(bound, best.bound)
            gap = (objective_value - bound) / max(abs(objective_value), 1e-12)
        return MilpResult(name if name in ("optimal", "target") else "time_limit", values, objective_value, bound, gap,
                          seconds, warm_state, warm_objective)


_STATUS_NAMES = {"kOptimal": "optimal", "kInfeasible": "infeasible", "kTimeLimit": "time_limit",
                 "kObjectiveTarget": "target"}


class _Best:
    """The best objective and bound HiGHS has reported (written from HiGHS's thread)."""

    def __init__(self):
        self.objective = np.inf
        self.bound = -np.inf
        self.since = time.perf_counter()  # when the best objective last changed (made just before its run)
        self.values: np.ndarray | None = None  # the newest better solution, until taken

    def seen(self, event) -> None:
        out = event.data_out
        if out.mip_primal_bound < self.objective:
            self.objective, self.since = out.mip_primal_bound, time.perf_counter()
        self.bound = max(self.bound, out.mip_dual_bound)

    def improved(self, event) -> None:
        self.values = np.array(event.data_out.mip_solution, dtype=float)


_stopping: list = []  # cancelled HiGHS runs that had not stopped when KeyboardInterrupt was raised


def stopping() -> bool:
    """Whether a HiGHS run cancelled by Ctrl-C is still stopping in its own thread. HiGHS looks for
    the cancellation often in its search, but not within some steps at the root of the search
    (heuristics, cut rounds: seconds on large models). The interpreter must not be finalised while
    it runs (its next callback into Python aborts the process); an exit at once, os._exit, is safe."""
    _stopping[:] = [highs for highs in _stopping if highs.is_solver_running()]
    return bool(_stopping)


@atexit.register
def _wait_stopped() -> None:
    """Wait for cancelled HiGHS runs to stop (before the next run, and at exit)."""
    while _stopping:
        _stopping.pop().wait()


def _run(highs, best: _Best, progress: Callable[[float, float], None] | None,
         incumbent: Callable[[np.ndarray], None] | None = None, stall: float | None = None,
         stall_above: float = 0.0) -> None:
    """`highs.run()` in HiGHS's own thread, so that this one can report progress (and better solutions),
    cancel a stalled search (see Milp.solve), and take Ctrl-C: on any exception here (KeyboardInterrupt,
    or one from a callback) HiGHS is cancelled, given GRACE seconds to stop, and the exception raised."""
    _wait_stopped()  # highspy lets one run at a time
    highs.HandleUserInterrupt = True  # cancelSolve() stops the run at HiGHS's next interrupt check
    for callback in (highs.cbMipImprovingSolution, highs.cbMipInterrupt, highs.cbMipLogging):
        callback.subscribe(best.seen)
    if incumbent:
        highs.cbMipImprovingSolution.subscribe(best.improved)
    highs.startSolve()
    try:
        while not highs.wait(TICK)[0]:
            if (stall is not None and np.isfinite(best.objective) and time.perf_counter() - best.since > stall
                    and best.objective - best.bound > stall_above):
                highs.cancelSolve()  # HiGHS stops at its next interrupt check; this loop waits for it
                stall = None
            if progress:
                progress(best.objective, best.bound)
            if incumbent and best.values is not None:
                values, best.values = best.values, None
                incumbent(values)
    except BaseException:
        highs.cancelSolve()
        if not highs.wait(GRACE)[0]:
            _stopping.append(highs)
        raise


SLACK = 1e-5  # relative budget margin that covers HiGHS's feasibility and integrality tolerances


class MemoryLimit:
    """Memory rows `terms + fixed <= limit` in units of `unit` bytes (chosen so that the largest
    tensor is about a thousand units): a budget, or (budget None) a peak variable to minimise."""

    def __init__(self, milp: Milp, budget: int | None, largest_tensor: int):
        self.milp = milp
        self.unit = max(1.0, 2.0 ** np.floor(np.log2(max(largest_tensor, 1))) / 1024)
        if budget is None:
            self.peak = milp.add_vars()
            milp.add_cost(self.peak, 1.0)
            self.limit = None
        else:
            self.peak = None
            self.limit = self.units(budget)

    def add(self, terms: list[tuple[int, float]], fixed_bytes: float) -> None:
        """Row for one point in time; term coefficients are bytes."""
        scaled = [(var, coef / self.unit) for var, coef in terms]
        if self.peak is None:
            self.milp.add_row(scaled, self.limit - fixed_bytes / self.unit)
        else:
            self.milp.add_row(scaled + [(self.peak, -1.0)], -fixed_bytes / self.unit)

    def add_time(self, var: int, seconds: float) -> None:
        """Objective term: time spent when `var` is 1. Only a tie-breaker when minimising the peak."""
        self.milp.add_cost(var, seconds * (1e3 if self.peak is None else 1e-9))

    def units(self, budget: int) -> float:
        """`budget` bytes as a peak in units: the peak objective that least_budget maps within it."""
        return budget * (1 - SLACK) / self.unit

    def least_budget(self, peak_units: float) -> int:
        """The smallest budget that admits a peak of `peak_units` under this row scaling."""
        return int(np.ceil(peak_units * self.unit / (1 - SLACK)))
