"""The general formulation: a tensor may be recomputed in any number of stages.

For every droppable forward tensor t that the backward may need, and every
stage k in the window where it can be needed (from where its op may first
rerun, if earlier: an op's rerun for one output also makes the others):
  s[t]    t is saved at the end of the forward pass
  S[t,k]  a copy of t is held entering stage k
and for every recomputable forward op o:
  R[o,k]  o is rerun in stage k, just before backward op k.
Presence:  a backward op reading t at stage k needs S[t,k] + R[op(t),k] >= 1;
           a rerun R[o,k] needs the same for each input of o.
Carry:     S[t,k+1] <= S[t,k] + R[op(t),k],  S[t,first] <= s[t].
Memory:    every forward op, and every moment of every stage (each rerun, then
           the backward op), within the budget; see Formulation.add_stage. A copy
           held into stage k counts at its reruns, and at backward op k only where
           that op reads it or it is held on (_left_for_backward).
How ops run is chosen with the rest, as in the compact formulation: y[c,j] (choice
c takes option j) decides what a backward op reads (its presence rows bind only
under the options that read), which tensors exist (a tensor made under some
options only is saved only under them), which ops may rerun, and each op's time,
workspace and rerun time (a rerun's time under option j is priced by a variable
at least R[o,k] + y[c,j] - 1).
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

    def __init__(self, problem: Problem, budget: int | None, horizon: int | None = None, *,
                 allow_approximate: bool = False, options: dict[str, str] | None = None):
        """`options` fixes choices; the others are chosen (approximate options only when allowed)."""
        super().__init__(problem, budget, horizon)
        self._choices(allow_approximate, options or {})
        self._variables()
        self._existence()
        self._presence()
        self._carry()
        self._forward_rows()
        self._stage_rows()
        self._objective()

    def _variables(self) -> None:
        """s[t], S[t,k] over t's hold window and R[o,k] over o's window. A tensor's hold window starts
        where its op may first rerun, where that is before the tensor's own window (an op with several
        outputs reruns for the first one needed): the copy that rerun makes can be held until needed."""
        milp = self.milp
        self.saved = {t: milp.add_vars(binary=True) for t in sorted(self.tensor_window)}
        producer = {t: self.problem.tensors[t].producer for t in self.tensor_window}
        self.hold_window = {t: (min(a, self.window[producer[t]][0]) if producer[t] in self.window else a, b)
                            for t, (a, b) in self.tensor_window.items()}
        self.held = {}
        for t, (a, b) in sorted(self.hold_window.items()):
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

    def _existence(self) -> None:
        """Options decide what can be saved and what can rerun: a tensor made under some options only
        is saved only under them, and an op reruns only under an option that lets it."""
        milp, problem = self.milp, self.problem
        for t, var in self.saved.items():
            made = self.stages.existence(t)
            if made is not None:
                producer, runs = made
                milp.add_row([(var, 1.0)] + [(v, -c) for j in runs for v, c in self._option(producer, j)], 0.0)
        for o in self.window:
            impls = problem.ops[o].impls
            if all(impl.recomputable for impl in impls):
                continue
            allowed = [(v, -c) for j, impl in enumerate(impls) if impl.recomputable for v, c in self._option(o, j)]
            for k in range(self.window[o][0], self.window[o][1] + 1):
                milp.add_row([(self.rerun[(o, k)], 1.0)] + allowed, 0.0)

    def _presence(self) -> None:
        """What backward op k reads under the chosen option, and what a rerun R[o,k] reads (its
        inputs, and what its option keeps), is present at stage k."""
        milp, problem = self.milp, self.problem
        for k, op in enumerate(problem.backward_ops):
            for t in {t for impl in op.impls if impl.runs for t in impl.inputs}:
                if t in self.tensor_window:
                    condition = self.reads_if(t, k)
                    milp.add_row(condition + [(c, -v) for c, v in self._present(t, k)], 0.0 if condition else -1.0)
        for (o, k), var in self.rerun.items():
            for t in problem.ops[o].inputs:
                if t in self.tensor_window:
                    milp.add_row([(var, 1.0)] + [(c, -v) for c, v in self._present(t, k)], 0.0)
            for j, impl in enumerate(problem.ops[o].impls):
                for t in impl.keeps:
                    if (t, k) in self.held:  # rerun here under option j: R + y_j - 1 <= present
                        milp.add_row([(var, 1.0)] + self._option(o, j) + [(c, -v) for c, v in self._present(t, k)],
                                     1.0 if self._option(o, j) else 0.0)

    def _carry(self) -> None:
        """S[t,k+1] <= S[t,k] + R[op(t),k],  S[t,first] <= s[t]."""
        milp, tensors = self.milp, self.problem.tensors
        for t, (a, b) in self.hold_window.items():
            milp.add_row([(self.held[(t, a)], 1.0), (self.saved[t], -1.0)], 0.0)
            for k in range(a, b):
                terms = [(self.held[(t, k + 1)], 1.0), (self.held[(t, k)], -1.0)]
                if (tensors[t].producer, k) in self.rerun:
                    terms.append((self.rerun[(tensors[t].producer, k)], -1.0))
                milp.add_row(terms, 0.0)

    def _forward_rows(self) -> None:
        """Memory rows at every forward op, with the saved tensors made so far and what the options
        make there."""
        tensors = self.problem.tensors
        for fixed, optional, by_option in self.stages.forward_rows:
            terms = [(self.saved[t], tensors[t].bytes) for t in optional]
            terms += [(v, c * size) for o, j, size in by_option for v, c in self._option(o, j)]
            self.memory.add(terms, fixed)
        self._saved_unless_in_place(lambda t: ([(self.saved[t], 1.0)], 0.0))

    def needed_after(self, t: int, k: int) -> Terms:
        """Held into stage k + 1."""
        return [(self.held[(t, k + 1)], 1.0)] if (t, k + 1) in self.held else []

    def _stage_rows(self) -> None:
        """Memory rows at every moment of every backward stage (see Formulation.add_stage)."""
        stages, tensors = self.stages, self.problem.tensors
        held: list[Terms] = [[] for _ in range(stages.count)]
        holding: list[list[int]] = [[] for _ in range(stages.count)]  # tensors saved or held at each stage
        for t, (a, b) in self.hold_window.items():
            size = self.units(tensors[t].bytes)
            for k in range(b + 1):
                held[k].append((self.saved[t] if k < a else self.held[(t, k)], size))
                holding[k].append(t)
        candidates: list[list[int]] = [[] for _ in range(stages.count)]
        for o, k in sorted(self.rerun):
            candidates[k].append(o)
        for k in range(stages.count):
            self.add_stage(k, held[k], candidates[k], lambda o, k=k: [(self.rerun[(o, k)], 1.0)], self._cost_rows,
                           lambda k=k: [(v, c * self.units(tensors[t].bytes)) for t in holding[k]
                                        for v, c in self._left_for_backward(t, k)])

    def _left_for_backward(self, t: int, k: int) -> Terms:
        """Terms that sum to 1 when the copy of t held into stage k is still there when backward op k runs
        (Formulation.copy_at_backward); before t's hold window, s[t] (saved, held until a later stage)."""
        if k < self.hold_window[t][0]:
            return [(self.saved[t], 1.0)]
        return self.copy_at_backward(t, k, self.held[(t, k)], self.held.get((t, k + 1)))

    def _objective(self) -> None:
        """Each rerun's time under its op's option: the least of its options' on R[o,k], and what an
        option costs more on a variable at least R[o,k] + y_j - 1; the times that depend on options;
        what saving a tensor costs, on s[t]."""
        milp = self.milp
        for t, var in self.saved.items():
            if self.problem.tensors[t].keep_time:
                self.memory.add_time(var, self.problem.tensors[t].keep_time)
        for (o, _), var in self.rerun.items():
            times = [impl.recompute_time for impl in self.problem.ops[o].impls]
            self.memory.add_time(var, min(times))
            for j, seconds in enumerate(times):
                option = self._option(o, j)
                if seconds > min(times) and option and milp.upper(option[0][0]) > 0:
                    more = milp.add_vars(upper=1.0)
                    milp.add_row([(var, 1.0)] + option + [(more, -1.0)], 1.0)
                    self.memory.add_time(more, seconds - min(times))
        self._option_times()

    def warm_from(self, schedule: Schedule) -> dict[int, float] | None:
        """Binary values of `schedule` (of this formulation's problem): y from its options, s from what
        it saves, R from the stage of each rerun, S wherever a copy is read later before its op reruns
        again. None when a rerun falls outside its op's window (a horizon excludes it)."""
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
        read: dict[int, set[int]] = {}  # tensor -> stages that read it, as the schedule runs ops
        for k, op in enumerate(self.problem.backward_ops):
            impl = schedule.impl(self.problem, op)
            for t in impl.inputs if impl.runs else ():
                read.setdefault(t, set()).add(k)
        for o, stages in ran.items():
            for t in schedule.impl(self.problem, self.problem.ops[o]).backward_reads:
                read.setdefault(t, set()).update(stages)
        values = self.option_values(schedule.options)
        values.update({var: float(t in schedule.saved) for t, var in self.saved.items()})
        values.update({var: float(k in ran.get(o, ())) for (o, k), var in self.rerun.items()})
        for t, (a, b) in self.hold_window.items():
            remade = ran.get(self.problem.tensors[t].producer, set())
            needed = False  # walking back from the window's end: read at k or later, before a rerun
            for k in range(b, a - 1, -1):
                needed = k not in remade and (needed or k in read.get(t, ()))
                values[self.held[(t, k)]] = float(needed)
        return values

    def owners(self) -> dict[int, frozenset[int]]:
        """Binary variable -> the ops whose decisions it belongs to: s[t] and S[t,k] to t's producer,
        R[o,k] to o. Options (how ops run) belong to no op: a neighbourhood search (solver/polish.py)
        frees the variables of a few forward ops, and every option, in each piece."""
        problem = self.problem
        owners = {var: frozenset((problem.tensors[t].producer,)) for t, var in self.saved.items()}
        owners.update({var: frozenset((problem.tensors[t].producer,)) for (t, _), var in self.held.items()})
        owners.update({var: frozenset((o,)) for (o, _), var in self.rerun.items()})
        return owners

    def reruns(self, values: np.ndarray) -> dict[int, list[int]]:
        by_stage: dict[int, list[int]] = {}
        for (o, k), var in self.rerun.items():
            if values[var] > 0.5:
                by_stage.setdefault(k, []).append(o)
        return by_stage
