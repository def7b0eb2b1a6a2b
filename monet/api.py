"""`monet.solve`: model and input shape in, schedule (with its prediction) out."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from monet.graph import InputSpec, TracedStep, analyze, costed_problem
from monet.schedules import ScheduleFile
from monet.solver import Problem, Replay, Solution, keep_all, simulate
from monet.solver import solve as solve_problem

from .budget import parse_budget

# progress(stage, done, total): total is None while the length of a stage is unknown.
Progress = Callable[[str, int, int | None], None]


def trace_problem(model: nn.Module, spec: InputSpec, *, cost_model: str = "measured",
                  progress: Progress | None = None) -> Problem:
    """Trace `model` at `spec` and cost every op of its training step."""
    if progress:
        progress("tracing", 0, None)
    with TracedStep(model, spec) as step:
        analysis = analyze(step.graph_module)
    on_op = (lambda done, total: progress("profiling ops", done, total)) if progress else None
    return costed_problem(step, analysis, cost_model, progress=on_op)


def solve(model: nn.Module, input_shape: Sequence[int], budget: str | int | float, *,
          input_dtype: str = "float32", input_requires_grad: bool = False, cost_model: str = "measured",
          formulation: str = "compact", time_limit: float = 60.0, progress: Progress | None = None,
          solver_log: bool = False) -> ScheduleFile:
    """The least-overhead schedule for training `model` on `input_shape` within `budget`.

    `budget` is bytes, a size string ('4GiB') or a percentage of the unconstrained peak ('50%').
    `formulation` is "compact" (each tensor recomputed at most once; scales) or "general"
    (any number of recomputations; reaches lower budgets on small graphs). `solver_log`
    prints HiGHS's progress.
    Nothing is written; call `.save(path)` on the result to keep it.
    """
    spec = InputSpec(tuple(input_shape), input_dtype, input_requires_grad)
    problem = trace_problem(model, spec, cost_model=cost_model, progress=progress)
    unconstrained = simulate(problem, keep_all(problem))
    budget_bytes = parse_budget(budget, unconstrained.peak)
    if progress:
        progress("solving", 0, None)
    solution = solve_problem(problem, budget_bytes, formulation=formulation, time_limit=time_limit,
                             verbose=solver_log)
    return schedule_file(problem, solution, unconstrained, type(model).__name__)


def schedule_file(problem: Problem, solution: Solution, unconstrained: Replay, model_name: str) -> ScheduleFile:
    """The file form of a solution on `problem`."""
    meta = problem.meta
    decisions = solution.schedule.to_dict(problem)
    return ScheduleFile(
        model=model_name,
        input=meta["input"],
        device=meta["device"],
        budget=int(solution.budget),
        predicted={"peak": solution.peak, "time": solution.replay.time,
                   "unconstrained_peak": unconstrained.peak, "unconstrained_time": unconstrained.time},
        solver=solution.summary(),
        cost_model=meta["cost_model"],
        graph={"fingerprint": meta["fingerprint"], "ops": [[op.name, op.target, op.phase] for op in problem.ops]},
        schedule={"saved": {name: problem.tensor_named(name).bytes for name in decisions["saved"]},
                  "backward": decisions["backward"]},
    )
