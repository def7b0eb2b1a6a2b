"""A schedule as plain data: how ops run, what the forward keeps, what the backward runs.

The forward pass runs every forward op once, in order. A schedule says which
option each choice takes (how ops run: which tensors a backward op reads,
which extra ops run), which forward tensors are *saved* for the backward, and
the exact sequence of ops the backward runs: each running backward op once, in
order, with forward ops placed before the ops that need them wherever they are
*recomputed*. A recomputed op reads the newest copy of each input; its outputs
replace the older copies for every later reader. Frees are implied: a copy
dies after its last reader. This is all the runtime and the simulator need.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from monet.errors import MonetError

from .problem import Impl, Op, Problem

# Forward tensors that a schedule may drop and rebuild. Persistent inputs and
# model outputs are held by the caller anyway, so keeping them costs nothing.
DROPPABLE_ROLES = ("activation", "state")


class ScheduleError(MonetError, ValueError):
    """A schedule that cannot run on its problem."""


@dataclass(frozen=True)
class Schedule:
    """Chosen options, saved forward tensors and the backward op sequence, by problem ids."""

    saved: frozenset[int]
    backward: tuple[int, ...]
    options: dict[str, str] = field(default_factory=dict, hash=False)  # choice -> option; unset: the first

    @classmethod
    def from_backward(cls, problem: Problem, backward: list[int] | tuple[int, ...],
                      options: dict[str, str] | None = None, *, prune: bool = True) -> Schedule:
        """The schedule that runs `backward`, saving exactly what it reads before any recomputation,
        without reruns that no op reads (unless not `prune`). Options equal to a choice's first option
        are left out."""
        options = {c: o for c, o in (options or {}).items() if problem.choice_named[c].options[0] != o}
        backward = prune_dead_recomputations(problem, tuple(backward), options) if prune else tuple(backward)
        return cls(saved=_first_reads(problem, backward, options), backward=backward, options=options)

    def impl(self, problem: Problem, op: Op) -> Impl:
        return op.impl(problem.option_index(op, self.options))

    def recomputations(self, problem: Problem) -> list[int]:
        """Ids of forward ops that the backward reruns, in sequence order."""
        return [i for i in self.backward if problem.ops[i].phase == "forward"]

    @classmethod
    def from_names(cls, problem: Problem, saved, backward, options: dict[str, str] | None = None) -> Schedule:
        """The schedule of `problem` that saves the tensors and runs the ops so named, with `options`."""
        try:
            saved_ids = frozenset(problem.tensor_named(n).id for n in saved)
            backward_ids = tuple(problem.op_named(n).id for n in backward)
            options = dict(options or {})
            for choice, option in options.items():
                if option not in problem.choice_named[choice].options:
                    raise ScheduleError(f"choice {choice!r} has no option {option!r}")
        except KeyError as exc:
            raise ScheduleError(f"schedule names {exc} which this graph does not have") from exc
        return cls(saved=saved_ids, backward=backward_ids, options=options)

    def remap(self, source: Problem, target: Problem, options: dict[str, str] | None = None) -> Schedule:
        """This schedule of `source` as one of `target`, a problem with the same names (an edited
        copy: a posed or plain form of it); `options`, where given, replace its own."""
        return Schedule.from_names(target, (source.tensors[t].name for t in self.saved),
                                   (source.ops[i].name for i in self.backward),
                                   self.options if options is None else options)


def keep_all(problem: Problem, options: dict[str, str] | None = None) -> Schedule:
    """PyTorch's default: save everything the backward reads, recompute nothing."""
    options = options or {}
    running = [op.id for op in problem.backward_ops if op.impl(problem.option_index(op, options)).runs]
    return Schedule.from_backward(problem, running, options)


def _first_reads(problem: Problem, backward: tuple[int, ...], options: dict[str, str]) -> frozenset[int]:
    """Droppable forward tensors that the backward reads from their forward copy."""
    recomputed: set[int] = set()
    saved: set[int] = set()
    for i in backward:
        op = problem.ops[i]
        for t in op.impl(problem.option_index(op, options)).backward_reads:
            tensor = problem.tensors[t]
            if tensor.role in DROPPABLE_ROLES and tensor.producer not in recomputed:
                saved.add(t)
        if op.phase == "forward":
            recomputed.add(op.id)
    return frozenset(saved)


def prune_dead_recomputations(problem: Problem, backward: tuple[int, ...],
                              options: dict[str, str] | None = None) -> tuple[int, ...]:
    """Drop recomputations whose outputs nobody reads before they are replaced."""
    seq = list(backward)
    while True:
        dead = _dead_positions(problem, seq, options or {})
        if not dead:
            return tuple(seq)
        seq = [op for pos, op in enumerate(seq) if pos not in dead]


def _dead_positions(problem: Problem, seq: list[int], options: dict[str, str]) -> set[int]:
    live_copy: dict[int, int] = {}  # forward op id -> position of its newest copy
    used: set[int] = set()
    for pos, i in enumerate(seq):
        op = problem.ops[i]
        for t in op.impl(problem.option_index(op, options)).backward_reads:
            producer = problem.tensors[t].producer
            if producer in live_copy:
                used.add(live_copy[producer])
        if op.phase == "forward":
            live_copy[op.id] = pos
    return {pos for pos, i in enumerate(seq) if problem.ops[i].phase == "forward" and pos not in used}


def validate(problem: Problem, schedule: Schedule, *, allow_approximate: bool = True) -> None:
    """Raise ScheduleError unless every op's inputs exist when it runs (a copy that an op overwrote in
    place does not: the forward's when the schedule saves it, a rerun's after that rerun)."""
    for choice, option in schedule.options.items():
        if choice not in problem.choice_named or option not in problem.choice_named[choice].options:
            raise ScheduleError(f"schedule picks option {option!r} of unknown choice {choice!r}")
        if not allow_approximate and option in problem.choice_named[choice].approximate:
            raise ScheduleError(f"option {option!r} of {choice!r} changes gradients and is not enabled")
    impls = {op.id: schedule.impl(problem, op) for op in problem.ops}
    expected = [op.id for op in problem.backward_ops if impls[op.id].runs]
    ran_backward = [i for i in schedule.backward if problem.ops[i].phase == "backward"]
    if ran_backward != expected:
        raise ScheduleError("the backward sequence must run every backward op once, in order")
    for t in schedule.saved:
        if problem.tensors[t].role not in DROPPABLE_ROLES:
            raise ScheduleError(f"saved tensor {problem.tensors[t].name!r} is not a forward activation")
    for op in problem.forward_ops:
        if impls[op.id].runs and impls[op.id].overwrites in schedule.saved:
            raise ScheduleError(f"op {op.name!r} overwrites {problem.tensors[impls[op.id].overwrites].name!r} in "
                                "place, which the schedule saves")
    available = {t.id for t in problem.tensors if t.producer is None or t.role == "output"}
    available |= {t for t in schedule.saved if impls[problem.tensors[t].producer].runs}
    gone: dict[int, str] = {}  # tensor -> the rerun that overwrote its copy in place
    for i in schedule.backward:
        op, impl = problem.ops[i], impls[i]
        if not impl.runs:
            raise ScheduleError(f"op {op.name!r} does not run under the chosen options")
        if op.phase == "forward" and not impl.recomputable:
            raise ScheduleError(f"op {op.name!r} must not be recomputed (random or impure) under the chosen option")
        overwritten = [f"{problem.tensors[t].name} (overwritten by {gone[t]})"
                       for t in impl.backward_reads if t in gone]
        if overwritten:
            raise ScheduleError(f"op {op.name!r} reads copies an earlier rerun overwrote in place: "
                                f"{', '.join(overwritten)}")
        missing = [problem.tensors[t].name for t in impl.backward_reads if t not in available]
        if missing:
            raise ScheduleError(f"op {op.name!r} runs before its inputs exist: {', '.join(missing)}")
        available.update(op.outputs)
        for t in op.outputs:
            gone.pop(t, None)
        if op.phase == "forward" and impl.overwrites is not None:
            gone[impl.overwrites] = f"rerun {op.name!r}"
