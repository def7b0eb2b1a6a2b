"""MONeTWrapper: a module that trains exactly like the model, with the schedule's memory."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from monet.graph import (
    Example,
    GraphAnalysis,
    Inputs,
    InputSpec,
    TracedStep,
    TraceError,
    analyze,
    compiled_options,
    model_device,
    not_compiled,
    structure,
)
from monet.schedules import ScheduleFile, check_writable, load_schedule
from monet.solver import Problem, validate
from monet.solver.order import in_schedule_order

from .runtime import ExecutionPlan, ScheduleMismatchError, make_partition


class MONeTWrapper(nn.Module):
    """Wrap `model` to train under the schedule in `solution_file`.

    `solution_file` is a path, the name of a bundled schedule, or a ScheduleFile
    (as `monet.solve` returns). `inputs` is what the model is called with, as `monet.solve` takes
    it (an input shape, an example tensor, a tuple of positional or a dict of keyword inputs; None:
    the schedule's own). The model is traced once here and checked against the schedule; every
    training step, `wrapper(*args, **kwargs)` with inputs like those, then runs the compiled
    schedule and returns the model's output. A call with other inputs is a ScheduleMismatchError;
    with `new_shapes` (a folder), a call whose tensors alone have other shapes (another batch size or
    sequence length) runs a schedule for those shapes: the folder's, or one solved then as this one
    was (the same share of the unconstrained peak) with a progress display, and kept there.
    In eval mode or under torch.no_grad the plain model runs. `graphs` holds the forward and
    backward fx modules that run (to see what is saved, recomputed and how each op runs).
    With `compile`, Inductor compiles that forward and backward (fused kernels, as torch.compile
    runs; the backward in pieces cut where recomputations begin, so that fusion keeps the schedule's
    frees); the schedule's saved tensors and reruns stay as solved, but its predicted step time and
    peak are for the ops unfused (see docs/guides/torch-compile.md).
    """

    def __init__(self, model: nn.Module, solution_file: str | os.PathLike | ScheduleFile, inputs=None, *,
                 compile: bool = False, new_shapes: str | os.PathLike | None = None):
        super().__init__()
        self.model = model
        self._compile = compile
        self._new_shapes = None if new_shapes is None else Path(new_shapes)
        # `solution_file` is MONeT's name for the argument; inside, it is the schedule file it names
        schedule_file = solution_file if isinstance(solution_file, ScheduleFile) else load_schedule(solution_file)
        first = self._build(schedule_file, _example(schedule_file, inputs, model))
        self._steps = [first]
        self.spec, self.schedule_file, self.graphs = first.spec, schedule_file, first.graphs

    def _build(self, schedule_file: ScheduleFile, example: Example) -> _Step:
        """The schedule's step traced at `example` and compiled, after checking that they agree."""
        spec = example.spec()
        _check_input(schedule_file, spec, self.model)
        graphs: dict[str, torch.fx.GraphModule] = {}
        with _traced(self.model, example, schedule_file) as step:
            analysis = analyze(step.graph_module)
            structured = structure(analysis, step.graph_module)
            _check_graph(schedule_file, analysis.fingerprint, structured, self.model, spec)
            problem = in_schedule_order(structured, schedule_file.schedule.backward)
            schedule = schedule_file.schedule.on(problem)
            validate(problem, schedule)
            if self._compile:
                _check_compilable(schedule_file, step.graph_module, analysis)
                schedule = dataclasses.replace(schedule, options=compiled_options(step.graph_module, analysis,
                                                                                  schedule.options))
            plan = ExecutionPlan.build(analysis, problem, schedule)
            run = step.compile(make_partition(plan, lambda fw, bw: graphs.update(forward=fw, backward=bw)),
                               inductor=self._compile, layout_optimization=schedule_file.layout_optimization)
            return _Step(schedule_file, spec, run, step.param_names, step.buffer_names, graphs, step.loss_only)

    def forward(self, *args, **kwargs):
        # the schedule is the training step: in eval mode (the wrapper's or the model's own) or without
        # gradients, the model runs as it is
        if not (self.training and self.model.training and torch.is_grad_enabled()):
            return self.model(*args, **kwargs)
        device = self.schedule_file.device
        if torch.is_autocast_enabled(device):
            called = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
            if called != self.schedule_file.autocast:
                solved = (f"under torch.autocast at {self.schedule_file.autocast}" if self.schedule_file.autocast
                          else "without autocast")
                raise ScheduleMismatchError(
                    f"the wrapper was called under torch.autocast({device!r}, dtype=torch.{called}), but the schedule "
                    f"was solved {solved}, which the wrapper applies itself; call it outside autocast, or solve with "
                    f"monet.solve(..., autocast={called!r}) (CLI: --autocast {called})")
        called = Example(args, kwargs)
        step = next((s for s in self._steps if _difference(s.spec, called.spec()) is None), None)
        if step is None:
            step = self._for_new_shapes(called)
        params = [self.model.get_parameter(n) for n in step.param_names]
        buffers = [self.model.get_buffer(n) for n in step.buffer_names]
        with torch.autocast(device, enabled=False):  # the graph holds the schedule's casts
            output = step.run(*params, *buffers, *args, **kwargs)
        return _guard_undifferentiated(output) if step.loss_only else output

    def _for_new_shapes(self, called: Example) -> _Step:
        """The step for inputs whose shapes alone differ from the schedule's, where `new_shapes` allows it:
        that folder's schedule file for them, or one solved now (and kept there)."""
        spec = called.spec()  # the difference from the nearest step: one other than shapes where there is one
        mismatch = min((_difference(step.spec, spec) for step in self._steps), key=lambda text: "has shape" in text)
        if self._new_shapes is None or not _only_shapes_differ(self.spec, spec):
            hint = (" (or let the wrapper solve for new shapes: MONeTWrapper(..., new_shapes=folder))"
                    if _only_shapes_differ(self.spec, spec) else "")
            raise ScheduleMismatchError(f"{mismatch}; solve a schedule for these inputs{hint}")
        step = self._build(_schedule_for_shapes(self.model, self.schedule_file, called, self._new_shapes), called)
        self._steps.append(step)
        return step


@dataclass(frozen=True)
class _Step:
    """One schedule compiled for one set of input shapes, and what it is called with."""

    schedule_file: ScheduleFile
    spec: Inputs
    run: Callable
    param_names: list[str]
    buffer_names: list[str]
    graphs: dict[str, torch.fx.GraphModule]
    loss_only: bool  # the model returned its loss, and the step differentiates it alone


class _Undifferentiated(torch.autograd.Function):
    """An output of a step that differentiates the loss alone, made to require grad (through the loss)
    so that a backward through it stops with the reason instead of leaving its share of the gradient out."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, loss: torch.Tensor, name: str) -> torch.Tensor:
        ctx.name = name
        return output.detach()

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(
            f"the model returned its loss, so monet's step backpropagates that alone, and its output {ctx.name!r} "
            "has no backward under monet (eager would have made it a zero gradient whenever only the loss is "
            "backpropagated); backpropagate the loss, or call the model without the labels so that it returns no "
            "loss, and compute the loss from its outputs (then every output is differentiated)")


def _guard_undifferentiated(output):
    """The step's `output` (a mapping with its loss) with every other floating-point tensor an _Undifferentiated."""
    loss = output["loss"]
    for key in [k for k in output.keys() if k != "loss"]:
        output[key] = tree_map_only(
            torch.Tensor, lambda t, key=key: _Undifferentiated.apply(t, loss, key) if t.is_floating_point() else t,
            output[key])
    return output


def _only_shapes_differ(expected: Inputs, called: Inputs) -> bool:
    """Whether `called` is `expected` with other tensor shapes (structure, dtypes and constants the same)."""
    def unshaped(inputs: Inputs) -> list:
        return [(path, dataclasses.replace(leaf, shape=()) if isinstance(leaf, InputSpec) else leaf)
                for path, leaf in inputs.leaves()]
    return unshaped(expected) == unshaped(called)


def _schedule_for_shapes(model: nn.Module, original: ScheduleFile, example: Example, folder: Path) -> ScheduleFile:
    """The schedule for `model` at `example`'s shapes, solved as `original` was (the same share of the
    unconstrained peak, autocast, optimizer, choices and cost model): read from `folder`, where a file
    for this model and these inputs is kept, else solved now with a progress display and kept there."""
    from rich.console import Console

    from .api import solve
    from .progress import progress_display

    spec = example.spec()
    share = original.budget / original.predicted.unconstrained_peak
    key = json.dumps({"model": _model_key(model), "input": spec.to_json(), "share": share,
                      "autocast": original.autocast, "optimizer": original.optimizer and original.optimizer.to_dict(),
                      "cost_model": original.cost_model, "device": original.device,
                      "implementations": original.solver.implementations,
                      "approximate": original.solver.approximate_allowed}, sort_keys=True)
    path = folder / f"{type(model).__name__}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if path.exists():
        return load_schedule(path)
    check_writable(path)
    optimizer = original.optimizer
    with progress_display(Console(stderr=True)) as progress:
        made = solve(model, example, f"{share * 100:.9f}%", implementations=bool(original.solver.implementations),
                     allow_approximate=bool(original.solver.approximate_allowed), autocast=original.autocast,
                     optimizer=optimizer and (optimizer.load(), optimizer.options),
                     micro_batches=optimizer.micro_batches if optimizer else 1, cost_model=original.cost_model,
                     progress=lambda stage, *state: progress(f"new input shapes {spec.describe()}: {stage}", *state))
    made.save(path)
    warnings.warn(f"solved a schedule for new input shapes {spec.describe()} at {share:.0%} of their unconstrained "
                  f"peak in {made.solver.solve_time_s or 0:.0f} s; kept in {path}", stacklevel=4)
    return made


def _model_key(model: nn.Module) -> list:
    """What identifies a model's architecture for the new-shape cache: its class, and its parameters'
    and buffers' names, shapes and dtypes."""
    return [type(model).__qualname__, *([name, list(t.shape), str(t.dtype)]
                                        for name, t in [*model.named_parameters(), *model.named_buffers()])]


def _example(schedule_file: ScheduleFile, inputs, model: nn.Module) -> Example:
    """The inputs to trace the wrapper's step at: `inputs` as given (a shape takes the schedule's
    dtype and requires_grad), or the schedule's own (None)."""
    device = model_device(model)
    recorded, single = schedule_file.input, schedule_file.input.single
    if inputs is None:
        return Example.of(recorded, device=device)
    if single is not None and not isinstance(inputs, torch.Tensor) and isinstance(inputs, (tuple, list, torch.Size)) \
            and all(isinstance(s, int) for s in inputs):
        return Example.of(inputs, dtype=single.dtype, requires_grad=single.requires_grad, device=device)
    return Example.of(inputs, device=device)


def _traced(model: nn.Module, example: Example, schedule_file: ScheduleFile) -> TracedStep:
    """Trace `model`; a model that cannot take the schedule's input is the wrong model."""
    spec = example.spec()
    try:
        return TracedStep(model, example, schedule_file.autocast)
    except TraceError as exc:
        if schedule_file.model == type(model).__name__:
            raise
        raise ScheduleMismatchError(
            f"the schedule was made for {schedule_file.model} at input {spec.describe()}, and "
            f"{type(model).__name__} does not trace at that input ({exc.reason}); solve a schedule for this model"
        ) from exc


def _difference(expected: Inputs, called: Inputs) -> str | None:
    """How a call's inputs differ from those a schedule was made for, in words; None where they agree
    (an input may go without the gradient the schedule allows for, not the other way round)."""
    ours, theirs = list(expected.leaves()), list(called.leaves())
    if [path for path, _ in ours] != [path for path, _ in theirs]:
        return (f"the inputs are {called.describe()}, but the schedule was made for {expected.describe()} "
                "(other arguments or structure)")
    for (path, want), (_, got) in zip(ours, theirs):
        if isinstance(want, InputSpec) and isinstance(got, InputSpec):
            if want.shape != got.shape:
                return f"input {path} has shape {got.shape}, but the schedule was made for shape {want.shape}"
            if want.dtype != got.dtype:
                return f"input {path} is {got.dtype}, but the schedule was made for {want.dtype}"
            if got.requires_grad and not want.requires_grad:
                return (f"input {path} requires grad, but the schedule was made for it without a gradient "
                        "(solve with input_requires_grad=True, CLI --input-requires-grad, or pass it so)")
        elif want != got or type(want) is not type(got):
            return f"input {path} is {got!r}, but the schedule was made for {want!r}"
    return None


def _check_input(schedule_file: ScheduleFile, spec: Inputs, model: nn.Module) -> None:
    mismatch = _difference(schedule_file.input, spec)
    if mismatch:
        raise ScheduleMismatchError(mismatch)
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


def _check_graph(schedule_file: ScheduleFile, fingerprint: str, problem: Problem, model: nn.Module,
                 spec: Inputs) -> None:
    """A ScheduleMismatchError unless the schedule was made for the traced graph (its `fingerprint`),
    naming the first op where the schedule's recorded ops and `problem`'s (with its choices' ops) differ."""
    if schedule_file.graph.fingerprint == fingerprint:
        return
    theirs = list(schedule_file.graph.ops)
    ours = [(op.name, op.target, op.phase) for op in problem.ops]
    position = {name: i for i, (name, _, _) in enumerate(theirs)}
    if set(position) == {name for name, _, _ in ours}:  # compared in the schedule's order, which may run
        ours.sort(key=lambda op: position[op[0]])  # gradients later than autograd (solver.order)
    where = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
    detail = (f"op #{where}: schedule has {theirs[where][0]} ({theirs[where][1]}), model has "
              f"{ours[where][0]} ({ours[where][1]})" if where < min(len(theirs), len(ours))
              else "ops agree, but shapes or wiring differ")
    raise ScheduleMismatchError(
        f"the schedule was made for a different graph: {schedule_file.model} with {len(theirs)} ops, while "
        f"{type(model).__name__} at input {spec.describe()} traces to "
        f"{len(ours)} ops; first difference at {detail}. Solve a schedule for this model"
    )
