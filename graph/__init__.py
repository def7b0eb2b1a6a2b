"""monet.graph: trace a training step, analyse its joint graph, and cost its ops."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from monet.solver import Problem

from .analyze import GraphAnalysis, UnsupportedGraphError, allocation_bytes, analyze, fingerprint
from .capture import InputSpec, TracedStep, TraceError, model_device
from .cost_model import analytic_costs
from .profile import OpCost, measure

COST_MODELS = ("measured", "analytic")


def costed_problem(step: TracedStep, analysis: GraphAnalysis, cost_model: str = "measured", *,
                   repeats: int = 3, progress: Callable[[int, int], None] | None = None) -> Problem:
    """The analysed problem with each op's time and workspace filled in."""
    if cost_model == "measured":
        costs = measure(analysis, step.graph_module, step.model, step.spec.example(step.device),
                        repeats=repeats, progress=progress)
    elif cost_model == "analytic":
        costs = analytic_costs(analysis, step.graph_module)
    else:
        raise ValueError(f"cost model {cost_model!r} is not one of {', '.join(COST_MODELS)}")
    problem = analysis.problem
    ops = [dataclasses.replace(op, time=costs[op.name].time, workspace=costs[op.name].workspace)
           for op in problem.ops]
    meta = {
        **problem.meta,
        "model": type(step.model).__name__,
        "input": dataclasses.asdict(step.spec),
        "device": step.device.type,
        "cost_model": cost_model,
        "torch": torch.__version__.split("+")[0],
    }
    return Problem(problem.tensors, ops, meta)


__all__ = [
    "COST_MODELS", "GraphAnalysis", "InputSpec", "OpCost", "TraceError", "TracedStep", "UnsupportedGraphError",
    "allocation_bytes", "analyze", "analytic_costs", "costed_problem", "fingerprint", "measure", "model_device",
]
