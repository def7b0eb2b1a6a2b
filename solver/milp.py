"""A small builder for mixed binary programs, solved by HiGHS through cvxpy.

Formulations add variables and rows `sum(coef * var) <= rhs` by index; `solve`
turns them into two cvxpy variables (boolean and continuous) and sparse
matrices, so building stays linear in the number of nonzeros.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class MilpResult:
    status: str  # "optimal", "time_limit", "infeasible" or cvxpy's status
    values: np.ndarray | None  # every variable by index, or None without a solution
    objective: float
    bound: float
    gap: float
    seconds: float


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
              warm: dict[int, float] | None = None, verbose: bool = False, relax: bool = False) -> MilpResult:
        """Minimise the cost; stop when proven within `mip_rel_gap` (relative) or `abs_gap` (in
        cost units) of the optimum. `warm` fixes binaries to a known solution first (an LP, quick);
        if that solution is feasible HiGHS starts from it, so the time limit returns at least it.
        `relax` solves the LP relaxation instead (binaries anywhere in [0, 1])."""
        import cvxpy as cp  # seconds to import: loaded only when something is solved

        binary = np.array(self._binary, dtype=bool)
        index = np.zeros(self.size, dtype=int)
        index[binary] = np.arange(binary.sum())
        index[~binary] = np.arange((~binary).sum())
        rows, cols, vals = np.array(self._rows), np.array(self._cols, dtype=int), np.array(self._vals)
        lower, upper = np.array(self._lower), np.array(self._upper)
        cost = np.zeros(self.size)
        for var_index, coef in self._cost.items():
            cost[var_index] = coef
        n_bin, n_cont = int(binary.sum()), int((~binary).sum())
        bins = cp.Variable(n_bin, boolean=not relax) if n_bin else None
        conts = cp.Variable(n_cont, bounds=[lower[~binary], upper[~binary]]) if n_cont else None
        variables = [(mask, var) for mask, var in ((binary, bins), (~binary, conts)) if var is not None]
        lhs = 0
        for mask, var in variables:
            keep = mask[cols] if len(cols) else np.zeros(0, dtype=bool)
            matrix = sp.csr_matrix((vals[keep], (rows[keep], index[cols[keep]])), shape=(len(self._rhs), var.size))
            lhs = lhs + matrix @ var
        constraints = [lhs <= np.array(self._rhs)] if self._rhs else []
        lo_bin = cp.Parameter(n_bin) if n_bin else None
        hi_bin = cp.Parameter(n_bin) if n_bin else None
        if n_bin:
            constraints += [bins >= lo_bin, bins <= hi_bin]
        objective = sum(cost[mask] @ var for mask, var in variables)
        problem = cp.Problem(cp.Minimize(objective), constraints)
        start = time.perf_counter()

        def run(lo: np.ndarray, hi: np.ndarray, warm_start: bool) -> str:
            """One HiGHS run within what is left of the time limit; cvxpy's status, or 'error'."""
            if n_bin:
                lo_bin.value, hi_bin.value = lo, hi
            left = max(1.0, time_limit - (time.perf_counter() - start))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # cvxpy warns on inaccurate solutions; the status says so
                try:
                    problem.solve(solver=cp.HIGHS, warm_start=warm_start, time_limit=float(left),
                                  random_seed=int(seed), mip_rel_gap=mip_rel_gap, mip_abs_gap=abs_gap,
                                  verbose=verbose)
                except (cp.error.SolverError, ValueError):  # HiGHS stopped without a usable answer
                    return "error"
            return problem.status

        seeded = False
        if warm and n_bin:
            fixed = lower.copy()
            for var_index, value in warm.items():
                fixed[var_index] = value
            seeded = run(fixed[binary], fixed[binary], False).startswith("optimal")
        status = run(lower[binary], upper[binary], seeded)
        seconds = time.perf_counter() - start
        if status in ("infeasible", "infeasible_inaccurate"):
            return MilpResult("infeasible", None, np.inf, np.inf, np.inf, seconds)
        if status == "error" or any(var.value is None for _, var in variables):
            return MilpResult(status, None, np.inf, -np.inf, np.inf, seconds)
        values = np.zeros(self.size)
        for mask, var in variables:
            values[mask] = np.asarray(var.value, dtype=float)
        info = problem.solver_stats.extra_stats
        objective_value = float(info.objective_function_value)
        if not np.isfinite(objective_value):  # stopped before any incumbent; the values are not a solution
            return MilpResult(status, None, np.inf, -np.inf, np.inf, seconds)
        bound = float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else objective_value
        gap = float(info.mip_gap) if np.isfinite(info.mip_gap) else 0.0
        return MilpResult("optimal" if status.startswith("optimal") else "time_limit", values, objective_value,
                          bound, gap, seconds)


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
            self.limit = budget * (1 - SLACK) / self.unit

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

    def least_budget(self, peak_units: float) -> int:
        """The smallest budget that admits a peak of `peak_units` under this row scaling."""
        return int(np.ceil(peak_units * self.unit / (1 - SLACK)))
