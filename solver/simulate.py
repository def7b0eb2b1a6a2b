"""Replay a schedule on its problem: memory live at every op, the peak, the time.

This is the one place that defines what a schedule costs. The solvers' reported
peaks, the tests and the benchmarks all come from here, and the runtime is built
to free exactly when this replay frees (after each copy's last reader).
"""

from __future__ import annotations

from dataclasses import dataclass

from .problem import PERSISTENT_ROLES, Problem
from .schedule import Schedule, validate
from .stages import last_forward_readers

# Tensors nobody frees during the step once they exist.
_HELD_ROLES = (*PERSISTENT_ROLES, "output", "grad")


@dataclass(frozen=True)
class Replay:
    """Memory during each op run (live bytes plus its outputs and workspace) and times (the forward's
    includes what saving costs: Tensor.keep_time)."""

    timeline: tuple[tuple[str, int], ...]
    forward_time: float
    backward_time: float
    recompute_time: float
    peak_live: frozenset[int]  # tensors held (or being made) at the peak

    @property
    def peak(self) -> int:
        return max(b for _, b in self.timeline)

    @property
    def peak_at(self) -> str:
        return max(self.timeline, key=lambda e: e[1])[0]

    @property
    def time(self) -> float:
        return self.forward_time + self.backward_time + self.recompute_time


def simulate(problem: Problem, schedule: Schedule) -> Replay:
    """Replay `schedule`; raises ScheduleError if it cannot run."""
    validate(problem, schedule)
    tensors = problem.tensors
    impls = {op.id: schedule.impl(problem, op) for op in problem.ops}
    base = problem.persistent_bytes
    timeline: list[tuple[str, int]] = []
    live = _LiveSet()
    peak, peak_live = -1, frozenset()

    def run(label: str, op, copy: dict[int, int]) -> None:
        nonlocal peak, peak_live
        now = base + live.bytes + problem.out_bytes(op) + impls[op.id].workspace
        if impls[op.id].overwrites is not None:  # in place: the output takes its input's storage
            now -= tensors[impls[op.id].overwrites].bytes
        if now > peak:
            peak, peak_live = now, live.tensors() | frozenset(op.outputs)
        timeline.append((label, now))
        for t in op.outputs:
            live.add((t, copy.get(t, 0)), tensors[t].bytes)

    # Forward: every op once; a tensor dies after its last forward reader unless saved.
    forward = [op for op in problem.forward_ops if impls[op.id].runs]
    last_forward_read = last_forward_readers(problem, lambda op: impls[op.id].inputs if impls[op.id].runs else ())
    for op in forward:
        run(op.name, op, {})
        for t in (*impls[op.id].inputs, *op.outputs):
            role = tensors[t].role
            if role == "activation" and t not in schedule.saved and last_forward_read.get(t, -1) <= op.id:
                live.discard((t, 0))
    forward_time = sum(impls[op.id].time for op in forward) + sum(tensors[t].keep_time for t in schedule.saved)

    # The caller's buffers take the new running stats; the backward's seeds arrive.
    for t in tensors:
        if t.role == "state" and t.id not in schedule.saved:
            live.discard((t.id, 0))
        if t.role == "tangent":
            live.add((t.id, 0), t.bytes)

    # Backward: each read takes the newest copy; each copy dies after its last reader.
    reads: list[list[tuple[int, int]]] = []
    last_read: dict[tuple[int, int], int] = {}
    version = {t.id: 0 for t in tensors}
    for pos, i in enumerate(schedule.backward):
        op = problem.ops[i]
        keys = [(t, version[t]) for t in impls[i].backward_reads]
        reads.append(keys)
        for key in keys:
            last_read[key] = pos
        if op.phase == "forward":
            for t in op.outputs:
                version[t] += 1
    for key in live.keys():
        if key not in last_read and tensors[key[0]].role not in _HELD_ROLES:
            live.discard(key)

    backward_time = recompute_time = 0.0
    copy = {t.id: 0 for t in tensors}
    for pos, i in enumerate(schedule.backward):
        op = problem.ops[i]
        if op.phase == "forward":
            for t in op.outputs:
                copy[t] += 1
            recompute_time += impls[i].recompute_time
            run(f"recompute {op.name}", op, copy)
        else:
            backward_time += impls[i].time
            run(op.name, op, copy)
        done = [k for k in reads[pos] if last_read[k] == pos]
        done += [(t, copy[t]) for t in op.outputs if (t, copy[t]) not in last_read]
        for key in done:
            if tensors[key[0]].role not in _HELD_ROLES:
                live.discard(key)
    if problem.update is not None:  # the optimizer's step, on what the backward leaves
        now = base + live.bytes + problem.update.workspace
        if now > peak:
            peak, peak_live = now, live.tensors()
        timeline.append(("optimizer step", now))
    return Replay(tuple(timeline), forward_time, backward_time, recompute_time, peak_live)


class _LiveSet:
    """Copies of tensors that are live, keyed (tensor, copy), with their byte total."""

    def __init__(self):
        self._sizes: dict[tuple[int, int], int] = {}
        self.bytes = 0

    def add(self, key: tuple[int, int], size: int) -> None:
        self.discard(key)
        self._sizes[key] = size
        self.bytes += size

    def discard(self, key: tuple[int, int]) -> None:
        self.bytes -= self._sizes.pop(key, 0)

    def keys(self) -> list[tuple[int, int]]:
        return list(self._sizes)

    def tensors(self) -> frozenset[int]:
        return frozenset(t for t, _ in self._sizes)
