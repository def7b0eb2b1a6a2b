"""`monet.solve`: model and input shape in, schedule (with its prediction) out."""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from monet.schedules import ProblemFile, ScheduleFile, load_problem
from monet.solver import Problem, Schedule, keep_all, simulate
from monet.solver import solve as solve_problem
from monet.solver.solve import Progress

from .budget import parse_budget

if TYPE_CHECKING:  # torch and monet.graph load where a model is traced: solving needs neither
    from torch import nn

    from monet.graph import InputSpec

# Progress: progress(stage, done, total, detail), what monet is doing, for a progress display. `total`
# is None while the length of a stage is unknown; `detail` says more (while HiGHS runs: the best
# schedule so far, its gap and the seconds left, with done and total in seconds).


def trace_problem(model: nn.Module, spec: InputSpec, *, cost_model: str = "measured",
                  implementations: bool = True, progress: Progress | None = None) -> Problem:
    """Trace `model` at `spec` and cost every op of its training step, with (`implementations`)
    every alternative way an op can run, measured here."""
    from monet.graph import TracedStep, analyze, costed_problem

    if not model.training:
        warnings.warn(f"{type(model).__name__} is in eval mode; monet solves its training step, so the schedule is "
                      "for train mode (dropout on, batch norm on batch statistics), and MONeTWrapper trains in train "
                      "mode (in eval mode it runs the plain model)", stacklevel=3)
    if progress:
        progress("tracing", 0, None, "")
    with TracedStep(model, spec) as step:
        analysis = analyze(step.graph_module)
    stage = (lambda name, done, total: progress(name, done, total, "")) if progress else None
    return costed_problem(step, analysis, cost_model, implementations=implementations, progress=stage)


def solve(model: nn.Module, input_shape: Sequence[int], budget: str | int | float, *,
          input_dtype: str = "float32", input_requires_grad: bool = False, cost_model: str = "measured",
          implementations: bool = True, allow_approximate: bool = False, options: dict[str, str] | None = None,
          formulation: str = "auto", time_limit: float = 60.0, gap: float = 5e-3, horizon: int | None | str = "auto",
          progress: Progress | None = None, solver_log: bool = False) -> ScheduleFile:
    """The fastest schedule for training `model` on `input_shape` within `budget`.

    `budget` is bytes, a size string ('4GiB') or a percentage of the unconstrained peak ('50%').
    With `implementations` the solver also chooses how ops run (ReLU/dropout masks, dropout
    replayed from its generator state, max-pool offsets, batch-norm reruns from saved statistics),
    jointly with what to keep; off, it only checkpoints.
    Options that change gradients (few-bit GELU/SiLU, batch norm from its output, other
    convolution algorithms) need
    `allow_approximate`; their measured error is recorded in the schedule. `options` fixes
    implementations ({choice: option}, named as in a schedule's "options"). `formulation` is
    "compact" (each tensor recomputed at most once; scales), "general" (any number of
    recomputations, no implementation choices; reaches lower budgets on small graphs) or "auto"
    (general for small graphs with nothing else to choose, else compact).
    The solver stops when the predicted step time is proven within `gap` of the formulation's
    best, or at `time_limit` seconds; `horizon` bounds how many stages ahead of its use an op may
    rerun ("auto": as long as the graph's size allows; None: unbounded).
    `solver_log` prints HiGHS's progress.
    Nothing is written; call `.save(path)` on the result to keep it.
    """
    from monet.graph import InputSpec

    spec = InputSpec(tuple(input_shape), input_dtype, input_requires_grad)
    problem = trace_problem(model, spec, cost_model=cost_model, implementations=implementations or bool(options),
                            progress=progress)
    return solve_traced(problem, budget, type(model).__name__, implementations=implementations,
                        allow_approximate=allow_approximate, options=options, formulation=formulation,
                        time_limit=time_limit, gap=gap, horizon=horizon, solver_log=solver_log, progress=progress)


def solve_traced(problem: Problem, budget: str | int | float, model_name: str, *, implementations: bool = True,
                 allow_approximate: bool = False, options: dict[str, str] | None = None,
                 formulation: str = "auto", time_limit: float = 60.0, gap: float = 5e-3,
                 horizon: int | None | str = "auto", start: Schedule | ScheduleFile | None = None,
                 solver_log: bool = False, progress: Progress | None = None) -> ScheduleFile:
    """`solve` on an already traced and costed problem (to solve several variants of one);
    `start`, a schedule of the same problem (or its file), is a starting point the result is no slower than."""
    if isinstance(start, ScheduleFile):
        start = Schedule.from_dict(problem, {**start.schedule, "saved": list(start.schedule["saved"])})
    unconstrained = simulate(problem, keep_all(problem))
    solution = solve_problem(problem, parse_budget(budget, unconstrained.peak), formulation=formulation,
                             implementations=implementations, allow_approximate=allow_approximate,
                             options=options, time_limit=time_limit, gap=gap, horizon=horizon,
                             start=start, verbose=solver_log, progress=progress)
    return schedule_file(problem, solution.schedule, model_name, budget=int(solution.budget),
                         solver={**solution.summary(), "implementations": implementations,
                                 "approximate_allowed": allow_approximate})


def schedule_file(problem: Problem, schedule: Schedule, model_name: str, *, budget: int,
                  solver: dict) -> ScheduleFile:
    """Any schedule of `problem` (the ILP's, or a baseline's: Chen, Checkmate) as a schedule file
    that MONeTWrapper runs; `solver` says what made it ("formulation" and "status" at least)."""
    unconstrained = simulate(problem, keep_all(problem))
    replay = simulate(problem, schedule)
    meta = problem.meta
    decisions = schedule.to_dict(problem)
    return ScheduleFile(
        model=model_name,
        input=meta["input"],
        device=meta["device"],
        budget=budget,
        predicted={"peak": replay.peak, "time": replay.time,
                   "unconstrained_peak": unconstrained.peak, "unconstrained_time": unconstrained.time},
        solver=solver,
        cost_model=meta["cost_model"],
        graph={"fingerprint": meta["fingerprint"], "ops": [[op.name, op.target, op.phase] for op in problem.ops],
               "param_dtypes": sorted({t.dtype for t in problem.tensors if t.role == "param" and t.dtype})},
        schedule={"options": decisions["options"],
                  "approximate": {c: problem.choice_named[c].error(o) for c, o in sorted(decisions["options"].items())
                                  if o in problem.choice_named[c].approximate},
                  "saved": {name: problem.tensor_named(name).bytes for name in decisions["saved"]},
                  "backward": decisions["backward"]},
    )


def profile(model: nn.Module, input_shape: Sequence[int], *, input_dtype: str = "float32",
            input_requires_grad: bool = False, cost_model: str = "measured", implementations: bool = True,
            progress: Progress | None = None) -> ProblemFile:
    """Trace and profile `model` at `input_shape` here (on the model's device), for solving later or
    elsewhere: `.save(path)` writes the problem file (`monet profile`), and `solve_problem_file`
    solves it with `solve`'s options, without the model's code or torch. `implementations=False`
    profiles only what checkpointing needs (every op runs as in PyTorch)."""
    from monet.graph import InputSpec

    spec = InputSpec(tuple(input_shape), input_dtype, input_requires_grad)
    problem = trace_problem(model, spec, cost_model=cost_model, implementations=implementations, progress=progress)
    return ProblemFile(problem, implementations)


def solve_problem_file(problem_file: ProblemFile | str | os.PathLike, budget: str | int | float, *,
                       implementations: bool = True, allow_approximate: bool = False,
                       options: dict[str, str] | None = None, formulation: str = "auto", time_limit: float = 60.0,
                       gap: float = 5e-3, horizon: int | None | str = "auto",
                       start: Schedule | ScheduleFile | None = None, solver_log: bool = False,
                       progress: Progress | None = None) -> ScheduleFile:
    """`solve` on a profiled problem (a ProblemFile, or the path of one that `profile` or `monet profile`
    wrote): the same options, the same schedule file (its solver record names the problem's digest),
    which MONeTWrapper runs on the model the problem was profiled from. Needs neither the model nor torch."""
    made = problem_file if isinstance(problem_file, ProblemFile) else load_problem(problem_file)
    schedule = solve_traced(made.problem, budget, made.model, implementations=implementations,
                            allow_approximate=allow_approximate, options=options, formulation=formulation,
                            time_limit=time_limit, gap=gap, horizon=horizon, start=start, solver_log=solver_log,
                            progress=progress)
    return dataclasses.replace(schedule, solver={**schedule.solver, "problem": made.digest})
