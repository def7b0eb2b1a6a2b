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

from .formulation import Formulation
from .problem import Problem


class General(Formulation):
    name = "general"

    def __init__(self, problem: Problem, budget: int | None, horizon: int | None = None):
        super().__init__(problem, budget, horizon)
        stages, milp, memory = self.stages, self.milp, self.memory
        tensors = problem.tensors
        tensor_win, op_win = stages.windows
        self.saved = {t: milp.add_vars(binary=True) for t in sorted(tensor_win)}
        self.held = {}
        for t, (a, b) in sorted(tensor_win.items()):
            first = milp.add_vars(b - a + 1, binary=True)
            self.held.update({(t, k): first + k - a for k in range(a, b + 1)})
        self.rerun = {}
        for o, (a, b) in sorted(op_win.items()):
            first = milp.add_vars(b - a + 1, binary=True)
            self.rerun.update({(o, k): first + k - a for k in range(a, b + 1)})
            for k in range(a, b + 1):
                memory.add_time(first + k - a, problem.ops[o].time)

        def present(t: int, k: int) -> list[tuple[int, float]]:
            terms = [(self.held[(t, k)], 1.0)]
            if (tensors[t].producer, k) in self.rerun:
                terms.append((self.rerun[(tensors[t].producer, k)], 1.0))
            return terms

        for k, op in enumerate(problem.backward_ops):
            for t in op.inputs:
                if t in tensor_win:
                    milp.add_row([(c, -v) for c, v in present(t, k)], -1.0)
        for (o, k), var in self.rerun.items():
            for t in problem.ops[o].inputs:
                if t in tensor_win:
                    milp.add_row([(var, 1.0)] + [(c, -v) for c, v in present(t, k)], 0.0)
        for t, (a, b) in tensor_win.items():
            milp.add_row([(self.held[(t, a)], 1.0), (self.saved[t], -1.0)], 0.0)
            for k in range(a, b):
                terms = [(self.held[(t, k + 1)], 1.0), (self.held[(t, k)], -1.0)]
                if (tensors[t].producer, k) in self.rerun:
                    terms.append((self.rerun[(tensors[t].producer, k)], -1.0))
                milp.add_row(terms, 0.0)

        for fixed, optional, _ in stages.forward_rows:
            memory.add([(self.saved[t], tensors[t].bytes) for t in optional], fixed)
        held: list[list[tuple[int, float]]] = [[] for _ in range(stages.count)]
        for t, (a, b) in tensor_win.items():
            for k in range(a):
                held[k].append((self.saved[t], self.units(tensors[t].bytes)))
            for k in range(a, b + 1):
                held[k].append((self.held[(t, k)], self.units(tensors[t].bytes)))
        candidates: list[list[int]] = [[] for _ in range(stages.count)]
        for o, k in sorted(self.rerun):
            candidates[k].append(o)

        def kept_after(k: int, u: int, made: list[tuple[int, float]]) -> list[tuple[int, float]]:
            """Made at stage k and read by backward op k, or held into stage k + 1."""
            if u not in tensor_win or k > tensor_win[u][1]:
                return []
            x = milp.add_vars()
            if k in stages.read_at.get(u, ()):
                milp.add_row(made + [(x, -1.0)], 0.0)
            if (u, k + 1) in self.held:
                milp.add_row(made + [(self.held[(u, k + 1)], 1.0), (x, -1.0)], 1.0)
            return [(x, 1.0)]

        def cost(o: int, when: list[tuple[int, float]]) -> list[tuple[float, list[tuple[int, float]]]]:
            (_, size), = stages.op_cost(problem.ops[o])  # resolved problems have no choices
            return [(0.0, [(v, c * self.units(size)) for v, c in when]) if when else (size, [])]

        for k in range(stages.count):
            self.add_stage(k, held[k], candidates[k], lambda o, k=k: [(self.rerun[(o, k)], 1.0)],
                           lambda u, made, k=k: kept_after(k, u, made), cost)

    def reruns(self, values: np.ndarray) -> dict[int, list[int]]:
        by_stage: dict[int, list[int]] = {}
        for (o, k), var in self.rerun.items():
            if values[var] > 0.5:
                by_stage.setdefault(k, []).append(o)
        return by_stage
