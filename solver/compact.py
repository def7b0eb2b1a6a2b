"""The compact formulation: how each op runs, and whether each tensor is kept or rebuilt once.

Binary decisions:
  y[c,j]   choice c takes option j (one option per choice; approximate options
           only when allowed), which fixes how the ops that depend on c run;
  d[t]     forward tensor t is dropped (else it is saved).
A dropped tensor's op reruns once, at the first stage where any dropped output
of it is needed (read by the backward, or read by a rerun that needs it), and
that copy is held until the tensor's last need: the schedules of Chen's
checkpointing, generalised to any keep set on a DAG. Everything else follows
from y and d, is continuous, and is integral whenever they are:
  P[o,k]   op o has rerun at or before stage k (monotone in k); bounded below and
           above by the needs that trigger it, so it switches on at the first need;
  Q[t,k]   t is still needed at stage k or later;
  held     copies made before stage k and still needed at it;
  S, X     bytes made by a stage's reruns, moment by moment;
  and products of a binary with another 0/1 quantity where a need, a time or
  a workspace depends on an option.
Memory rows: every forward op, and every moment of every stage (each rerun,
then the backward op). A rerun output stays counted until its last forward
reader among the stage's possible reruns has run, so the rows are exact for
chains and an upper bound elsewhere; a copy held into a stage counts at its
backward op only where that op may read it or it is needed later (as in the
general formulation). Tensors whose keeping is dominated
(Stages.never_worth_keeping) are dropped outright, which loses no optimality.
"""

from __future__ import annotations

import numpy as np

from .formulation import Formulation, Terms
from .problem import Problem


class Compact(Formulation):
    name = "compact"

    def __init__(self, problem: Problem, budget: int | None, *, allow_approximate: bool = False,
                 options: dict[str, str] | None = None, horizon: int | None = None):
        """`options` fixes choices (e.g. every choice to its first option: checkpointing alone);
        `horizon` bounds how early ops may rerun (see Stages)."""
        super().__init__(problem, budget, horizon)
        self._choices(allow_approximate, options or {})
        self._keep_or_drop()
        self._rerun_variables()
        self._rerun_triggers()
        self._needs()
        held = self._held()
        self._stage_rows(held)
        self._forward_rows()
        self._objective()

    # ---- variables and their links -----------------------------------------
    def _keep_or_drop(self) -> None:
        """d[t], and the options that forbid dropping: an option whose reruns read saved tensors
        keeps them, and an op's outputs are dropped only under an option that lets it rerun."""
        milp, problem, stages = self.milp, self.problem, self.stages
        self.one = milp.add_vars(lower=1.0, upper=1.0)  # the constant 1, for bytes in running sums
        self.drop = {t: milp.add_vars(binary=True) for t in sorted(self.tensor_window)}
        for t, var in self.drop.items():
            if problem.tensors[t].producer not in self.window:
                milp.fix(var, 0.0)  # its op cannot rerun
            elif t in stages.never_worth_keeping:
                milp.fix(var, 1.0)
        for op in problem.ops:
            for j, impl in enumerate(op.impls):
                for t in impl.keeps:
                    if t in self.drop:
                        milp.add_row([(self.drop[t], 1.0)] + self._option(op.id, j), 1.0)
            if op.id in self.window and not all(impl.recomputable for impl in op.impls):
                rerun_options = [term for j, impl in enumerate(op.impls) if impl.recomputable
                                 for term in self._option(op.id, j)]
                for t in op.outputs:
                    if t in self.drop:
                        milp.add_row([(self.drop[t], 1.0)] + [(v, -c) for v, c in rerun_options], 0.0)

    def _P(self, o: int, k: int) -> int | None:
        """P[o,k] over o's window; after the window it keeps its last value (None before it)."""
        if o not in self.window or k < self.window[o][0]:
            return None
        a, b = self.window[o]
        return self.p_first[o] + min(k, b) - a

    def _ran_here(self, o: int, k: int) -> Terms:
        """Terms equal to 1 when o reruns exactly at stage k."""
        terms = [(self._P(o, k), 1.0)]
        if self._P(o, k - 1) is not None:
            terms.append((self._P(o, k - 1), -1.0))
        return terms

    def _rerun_variables(self) -> None:
        """P[o,k], monotone in k, and the rerun's time under each option (for the objective)."""
        milp, P = self.milp, self._P
        self.p_first = {o: milp.add_vars(b - a + 1, upper=1.0) for o, (a, b) in sorted(self.window.items())}
        self._rerun_times: list[tuple[int, float]] = []
        for o, (a, b) in self.window.items():
            for k in range(a + 1, b + 1):
                milp.add_row([(P(o, k - 1), 1.0), (P(o, k), -1.0)], 0.0)
            impls = self.problem.ops[o].impls
            end = [(P(o, b), 1.0)]
            for j, impl in enumerate(impls):  # rerun time, as the op runs under the chosen option
                self._rerun_times += [(var, impl.recompute_time) for var, _ in self._both(end, self._option(o, j))]

    def _rerun_triggers(self) -> None:
        """P[o,k] squeezed between the needs that trigger o by stage k: below by each, above by
        their sum. A need is a dropped output read by the backward, or read by a rerun that needs it."""
        milp, problem, P, op_win = self.milp, self.problem, self._P, self.window
        tensors = problem.tensors
        triggers: dict[tuple[int, int], list[int]] = {(o, k): [] for o, (a, b) in op_win.items()
                                                       for k in range(a, b + 1)}
        for t, drop in self.drop.items():
            o = tensors[t].producer
            if o not in op_win:
                continue
            for k in sorted(self.stages.read_at.get(t, ())):
                condition = self.reads_if(t, k)
                (need, _), = self._both([(drop, 1.0)], condition)  # dropped, and read here
                milp.add_row([(need, 1.0), (P(o, k), -1.0)], 0.0)
                for later in range(k, op_win[o][1] + 1):
                    triggers[(o, later)].append(need)
                if not condition:
                    break  # later reads are implied by monotonicity
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
                    if P(source, k) is None:  # u's op cannot rerun by then
                        milp.add_row([(P(c, k), 1.0), (self.drop[u], 1.0)], 1.0)
                        continue
                    # c rerun by stage k with u dropped forces u's op by then.
                    milp.add_row([(P(c, k), 1.0), (self.drop[u], 1.0), (P(source, k), -1.0)], 1.0)
                    trigger = ([(P(c, k), 1.0)] if len(needed_outputs[source]) == 1  # its own row ties it to d[u]
                               else self._both([(P(c, k), 1.0)], [(self.drop[u], 1.0)]))
                    triggers[(source, k)].append(trigger[0][0])
                    if k == b:  # past c's window P[c] keeps its last value, and so does this trigger
                        for later in range(b + 1, op_win[source][1] + 1):
                            triggers[(source, later)].append(trigger[0][0])
        for (o, k), trig in triggers.items():
            milp.add_row([(P(o, k), 1.0)] + [(v, -1.0) for v in trig], 0.0)

    def _Q(self, t: int, k: int) -> int:
        """Q[t,k]: a variable over t's window only; before the window it equals its first value."""
        a = self.tensor_window[t][0]
        return self._needed[t] + max(k, a) - a

    def _needs(self) -> None:
        """Q[t,k]: t is still needed at stage k or later (read there, or read by a rerun there)."""
        milp, stages, Q = self.milp, self.stages, self._Q
        conditional = stages.read_only_under
        self._needed: dict[int, int] = {}
        self._surely: dict[int, int] = {}  # the last stage that reads t under every option (-1: none)
        for t, (a, b) in self.tensor_window.items():
            self._needed[t] = milp.add_vars(b - a + 2, upper=1.0)  # Q[t,a..b+1]; Q[t,b+1] = 0
            milp.fix(Q(t, b + 1), 0.0)
            self._surely[t] = max((k for k in stages.read_at.get(t, ()) if (t, k) not in conditional), default=-1)
            for k in range(a, b + 1):
                if k <= self._surely[t]:
                    milp.fix(Q(t, k), 1.0)
                else:
                    milp.add_row([(Q(t, k + 1), 1.0), (Q(t, k), -1.0)], 0.0)
                if (t, k) in conditional:
                    milp.add_row(self.reads_if(t, k) + [(Q(t, k), -1.0)], 0.0)
            for c in (c for c in self.problem.readers[t] if c in self.window):
                for k in range(self.window[c][0], self.window[c][1] + 1):  # c reruns at k, so t is needed at k
                    milp.add_row(self._ran_here(c, k) + [(Q(t, k), -1.0)], 0.0)

    def _held(self) -> list[Terms]:
        """Per stage k, entering: copies made before it that are still needed (the saved copy of a
        kept tensor, or a copy rerun in an earlier stage), as terms of their bytes in memory units.
        Before t's op can have rerun and before t's window, only the saved copy can be held, and
        whether it is needed does not change: one term (1 - d[t], or max(0, Q[t,a] - d[t]) when
        no read is sure) counts it over those stages, gathered per stage by a running sum."""
        milp, stages, P, Q = self.milp, self.stages, self._P, self._Q
        held_terms: list[Terms] = [[] for _ in range(stages.count)]
        self._copies: list[dict[int, tuple[int, float]]] = [{} for _ in range(stages.count + 1)]  # t -> (h, size)
        saved_from: list[Terms] = [[] for _ in range(stages.count + 1)]  # saved copies counted below stage k
        for t, (a, b) in self.tensor_window.items():
            o, size = self.problem.tensors[t].producer, self.units(self.problem.tensors[t].bytes)
            pre = min(self.window[o][0] + 1 if o in self.window else b + 1, b + 1, max(a, self._surely[t] + 1))
            if self._surely[t] >= a:
                saved_from[pre] += [(self.drop[t], -size), (self.one, size)]
            else:
                h = milp.add_vars()
                milp.add_row([(Q(t, a), 1.0), (self.drop[t], -1.0), (h, -1.0)], 0.0)
                saved_from[pre].append((h, size))
            for k in range(pre, b + 1):
                h = milp.add_vars()
                milp.add_row([(Q(t, k), 1.0), (self.drop[t], -1.0), (h, -1.0)], 0.0)
                if P(o, k - 1) is not None:
                    milp.add_row([(P(o, k - 1), 1.0), (Q(t, k), 1.0), (h, -1.0)], 1.0)
                held_terms[k].append((h, size))
                self._copies[k][t] = (h, size)
        below: Terms = []
        for k in range(stages.count - 1, -1, -1):
            saved_before = milp.add_vars()
            milp.add_row(below + saved_from[k + 1] + [(saved_before, -1.0)], 0.0)
            held_terms[k].append((saved_before, 1.0))
            below = [(saved_before, 1.0)]
        return held_terms

    # ---- memory rows and objective -----------------------------------------
    def needed_after(self, t: int, k: int) -> Terms:
        return [(self._Q(t, k + 1), 1.0)]

    def _stage_rows(self, held: list[Terms]) -> None:
        """Memory rows at every moment of every backward stage (see Formulation.add_stage)."""
        candidates: list[list[int]] = [[] for _ in range(self.stages.count)]
        for o, (a, b) in sorted(self.window.items()):
            for k in range(a, b + 1):
                candidates[k].append(o)
        for k in range(self.stages.count):
            self.add_stage(k, held[k], candidates[k], lambda o, k=k: self._ran_here(o, k), self._cost_rows,
                           lambda k=k: self._left_for_backward(held[k], k))

    def _left_for_backward(self, held: Terms, k: int) -> Terms:
        """`held` as backward op k finds it: each copy counted as h[t,k] as Formulation.copy_at_backward
        says, with h[t,k+1] as the copy held on. The saved copies counted before t's h stages are read at k
        or needed later, so stay."""
        copies, after = self._copies[k], self._copies[k + 1]
        held_copies = {h for h, _ in copies.values()}
        left: Terms = [(v, c) for v, c in held if v not in held_copies]
        for t, (h, size) in copies.items():
            held_on = after[t][0] if t in after else None
            left += [(v, c * size) for v, c in self.copy_at_backward(t, k, h, held_on)]
        return left

    def _forward_rows(self) -> None:
        """Memory rows at every forward op: what is live, less the saved tensors dropped."""
        tensors = self.problem.tensors
        for fixed, optional, by_option in self.stages.forward_rows:
            saved_bytes = sum(tensors[t].bytes for t in optional)
            terms = [(self.drop[t], -tensors[t].bytes) for t in optional]
            terms += [(v, c * size) for o, j, size in by_option for v, c in self._option(o, j)]
            self.memory.add(terms, fixed + saved_bytes)
        self._saved_unless_in_place(lambda t: ([(self.drop[t], -1.0)], 1.0))

    def _objective(self) -> None:
        """Rerun times, the forward and backward ops' own times where they depend on an option, and what
        saving a tensor costs (on a variable at least 1 - d[t])."""
        for var, seconds in self._rerun_times:
            self.memory.add_time(var, seconds)
        self._option_times()
        for t, drop in self.drop.items():
            if self.problem.tensors[t].keep_time:
                kept = self.milp.add_vars(upper=1.0)
                self.milp.add_row([(kept, -1.0), (drop, -1.0)], -1.0)
                self.memory.add_time(kept, self.problem.tensors[t].keep_time)

    def warm_start(self, dropped: frozenset[int], options: dict[str, str]) -> dict[int, float]:
        return {var: float(t in dropped) for t, var in self.drop.items()} | self.option_values(options)

    def reruns(self, values: np.ndarray) -> dict[int, list[int]]:
        by_stage: dict[int, list[int]] = {}
        for o, (a, b) in self.window.items():
            on = values[self.p_first[o]:self.p_first[o] + b - a + 1] > 0.5
            if on.any():
                by_stage.setdefault(a + int(np.argmax(on)), []).append(o)
        return by_stage

