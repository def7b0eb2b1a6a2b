"""`monet.solve`: model and input shape in, schedule (with its prediction) out."""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import TYPE_CHECKING

from monet.schedules import OptimizerSpec, ProblemFile, ScheduleFile, load_problem
from monet.solver import Problem, Schedule, SolveSettings, keep_all, least_peak, simulate
from monet.solver import solve as solve_problem
from monet.solver.options import settings_of
from monet.solver.order import sink_gradients
from monet.solver.solve import Progress

from .budget import is_least, parse_budget

if TYPE_CHECKING:  # torch and monet.graph load where a model is traced: solving needs neither
    import torch
    from torch import nn

# Progress: progress(stage, done, total, detail), what monet is doing, for a progress display. `total`
# is None while the length of a stage is unknown; `detail` says more (while HiGHS runs: the best
# schedule so far, its gap and the seconds left, with done and total in seconds).


def trace_problem(model: nn.Module, inputs, *, input_dtype: str | torch.dtype | None = None,
                  input_requires_grad: bool | None = None, autocast: str | torch.dtype | None = None,
                  optimizer=None, micro_batches: int = 1, cost_model: str = "measured", implementations: bool = True,
                  sink: bool = True, progress: Progress | None = None) -> Problem:
    """Trace `model` called with `inputs` (see `solve`), under `autocast`, and cost every op of its
    training step, with (`implementations`) every alternative way an op can run, and the
    `optimizer`'s update after `micro_batches` backward passes, measured here. With `sink`, the
    backward ops that make only parameter gradients move late where that lowers the peak
    (`monet.solver.order.sink_gradients`): MONeTWrapper runs the backward in its schedule's order."""
    from monet.graph import Example, TracedStep, analyze, costed_problem, model_device

    if not model.training:
        warnings.warn(f"{type(model).__name__} is in eval mode; monet solves its training step, so the schedule is "
                      "for train mode (dropout on, batch norm on batch statistics), and MONeTWrapper trains in train "
                      "mode (in eval mode it runs the plain model)", stacklevel=3)
    if progress:
        progress("tracing", 0, None, "")
    example = Example.of(inputs, dtype=input_dtype, requires_grad=input_requires_grad, device=model_device(model))
    if micro_batches != 1 and optimizer is None:
        raise ValueError("micro_batches counts the backward passes whose gradients accumulate before each optimizer "
                         "step: name the optimizer too (optimizer='adam')")
    spec = OptimizerSpec.of(optimizer, micro_batches) if optimizer is not None else None
    with TracedStep(model, example, autocast) as step:
        analysis = analyze(step.graph_module)
    stage = (lambda name, done, total: progress(name, done, total, "")) if progress else None
    problem = costed_problem(step, analysis, cost_model, implementations=implementations, optimizer=spec,
                             progress=stage)
    return sink_gradients(problem) if sink else problem


def solve(model: nn.Module, inputs, budget: str | int | float, settings: SolveSettings | None = None, *,
          input_dtype: str | torch.dtype | None = None, input_requires_grad: bool | None = None,
          autocast: str | torch.dtype | None = None, optimizer=None, micro_batches: int = 1,
          cost_model: str = "measured", progress: Progress | None = None, **changes) -> ScheduleFile:
    """The fastest schedule for training `model` on `inputs` within `budget`, solved as `settings`
    (a SolveSettings; default: SolveSettings()) with `changes` to them as keyword arguments
    (`monet.solve(model, shape, "50%", time_limit=10)`) say.

    `inputs` is what the model is called with: an input shape (one tensor of `input_dtype`, default
    float32, with a gradient if `input_requires_grad`), an example tensor, a tuple of positional
    inputs, or a dict of keyword inputs (`{"input_ids": ids, "attention_mask": mask, "labels": y}`),
    nested in tuples, lists and dicts as the model takes them, with Python constants (None, bool,
    int, float, str) among them. Given tensors are profiled as they are; the schedule records their
    shapes, dtypes and constants, and MONeTWrapper runs it on calls of that structure. The model's
    output may be any structure of tensors (a ModelOutput, a dict, a tuple; a loss computed inside).
    `autocast` (torch.bfloat16 or torch.float16, or its name; None: off) traces the step under
    torch.autocast at that dtype (mixed precision): the schedule records it, tensor sizes follow the
    casts, and MONeTWrapper runs the step that way.
    `optimizer` ('sgd', 'adam', 'adamw', an optimizer class, or (class, {options})) makes the step
    the whole of one: forward, backward, `optimizer.step()` and zeroing the gradients (set to None).
    The budget and the predicted peak then cover the optimizer's state, held from the step before,
    and the temporaries its step allocates (both measured here); with `micro_batches`, that many
    backward passes accumulate gradients before each optimizer step (the later ones run with the
    earlier gradients held).

    `budget` is bytes, a size string ('4GiB'), a percentage of the unconstrained peak ('50%') or of its
    activation memory ('50%act': of the peak above parameters, their gradients, buffers and inputs), or 'least':
    the least peak the search finds within `time_limit`, then the fastest schedule there (in up to
    `time_limit` more).
    With `implementations` the solver also chooses how ops run (ReLU/dropout masks, dropout
    replayed from its generator state, max-pool offsets, batch-norm reruns from saved statistics),
    jointly with what to keep; off, it only checkpoints.
    Options that change gradients (few-bit GELU/SiLU, batch norm from its output, other
    convolution algorithms) need
    `allow_approximate`; their measured error is recorded in the schedule. `options` fixes
    implementations ({choice: option}, named as in a schedule's "options"). `formulation` is
    "compact" (each tensor recomputed at most once; scales), "general" (any number of
    recomputations; reaches lower budgets and faster schedules, grows as tensors x stages) or "auto"
    (general for small graphs with nothing else to choose, else compact); a list solves with each in
    turn, each from the best schedule so far (see monet.solver.solve).
    The solver stops when the predicted step time is proven within `gap` of the formulation's
    best, or at `time_limit` seconds; `horizon` bounds how many stages ahead of its use an op may
    rerun ("auto": as long as the graph's size allows; None: unbounded).
    `solver_log` prints HiGHS's progress.
    Nothing is written; call `.save(path)` on the result to keep it.
    """
    settings = settings_of(settings, **changes)
    problem = trace_problem(model, inputs, input_dtype=input_dtype, input_requires_grad=input_requires_grad,
                            autocast=autocast, optimizer=optimizer, micro_batches=micro_batches, cost_model=cost_model,
                            implementations=settings.implementations or bool(settings.options), progress=progress)
    return solve_traced(problem, budget, type(model).__name__, settings, progress=progress)


def solve_traced(problem: Problem, budget: str | int | float, model_name: str, settings: SolveSettings | None = None,
                 *, start: Schedule | ScheduleFile | None = None, progress: Progress | None = None,
                 **changes) -> ScheduleFile:
    """`solve` on an already traced and costed problem (to solve several variants of one);
    `start`, a schedule of the same problem (or its file), is a starting point the result is no slower than.
    Budget 'least' first searches the least peak (`least_peak`, up to `time_limit`), then solves at it
    from the schedule found there (up to `time_limit` more); the file records `least`."""
    settings = settings_of(settings, **changes)
    if isinstance(start, ScheduleFile):
        start = start.schedule.on(problem)
    unconstrained = simulate(problem, keep_all(problem))
    least = is_least(budget)
    if least:
        found = least_peak(problem, settings, progress=progress, unconstrained=unconstrained)
        budget, start = found.found, start if start is not None else found.schedule
    solution = solve_problem(problem, parse_budget(budget, unconstrained.peak, floor=problem.floor), settings,
                             start=start, progress=progress, unconstrained=unconstrained)
    return ScheduleFile.from_solution(problem, solution, model_name, unconstrained=unconstrained,
                                      implementations=settings.implementations,
                                      approximate_allowed=settings.allow_approximate,
                                      least=least or None)


def profile(model: nn.Module, inputs, *, input_dtype: str | torch.dtype | None = None,
            input_requires_grad: bool | None = None, autocast: str | torch.dtype | None = None, optimizer=None,
            micro_batches: int = 1, cost_model: str = "measured", implementations: bool = True,
            progress: Progress | None = None) -> ProblemFile:
    """Trace and profile `model` called with `inputs` (as `solve` takes them) here (on the model's
    device), for solving later or elsewhere: `.save(path)` writes the problem file (`monet profile`),
    and `solve_problem_file` solves it with `solve`'s settings, without the model's code or torch.
    `implementations=False` profiles only what checkpointing needs (every op runs as in PyTorch)."""
    problem = trace_problem(model, inputs, input_dtype=input_dtype, input_requires_grad=input_requires_grad,
                            autocast=autocast, optimizer=optimizer, micro_batches=micro_batches,
                            cost_model=cost_model, implementations=implementations, progress=progress)
    return ProblemFile(problem, implementations)


def solve_problem_file(problem_file: ProblemFile | str | os.PathLike, budget: str | int | float,
                       settings: SolveSettings | None = None, *, start: Schedule | ScheduleFile | None = None,
                       progress: Progress | None = None, **changes) -> ScheduleFile:
    """`solve` on a profiled problem (a ProblemFile, or the path of one that `profile` or `monet profile`
    wrote): the same settings, the same schedule file (its solver record names the problem's digest),
    which MONeTWrapper runs on the model the problem was profiled from. Needs neither the model nor torch."""
    made = problem_file if isinstance(problem_file, ProblemFile) else load_problem(problem_file)
    schedule = solve_traced(made.problem, budget, made.model, settings, start=start, progress=progress, **changes)
    return dataclasses.replace(schedule, solver=dataclasses.replace(schedule.solver, problem=made.digest))
