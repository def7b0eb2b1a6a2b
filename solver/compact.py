"""The compact formulation: keep or drop each tensor; a dropped one is recomputed once.

The only binary decisions are d[t], "drop forward tensor t" (else it is saved).
A dropped tensor's op reruns once, at the first stage where any dropped
output of it is needed (read by the backward, or read by a rerun that needs
it), and that copy is held until the tensor's last need: the schedules of
Chen's checkpointing, generalised to any keep set on a DAG. Everything else
follows from d and is continuous, and integral whenever d is:
  P[o,k]   op o has rerun at or before stage k (monotone in k);
           bounded below and above by the needs that trigger it, so it
           switches on exactly at the first need;
  z        "consumer c has rerun by k and its input u is dropped", needed only when
           u's op has several needed outputs (else P[op(u),k] <= d[u] does it);
  Q[t,k]   t is still needed at stage k or later;
  M[t,k]   bytes of t held at stage k (saved copy, or the rerun copy).
Memory rows are those of the general formulation with M in place of S and R.
Binary variables: one per droppable tensor, so branch and bound stays small.
Tensors whose keeping is dominated (see Stages.never_worth_keeping) are
dropped outright; that loses no optimality.
"""

from __future__ import annotations

import numpy as np

from .milp import MemoryLimit, Milp
from .problem import Problem
from .schedule import Schedule
from .stages import Stages, stage_workspace

NAME = "compact"


class Compact:
    def __init__(self, problem: Problem, budget: int | None):
        self.problem = problem
        stages = Stages(problem)
        tensors = problem.tensors
        tensor_win, op_win = stages.windows
        first_read, last_read = stages.reads
        milp = self.milp = Milp()
        memory = MemoryLimit(milp, budget)

        self.drop = {t: milp.add_vars(binary=True) for t in sorted(tensor_win)}
        for t, var in self.drop.items():
            if tensors[t].producer not in op_win:
                milp.fix(var, 0.0)  # its op cannot rerun
            elif t in stages.never_worth_keeping:
                milp.fix(var, 1.0)

        # P[o,k] over o's window; after the window it keeps its last value.
        self.window = op_win
        self.p_first = {o: milp.add_vars(b - a + 1, upper=1.0) for o, (a, b) in sorted(op_win.items())}

        def P(o: int, k: int) -> int | None:
            if o not in op_win or k < op_win[o][0]:
                return None
            a, b = op_win[o]
            return self.p_first[o] + min(k, b) - a

        def ran_here(o: int, k: int) -> list[tuple[int, float]]:
            """Terms equal to 1 when o reruns exactly at stage k."""
            terms = [(P(o, k), 1.0)]
            if P(o, k - 1) is not None:
                terms.append((P(o, k - 1), -1.0))
            return terms

        # P[o,k] is squeezed between the needs that trigger o by stage k: below by each, above by their sum.
        triggers: dict[tuple[int, int], list[int]] = {}  # (op, stage) -> variables that may switch it on
        for o, (a, b) in op_win.items():
            for k in range(a + 1, b + 1):
                milp.add_row([(P(o, k - 1), 1.0), (P(o, k), -1.0)], 0.0)
            for k in range(a, b + 1):
                triggers[(o, k)] = []
            milp.add_cost(P(o, b), problem.ops[o].time * 1e3)
        for t, var in self.drop.items():
            o = tensors[t].producer
            if o in op_win and t in first_read:
                for k in range(max(op_win[o][0], first_read[t]), op_win[o][1] + 1):
                    milp.add_row([(var, 1.0), (P(o, k), -1.0)], 0.0)
                    triggers[(o, k)].append(var)
        needed_outputs = {o: [u for u in problem.ops[o].outputs if u in self.drop] for o in op_win}
        for o, outs in needed_outputs.items():
            if len(outs) == 1:  # a single needed output: o reruns only if it is dropped
                for k in range(op_win[o][0], op_win[o][1] + 1):
                    milp.add_row([(P(o, k), 1.0), (self.drop[outs[0]], -1.0)], 0.0)
        for c, (a, b) in op_win.items():
            for u in problem.ops[c].inputs:
                if u not in self.drop:
                    continue
                source = tensors[u].producer
                for k in range(a, b + 1):
                    if source not in op_win:
                        milp.add_row([(P(c, k), 1.0), (self.drop[u], 1.0)], 1.0)
                        continue
                    # c rerun by stage k with u dropped forces u's op by then.
                    milp.add_row([(P(c, k), 1.0), (self.drop[u], 1.0), (P(source, k), -1.0)], 1.0)
                    if len(needed_outputs[source]) == 1:
                        trigger = P(c, k)  # the source's own row above ties it to d[u]
                    else:
                        trigger = milp.add_vars(upper=1.0)  # P[c,k] and d[u]
                        milp.add_row([(P(c, k), 1.0), (self.drop[u], 1.0), (trigger, -1.0)], 1.0)
                        milp.add_row([(trigger, 1.0), (P(c, k), -1.0)], 0.0)
                        milp.add_row([(trigger, 1.0), (self.drop[u], -1.0)], 0.0)
                    triggers[(source, k)].append(trigger)
                    if k == b:  # past c's window P[c] keeps its last value, and so does this trigger
                        for later in range(b + 1, op_win[source][1] + 1):
                            triggers[(source, later)].append(trigger)
        for (o, k), trig in triggers.items():
            milp.add_row([(P(o, k), 1.0)] + [(v, -1.0) for v in trig], 0.0)

        # Memory held per tensor and stage.
        stage_terms: list[list[tuple[int, float]]] = [[] for _ in range(stages.count)]
        for t, (a, b) in tensor_win.items():
            o = tensors[t].producer
            needed = milp.add_vars(b + 1, upper=1.0)  # Q[t,0..b]
            held = milp.add_vars(b + 1)  # M[t,0..b]
            for k in range(b + 1):
                if k <= last_read.get(t, -1):
                    milp.fix(needed + k, 1.0)
                for c in problem.readers[t]:
                    if c in op_win:
                        terms = [(P(c, op_win[c][1]), 1.0), (needed + k, -1.0)]
                        if P(c, k - 1) is not None:
                            terms.append((P(c, k - 1), -1.0))
                        milp.add_row(terms, 0.0)
                milp.add_row([(needed + k, 1.0), (self.drop[t], -1.0), (held + k, -1.0)], 0.0)
                if P(o, k) is not None:
                    milp.add_row([(P(o, k), 1.0), (needed + k, 1.0), (held + k, -1.0)], 1.0)
                    milp.add_row(ran_here(o, k) + [(held + k, -1.0)], 0.0)
                stage_terms[k].append((held + k, tensors[t].bytes))

        reruns_at: list[list] = [[] for _ in range(stages.count)]
        for o, (a, b) in op_win.items():
            transient = sum(tensors[u].bytes for u in problem.ops[o].outputs if u not in tensor_win)
            for k in range(a, b + 1):
                reruns_at[k].append((o, ran_here(o, k)))
                if transient:
                    stage_terms[k] += [(v, c * transient) for v, c in ran_here(o, k)]
        for k in range(stages.count):
            ws = stage_workspace(milp, problem, stages.op_floor[k], reruns_at[k])
            memory.add(stage_terms[k] + [(ws, 1.0)], stages.backward_fixed[k])
        for fixed, optional in stages.forward_rows:
            saved_bytes = sum(tensors[t].bytes for t in optional)
            memory.add([(self.drop[t], -tensors[t].bytes) for t in optional], fixed + saved_bytes)
        self.memory = memory

    def schedule(self, values: np.ndarray) -> Schedule:
        by_stage: dict[int, list[int]] = {}
        for o, (a, b) in self.window.items():
            on = values[self.p_first[o]:self.p_first[o] + b - a + 1] > 0.5
            if on.any():
                by_stage.setdefault(a + int(np.argmax(on)), []).append(o)
        seq: list[int] = []
        for k, op in enumerate(self.problem.backward_ops):
            seq.extend(sorted(by_stage.get(k, [])))
            seq.append(op.id)
        return Schedule.from_backward(self.problem, seq)
