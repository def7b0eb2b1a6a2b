"""MONeTWrapper: a module that trains exactly like the model, with the schedule's memory."""

from __future__ import annotations

import os

import torch
from torch import nn

from monet.graph import (
    GraphAnalysis,
    InputSpec,
    TracedStep,
    TraceError,
    analyze,
    model_device,
    not_compiled,
    structure,
)
from monet.schedules import ScheduleFile, load_schedule
from monet.solver import validate

from .runtime import ExecutionPlan, ScheduleMismatchError, make_partition


class MONeTWrapper(nn.Module):
    """Wrap `model` to train under the schedule in `solution_file`.

    `solution_file` is a path, the name of a bundled schedule, or a ScheduleFile
    (as `monet.solve` returns). The model is traced once here and checked
    against the schedule; every training step then runs the compiled schedule.
    In eval mode or under torch.no_grad the plain model runs. `graphs` holds the forward and
    backward fx modules that run (to see what is saved, recomputed and how each op runs).
    With `compile`, Inductor compiles that forward and backward (fused kernels, as torch.compile
    runs); the schedule's saved tensors and reruns stay as solved, but its predicted step time and
    peak are for the ops unfused (see README, "Compiled by Inductor").
    """

    def __init__(self, model: nn.Module, solution_file: str | os.PathLike | ScheduleFile,
                 input_shape: tuple[int, ...] | list[int] | torch.Size, *, compile: bool = False):
        super().__init__()
        self.model = model
        # `solution_file` is MONeT's name for the argument; inside, it is the schedule file it names
        schedule_file = solution_file if isinstance(solution_file, ScheduleFile) else load_schedule(solution_file)
        spec = InputSpec(tuple(input_shape), schedule_file.input.dtype, schedule_file.input.requires_grad)
        _check_input(schedule_file, spec, model)
        with _traced(model, spec, schedule_file) as step:
            analysis = analyze(step.graph_module)
            _check_graph(schedule_file, analysis, model, spec)
            problem = structure(analysis, step.graph_module)
            schedule = schedule_file.schedule.on(problem)
            validate(problem, schedule)
            if compile:
                _check_compilable(schedule_file, step.graph_module, analysis)
            self._step = step.compile(make_partition(ExecutionPlan.build(analysis, problem, schedule),
                                                     self._keep_graphs), inductor=compile)
            self._param_names = step.param_names
            self._buffer_names = step.buffer_names
        self.spec = spec
        self.schedule_file = schedule_file

    def _keep_graphs(self, forward: torch.fx.GraphModule, backward: torch.fx.GraphModule) -> None:
        self.graphs = {"forward": forward, "backward": backward}

    def forward(self, x: torch.Tensor):
        if not (self.training and torch.is_grad_enabled()):
            return self.model(x)
        device = self.schedule_file.device
        if torch.is_autocast_enabled(device):
            raise ScheduleMismatchError(
                f"the wrapper was called under torch.autocast({device!r}), but schedules are solved and run without "
                "it; autocast inside the model's own forward is traced and works, or call the wrapper outside it")
        if tuple(x.shape) != self.spec.shape:
            raise ValueError(f"input shape {tuple(x.shape)} is not the shape {self.spec.shape} this schedule "
                             "was solved for; solve a schedule for this shape")
        if x.dtype != self.spec.torch_dtype:
            raise ValueError(f"input dtype {x.dtype} is not {self.spec.dtype}, which this schedule was solved for")
        if x.requires_grad and not self.spec.requires_grad:
            raise ValueError("the input requires grad, but this schedule was solved for an input without a "
                             "gradient; re-solve with input_requires_grad=True (CLI: --input-requires-grad)")
        params = [self.model.get_parameter(n) for n in self._param_names]
        buffers = [self.model.get_buffer(n) for n in self._buffer_names]
        return self._step(*params, *buffers, x)


def _traced(model: nn.Module, spec: InputSpec, schedule_file: ScheduleFile) -> TracedStep:
    """Trace `model`; a model that cannot take the schedule's input is the wrong model."""
    try:
        return TracedStep(model, spec)
    except TraceError as exc:
        if schedule_file.model == type(model).__name__:
            raise
        raise ScheduleMismatchError(
            f"the schedule was made for {schedule_file.model} at input {spec.describe()}, and "
            f"{type(model).__name__} does not trace at that input ({exc.reason}); solve a schedule for this model"
        ) from exc


def _check_input(schedule_file: ScheduleFile, spec: InputSpec, model: nn.Module) -> None:
    shape = schedule_file.input.shape
    if shape != spec.shape:
        raise ScheduleMismatchError(f"the schedule was made for input shape {shape}, not {spec.shape}")
    device = model_device(model).type
    if schedule_file.device != device:
        raise ScheduleMismatchError(
            f"the schedule was made for a {schedule_file.device} model, but the model is on {device}")
    theirs = list(schedule_file.graph.param_dtypes)  # empty in files written before it was recorded
    ours = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    if theirs and theirs != ours:
        raise ScheduleMismatchError(
            f"the schedule was made for a model with {', '.join(theirs)} parameters, but this model's are "
            f"{', '.join(ours)} (converted with .double(), .half() or .to(dtype)?); convert it back, or solve a "
            "schedule for the model as it is")


def _check_compilable(schedule_file: ScheduleFile, gm: torch.fx.GraphModule, analysis: GraphAnalysis) -> None:
    found = not_compiled(gm, analysis, schedule_file.schedule.options)
    if found:
        by_reason: dict[str, list[str]] = {}
        for choice, why in found.items():
            by_reason.setdefault(why, []).append(choice)
        listed = "; ".join(f"{', '.join(choices[:3])}{' ...' if len(choices) > 3 else ''} run {why}"
                           for why, choices in by_reason.items())
        raise ScheduleMismatchError(
            f"{len(found)} of the schedule's choices take options that cannot run under Inductor: {listed}. Run it "
            "with compile=False, or solve a schedule with those choices fixed to another option "
            "(monet.solve(..., options={choice: option}))")


def _check_graph(schedule_file: ScheduleFile, analysis: GraphAnalysis, model: nn.Module, spec: InputSpec) -> None:
    if schedule_file.graph.fingerprint == analysis.fingerprint:
        return
    theirs = list(schedule_file.graph.ops)
    ours = [(op.name, op.target, op.phase) for op in analysis.problem.ops]
    where = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
    detail = (f"op #{where}: schedule has {theirs[where][0]} ({theirs[where][1]}), model has "
              f"{ours[where][0]} ({ours[where][1]})" if where < min(len(theirs), len(ours))
              else "ops agree, but shapes or wiring differ")
    raise ScheduleMismatchError(
        f"the schedule was made for a different graph: {schedule_file.model} with {len(theirs)} ops, while "
        f"{type(model).__name__} at input {spec.describe()} traces to "
        f"{len(ours)} ops; first difference at {detail}. Solve a schedule for this model"
    )
