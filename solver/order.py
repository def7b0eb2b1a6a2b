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
from .schedule import keep_all
from .simulate import simulate
from .solve import auto_horizon


def sink_gradients(problem: Problem) -> Problem:
    """`problem` with each backward op that makes only parameter gradients moved to the end of the
    backward where that lowers the peak of keeping everything (largest first, each kept only if
    the simulator finds the peak lower: the move holds its inputs longer) and leaves the automatic
    rerun horizon as it was: the ops that make its inputs may then rerun up to the last stage, which
    enlarges the ILP (on the bundled CNN, a move that lowered that peak by 232 bytes shrank the
    horizon from unbounded to 20 stages, and the least peak found in 5 s rose from 6.25 to 7.28 MB).
    Unchanged where no move helps."""
    readers = problem.readers
    movable = [op for op in problem.backward_ops
               if op.choice is None and op.outputs
               and all(problem.tensors[t].role == "grad" and not readers[t] for t in op.outputs)]
    order = [op.id for op in problem.backward_ops]
    best = problem
    peak, horizon = simulate(problem, keep_all(problem)).peak, auto_horizon(problem)
    for op in sorted(movable, key=lambda op: -problem.out_bytes(op)):
        trial = [i for i in order if i != op.id] + [op.id]
        candidate = problem.reordered(trial)
        candidate_peak = simulate(candidate, keep_all(candidate)).peak
        if candidate_peak < peak and auto_horizon(candidate) == horizon:
            order, best, peak = trial, candidate, candidate_peak
    return best


def in_schedule_order(problem: Problem, backward: tuple[str, ...]) -> Problem:
    """`problem` with its backward ops in the order a schedule's backward sequence (op names, reruns
    among them) runs them: a schedule solved on a reordered problem, read back onto the problem
    as traced."""
    named = [problem.op_named(name) for name in backward]
    return problem.reordered([op.id for op in named if op.phase == "backward"])
