"""The backward's op order: large parameter gradients made late.

A parameter's gradient is held from the op that makes it to the end of the step, and nothing in
the backward reads it, so it can be made at any point after its inputs exist. Autograd makes it
where its layer's backward runs: VGG-16's first classifier layer makes 392 MiB of gradient from
under 1 MiB of inputs at the start of the backward, held while every saved activation is still
live. Inductor's `reorder_for_peak_memory` moves such kernels late in torch.compile's backward;
monet's schedules run the backward in the problem's order, so the problem is reordered first.
"""

from __future__ import annotations

from .problem import Problem
from .schedule import ScheduleError, keep_all
from .simulate import simulate
from .solve import RERUN_SLOTS, auto_horizon
from .stages import Stages


def sink_gradients(problem: Problem) -> Problem:
    """`problem` with each backward op that makes only parameter gradients moved to the end of the
    backward where that lowers the peak of keeping everything (largest first, each kept only if
    the simulator finds the peak lower: the move holds its inputs longer) and leaves the ILP's size
    within what the automatic rerun horizon allows: the ops that make the moved op's inputs may then
    rerun up to the last stage. A move is refused where it shortens that horizon (on the bundled CNN,
    a move that lowered the peak by 232 bytes shrank it from unbounded to 20 stages, and the least peak
    found in 5 s rose from 6.25 to 7.28 MB) or where it lets more (op, stage) reruns than RERUN_SLOTS
    (or than the problem had) at it: ResNet-50's classifier weight gradient (quick size), made last,
    lowered the peak 1.3 % and took its rerun pairs from 1,856 to 14,036 at the same horizon, and
    its 60 % solve then found no schedule in 15 s (one that found the optimum without the move).
    Unchanged where no move helps. Only ops made before the last op at keeping everything's peak are
    tried (a move of a later one leaves the peak where it is), so deep models cost a few replays."""
    readers = problem.readers
    movable = [op for op in problem.backward_ops
               if op.choice is None and op.outputs
               and all(problem.tensors[t].role == "grad" and not readers[t] for t in op.outputs)]
    order = [op.id for op in problem.backward_ops]
    best = problem
    replay = simulate(problem, keep_all(problem))
    horizon, slots = None, None  # the rerun size, computed once a move lowers the peak
    last = _last_peak(best, replay)
    for op in sorted(movable, key=lambda op: -problem.out_bytes(op)):
        if order.index(op.id) > last:
            continue  # made after the last op at the peak: moving it later cannot lower the peak
        trial = [i for i in order if i != op.id] + [op.id]
        candidate = problem.reordered(trial)
        candidate_replay = simulate(candidate, keep_all(candidate))
        if candidate_replay.peak >= replay.peak:
            continue
        if horizon is None:
            horizon, slots = _rerun_size(problem)
        candidate_horizon, candidate_slots = _rerun_size(candidate)
        if candidate_horizon == horizon and candidate_slots <= max(RERUN_SLOTS, slots):
            order, best, replay = trial, candidate, candidate_replay
            last = _last_peak(best, replay)
    return best


def _last_peak(problem: Problem, replay) -> int:
    """The position in the backward of the last op at which keeping everything (`replay`) peaks: -1 in
    the forward, past the last op at the optimizer's step (where every move is tried)."""
    sequence = keep_all(problem).backward
    forward = len(replay.timeline) - len(sequence) - (problem.update is not None)
    last = max(i for i, (_, bytes) in enumerate(replay.timeline) if bytes == replay.peak) - forward
    if last < 0 or last >= len(sequence):
        return -1 if last < 0 else len(problem.ops)
    return [op.id for op in problem.backward_ops].index(sequence[last])


def _rerun_size(problem: Problem) -> tuple[int | None, int]:
    """The automatic rerun horizon and the (op, stage) rerun pairs it admits: what the ILP's size grows with."""
    horizon = auto_horizon(problem)
    return horizon, Stages(problem, horizon).rerun_slots


def in_schedule_order(problem: Problem, backward: tuple[str, ...]) -> Problem:
    """`problem` with its backward ops in the order a schedule's backward sequence (op names, reruns
    among them) runs them: a schedule solved on a reordered problem, read back onto the problem
    as traced. ScheduleError where it names an op the problem lacks."""
    try:
        named = [problem.op_named(name) for name in backward]
    except KeyError as exc:
        raise ScheduleError(f"schedule names {exc} which this graph does not have") from exc
    return problem.reordered([op.id for op in named if op.phase == "backward"])
