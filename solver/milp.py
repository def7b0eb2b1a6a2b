"""A small builder for mixed binary programs, solved by HiGHS through cvxpy.

Formulations add variables and rows `sum(coef * var) <= rhs` by index; `solve`
turns them into two cvxpy variables (boolean and continuous) and sparse
matrices, so building stays linear in the number of nonzeros.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import cvxpy as cp
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

    def solve(self, *, time_limit: float, seed: int = 0, mip_rel_gap: float = 1e-4) -> MilpResult:
        binary = np.array(self._binary, dtype=bool)
        index = np.zeros(self.size, dtype=int)
        index[binary] = np.arange(binary.sum())
        index[~binary] = np.arange((~binary).sum())
        rows, cols, vals = np.array(self._rows), np.array(self._cols, dtype=int), np.array(self._vals)
        shape_rows = len(self._rhs)
        parts, variables = [], []
        for mask, kind in ((binary, {"boolean": True}), (~binary, {})):
            n = int(mask.sum())
            if n == 0:
                continue
            var = cp.Variable(n, **kind)
            keep = mask[cols] if len(cols) else np.zeros(0, dtype=bool)
            matrix = sp.csr_matrix((vals[keep], (rows[keep], index[cols[keep]])), shape=(shape_rows, n))
            parts.append(matrix @ var)
            variables.append((mask, var))
        constraints = []
        if shape_rows:
            constraints.append(sum(parts) <= np.array(self._rhs))
        cost = np.zeros(self.size)
        for var_index, coef in self._cost.items():
            cost[var_index] = coef
        objective = 0
        lower, upper = np.array(self._lower), np.array(self._upper)
        for mask, var in variables:
            objective = objective + cost[mask] @ var
            lo, hi = lower[mask], upper[mask]
            if var.attributes["boolean"]:
                lo_set, hi_set = lo > 0, hi < 1
            else:
                lo_set, hi_set = np.isfinite(lo), np.isfinite(hi)
            if lo_set.any():
                constraints.append(var[lo_set] >= lo[lo_set])
            if hi_set.any():
                constraints.append(var[hi_set] <= hi[hi_set])
        problem = cp.Problem(cp.Minimize(objective), constraints)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cvxpy warns on inaccurate solutions; the status says so
            problem.solve(solver=cp.HIGHS, time_limit=float(time_limit), random_seed=int(seed),
                          mip_rel_gap=mip_rel_gap, verbose=bool(__import__('os').environ.get('MONET_HIGHS_VERBOSE')))
        seconds = time.perf_counter() - start
        if problem.status in ("infeasible", "infeasible_inaccurate"):
            return MilpResult("infeasible", None, np.inf, np.inf, np.inf, seconds)
        if any(var.value is None for _, var in variables):
            return MilpResult(problem.status, None, np.inf, -np.inf, np.inf, seconds)
        values = np.zeros(self.size)
        for mask, var in variables:
            values[mask] = np.asarray(var.value, dtype=float)
        info = problem.solver_stats.extra_stats
        objective_value = float(info.objective_function_value)
        bound = float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else objective_value
        gap = float(info.mip_gap) if np.isfinite(info.mip_gap) else 0.0
        status = "optimal" if problem.status.startswith("optimal") else "time_limit"
        return MilpResult(status, values, objective_value, bound, gap, seconds)


MIB = float(1 << 20)
SLACK = 1e-5  # relative budget margin that covers HiGHS's feasibility and integrality tolerances


class MemoryLimit:
    """Memory rows `terms + fixed <= limit`, in MiB: a budget, or (budget None) a peak variable to minimise."""

    def __init__(self, milp: Milp, budget: int | None):
        self.milp = milp
        if budget is None:
            self.peak = milp.add_vars()
            milp.add_cost(self.peak, 1.0)
            self.limit = None
        else:
            self.peak = None
            self.limit = budget * (1 - SLACK) / MIB

    def add(self, terms: list[tuple[int, float]], fixed_bytes: float) -> None:
        """Row for one point in time; term coefficients are bytes."""
        scaled = [(var, coef / MIB) for var, coef in terms]
        if self.peak is None:
            self.milp.add_row(scaled, self.limit - fixed_bytes / MIB)
        else:
            self.milp.add_row(scaled + [(self.peak, -1.0)], -fixed_bytes / MIB)

    def least_budget(self, objective_mib: float) -> int:
        """The smallest budget that admits a peak of `objective_mib` under this row scaling."""
        return int(np.ceil(objective_mib * MIB / (1 - SLACK)))
