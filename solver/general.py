"""The general formulation: a tensor may be recomputed in any number of stages.

For every droppable forward tensor t that the backward may need, and every
stage k in the window where it can be needed:
  s[t]    t is saved at the end of the forward pass
  S[t,k]  a copy of t is held entering stage k
and for every recomputable forward op o:
  R[o,k]  o is rerun in stage k, just before backward op k.
Presence:  a backward op reading t at stage k needs S[t,k] + R[op(t),k] >= 1;
           a rerun R[o,k] needs the same for each input of o.
Carry:     S[t,k+1] <= S[t,k] + R[op(t),k],  S[t,first] <= s[t].
Memory:    every forward op, and every moment of every stage (each rerun, then
           the backward op), within the budget; see Formulation.add_stage.
This is MONeT's stage formulation for checkpointing; it reaches the lowest
budgets (revolve-style repeated recomputation) but grows as tensors x stages.
"""

from __future__ import annotations

import numpy as np

from .formulation import Formulation, Terms
from .problem import Problem
from .schedule import Schedule


class General(Formulation):
    name = "general"

    def __init__(self, problem: Problem, budget: int | None, horizon: int | None = None):
        super().__init__(problem, budget, horizon)
        self._variables()
        self._presence()
        self._carry()
        self._forward_rows()
        self._stage_rows()
        self._objective()

    def _variables(self) -> None:
        """s[t], S[t,k] over t's window and R[o,k] over o's window."""
        milp = self.milp
        self.saved = {t: milp.add_vars(binary=True) for t in sorted(self.tensor_window)}
        self.held = {}
        for t, (a, b) in sorted(self.tensor_window.items()):
            first = milp.add_vars(b - a + 1, binary=True)
            self.held.update({(t, k): first + k - a for k in range(a, b + 1)})
        self.rerun = {}
        for o, (a, b) in sorted(self.window.items()):
            first = milp.add_vars(b - a + 1, binary=True)
            self.rerun.update({(o, k): first + k - a for k in range(a, b + 1)})

    def _present(self, t: int, k: int) -> Terms:
        """Terms that sum to at least 1 when t can be read at stage k: held, or rerun there."""
        terms = [(self.held[(t, k)], 1.0)]
        if (self.problem.tensors[t].producer, k) in self.rerun:
            terms.append((self.rerun[(self.problem.tensors[t].producer, k)], 1.0))
        return terms

    def _presence(self) -> None:
        """What backward op k, or a rerun R[o,k], reads is present at stage k."""
        milp, problem = self.milp, self.problem
        for k, op in enumerate(problem.backward_ops):
            for t in op.inputs:
                if t in self.tensor_window:
                    milp.add_row([(c, -v) for c, v in self._present(t, k)], -1.0)
        for (o, k), var in self.rerun.items():
            for t in problem.ops[o].inputs:
                if t in self.tensor_window:
                    milp.add_row([(var, 1.0)] + [(c, -v) for c, v in self._present(t, k)], 0.0)

    def _carry(self) -> None:
        """S[t,k+1] <= S[t,k] + R[op(t),k],  S[t,first] <= s[t]."""
        milp, tensors = self.milp, self.problem.tensors
        for t, (a, b) in self.tensor_window.items():
            milp.add_row([(self.held[(t, a)], 1.0), (self.saved[t], -1.0)], 0.0)
            for k in range(a, b):
                terms = [(self.held[(t, k + 1)], 1.0), (self.held[(t, k)], -1.0)]
                if (tensors[t].producer, k) in self.rerun:
                    terms.append((self.rerun[(tensors[t].producer, k)], -1.0))
                milp.add_row(terms, 0.0)

    def _forward_rows(self) -> None:
        """Memory rows at every forward op, with the saved tensors made so far."""
        tensors = self.problem.tensors
        for fixed, optional, _ in self.stages.forward_rows:
            self.memory.add([(self.saved[t], tensors[t].bytes) for t in optional], fixed)

    def needed_after(self, t: int, k: int) -> Terms:
        """Held into stage k + 1."""
        return [(self.held[(t, k + 1)], 1.0)] if (t, k + 1) in self.held else []

    def _cost(self, o: int, when: Terms) -> list[tuple[float, Terms]]:
        (_, size), = self.stages.op_cost(self.problem.ops[o])  # resolved problems have no choices
        return [(0.0, [(v, c * self.units(size)) for v, c in when]) if when else (size, [])]

    def _stage_rows(self) -> None:
        """Memory rows at every moment of every backward stage (see Formulation.add_stage)."""
        stages, tensors = self.stages, self.problem.tensors
        held: list[Terms] = [[] for _ in range(stages.count)]
        for t, (a, b) in self.tensor_window.items():
            for k in range(a):
                held[k].append((self.saved[t], self.units(tensors[t].bytes)))
            for k in range(a, b + 1):
                held[k].append((self.held[(t, k)], self.units(tensors[t].bytes)))
        candidates: list[list[int]] = [[] for _ in range(stages.count)]
        for o, k in sorted(self.rerun):
            candidates[k].append(o)
        for k in range(stages.count):
            self.add_stage(k, held[k], candidates[k], lambda o, k=k: [(self.rerun[(o, k)], 1.0)], self._cost)

    def _objective(self) -> None:
        """Each rerun's time."""
        for (o, _), var in self.rerun.items():
            self.memory.add_time(var, self.problem.ops[o].pytorch.recompute_time)

    def warm_from(self, schedule: Schedule) -> dict[int, float] | None:
        """Binary values of `schedule` (of this formulation's problem): s from what it saves, R from
        the stage of each rerun, S wherever a copy is read later before its op reruns again. None
        when a rerun falls outside its op's window (a horizon excludes it)."""
        stage_of = self.stages.stage_of
        ran: dict[int, set[int]] = {}  # op -> stages it reruns in
        pending: list[int] = []
        for i in schedule.backward:
            if i not in stage_of:
                pending.append(i)
                continue
            for o in pending:
                if (o, stage_of[i]) not in self.rerun:
                    return None
                ran.setdefault(o, set()).add(stage_of[i])
            pending = []
        read: dict[int, set[int]] = {t: set(ks) for t, ks in self.stages.read_at.items()}
        for o, stages in ran.items():
            for t in self.problem.ops[o].inputs:
                read.setdefault(t, set()).update(stages)
        values = {var: float(t in schedule.saved) for t, var in self.saved.items()}
        values.update({var: float(k in ran.get(o, ())) for (o, k), var in self.rerun.items()})
        for t, (a, b) in self.tensor_window.items():
            remade = ran.get(self.problem.tensors[t].producer, set())
            needed = False  # walking back from the window's end: read at k or later, before a rerun
            for k in range(b, a - 1, -1):
                needed = k not in remade and (needed or k in read.get(t, ()))
                values[self.held[(t, k)]] = float(needed)
        return values

    def reruns(self, values: np.ndarray) -> dict[int, list[int]]:
        by_stage: dict[int, list[int]] = {}
        for (o, k), var in self.rerun.items():
            if values[var] > 0.5:
                by_stage.setdefault(k, []).append(o)
        return by_stage
