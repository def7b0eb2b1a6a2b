"""monet.graph: trace a training step, analyse its joint graph, and cost its ops."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from monet.schedules import COST_MODELS
from monet.solver import Problem
from monet.solver.edit import add_choices

from .analyze import GraphAnalysis, UnsupportedGraphError, allocation_bytes, analyze, fingerprint
from .capture import InputSpec, TracedStep, TraceError, model_device
from .cost_model import analytic_times
from .implementations import RERUN, choice_specs, not_compiled, rewrite, structure
from .profile import measure_times, measure_workspace


def costed_problem(step: TracedStep, analysis: GraphAnalysis, cost_model: str = "measured", *,
                   implementations: bool = True, repeats: int = 3,
                   progress: Callable[[str, int, int | None], None] | None = None) -> Problem:
    """The analysed problem with each op's time and workspace filled in, and (with
    `implementations`) a choice for every op that can run in more than one way.

    Workspace is always measured (kernel temporaries are a fact of this machine's
    libraries, and their sizes repeat exactly); time is measured ("measured") or
    the roofline estimate ("analytic", deterministic). `progress(stage, done, total)` hears
    each stage (total None where its length is unknown) and each op profiled.
    """
    if cost_model not in COST_MODELS:
        raise ValueError(f"cost model {cost_model!r} is not one of {', '.join(COST_MODELS)}")
    stage = progress or (lambda *_: None)
    gm, x = step.graph_module, step.spec.example(step.device)
    stage("measuring workspace", 0, None)
    workspace = measure_workspace(analysis, gm, step.model, x)
    if cost_model == "measured":
        times = measure_times(analysis, gm, step.model, x, repeats=repeats,
                              progress=lambda done, total: stage("profiling ops", done, total))
    else:
        times = analytic_times(analysis, gm)
    meta = {
        **analysis.problem.meta,
        "model": type(step.model).__name__,
        "input": dataclasses.asdict(step.spec),
        "device": step.device.type,
        "cost_model": cost_model,
        "torch": torch.__version__.split("+")[0],
    }
    ops = [dataclasses.replace(op, pytorch=dataclasses.replace(op.pytorch, time=times[op.name],
                                                                workspace=workspace[op.name]))
           for op in analysis.problem.ops]
    problem = Problem(analysis.problem.tensors, ops, meta)
    if not implementations:
        return problem
    stage("measuring other ways to run ops", 0, None)
    return add_choices(problem, choice_specs(analysis, gm, step.model, x, problem,
                                             times_measured=cost_model == "measured"))


__all__ = [
    "COST_MODELS", "RERUN", "GraphAnalysis", "InputSpec", "TraceError", "TracedStep", "UnsupportedGraphError",
    "not_compiled", "rewrite", "structure",
    "allocation_bytes", "analyze", "analytic_times", "costed_problem", "fingerprint", "measure_times",
    "measure_workspace", "model_device",
]
