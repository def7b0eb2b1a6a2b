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
    fetch: tuple[tuple[int, ...], ...]  # per block: what its backward begins with (all-gathers, copy-out)
    ends: tuple[tuple[int, int], ...]  # per block: its reshard and reduce-scatter
    gathered: tuple[int, ...]  # per block: bytes of its all-gather's output (its padded parameters)

    def schedule(self, schedules: Sequence[Schedule]) -> Schedule:
        """The step with the blocks running `schedules`, as FSDP2 runs it."""
        joined = join(self.stacked, schedules)
        block_of = {step: k for k, ids in enumerate(self.stacked.op_ids) for step in ids.values()}
        sequence: list[int] = []
        for k in reversed(range(len(self.stacked.blocks))):
            sequence += self.fetch[k]
            sequence += [self.moved[i] for i in joined.backward if block_of[i] == k]
            sequence += self.ends[k]
        return Schedule.from_backward(self.problem, sequence, joined.options)

    def replay(self, schedules: Sequence[Schedule]) -> Replay:
        """The step's replay with the blocks running `schedules`: its peak is one rank's."""
        return simulate(self.problem, self.schedule(schedules))

    def split(self, schedule: Schedule) -> list[Schedule]:
        """A schedule of this problem as one schedule per block (FSDP2's own ops left to FSDP2)."""
        back = {here: step for step, here in self.moved.items()}
        return split(self.stacked, Schedule(frozenset(), tuple(back[i] for i in schedule.backward if i in back),
                                            schedule.options))


def sharded(stacked: Stacked, world: int) -> Sharded:
    """The blocks' step as FSDP2 runs it on one of `world` ranks (`fully_shard` on each block, its
    defaults). What FSDP2 allocates, as read in its source (torch/distributed/fsdp/_fully_shard) and
    counted here, block by block:
      * each block's parameters are held as this rank's shard (rows padded to a multiple of `world`);
      * before the block's forward, an all-gather into one flat buffer of the padded parameters, which
        is copied out into the whole parameters; in the forward the buffer is freed at the next
        block's all-gather (the last one's when the forward ends), the parameters after the forward;
      * in the backward the block's all-gather was issued when the block after it began its backward
        (prefetch), and its buffer is freed at the copy-out; the whole parameters are freed when the
        block's backward ends; then its whole gradients are copied into a flat reduce-scatter input
        (freed when the block before it ends its backward) and reduced into this rank's gradient shard,
        held to the end.
    Collectives take no time here."""
    if world < 1:
        raise ProblemError(f"world {world!r} must be 1 or more ranks")
    problem, n = stacked.problem, len(stacked.blocks)
    tensors = list(problem.tensors)
    params, grads, roles = [], [], {}
    for k, block in enumerate(stacked.blocks):
        ids = stacked.tensor_ids[k]
        passed = set(block.meta.get("gradients", {}).values())
        params.append([ids[t.id] for t in block.tensors if t.role == "param"])
        grads.append([ids[t.id] for t in block.tensors if t.role == "grad" and t.name not in passed])
        roles |= {t: "activation" for t in params[k]} | {t: "temp" for t in grads[k]}
    shard = [sum(_shard_bytes(problem.tensors[t], world) for t in own) for own in params]
    shards = [_new(tensors, f"{k}{SEPARATOR}fsdp.shard", shard[k], "param") for k in range(n)]
    buffers = [_new(tensors, f"{k}{SEPARATOR}fsdp.all_gather_output", world * shard[k], "activation")
               for k in range(n)]
    inputs = [_new(tensors, f"{k}{SEPARATOR}fsdp.reduce_scatter_input", world * shard[k], "temp") for k in range(n)]
    outputs = [_new(tensors, f"{k}{SEPARATOR}fsdp.grad_shard", shard[k], "grad") for k in range(n)]

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

    gather, copy_out, ends = {}, {}, {}
    for k in range(n):
        gather[k] = add(f"{k}{SEPARATOR}fsdp.all_gather", "forward", [shards[k]], [buffers[k]], rerun=True)
        if k:
            add(f"{k}{SEPARATOR}fsdp.free_previous_all_gather_output", "forward", [buffers[k - 1]], ())
        copy_out[k] = add(f"{k}{SEPARATOR}fsdp.copy_out", "forward", [buffers[k]], params[k], rerun=True)
        copy(k, "forward")
    add("fsdp.free_last_all_gather_output", "forward", [buffers[n - 1]], ())
    for k in reversed(range(n)):
        copy(k, "backward")
        ends[k] = (add(f"{k}{SEPARATOR}fsdp.reshard", "backward", params[k] + inputs[k + 1:k + 2], ()),
                   add(f"{k}{SEPARATOR}fsdp.reduce_scatter", "backward", grads[k], [inputs[k], outputs[k]]))
    producer = {t: op.id for op in ops for t in op.outputs}
    tensors = [replace(t, role=roles.get(t.id, t.role), producer=producer.get(t.id)) for t in tensors]
    fetch = tuple(((gather[k],) if k == n - 1 else ()) + (copy_out[k],) + ((gather[k - 1],) if k else ())
                  for k in range(n))
    return Sharded(stacked, Problem(tensors, ops, dict(problem.meta, world=world), problem.choices, held=problem.held),
                   moved, fetch, tuple(ends[k] for k in range(n)), tuple(world * b for b in shard))


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
