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
  held     copies made before stage k and still needed at it;
  S, X     bytes made by a stage's reruns, moment by moment (see below).
Memory rows: every forward op, and every moment of every stage (each rerun,
then the backward op). A rerun output stays counted until its last forward
reader among the stage's possible reruns has run, so the rows are exact for
chains and an upper bound elsewhere.
Binary variables: one per droppable tensor, so branch and bound stays small.
Tensors whose keeping is dominated (see Stages.never_worth_keeping) are
dropped outright; that loses no optimality.
"""

from __future__ import annotations

import numpy as np

from .formulation import Formulation
from .problem import Problem


class Compact(Formulation):
    def __init__(self, problem: Problem, budget: int | None):
        super().__init__(problem, budget)
        stages, milp, memory = self.stages, self.milp, self.memory
        tensors = problem.tensors
        tensor_win, op_win = stages.windows
        first_read, last_read = stages.reads

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
            memory.add_time(P(o, b), problem.ops[o].time)
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

        # Q[t,k]: t is still needed at stage k or later (read there, or read by a rerun there).
        needed: dict[int, int] = {}
        for t, (_, b) in tensor_win.items():
            needed[t] = milp.add_vars(b + 2, upper=1.0)  # Q[t,0..b+1]; Q[t,b+1] = 0
            milp.fix(needed[t] + b + 1, 0.0)
            for k in range(b + 1):
                if k <= last_read.get(t, -1):
                    milp.fix(needed[t] + k, 1.0)
                for c in problem.readers[t]:
                    if c in op_win:
                        terms = [(P(c, op_win[c][1]), 1.0), (needed[t] + k, -1.0)]
                        if P(c, k - 1) is not None:
                            terms.append((P(c, k - 1), -1.0))
                        milp.add_row(terms, 0.0)

        # Stage k, entering: copies made before it that are still needed (the saved copy of a
        # kept tensor, or a copy rerun in an earlier stage). Their bytes, summed, are held[k].
        held_terms: list[list[tuple[int, float]]] = [[] for _ in range(stages.count)]
        for t, (_, b) in tensor_win.items():
            o = tensors[t].producer
            for k in range(b + 1):
                h = milp.add_vars()
                milp.add_row([(needed[t] + k, 1.0), (self.drop[t], -1.0), (h, -1.0)], 0.0)
                if P(o, k - 1) is not None:
                    milp.add_row([(P(o, k - 1), 1.0), (needed[t] + k, 1.0), (h, -1.0)], 1.0)
                held_terms[k].append((h, tensors[t].bytes))

        # Within stage k, reruns run in forward order, then backward op k. A running sum
        # S tracks the bytes made by this stage's reruns: an output counts until its last
        # forward reader among this stage's candidates has run, then only if it is still
        # needed later (X). Each moment is a memory row, so workspace counts where it occurs.
        candidates: list[list[int]] = [[] for _ in range(stages.count)]
        for o, (a, b) in sorted(op_win.items()):
            for k in range(a, b + 1):
                candidates[k].append(o)
        for k in range(stages.count):
            held = milp.add_vars()
            milp.add_row(held_terms[k] + [(held, -1.0)], 0.0)
            ops_here = candidates[k]
            position = {o: i for i, o in enumerate(ops_here)}
            releases: list[list[tuple[int, list[tuple[int, float]]]]] = [[] for _ in ops_here]
            for i, o in enumerate(ops_here):
                for u in problem.ops[o].outputs:
                    readers_here = [position[c] for c in problem.readers[u] if c in position]
                    later = []  # terms of "made here and still needed after this stage's reruns"
                    if u in tensor_win and k <= tensor_win[u][1]:
                        x = milp.add_vars()
                        later = [(x, 1.0)]
                        if k in stages.read_at.get(u, ()):
                            milp.add_row(ran_here(o, k) + [(x, -1.0)], 0.0)
                        else:
                            milp.add_row(ran_here(o, k) + [(needed[u] + k + 1, 1.0), (x, -1.0)], 1.0)
                    releases[max(readers_here, default=i)].append((u, later))
            running = None
            for i, o in enumerate(ops_here):
                moment = [(held, 1.0)] + ([(running, 1.0)] if running is not None else [])
                cost = problem.out_bytes(problem.ops[o]) + problem.ops[o].workspace
                memory.add(moment + [(v, c * cost) for v, c in ran_here(o, k)], stages.backward_fixed[k])
                nxt = milp.add_vars()
                row = [(nxt, -1.0)] + ([(running, 1.0)] if running is not None else [])
                row += [(v, c * problem.out_bytes(problem.ops[o])) for v, c in ran_here(o, k)]
                for u, later in releases[i]:
                    made = ran_here(tensors[u].producer, k)
                    row += [(v, -c * tensors[u].bytes) for v, c in made]
                    row += [(v, c * tensors[u].bytes) for v, c in later]
                milp.add_row(row, 0.0)
                running = nxt
            end = [(held, 1.0)] + ([(running, 1.0)] if running is not None else [])
            memory.add(end, stages.backward_fixed[k] + stages.op_floor[k])

        for fixed, optional in stages.forward_rows:
            saved_bytes = sum(tensors[t].bytes for t in optional)
            memory.add([(self.drop[t], -tensors[t].bytes) for t in optional], fixed + saved_bytes)

    def warm_start(self, dropped: frozenset[int]) -> dict[int, float]:
        """Values of the binaries for a first-need schedule that drops `dropped`."""
        return {var: float(t in dropped) for t, var in self.drop.items()}

    def reruns(self, values: np.ndarray) -> dict[int, list[int]]:
        by_stage: dict[int, list[int]] = {}
        for o, (a, b) in self.window.items():
            on = values[self.p_first[o]:self.p_first[o] + b - a + 1] > 0.5
            if on.any():
                by_stage.setdefault(a + int(np.argmax(on)), []).append(o)
        return by_stage
