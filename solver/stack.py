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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

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


def stack(blocks: Sequence[Problem]) -> Stacked:
    """The step of `blocks` (block problems in call order, each the next one's input) as one problem."""
    blocks = tuple(blocks)
    if not blocks:
        raise ProblemError("no blocks to stack")
    if any(b.update is not None for b in blocks):
        raise ProblemError("a block's problem includes an optimizer step; stack problems of blocks alone")
    for k in range(1, len(blocks)):
        (out, _), (into, _) = _returned(blocks[k - 1], k - 1), _passed(blocks[k], k)
        a, b = blocks[k - 1].tensor_named(out), blocks[k].tensor_named(into)
        if (a.shape, a.dtype, a.bytes) != (b.shape, b.dtype, b.bytes):
            raise ProblemError(f"block {k - 1} returns {a.shape} {a.dtype}, but block {k} takes {b.shape} {b.dtype}")

    tensors: list[Tensor] = []
    tensor_ids: list[dict[int, int]] = [{} for _ in blocks]
    for k, block in enumerate(blocks):
        into = _passed(block, k)[0] if k else None
        for t in block.tensors:
            if t.name == into:
                continue  # the previous block's output
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
                   tuple(tensor_ids), tuple(op_ids))


def _with_step_roles(tensors: list[Tensor], blocks: tuple[Problem, ...], tensor_ids, ops: list[Op]) -> list[Tensor]:
    """Producers renumbered; a passed output becomes an activation, a passed gradient a temp."""
    producer = {t: op.id for op in ops for t in op.outputs}
    roles = {}
    for k in range(len(blocks) - 1):
        out, tangent = _returned(blocks[k], k)
        roles[tensor_ids[k][blocks[k].tensor_named(out).id]] = "activation"
        roles[tensor_ids[k][blocks[k].tensor_named(tangent).id]] = "temp"
    return [replace(t, role=roles.get(t.id, t.role), producer=producer.get(t.id)) for t in tensors]


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
