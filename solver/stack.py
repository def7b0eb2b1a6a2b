"""Blocks called one after another, as one step's problem: what each block keeps adds up across them.

A model's blocks, each traced as its own problem (each holding its input and output whole), run as
one step: every block's forward in order, then every block's backward in reverse order. `stack`
poses that step as one problem, so that one budget bounds the step's peak and the ILP chooses what
each block keeps knowing what the others keep; `split` cuts the step's schedule into one schedule
per block (what each block's MONeTWrapper runs), and `join` puts the blocks' schedules together
again as the step runs them, whose replay predicts the step's peak.

Block k+1's input is block k's output (the one tensor each passes on; its other inputs, such as a
mask, stay inputs of its own, counted once per block), and the gradient of that input is block k's
output gradient. The passed tensor is always kept (its op never reruns), so that every rerun of a
block's op falls within that block's backward, where its wrapper runs it.

Parts that run eagerly (`eager`: what the model runs before its first block and after its last one)
keep everything PyTorch keeps: their ops never rerun and run as PyTorch runs them. A parameter that
several parts read (named alike in their meta "parameters", as the model names it: GPT-2's
embedding, tied to its head) is one tensor, and its gradient is held once: the part whose backward
runs first makes it, the others' are added into it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from itertools import groupby

from .problem import Impl, Op, Problem, ProblemError, Tensor
from .schedule import Schedule

SEPARATOR = "/"  # names in the step problem: "<block>/<name in the block's problem>"


@dataclass(frozen=True)
class Stacked:
    """The step problem of `blocks`, and where each block's tensors and ops went in it."""

    problem: Problem
    blocks: tuple[Problem, ...]
    tensor_ids: tuple[dict[int, int], ...]  # per block: block tensor id -> step tensor id
    op_ids: tuple[dict[int, int], ...]  # per block: block op id -> step op id
    eager: frozenset[int] = field(default_factory=frozenset)  # the parts that run eagerly


def _passed(block: Problem, k: int) -> tuple[str, str]:
    """The names of the (input, its gradient) that block `k` takes from the block before it."""
    inputs = [t.name for t in block.tensors if t.role == "input" and t.name in block.meta.get("gradients", {})]
    if len(inputs) != 1:
        raise ProblemError(f"block {k} takes {len(inputs)} inputs that need a gradient; stacking blocks needs exactly "
                           "one: the tensor the block before it returns")
    return inputs[0], block.meta["gradients"][inputs[0]]


def _returned(block: Problem, k: int) -> tuple[str, str]:
    """The names of the (output, its tangent) that block `k` passes to the block after it."""
    outputs = [t.name for t in block.tensors if t.role == "output" and t.producer is not None]
    tangent = block.meta.get("tangents", {}).get(outputs[0]) if len(outputs) == 1 else None
    if tangent is None:
        raise ProblemError(f"block {k} returns {len(outputs)} outputs that it makes (or none with a gradient); "
                           "stacking blocks needs exactly one, the next block's input")
    return outputs[0], tangent


def stack(blocks: Sequence[Problem], eager: Collection[int] = ()) -> Stacked:
    """The step of `blocks` (block problems in call order, each the next one's input) as one problem;
    the parts at `eager` run eagerly (see the module's docstring)."""
    eager = frozenset(eager)
    blocks = tuple(_eager(b) if k in eager else b for k, b in enumerate(blocks))
    if not blocks:
        raise ProblemError("no blocks to stack")
    if any(b.update is not None for b in blocks):
        raise ProblemError("a block's problem includes an optimizer step; stack problems of blocks alone")
    for k in range(1, len(blocks)):
        (out, _), (into, _) = _returned(blocks[k - 1], k - 1), _passed(blocks[k], k)
        a, b = blocks[k - 1].tensor_named(out), blocks[k].tensor_named(into)
        if (a.dtype, a.bytes) != (b.dtype, b.bytes):  # a storage: a view of it may have another shape
            raise ProblemError(f"block {k - 1} returns {a.shape} {a.dtype}, but block {k} takes {b.shape} {b.dtype}")

    tensors: list[Tensor] = []
    tensor_ids: list[dict[int, int]] = [{} for _ in blocks]
    shared: dict[str, int] = {}  # a parameter's name in the model -> its step tensor
    for k, block in enumerate(blocks):
        into = _passed(block, k)[0] if k else None
        names = block.meta.get("parameters", {})
        for t in block.tensors:
            if t.name == into:
                continue  # the previous block's output
            if t.role == "param" and names.get(t.name) in shared:
                tensor_ids[k][t.id] = shared[names[t.name]]
                continue
            if t.role == "param" and t.name in names:
                shared[names[t.name]] = len(tensors)
            tensor_ids[k][t.id] = len(tensors)
            tensors.append(replace(t, id=len(tensors), name=f"{k}{SEPARATOR}{t.name}"))
        if k:
            out = _returned(blocks[k - 1], k - 1)[0]
            tensor_ids[k][block.tensor_named(into).id] = tensor_ids[k - 1][blocks[k - 1].tensor_named(out).id]

    # Block k's input gradient is block k-1's tangent: one temp, made by block k's backward.
    for k in range(1, len(blocks)):
        _, tangent = _returned(blocks[k - 1], k - 1)
        _, gradient = _passed(blocks[k], k)
        tensor_ids[k - 1][blocks[k - 1].tensor_named(tangent).id] = tensor_ids[k][blocks[k].tensor_named(gradient).id]

    order = [(k, op) for k, b in enumerate(blocks) for op in b.forward_ops]
    order += [(k, op) for k in reversed(range(len(blocks))) for op in blocks[k].backward_ops]
    op_ids: list[dict[int, int]] = [{} for _ in blocks]
    for i, (k, op) in enumerate(order):
        op_ids[k][op.id] = i
    kept = {op_ids[k][blocks[k].tensor_named(_returned(blocks[k], k)[0]).producer] for k in range(len(blocks) - 1)}
    kept |= {op_ids[k][op.id] for k in eager for op in blocks[k].ops}

    def impl(k: int, impl: Impl, pinned: bool) -> Impl:
        ids = tensor_ids[k]
        return replace(impl, inputs=tuple(ids[t] for t in impl.inputs), keeps=tuple(ids[t] for t in impl.keeps),
                       overwrites=None if impl.overwrites is None else ids[impl.overwrites],
                       recomputable=False if pinned else impl.recomputable)

    ops = []
    for i, (k, op) in enumerate(order):
        pinned = i in kept
        ops.append(Op(i, f"{k}{SEPARATOR}{op.name}", op.target, op.phase,
                      tuple(tensor_ids[k][t] for t in op.outputs), impl(k, op.pytorch, pinned),
                      None if op.choice is None else f"{k}{SEPARATOR}{op.choice}",
                      tuple(impl(k, other, pinned) for other in op.others)))
    tensors = _with_step_roles(tensors, blocks, tensor_ids, ops)
    choices = [replace(c, name=f"{k}{SEPARATOR}{c.name}") for k, b in enumerate(blocks) for c in b.choices]
    meta = {"blocks": len(blocks), "device": blocks[0].meta.get("device")}
    return Stacked(Problem(tensors, ops, meta, choices, held=max(b.held for b in blocks)), blocks,
                   tuple(tensor_ids), tuple(op_ids), eager)


def _with_step_roles(tensors: list[Tensor], blocks: tuple[Problem, ...], tensor_ids, ops: list[Op]) -> list[Tensor]:
    """Producers renumbered; a passed output becomes an activation, a passed gradient a temp, and the
    gradient of a shared parameter a temp in every part but the one whose backward runs first."""
    producer = {t: op.id for op in ops for t in op.outputs}
    roles = {}
    for k in range(len(blocks) - 1):
        out, tangent = _returned(blocks[k], k)
        roles[tensor_ids[k][blocks[k].tensor_named(out).id]] = "activation"
        roles[tensor_ids[k][blocks[k].tensor_named(tangent).id]] = "temp"
    held: set[int] = set()  # step ids of parameters whose gradient a later part makes
    for k in reversed(range(len(blocks))):
        ids = tensor_ids[k]
        for param, grad in blocks[k].meta.get("parameter_gradients", {}).items():
            step = ids[blocks[k].tensor_named(param).id]
            if step in held:
                roles[ids[blocks[k].tensor_named(grad).id]] = "temp"
            held.add(step)
    return [replace(t, role=roles.get(t.id, t.role), producer=producer.get(t.id)) for t in tensors]


def _eager(problem: Problem) -> Problem:
    """`problem` as PyTorch runs it: one way for each op, without the ops that make nothing the step
    uses (a part traced with the model's blocks stood in also traces what the model computes before
    them, for nothing), and with what each autograd formula makes held until the formula's last op
    (eager autograd computes a formula as one C++ function, whose temporaries live until it returns:
    `grad * (2 * x.pow(1))` holds `x.pow(1)` until the product is made). The formulas are the
    backward ops of one forward op's sequence number (meta "autograd_nodes", one run of ops)."""
    problem = _formulas_held(problem)
    live = {t.id for t in problem.tensors if t.role in ("output", "grad", "state")}
    ops = []
    for op in reversed(problem.ops):
        if any(t in live for t in op.outputs):
            ops.append(op)
            live |= set(op.pytorch.inputs) | set(op.pytorch.keeps)
    ops.reverse()
    tensors = [t for t in problem.tensors if t.producer is None or t.id in live]
    tid = {t.id: i for i, t in enumerate(tensors)}
    oid = {op.id: i for i, op in enumerate(ops)}
    pytorch = [replace(op.pytorch, inputs=tuple(tid[t] for t in op.pytorch.inputs),
                       keeps=tuple(tid[t] for t in op.pytorch.keeps),
                       overwrites=None if op.pytorch.overwrites is None else tid[op.pytorch.overwrites])
               for op in ops]
    return replace(problem, tensors=tuple(replace(t, id=tid[t.id], producer=None if t.producer is None
                                                  else oid[t.producer]) for t in tensors),
                   ops=tuple(replace(op, id=oid[op.id], outputs=tuple(tid[t] for t in op.outputs), pytorch=impl,
                                     choice=None, others=()) for op, impl in zip(ops, pytorch)),
                   choices=())


def split(stacked: Stacked, schedule: Schedule) -> list[Schedule]:
    """The step's `schedule` as one schedule per block: each block's ops of the step's backward, in
    order (a rerun the step placed before its block's backward begins runs at its start), and its options."""
    out = []
    for k, block in enumerate(stacked.blocks):
        back = {step: own for own, step in stacked.op_ids[k].items()}
        backward = [back[i] for i in schedule.backward if i in back]
        prefix = f"{k}{SEPARATOR}"
        options = {c.removeprefix(prefix): o for c, o in schedule.options.items() if c.startswith(prefix)}
        out.append(Schedule.from_backward(block, backward, options))
    return out


def join(stacked: Stacked, schedules: Sequence[Schedule]) -> Schedule:
    """The step's schedule that runs each block's schedule: backward of the last block first."""
    if len(schedules) != len(stacked.blocks):
        raise ProblemError(f"{len(schedules)} schedules for {len(stacked.blocks)} blocks")
    backward = [stacked.op_ids[k][i] for k in reversed(range(len(schedules))) for i in schedules[k].backward]
    options = {f"{k}{SEPARATOR}{c}": o for k, s in enumerate(schedules) for c, o in s.options.items()}
    return Schedule.from_backward(stacked.problem, backward, options)


def _formulas_held(problem: Problem) -> Problem:
    """`problem` with the last op of each autograd formula reading what the formula's earlier ops made."""
    nodes = problem.meta.get("autograd_nodes", {})
    ops = list(problem.ops)
    for node, run in groupby(problem.backward_ops, key=lambda op: nodes.get(op.name)):
        *earlier, last = run
        made = tuple(t for op in earlier for t in op.outputs if t not in last.pytorch.inputs)
        if node is not None and made:
            ops[last.id] = replace(last, pytorch=replace(last.pytorch, inputs=last.pytorch.inputs + made))
    return replace(problem, ops=tuple(ops))
