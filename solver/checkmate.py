"""Checkmate's MILP (Jain et al., MLSys 2020), posed on MONeT's problems as a baseline.

Stage t runs op t (problem order: forward ops, then backward ops), after recomputing
earlier ops it needs. As in the paper, with binaries R[t,i] (op i computed in stage t),
S[t,i] (op i's outputs held from stage t-1 into t), FREE[t,i,k] (op i's outputs freed
after op k in stage t) and U[t,k] (bytes in use after computing op k in stage t):
  correctness   R[t,t] = 1;  R[t,k] <= R[t,i] + S[t,i] for every op i whose outputs op k reads;
                S[t+1,i] <= R[t,i] + S[t,i];  nothing is held into stage 0;
  memory        U[t,first] = sum_i M_i S[t,i] + M_first R[t,first],
                U[t,k] = U[t,prev] - sum_i M_i FREE[t,i,prev] + M_k R[t,k],  U[t,k] + fixed <= budget;
  freeing       FREE[t,i,k] = R[t,k] (1 - S[t+1,i]) prod over later readers j of i (1 - R[t,j]), over
                i in DEPS[k] and k itself, linearised through num_hazards: 1 - FREE <= hazards <= kappa (1 - FREE);
  objective     sum of R[t,i] times op i's time.
U rows are written as U >= ..., which is exact: U only ever bounds memory from above. Budget
rows are U + fixed <= budget exactly, as in the paper, without MONeT's small safety margin.

Restricted to what MONeT's execution model runs: forward stages compute only their own op
(no recomputation in the forward pass); backward stages may recompute recomputable forward ops,
but no backward op other than their own. R[t,t] = 1 is a constant, not a variable. Points where
nothing can be computed (R fixed to 0) get no U, since memory only falls there, and FREE after
a stage's own op is left out, since it ends the stage (the next one starts from S).
Graph nodes are the forward ops with droppable outputs (activation, state) that some op reads;
M_i is their bytes (an output nobody reads is freed as soon as it is made, so it counts only
while its op runs). The rest is constant, as the replay counts it (see Stages.backward_fixed):
persistent bytes, model outputs, grads, tangents, and backward ops' outputs, which never rerun
and so are held from their op to their last reader, plus each op's workspace and non-droppable
outputs while it runs. State tensors live to the end of the forward pass, as in the replay, so
forward stages count them as constants.

Checkmate holds and frees an op's outputs together, while the replay (the judge of every
schedule here) frees each tensor after its last reader; Checkmate's count is therefore mostly
conservative, but not always (a rerun's copy of a model output is never freed in the replay,
and is counted only while its op runs). A schedule whose replayed peak exceeds the budget is
returned as is: check `solution.peak > budget`.
"""

from __future__ import annotations

import time

import numpy as np

from .milp import MemoryLimit, Milp
from .problem import Problem
from .result import InfeasibleBudgetError, LeastPeak, Solution, SolverFailedError
from .schedule import DROPPABLE_ROLES, Schedule
from .simulate import simulate
from .stages import Stages

Terms = list[tuple[int, float]]


class Checkmate:
    """Checkmate's MILP on a problem without choices: within `budget` bytes, or (None) minimising the peak."""

    name = "checkmate"

    def __init__(self, problem: Problem, budget: int | None):
        self.problem = problem
        self.milp = Milp()
        self.memory = MemoryLimit(self.milp, budget, max((t.bytes for t in problem.tensors), default=1))
        if budget is not None:
            self.memory.limit = budget / self.memory.unit  # the paper's U <= budget, without MONeT's safety margin
        self._graph()
        self._variables()
        self._correctness()
        backward_fixed = Stages(problem).backward_fixed
        kept = problem.persistent_bytes  # bytes the forward pass made that live to its end
        for op in problem.forward_ops:
            self._stage(op.id, kept, problem.out_bytes(op) - self.forward_size.get(op.id, 0) + op.workspace)
            kept += sum(problem.tensors[t].bytes for t in op.outputs if problem.tensors[t].role in ("output", "state"))
        for k, op in enumerate(problem.backward_ops):
            self._stage(op.id, backward_fixed[k], problem.out_bytes(op) + op.workspace)

    def _graph(self) -> None:
        """Nodes (forward ops with droppable outputs) with their bytes, and who reads them."""
        p = self.problem
        self.size: dict[int, int] = {}  # node -> bytes of its droppable outputs that some op reads
        self.forward_size: dict[int, int] = {}  # the same, less state tensors (held to the forward's end)
        for op in p.forward_ops:
            read = [p.tensors[t] for t in op.outputs if p.tensors[t].role in DROPPABLE_ROLES and p.readers[t]]
            if read:
                self.size[op.id] = sum(t.bytes for t in read)
                self.forward_size[op.id] = sum(t.bytes for t in read if t.role == "activation")
        self.deps = [sorted({p.tensors[t].producer for t in op.inputs
                             if p.tensors[t].role in DROPPABLE_ROLES and p.tensors[t].producer in self.size})
                     for op in p.ops]
        self.readers: dict[int, set[int]] = {i: set() for i in self.size}
        for k, deps in enumerate(self.deps):
            for i in deps:
                self.readers[i].add(k)

    def _variables(self) -> None:
        p, milp = self.problem, self.milp
        self.recompute: dict[tuple[int, int], int] = {}  # R[t,i], i != t: only forward ops in backward stages
        self.reruns: dict[int, list[int]] = {op.id: [] for op in p.ops}
        for op in p.backward_ops:
            for i in sorted(self.size):
                if p.ops[i].recomputable:
                    var = self.recompute[(op.id, i)] = milp.add_vars(binary=True)
                    self.memory.add_time(var, p.ops[i].time)
                    self.reruns[op.id].append(i)
        self.held = {(t, i): milp.add_vars(binary=True) for i in sorted(self.size) for t in range(i + 1, len(p.ops))}

    def _present(self, t: int, i: int) -> Terms:
        """Terms that sum to at least 1 when node i's outputs can be read in stage t."""
        return [(var, 1.0) for var in (self.recompute.get((t, i)), self.held.get((t, i))) if var is not None]

    def _correctness(self) -> None:
        milp = self.milp
        for t, reruns in self.reruns.items():
            for i in self.deps[t]:
                milp.add_row([(v, -c) for v, c in self._present(t, i)], -1.0)
            for k in reruns:
                for i in self.deps[k]:
                    milp.add_row([(self.recompute[(t, k)], 1.0)] + [(v, -c) for v, c in self._present(t, i)], 0.0)
        for (t, i), var in self.held.items():
            if t - 1 > i:  # in stage i op i runs anyway
                milp.add_row([(var, 1.0)] + [(v, -c) for v, c in self._present(t - 1, i)], 0.0)

    def _stage(self, t: int, fixed: float, run: float) -> None:
        """U rows and budget rows at each point of stage t: its reruns in op order, then op t, which
        adds `run` bytes besides its node bytes; `fixed` bytes are held throughout the stage."""
        p, unit = self.problem, self.memory.unit
        size = self.forward_size if p.ops[t].phase == "forward" else self.size
        row: Terms = [(self.held[(t, i)], size[i]) for i in self.size if (t, i) in self.held]
        reruns = self.reruns[t]
        for n, k in enumerate(reruns):
            made = self.recompute[(t, k)]
            used = self._used(row + [(made, size[k])], 0)
            other = p.out_bytes(p.ops[k]) - size[k] + p.ops[k].workspace  # outputs outside the node, workspace
            self.memory.add([(used, unit), (made, other)], fixed)
            row = [(used, unit)] + [(free, -size[i]) for i, free in self._frees(t, k, reruns[n + 1:])]
        self.memory.add([(self._used(row, size.get(t, 0)), unit)], fixed + run)

    def _used(self, terms: Terms, constant: int) -> int:
        """A new U with the row U >= terms + constant (coefficients in bytes; U in memory units)."""
        used, unit = self.milp.add_vars(), self.memory.unit
        self.milp.add_row([(v, c / unit) for v, c in terms] + [(used, -1.0)], -constant / unit)
        return used

    def _frees(self, t: int, k: int, later: list[int]) -> list[tuple[int, int]]:
        """(node, FREE[t,node,k]) for the nodes that may be freed after rerun k in stage t."""
        milp, made = self.milp, self.recompute[(t, k)]
        out = []
        for i in [*self.deps[k], k]:
            if t in self.readers[i]:  # op t reads it after k: never freed here
                continue
            hazards = [(self.recompute[(t, j)], 1.0) for j in later if j in self.readers[i]]
            if (t + 1, i) in self.held:
                hazards.append((self.held[(t + 1, i)], 1.0))
            kappa = 1 + len(hazards)  # with 1 - R[t,k]
            free = milp.add_vars(binary=True)
            milp.add_row([(free, -1.0), (made, 1.0)] + [(v, -c) for v, c in hazards], 0.0)
            milp.add_row([(free, kappa), (made, -1.0)] + hazards, kappa - 1.0)
            out.append((i, free))
        return out

    @property
    def fixed_time(self) -> float:
        """Seconds every schedule spends: each op once."""
        return sum(op.time for op in self.problem.ops)

    def schedule(self, values: np.ndarray) -> Schedule:
        """Each backward stage's recomputations in op order, then its op."""
        seq: list[int] = []
        for op in self.problem.backward_ops:
            seq += [i for i in self.reruns[op.id] if values[self.recompute[(op.id, i)]] > 0.5]
            seq.append(op.id)
        return Schedule.from_backward(self.problem, seq)


def checkmate(problem: Problem, budget: int, *, time_limit: float = 60.0, seed: int = 0) -> Solution:
    """The fastest schedule Checkmate's MILP finds within `budget` bytes, as Checkmate counts memory.

    Choices take their first option (Checkmate only decides what to recompute). The objective is
    the predicted step time in seconds, the bound HiGHS's proven lower bound on it. Raises
    InfeasibleBudgetError (with the least peak Checkmate's accounting admits) when no schedule fits,
    and SolverFailedError when HiGHS stops without one. The replayed peak may exceed the budget
    (see the module docstring); it is reported, not hidden.
    """
    start = time.perf_counter()
    plain = problem.resolve({c.name: c.options[0] for c in problem.choices})
    model = Checkmate(plain, budget)
    result = model.milp.solve(time_limit=time_limit, seed=seed)
    if result.status == "infeasible":
        left = max(1.0, time_limit - (time.perf_counter() - start))
        raise InfeasibleBudgetError(budget, _least_peak(plain, left, seed), Checkmate.name, plain.floor)
    if result.values is None:
        raise SolverFailedError(f"HiGHS stopped ({result.status}) before finding any Checkmate schedule within "
                                f"{time_limit:g} s; raise the time limit or the budget")
    schedule = model.schedule(result.values).remap(plain, problem)
    objective = model.fixed_time + result.objective / 1e3
    bound = min(objective, model.fixed_time + max(0.0, result.bound) / 1e3)
    return Solution(schedule, simulate(problem, schedule), budget, Checkmate.name, result.status, objective, bound,
                    (objective - bound) / objective if objective > 0 else 0.0, time.perf_counter() - start)


def _least_peak(problem: Problem, time_limit: float, seed: int) -> LeastPeak:
    """The least budget Checkmate's memory rows admit, from its MILP that minimises the peak."""
    model = Checkmate(problem, None)
    result = model.milp.solve(time_limit=time_limit, seed=seed)
    if result.values is None:
        raise SolverFailedError(f"HiGHS found no Checkmate schedule at any budget within {time_limit:g} s "
                                f"({result.status})")
    unit = model.memory.unit
    found = round(result.values[model.memory.peak] * unit)  # Checkmate counts whole bytes
    bound = int(np.floor(result.bound * unit + 1e-6)) if np.isfinite(result.bound) else 0
    return LeastPeak(found, found if result.status == "optimal" else min(found, bound))
