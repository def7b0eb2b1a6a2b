"""monet.graph: trace a training step, analyse its joint graph, and cost its ops."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from monet.schedules import COST_MODELS, Inputs, InputSpec, OptimizerSpec
from monet.solver import Problem
from monet.solver.edit import add_choices

from .analyze import GraphAnalysis, UnsupportedGraphError, allocation_bytes, analyze, fingerprint
from .capture import (
    TracedStep,
    TraceError,
    inductor_compile,
    inductor_compile_backward,
    model_device,
    sharded_parameters,
)
from .cost_model import (
    analytic_times,
    channels_last_copies,
    fused_reruns,
    summed_in_place,
    with_workspace,
    write_time,
)
from .example import Example, tensor_spec
from .implementations import (
    RERUN,
    choice_specs,
    compiled_options,
    inductor_excluded,
    inductor_fused,
    not_compiled,
    rewrite,
    structure,
)
from .optimizer import measure_update
from .pieces import RECOMPUTED
from .profile import Feed, measure_convolution_layouts, measure_times, measure_workspace


def costed_problem(step: TracedStep, analysis: GraphAnalysis, cost_model: str = "measured", *,
                   implementations: bool = True, repeats: int = 3, optimizer: OptimizerSpec | None = None,
                   progress: Callable[[str, int, int | None], None] | None = None) -> Problem:
    """The analysed problem of a traced model's step, costed (see cost_graph) on its example batch;
    with `optimizer`, the step ends with its update (its state and workspace measured here)."""
    feed = Feed(step.model, tuple(step.example.flat))
    meta = {"model": type(step.model).__name__, "input": step.inputs.to_json(),
            **({"autocast": step.autocast} if step.autocast else {}),
            **({"optimizer": optimizer.to_dict()} if optimizer else {})}
    problem = cost_graph(step.graph_module, analysis, feed, cost_model, meta, implementations=implementations,
                         repeats=repeats, progress=progress)
    return dataclasses.replace(problem, update=measure_update(step.model, optimizer)) if optimizer else problem


def cost_graph(gm: torch.fx.GraphModule, analysis: GraphAnalysis, feed: Feed, cost_model: str, meta: dict, *,
               implementations: bool = True, repeats: int = 3,
               progress: Callable[[str, int, int | None], None] | None = None) -> Problem:
    """The analysed problem of the joint graph `gm` with each op's time and workspace filled in, and
    (with `implementations`) a choice for every op that can run in more than one way; `feed` gives
    its inputs real values, `meta` names the model and input for the schedule file.

    Workspace is always measured (kernel temporaries are a fact of this machine's
    libraries, and their sizes repeat exactly), and so is what libraries hold throughout (the
    problem's `held`: cuBLAS workspaces on CUDA); time is measured ("measured") or
    the roofline estimate ("analytic", deterministic). `progress(stage, done, total)` hears
    each stage (total None where its length is unknown) and each op profiled.
    """
    if cost_model not in COST_MODELS:
        raise ValueError(f"cost model {cost_model!r} is not one of {', '.join(COST_MODELS)}")
    stage = progress or (lambda *_: None)
    stage("measuring workspace", 0, None)
    workspace = measure_workspace(analysis, gm, feed)
    if cost_model == "measured":
        times = measure_times(analysis, gm, feed, repeats=repeats,
                              progress=lambda done, total: stage("profiling ops", done, total))
    else:
        times = analytic_times(analysis, gm)
    meta = {**analysis.problem.meta, **meta, "device": feed.device.type, "cost_model": cost_model,
            "torch": torch.__version__.split("+")[0]}
    ops = [dataclasses.replace(op, pytorch=dataclasses.replace(op.pytorch, time=times[op.name],
                                                                workspace=workspace.per_op[op.name]))
           for op in analysis.problem.ops]
    tensors = [dataclasses.replace(t, bytes=workspace.stored.get(t.name, t.bytes)) for t in analysis.problem.tensors]
    problem = Problem(tensors, ops, meta, held=workspace.held)
    if not implementations:
        return problem
    stage("measuring other ways to run ops", 0, None)
    return add_choices(problem, choice_specs(analysis, gm, feed, problem, times_measured=cost_model == "measured"))


__all__ = [
    "COST_MODELS", "RECOMPUTED", "RERUN", "Example", "Feed", "GraphAnalysis", "InputSpec", "Inputs", "TraceError",
    "TracedStep", "UnsupportedGraphError",
    "compiled_options", "inductor_compile", "inductor_compile_backward", "inductor_excluded", "inductor_fused",
    "not_compiled", "rewrite", "structure",
    "allocation_bytes", "analyze", "analytic_times", "channels_last_copies", "cost_graph", "costed_problem",
    "fingerprint", "fused_reruns", "summed_in_place",
    "write_time",
    "measure_convolution_layouts", "measure_times", "measure_workspace", "model_device", "sharded_parameters",
    "tensor_spec", "with_workspace",
]
