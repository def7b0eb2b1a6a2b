"""The blocks' step as FSDP2 runs it on one rank: sharded parameters, gathered around each block.

`sharded` adds to a stacked step (solver/stack.py) what FSDP2 allocates and frees around each block,
so that its replay predicts one rank's peak, and its ILP solves for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .problem import Impl, Op, Problem, ProblemError, Tensor
from .schedule import Schedule
from .simulate import Replay, simulate
from .stack import SEPARATOR, Stacked, join, split


@dataclass(frozen=True)
class Sharded:
    """The blocks' step as FSDP2 runs it on one rank: `problem`, with the stacked step's ops at
    `moved` (stacked op id -> id here) and FSDP2's own ops around them (`sharded` says which)."""

    stacked: Stacked
    problem: Problem
    moved: dict[int, int]
    fetch: tuple[tuple[int, ...], ...]  # per part: what its backward begins with (a block's all-gathers, copy-out)
    ends: tuple[tuple[int, ...], ...]  # per part: what follows its backward (a block's reshard and reduce-scatter)
    last: tuple[int, ...]  # what ends the backward: the root's reshard and reduce-scatter
    gathered: tuple[int, ...]  # per block: bytes of its all-gather's output (its padded parameters)

    def schedule(self, schedules: Sequence[Schedule]) -> Schedule:
        """The step with the parts running `schedules`, as FSDP2 runs it."""
        joined = join(self.stacked, schedules)
        part_of = {step: k for k, ids in enumerate(self.stacked.op_ids) for step in ids.values()}
        sequence: list[int] = []
        for k in reversed(range(len(self.stacked.blocks))):
            sequence += self.fetch[k]
            sequence += [self.moved[i] for i in joined.backward if part_of[i] == k]
            sequence += self.ends[k]
        return Schedule.from_backward(self.problem, sequence + list(self.last), joined.options)

    def replay(self, schedules: Sequence[Schedule]) -> Replay:
        """The step's replay with the parts running `schedules`: its peak is one rank's."""
        return simulate(self.problem, self.schedule(schedules))

    def split(self, schedule: Schedule) -> list[Schedule]:
        """A schedule of this problem as one schedule per part (FSDP2's own ops left to FSDP2)."""
        back = {here: step for step, here in self.moved.items()}
        return split(self.stacked, Schedule(frozenset(), tuple(back[i] for i in schedule.backward if i in back),
                                            schedule.options))


def sharded(stacked: Stacked, world: int) -> Sharded:
    """The blocks' step as FSDP2 runs it on one of `world` ranks (`fully_shard` on each block and on
    the root, its defaults). Each block is one parameter group; the parameters of the parts that run
    eagerly (stacked.eager: before and after the blocks) are the root's. What FSDP2 allocates, as read
    in its source (torch/distributed/fsdp/_fully_shard) and counted here:
      * each group's parameters are held as this rank's shard (rows padded to a multiple of `world`);
      * the root's are all-gathered when the model is called, before everything, into one flat
        buffer that is copied out into the whole parameters; the root does not reshard after the
        forward, so these are held until the backward ends, where its gradients are reduce-scattered;
      * before a block's forward, its all-gather into one flat buffer of its padded parameters, which
        is copied out into the whole parameters; in the forward the buffer is freed at the next
        block's all-gather (the last one's when the forward ends), the parameters after the forward;
      * in the backward the block's all-gather was issued when the block after it began its backward
        (prefetch), and its buffer is freed at the copy-out; the whole parameters are freed when the
        block's backward ends; then its whole gradients are copied into a flat reduce-scatter input
        (freed when the group before it ends its backward) and reduced into this rank's gradient
        shard, held to the end.
    Collectives take no time here."""
    if world < 1:
        raise ProblemError(f"world {world!r} must be 1 or more ranks")
    problem, parts = stacked.problem, len(stacked.blocks)
    blocks = [k for k in range(parts) if k not in stacked.eager]
    root = parts  # the root's group, after the blocks'
    tensors = list(problem.tensors)
    params: dict[int, list[int]] = {g: [] for g in [*blocks, root]}
    grads: dict[int, list[int]] = {g: [] for g in [*blocks, root]}
    for k, block in enumerate(stacked.blocks):
        group, ids = (root if k in stacked.eager else k), stacked.tensor_ids[k]
        passed = set(block.meta.get("gradients", {}).values())
        for t in block.tensors:
            step = ids[t.id]
            if t.role == "param" and step not in params[group]:
                params[group].append(step)
            elif t.role == "grad" and t.name not in passed and problem.tensors[step].role == "grad":
                grads[group].append(step)
    roles = {t: "activation" for own in params.values() for t in own}
    roles |= {t: "temp" for own in grads.values() for t in own}
    groups = [g for g in params if params[g]]
    shard = {g: sum(_shard_bytes(problem.tensors[t], world) for t in params[g]) for g in groups}
    name = {g: "root" if g == root else str(g) for g in groups}
    shards = {g: _new(tensors, f"{name[g]}{SEPARATOR}fsdp.shard", shard[g], "param") for g in groups}
    buffers = {g: _new(tensors, f"{name[g]}{SEPARATOR}fsdp.all_gather_output", world * shard[g], "activation")
               for g in groups}
    inputs = {g: _new(tensors, f"{name[g]}{SEPARATOR}fsdp.reduce_scatter_input", world * shard[g], "temp")
              for g in groups}
    outputs = {g: _new(tensors, f"{name[g]}{SEPARATOR}fsdp.grad_shard", shard[g], "grad") for g in groups}

    ops: list[Op] = []
    moved: dict[int, int] = {}

    def add(name: str, phase: str, reads, makes, rerun: bool = False) -> int:
        ops.append(Op(len(ops), name, "fsdp", phase, tuple(makes), Impl(tuple(reads), 0.0, recomputable=rerun)))
        return len(ops) - 1

    def copy(k: int, phase: str) -> None:
        for own in sorted(stacked.op_ids[k].values()):
            if problem.ops[own].phase == phase:
                moved[own] = len(ops)
                ops.append(replace(problem.ops[own], id=len(ops)))

    gather, copy_out = {}, {}
    previous = None  # the group whose all-gather output is held
    if root in groups:
        add(f"root{SEPARATOR}fsdp.all_gather", "forward", [shards[root]], [buffers[root]])
        add(f"root{SEPARATOR}fsdp.copy_out", "forward", [buffers[root]], params[root])
        previous = root
    for k in range(parts):
        if k in groups:
            gather[k] = add(f"{k}{SEPARATOR}fsdp.all_gather", "forward", [shards[k]], [buffers[k]], rerun=True)
            if previous is not None:
                add(f"{k}{SEPARATOR}fsdp.free_previous_all_gather_output", "forward", [buffers[previous]], ())
            copy_out[k] = add(f"{k}{SEPARATOR}fsdp.copy_out", "forward", [buffers[k]], params[k], rerun=True)
            previous = k
        copy(k, "forward")
    if previous is not None:
        add("fsdp.free_last_all_gather_output", "forward", [buffers[previous]], ())
    fetch: list[tuple[int, ...]] = [() for _ in range(parts)]
    ends: dict[int, tuple[int, ...]] = {}
    sharded_blocks = [k for k in blocks if k in groups]
    for k in reversed(range(parts)):
        copy(k, "backward")
        if k not in groups:
            continue
        i = sharded_blocks.index(k)
        later = sharded_blocks[i + 1:i + 2]  # the block whose reduce-scatter input this one's end frees
        ends[k] = (add(f"{k}{SEPARATOR}fsdp.reshard", "backward", params[k] + [inputs[g] for g in later], ()),
                   add(f"{k}{SEPARATOR}fsdp.reduce_scatter", "backward", grads[k], [inputs[k], outputs[k]]))
        fetch[k] = (((gather[k],) if i == len(sharded_blocks) - 1 else ()) + (copy_out[k],)
                    + ((gather[sharded_blocks[i - 1]],) if i else ()))
    last: tuple[int, ...] = ()
    if root in groups:
        first = [inputs[g] for g in sharded_blocks[:1]]
        last = (add(f"root{SEPARATOR}fsdp.reshard", "backward", params[root] + first, ()),
                add(f"root{SEPARATOR}fsdp.reduce_scatter", "backward", grads[root], [inputs[root], outputs[root]]))
    producer = {t: op.id for op in ops for t in op.outputs}
    tensors = [replace(t, role=roles.get(t.id, t.role), producer=producer.get(t.id)) for t in tensors]
    return Sharded(stacked, Problem(tensors, ops, dict(problem.meta, world=world), problem.choices, held=problem.held),
                   moved, tuple(fetch), tuple(ends.get(k, ()) for k in range(parts)), last,
                   tuple(world * shard[k] for k in sharded_blocks))


def _shard_bytes(tensor: Tensor, world: int) -> int:
    """Bytes of one rank's shard of `tensor`: its rows split in `world`, padded to a multiple of it."""
    if not tensor.shape:
        return tensor.bytes
    numel = 1
    for n in tensor.shape:
        numel *= n
    row = tensor.bytes // max(numel, 1) * (numel // tensor.shape[0] if tensor.shape[0] else 0)
    return -(-tensor.shape[0] // world) * row


def _new(tensors: list[Tensor], name: str, nbytes: int, role: str) -> int:
    tensors.append(Tensor(len(tensors), name, nbytes, role))
    return len(tensors) - 1
