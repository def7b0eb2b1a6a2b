"""Add implementation choices to a problem, naming tensors and ops by name.

A choice brings options; under each option, existing ops may read other tensors
and cost other time and workspace (`Alternative`), and new ops may run that make
new tensors (`NewOp`, placed right after an existing forward op). The first
option must describe the problem as it is. Ids are renumbered; names are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .problem import Choice, Impl, Op, Problem, ProblemError, Tensor


@dataclass(frozen=True)
class NewTensor:
    name: str
    bytes: int
    shape: tuple[int, ...] | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class NewOp:
    """A forward op that runs under some options only, right after forward op `after`;
    its outputs are kept for the backward (it does not rerun)."""

    name: str
    target: str
    after: str
    inputs: tuple[str, ...]
    outputs: tuple[NewTensor, ...]
    impls: tuple[tuple[float, int, bool], ...]  # per option: (time, workspace, runs)


@dataclass(frozen=True)
class Alternative:
    """An existing op, per option: (input tensor names, time, workspace), optionally followed by
    (rerun time, names of tensors its reruns read besides its inputs, whether it may rerun, the name
    of an input it overwrites in place)."""

    op: str
    impls: tuple[tuple, ...]


@dataclass(frozen=True)
class ChoiceSpec:
    name: str
    options: tuple[str, ...]
    approximate: tuple[str, ...] = ()
    errors: tuple[float, ...] = ()  # measured relative gradient error of each approximate option
    new_ops: tuple[NewOp, ...] = ()
    alternatives: tuple[Alternative, ...] = ()


def add_choices(problem: Problem, specs: list[ChoiceSpec]) -> Problem:
    """`problem` with the choices of `specs` added."""
    if not specs:
        return problem
    tensor_id = {t.name: t.id for t in problem.tensors}
    tensors = list(problem.tensors)
    new_after: dict[str, list[tuple[ChoiceSpec, NewOp]]] = {}
    for spec in specs:
        for new in spec.new_ops:
            new_after.setdefault(new.after, []).append((spec, new))
            for out in new.outputs:
                tensor_id[out.name] = len(tensors)
                tensors.append(Tensor(len(tensors), out.name, out.bytes, "activation", None, out.shape, out.dtype))
    alternatives = {alt.op: (spec, alt) for spec in specs for alt in spec.alternatives}

    ops: list[Op] = []
    for op in problem.ops:
        if op.name in alternatives:
            spec, alt = alternatives[op.name]
            if op.choice is not None:
                raise ProblemError(f"op {op.name!r} already depends on choice {op.choice!r}")
            (inputs, *_), *others = alt.impls
            if tuple(tensor_id[n] for n in inputs) != op.inputs:
                raise ProblemError(f"the first option of {spec.name!r} must read what {op.name!r} reads")
            op = replace(op, choice=spec.name, others=tuple(
                Impl(tuple(tensor_id[n] for n in names), time, workspace, rerun_time=rerun[0] if rerun else None,
                     keeps=tuple(tensor_id[n] for n in (rerun[1] if rerun else ())),
                     recomputable=rerun[2] if len(rerun) > 2 else None,
                     overwrites=tensor_id[rerun[3]] if len(rerun) > 3 else None)
                for names, time, workspace, *rerun in others))
        ops.append(replace(op, id=len(ops)))
        for spec, new in new_after.get(op.name, ()):
            (time, workspace, runs), *others = new.impls
            inputs = tuple(tensor_id[n] for n in new.inputs)
            ops.append(Op(len(ops), new.name, new.target, "forward", tuple(tensor_id[o.name] for o in new.outputs),
                          Impl(inputs, time, workspace, runs, recomputable=False), spec.name,
                          tuple(Impl(inputs, t, w, r) for t, w, r in others)))
    op_id = {op.name: op.id for op in ops}
    producer = {t: op.id for op in ops for t in op.outputs}
    tensors = [replace(t, producer=producer.get(t.id)) for t in tensors]
    choices = [*problem.choices, *(Choice(s.name, s.options, s.approximate, s.errors) for s in specs)]
    missing = [new.after for spec in specs for new in spec.new_ops if new.after not in op_id]
    if missing:
        raise ProblemError(f"new ops placed after unknown ops {missing}")
    return replace(problem, tensors=tuple(tensors), ops=tuple(ops), choices=tuple(choices))
