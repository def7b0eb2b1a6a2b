"""What the ILP formulations share: the problem, its stages, the MILP, its memory rows,
and turning "which ops rerun in which stage" into a schedule."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .milp import MemoryLimit, Milp
from .problem import Problem
from .schedule import Schedule
from .stages import Stages

Terms = list[tuple[int, float]]


class Formulation:
    name = ""

    def __init__(self, problem: Problem, budget: int | None, horizon: int | None = None):
        """Memory rows bound the peak by `budget` bytes, or (None) minimise the peak."""
        self.problem = problem
        self.stages = Stages(problem, horizon)
        # Where each droppable tensor can be needed, and where each op can rerun: stage ranges.
        self.tensor_window, self.window = self.stages.windows
        for o in self.window:  # a rerun is one op whatever its option: same inputs, and it runs
            impls = problem.ops[o].impls
            if any(impl.inputs != impls[0].inputs or (impl.recomputable and not impl.runs) for impl in impls):
                raise ValueError(f"op {problem.ops[o].name!r} reruns, so all its options must read the same, and "
                                 "each it reruns under must run")
        self.milp = Milp()
        self.kept: dict[tuple[int, int], int] = {}  # (output, stage) -> kept_after's variable
        self.memory = MemoryLimit(self.milp, budget, max((t.bytes for t in problem.tensors), default=1))
        # Every row that sums bytes states them in memory units (a power of two bytes, so the
        # conversion is exact): byte coefficients of a GPU-size problem (1e10) beside the memory
        # rows' 1 / unit (1e-7) span more than HiGHS can handle, and it then calls feasible
        # models infeasible and stops at schedules far from the optimum as if they were optimal.
        self.unit = self.memory.unit
        if problem.update_peak is not None:  # the optimizer's step: the same under every schedule
            self.add_memory([], problem.update_peak)

    def units(self, nbytes: float) -> float:
        """Bytes as memory units (the coefficients of every running sum of bytes)."""
        return nbytes / self.unit

    def add_memory(self, terms: Terms, fixed_bytes: float) -> None:
        """Memory row `terms + fixed_bytes <= limit`: `terms` in memory units (running sums,
        or bytes already divided by `units`), `fixed_bytes` in bytes."""
        self.memory.add([(v, c * self.unit) for v, c in terms], fixed_bytes)

    # ---- how ops run: one option per choice -----------------------------------
    def _choices(self, allow_approximate: bool, options: dict[str, str]) -> None:
        """y[c,j], one option per choice. An allowed option that another allowed option dominates
        is left out (no loss)."""
        milp = self.milp
        self.option_var: dict[tuple[str, int], int] = {}
        self.better: dict[tuple[str, int], int] = {}  # dominated option -> the option that replaces it
        ops_of: dict[str, list] = {}
        for op in self.problem.ops:
            if op.choice is not None:
                ops_of.setdefault(op.choice, []).append(op)
        for choice in self.problem.choices:
            first = milp.add_vars(len(choice.options), binary=True)
            milp.add_row([(first + j, 1.0) for j in range(len(choice.options))], 1.0)
            milp.add_row([(first + j, -1.0) for j in range(len(choice.options))], -1.0)
            forced = options.get(choice.name)
            allowed = [j for j, name in enumerate(choice.options)
                       if (allow_approximate or name not in choice.approximate) and (not forced or forced == name)]
            for j in range(len(choice.options)):
                self.option_var[(choice.name, j)] = first + j
                better = next((i for i in allowed if i != j and _dominates(ops_of.get(choice.name, []), i, j)), None)
                if j not in allowed or better is not None:
                    milp.fix(first + j, 0.0)
                if j in allowed and better is not None:
                    self.better[(choice.name, j)] = better

    def _option(self, op_id: int, j: int) -> Terms:
        """Terms equal to 1 when op `op_id` runs as its option j (always, without a choice)."""
        op = self.problem.ops[op_id]
        return [] if op.choice is None else [(self.option_var[(op.choice, j)], 1.0)]

    def _both(self, a: Terms, b: Terms) -> Terms:
        """Terms of a variable equal to the product of two 0/1 quantities (an empty one is 1)."""
        if not a or not b:
            return a or b
        milp = self.milp
        z = milp.add_vars(upper=1.0)
        milp.add_row(a + b + [(z, -1.0)], 1.0)
        milp.add_row([(z, 1.0)] + [(v, -c) for v, c in a], 0.0)
        milp.add_row([(z, 1.0)] + [(v, -c) for v, c in b], 0.0)
        return [(z, 1.0)]

    def reads_if(self, t: int, k: int) -> Terms:
        """Terms equal to 1 when backward op k reads t under the chosen option ([] when always)."""
        conditional = self.stages.read_only_under
        if (t, k) not in conditional:
            return []
        return [term for j in conditional[(t, k)] for term in self._option(self.problem.backward_ops[k].id, j)]

    def _cost_rows(self, op_id: int, when: Terms) -> list[tuple[float, Terms]]:
        """The outputs and workspace of running op `op_id` when `when` is 1, as (constant, terms)
        per memory row (constants in bytes, terms in memory units). A rerun whose options cost
        differently gets a row per option j that binds only when j is chosen:
        size_j * (when + y_j - 1), with no product variable."""
        sizes = self.stages.op_cost(self.problem.ops[op_id])
        if when and len({size for _, size in sizes}) > 1:
            return [(-size, [(v, c * self.units(size)) for v, c in when + self._option(op_id, j)])
                    for j, size in sizes]
        if when:
            return [(0.0, [(v, c * self.units(sizes[0][1])) for v, c in when])]
        constant, terms = 0.0, []
        for j, size in sizes:
            if j is None:
                constant += size
            else:
                terms += [(v, c * self.units(size)) for v, c in self._option(op_id, j)]
        return [(constant, terms)]

    def _option_times(self) -> None:
        """Objective terms: the time of every op whose time depends on its choice's option, run once."""
        for op in self.problem.ops:
            for j, impl in enumerate(op.impls if op.choice else ()):
                self.memory.add_time(self.option_var[(op.choice, j)], impl.time if impl.runs else 0.0)

    def option_values(self, options: dict[str, str]) -> dict[int, float]:
        """Binary values of the option variables when ops run as `options` say (a dominated option
        as the option that replaces it)."""
        chosen = {c.name: c.options.index(options.get(c.name, c.options[0])) for c in self.problem.choices}
        for c, j in chosen.items():
            while (c, j) in self.better:
                j = chosen[c] = self.better[(c, j)]
        return {var: float(j == chosen[c]) for (c, j), var in self.option_var.items()}

    def needed_after(self, t: int, k: int) -> Terms:
        """Terms equal to 1 when a copy of t made at stage k must outlive it ([] if never)."""
        raise NotImplementedError

    def kept_after(self, k: int, u: int, made: Terms) -> Terms:
        """Terms equal to 1 when output u, made at stage k (`made`), is still needed after the
        stage's reruns: by backward op k, or later ([] if never)."""
        if u not in self.tensor_window or k > self.tensor_window[u][1]:
            return []
        milp = self.milp
        x = self.kept[(u, k)] = milp.add_vars()
        if k in self.stages.read_at.get(u, ()):
            condition = self.reads_if(u, k)
            milp.add_row(made + condition + [(x, -1.0)], 1.0 if condition else 0.0)
        later = self.needed_after(u, k)
        if later:
            milp.add_row(made + later + [(x, -1.0)], 1.0)
        return [(x, 1.0)]

    def copy_at_backward(self, t: int, k: int, here: int, after: int | None) -> Terms:
        """Terms that sum to 1 when the copy of t held into stage k (variable `here`) is still there when
        backward op k runs: that op may read t, or a copy is held on into stage k + 1 (`after`, that copy's
        variable; None where t is not needed after k). A copy that only the stage's reruns read is gone by
        then (the simulator frees a copy after its last reader): counting it to the stage's end priced
        Gurobi's own UNet 5 GB schedule at 1.11 times the budget, which it replays within. Held on: `after`
        (one copy of t, held or remade here, enters stage k + 1), less the remade one where t's op reruns at
        k, which the running sum counts as kept (kept_after): the two cancel in the backward op's row."""
        if k in self.stages.read_at.get(t, ()):
            return [(here, 1.0)]
        if after is None:
            return []
        remade = self.kept.get((t, k))  # only where t's op may rerun at k
        return [(after, 1.0)] + ([(remade, -1.0)] if remade is not None else [])

    def add_stage(self, k: int, held: Terms, candidates: list[int], ran: Callable[[int], Terms],
                  cost: Callable[[int, Terms], list[tuple[float, Terms]]],
                  at_backward: Callable[[], Terms] | None = None) -> None:
        """Memory rows for every moment of stage k: each candidate rerun in forward order, then
        backward op k. `held`: bytes of copies made before the stage and still needed in it;
        `at_backward()`: those of them still there when backward op k runs, called once the stage's
        reruns' variables exist (None: all of `held`);
        `ran(o)`: terms equal to 1 when o reruns here;
        `cost(op, when)`: bytes of running an op (outputs and workspace), as (constant, terms) per
        memory row that must hold. `held` and `cost`'s terms are in memory units (see `units`),
        `cost`'s constants in bytes.
        A running sum tracks the bytes this stage's reruns made: an output counts until its last
        forward reader among the candidates has run, then only if it is kept after."""
        milp, problem = self.milp, self.problem
        fixed = self.stages.backward_fixed[k]
        held_var = milp.add_vars()
        milp.add_row(held + [(held_var, -1.0)], 0.0)
        position = {o: i for i, o in enumerate(candidates)}
        releases: list[list[tuple[int, Terms, Terms]]] = [[] for _ in candidates]
        for i, o in enumerate(candidates):
            for u in problem.ops[o].outputs:
                last = max((position[c] for c in problem.readers[u] if c in position), default=i)
                releases[last].append((u, ran(o), self.kept_after(k, u, ran(o))))
        running: Terms = []
        for i, o in enumerate(candidates):
            for constant, terms in cost(o, ran(o)):
                self.add_memory([(held_var, 1.0)] + running + terms, fixed + constant)
            after = milp.add_vars()
            row = [(after, -1.0)] + running + [(v, c * self.units(problem.out_bytes(problem.ops[o])))
                                               for v, c in ran(o)]
            for u, made, kept in releases[i]:
                size = self.units(problem.tensors[u].bytes)
                row += [(v, -c * size) for v, c in made] + [(v, c * size) for v, c in kept]
            milp.add_row(row, 0.0)
            running = [(after, 1.0)]
        if at_backward is not None:
            held_var = milp.add_vars()
            milp.add_row(at_backward() + [(held_var, -1.0)], 0.0)
        for constant, terms in cost(problem.backward_ops[k].id, []):
            self.add_memory([(held_var, 1.0)] + running + terms, fixed + constant)
        self._in_place_reruns(k, candidates, ran)

    def _in_place_reruns(self, k: int, candidates: list[int], ran: Callable[[int], Terms]) -> None:
        """An op that reruns at stage k overwriting its input in place leaves no copy of the input for
        backward op k or later stages: ran(o) + y + (read at k, or needed after) <= 2."""
        for o, j, t in self.stages.overwrites:
            if o not in candidates or t not in self.tensor_window:
                continue
            when = ran(o) + self._option(o, j)
            if k in self.stages.read_at.get(t, ()):
                condition = self.reads_if(t, k)
                self.milp.add_row(when + condition, len(self._option(o, j)) + (1.0 if condition else 0.0))
            later = self.needed_after(t, k)
            if later:
                self.milp.add_row(when + later, 1.0 + len(self._option(o, j)))

    def _saved_unless_in_place(self, saved: Callable[[int], tuple[Terms, float]]) -> None:
        """What an op overwrites in the forward is not saved: y + saved <= 1, where `saved(t)` gives
        (terms, constant) that sum to 1 when t is saved (tensors no backward op may need are never saved)."""
        for o, j, t in self.stages.overwrites:
            if t in self.tensor_window:
                terms, constant = saved(t)
                self.milp.add_row(self._option(o, j) + terms, len(self._option(o, j)) - constant)

    @property
    def fixed_time(self) -> float:
        """Seconds of step time that no decision changes: the ops without a choice, run once.
        The model's objective adds the rest (reruns, and ops whose time depends on an option)."""
        return sum(op.time for op in self.problem.ops if op.choice is None)

    def reruns(self, values: np.ndarray) -> dict[int, list[int]]:
        """Stage -> forward ops rerun just before that stage's backward op, in a solution."""
        raise NotImplementedError

    def options(self, values: np.ndarray) -> dict[str, str]:
        """Choice -> option taken, in a solution."""
        return {c: self.problem.choice_named[c].options[j]
                for (c, j), var in self.option_var.items() if values[var] > 0.5}

    def warm_start(self, dropped: frozenset[int], options: dict[str, str]) -> dict[int, float] | None:
        """Binary values of the first-need schedule that drops `dropped` and runs ops as `options`
        say, if this formulation has them."""
        return None

    def schedule(self, values: np.ndarray, *, prune: bool = True) -> Schedule:
        """The schedule of a solution, without the reruns that no op reads (HiGHS can stop at a solution
        with some: they cost time and memory, so never at an optimum); with them, unless `prune`."""
        by_stage = self.reruns(values)
        options = self.options(values)
        seq: list[int] = []
        for k, op in enumerate(self.problem.backward_ops):
            seq.extend(sorted(by_stage.get(k, [])))
            if op.impl(self.problem.option_index(op, options)).runs:
                seq.append(op.id)
        return Schedule.from_backward(self.problem, seq, options, prune=prune)


def _dominates(ops: list, i: int, j: int) -> bool:
    """Option i of the choice that `ops` share is no worse than option j in anything the simulator
    counts (same ops run, reading no more, overwriting the same, in no more time and workspace), and
    strictly better somewhere or first of equals."""
    pairs = [(op.impl(i), op.impl(j)) for op in ops]
    if any(a.runs != b.runs or a.overwrites != b.overwrites or not set(a.inputs) <= set(b.inputs)
           or a.time > b.time or a.workspace > b.workspace
           or a.recompute_time > b.recompute_time or not set(a.keeps) <= set(b.keeps)
           or (b.recomputable and not a.recomputable) for a, b in pairs):
        return False
    return i < j or any(a != b for a, b in pairs)
