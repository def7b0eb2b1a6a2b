"""What every formulation needs to know about a problem's stages.

Stage k is backward op k. For each droppable forward tensor this gives the
stages where the backward reads it directly and the window of stages where it
can be needed at all (directly, or to recompute something that is needed);
and the memory that no decision changes: at each forward op, and at each stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property

from .problem import Op, Problem
from .schedule import DROPPABLE_ROLES


def last_forward_readers(problem: Problem, reads: Callable[[Op], Iterable[int]]) -> dict[int, int]:
    """For each tensor a forward op reads, the id of the last forward op that reads it, `reads(op)`
    saying what each op reads (the simulator: under the schedule's options; the formulations: under
    any option that runs; Chen's segment cuts: as PyTorch runs it)."""
    last: dict[int, int] = {}
    for op in problem.forward_ops:
        for t in reads(op):
            last[t] = op.id
    return last


def _hull(a: tuple[int, int] | None, b: tuple[int, int]) -> tuple[int, int]:
    return b if a is None else (min(a[0], b[0]), max(a[1], b[1]))


@dataclass(frozen=True)
class Stages:
    """`horizon` (stages, None: unbounded) limits how early an op may rerun: no more than
    `horizon` stages before the last stage that may need it, unless the backward reads its
    outputs earlier. It bounds the formulations' size at the cost of schedules that rerun
    long chains of ops far ahead of their use."""

    problem: Problem
    horizon: int | None = None

    @cached_property
    def stage_of(self) -> dict[int, int]:
        return {op.id: k for k, op in enumerate(self.problem.backward_ops)}

    @property
    def count(self) -> int:
        return len(self.problem.backward_ops)

    @cached_property
    def read_at(self) -> dict[int, set[int]]:
        """For each tensor, the stages whose backward op reads it directly (under some option)."""
        out: dict[int, set[int]] = {}
        for k, op in enumerate(self.problem.backward_ops):
            for impl in op.impls:
                for t in impl.inputs if impl.runs else ():
                    out.setdefault(t, set()).add(k)
        return out

    @cached_property
    def read_only_under(self) -> dict[tuple[int, int], tuple[int, ...]]:
        """(tensor, stage) -> the options of the backward op's choice that read the tensor there,
        for reads that depend on the option (absent: read under every option)."""
        out = {}
        for k, op in enumerate(self.problem.backward_ops):
            impls = op.impls
            for t in {t for impl in impls for t in impl.inputs}:
                options = tuple(j for j, impl in enumerate(impls) if impl.runs and t in impl.inputs)
                if len(options) < len(impls):
                    out[(t, k)] = options
        return out

    def op_cost(self, op) -> list[tuple[int | None, int]]:
        """Bytes an op's run adds (outputs, less an input it overwrites, and workspace): [(None, bytes)]
        when it has no choice, else [(option, bytes)] per option of its choice."""
        out = self.problem.out_bytes(op)

        def made(impl) -> int:  # in place, the output takes its input's storage
            overwritten = 0 if impl.overwrites is None else self.problem.tensors[impl.overwrites].bytes
            return (out - overwritten if impl.runs else 0) + impl.workspace

        if op.choice is None:
            return [(None, made(op.pytorch))]
        return [(j, made(impl)) for j, impl in enumerate(op.impls)]

    @cached_property
    def overwrites(self) -> list[tuple[int, int, int]]:
        """(op, option, tensor) for every option under which an op overwrites its input in place."""
        return [(op.id, j, impl.overwrites) for op in self.problem.forward_ops for j, impl in enumerate(op.impls)
                if impl.overwrites is not None]

    def existence(self, t: int) -> tuple[int, tuple[int, ...]] | None:
        """(producer op, options) when tensor `t` is made under some options only; None when always."""
        producer = self.problem.tensors[t].producer
        return None if producer is None else self._made_under.get(producer)

    @cached_property
    def _made_under(self) -> dict[int, tuple[int, tuple[int, ...]]]:
        """op -> (op, the options under which it runs), for ops that run under some options only."""
        out = {}
        for op in self.problem.ops:
            runs = tuple(j for j, impl in enumerate(op.impls) if impl.runs)
            if len(runs) < len(op.impls):
                out[op.id] = (op.id, runs)
        return out

    @cached_property
    def reads(self) -> tuple[dict[int, int], dict[int, int]]:
        """First and last stage at which the backward reads each tensor directly."""
        return ({t: min(ks) for t, ks in self.read_at.items()}, {t: max(ks) for t, ks in self.read_at.items()})

    @cached_property
    def windows(self) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
        """Stages where each droppable forward tensor can be needed, and where each recomputable op
        may rerun (where it can be needed, within the horizon)."""
        p = self.problem
        tensor_win: dict[int, tuple[int, int]] = {}
        op_win: dict[int, tuple[int, int]] = {}
        for op in reversed(p.forward_ops):
            win = None
            for t in op.outputs:
                if p.tensors[t].role not in DROPPABLE_ROLES:
                    continue
                tw = None
                for reader in p.readers[t]:
                    if reader in self.stage_of:
                        k = self.stage_of[reader]
                        tw = _hull(tw, (k, k))
                    elif reader in op_win:
                        tw = _hull(tw, op_win[reader])
                if tw is not None:
                    tensor_win[t] = tw
                    win = _hull(win, tw)
            if win is not None and op.may_rerun:
                if self.horizon is not None:
                    direct = min((self.reads[0][t] for t in op.outputs if t in self.reads[0]), default=win[1])
                    win = (max(win[0], min(direct, win[1] - self.horizon)), win[1])
                op_win[op.id] = win
        return tensor_win, op_win

    @cached_property
    def rerun_slots(self) -> int:
        """The (op, stage) pairs where ops may rerun: what the compact formulation's size grows with."""
        return sum(b - a + 1 for a, b in self.windows[1].values())

    def admits(self, schedule) -> bool:
        """Whether every rerun of `schedule` (a Schedule) falls within its op's window."""
        op_win = self.windows[1]
        stage = None  # of the next backward op, walking the sequence from its end
        for i in reversed(schedule.backward):
            if i in self.stage_of:
                stage = self.stage_of[i]
            elif stage is None or i not in op_win or not op_win[i][0] <= stage <= op_win[i][1]:
                return False
        return True

    @cached_property
    def forward_rows(self) -> list[tuple[int, list[int], list[tuple[int, int, int]]]]:
        """Per forward op: (bytes live regardless of decisions, tensors that cost bytes there only
        if saved, [(op, option, bytes)] that count when that op's choice takes that option).
        A tensor made under some options only is always kept (its op does not rerun)."""
        p = self.problem
        tensor_win = self.windows[0]
        last_read = last_forward_readers(p, lambda op: (t for impl in op.impls if impl.runs for t in impl.inputs))
        produced: list[int] = []
        rows = []
        for op in p.forward_ops:
            fixed, by_option = p.persistent_bytes, []
            for option, size in self.op_cost(op):
                if option is None:
                    fixed += size
                else:
                    by_option.append((op.id, option, size))
            optional = []
            for t in produced:
                tensor = p.tensors[t]
                live = tensor.role in ("output", "state") or last_read.get(t, -1) >= op.id
                if (live or t in tensor_win) and (made := self.existence(t)):
                    producer, options = made
                    by_option += [(producer, j, tensor.bytes) for j in options]
                elif live:
                    fixed += tensor.bytes
                elif t in tensor_win:
                    optional.append(t)
            rows.append((fixed, optional, by_option))
            produced.extend(op.outputs)
        return rows

    @cached_property
    def backward_fixed(self) -> list[int]:
        """Per stage: persistent bytes, model outputs, gradients so far, live temporaries and tangents."""
        p = self.problem
        tensors = p.tensors
        last = self.reads[1]
        held = p.persistent_bytes + sum(t.bytes for t in tensors if t.role == "output")
        fixed = [held] * self.count
        grads = 0
        for k, op in enumerate(p.backward_ops):
            fixed[k] += grads
            grads += sum(tensors[t].bytes for t in op.outputs if tensors[t].role == "grad")
            for t in op.outputs:
                if tensors[t].role == "temp" and t in last:
                    for j in range(k + 1, last[t] + 1):
                        fixed[j] += tensors[t].bytes
        for t in tensors:
            if t.role == "tangent" and t.id in last:
                for j in range(last[t.id] + 1):
                    fixed[j] += t.bytes
        return fixed


    @cached_property
    def never_worth_keeping(self) -> frozenset[int]:
        """Tensors whose keeping is dominated: read by no backward op and by one forward op
        with a single needed output no larger than them; keeping that output instead costs
        no more memory and no recomputation."""
        p = self.problem
        tensor_win = self.windows[0]
        first = self.reads[0]
        out = set()
        for t in tensor_win:
            readers = p.readers[t]
            if t in first or len(readers) != 1 or p.ops[readers[0]].phase != "forward":
                continue
            if not all(impl.recomputable for impl in p.ops[p.tensors[t].producer].impls):
                continue  # dropping it would force the option under which its op may rerun
            needed = [u for u in p.ops[readers[0]].outputs if u in tensor_win]
            if len(needed) == 1 and p.tensors[needed[0]].bytes <= p.tensors[t].bytes:
                out.add(t)
        return frozenset(out)

