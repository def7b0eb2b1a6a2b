"""`monet.backend`: a torch.compile backend that trains every compiled region by a monet schedule.

torch.compile hands its backend one region at a time (an fx graph of the model's code between graph
breaks) with the region's real inputs. AOTAutograd traces the region's joint forward and backward
graph and asks a partitioner how to split it; monet's partitioner analyses that joint graph,
profiles its ops on the region's inputs, solves the schedule within the budget (or reuses the one
saved for the same graph), and splits the graph as the schedule says: what the forward saves, what
the backward recomputes, how ops run. Inductor then compiles the forward and the backward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import warnings
from pathlib import Path

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._guards import CompileContext
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from monet.graph import (
    Feed,
    GraphAnalysis,
    Inputs,
    InputSpec,
    analyze,
    channels_last_copies,
    cost_graph,
    fused_reruns,
    inductor_compile,
    inductor_compile_backward,
    inductor_excluded,
    inductor_fused,
    measure_convolution_layouts,
    measure_workspace,
    structure,
    summed_in_place,
    tensor_spec,
    with_workspace,
    write_time,
)
from monet.schedules import ScheduleFile, load_schedule
from monet.solver import InfeasibleBudgetError, Problem, SolverFailedError, SolveSettings, format_bytes, validate
from monet.solver.options import settings_of
from monet.solver.order import in_schedule_order, sink_gradients
from monet.solver.solve import Progress

from .api import solve_traced
from .budget import check_budget, is_least, parse_budget
from .progress import progress_display
from .runtime import ExecutionPlan, make_partition

LAYOUTS = ("priced", "inductor", "off")


class Backend:
    """A torch.compile backend (see `backend`). `regions` holds the schedule file of every region it
    has compiled for training so far, in the order torch.compile compiled them."""

    def __init__(self, budget: str | int | float, settings: SolveSettings, *, cost_model: str,
                 schedules: str | os.PathLike | None, progress: Progress | bool, layout: str):
        check_budget(budget)  # a budget that does not parse fails here, not inside torch.compile
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r} is not one of {', '.join(map(repr, LAYOUTS))}")
        self.budget, self.settings, self.cost_model, self.layout = budget, settings, cost_model, layout
        self.schedules = None if schedules is None else Path(schedules)
        self.progress = progress
        self.regions: list[ScheduleFile] = []
        self._compiled: dict[int, tuple[int, list[tuple[int, ...]]]] = {}  # Dynamo frame -> (its compile, shapes)
        self._split_warned = False

    def __call__(self, region: torch.fx.GraphModule, example_inputs: list) -> object:
        symbolic = [i for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)
                    or any(isinstance(s, torch.SymInt) for s in x.shape)]
        if symbolic:
            raise ValueError(
                f"torch.compile passed this region inputs of symbolic shape (inputs {symbolic[:5]}): monet solves a "
                "schedule for fixed shapes. Compile with torch.compile(model, backend=monet.backend(...), "
                "dynamic=False)")
        layout = {"on": True}  # the partition says whether this region's schedule lets Inductor optimize the layout

        def forward(gm, example):  # (an inference region, never partitioned, compiles as torch.compile's would)
            return inductor_compile(gm, example, layout_optimization=layout["on"])

        def backward(gm, example):
            return inductor_compile_backward(gm, example, layout_optimization=layout["on"])

        partition = functools.partial(self._partition, region, tuple(example_inputs), layout)
        return aot_autograd(fw_compiler=forward, bw_compiler=backward, partition_fn=partition,
                            keep_inference_input_mutations=True)(region, example_inputs)

    def _partition(self, region: torch.fx.GraphModule, inputs: tuple, layout: dict, joint: torch.fx.GraphModule,
                   joint_inputs, *, num_fwd_outputs: int, static_lifetime_input_indices=(), **_):
        analysis = analyze(joint, num_fwd_outputs)
        compile_id = CompileContext.current_compile_id()
        name = f"torch.compile region {compile_id or len(self.regions)}"
        recompiled = self._recompiled(name, compile_id, inputs)
        with self._progress() as progress:
            schedule_file, problem = self._schedule(name, region, inputs, joint, analysis,
                                                    set(static_lifetime_input_indices or ()), progress)
        self.regions.append(schedule_file)
        layout["on"] = schedule_file.layout_optimization
        if len(self.regions) > 1 and not recompiled and not self._split_warned:
            self._split_warned = True
            warnings.warn(
                "torch.compile split the model into several regions (graph breaks, or DistributedDataParallel's "
                "buckets, at whose bounds it splits so that the all-reduce overlaps the backward); monet solves each "
                "region's "
                f"schedule within the budget of {self.budget!r} on its own, so the step's peak can exceed it: what "
                "an earlier region saves for its backward stays held while later regions run. Remove the graph "
                "breaks (torch._dynamo.explain(model)(*inputs) lists them) for one schedule of the whole step",
                stacklevel=2)
        plan = ExecutionPlan.build(analysis, problem, schedule_file.schedule.on(problem))
        return make_partition(plan)(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)

    def _recompiled(self, name: str, compile_id, inputs: tuple) -> bool:
        """Whether torch.compile compiles a frame again that this backend partitioned before (a guard failed:
        new input shapes, for one), saying so: the region is solved again, for its own shapes. A graph break
        is another frame, and DistributedDataParallel's bucket regions share one compile of a frame."""
        if compile_id is None:
            return False
        shapes = [tuple(x.shape) for x in inputs if isinstance(x, torch.Tensor)]
        earlier = self._compiled.get(compile_id.frame_id)
        self._compiled[compile_id.frame_id] = compile_id.frame_compile_id, shapes
        if earlier is None or earlier[0] == compile_id.frame_compile_id:
            return False
        changed = [f"{list(old)} -> {list(new)}" for old, new in zip(earlier[1], shapes) if old != new]
        why = (f"input shapes changed ({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''})" if changed
               else "a guard other than the input shapes failed")
        warnings.warn(
            f"{name}: torch.compile compiles this code again ({why}); monet solves its schedule again, for these "
            "shapes (a schedule is solved for one set of shapes; with `schedules=DIR` each is saved and reused). "
            "To solve once, keep the shapes fixed (a DataLoader with drop_last=True drops a smaller last batch)",
            stacklevel=2)
        return True

    def _schedule(self, name: str, region: torch.fx.GraphModule, inputs: tuple, joint: torch.fx.GraphModule,
                  analysis: GraphAnalysis, static: set[int], progress: Progress) -> tuple[ScheduleFile, Problem]:
        """The region's schedule file and the problem its decisions are on: the saved file for this graph
        at this budget where there is one, else solved here (and saved)."""
        path = self.schedules / f"{analysis.fingerprint}.json" if self.schedules else None
        if path is not None and path.exists():
            saved = load_schedule(path)
            if (saved.solver.least if is_least(self.budget)
                    else parse_budget(self.budget, saved.predicted.unconstrained_peak) == saved.budget):
                progress(f"{name}: reusing {path}", 0, None, "")
                problem = in_schedule_order(structure(analysis, joint), saved.schedule.backward)
                validate(problem, saved.schedule.on(problem))
                return saved, problem
        meta = {"model": name, "input": Inputs.tensor(_batch_spec(inputs, static)).to_json()}
        inputs = tuple(_real(x) for x in inputs)
        # The partitioner runs under AOTAutograd's fake mode; profiling runs real tensors, and leaves
        # the random generators as it found them (the step's dropout masks stay eager's).
        with unset_fake_temporarily(), torch.random.fork_rng(
                devices=[x.device for x in inputs if x.device.type == "cuda"][:1]):
            feed = Feed(region, inputs)
            problem = cost_graph(joint, analysis, feed, self.cost_model, meta,
                                 implementations=self.settings.implementations or bool(self.settings.options),
                                 progress=lambda stage, done, total: progress(f"{name}: {stage}", done, total, ""))
            write = write_time(feed.device, self.cost_model)
            layout = None if is_least(self.budget) else self._layout(name, joint, analysis, feed, write, progress)
        problem = summed_in_place(sink_gradients(fused_reruns(problem, joint, inductor_fused(joint, analysis), write)),
                                  joint)
        if problem.choices:
            problem = problem.without(inductor_excluded(joint, analysis))
        schedule_file, problem = self._solve(name, problem, layout, progress)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            schedule_file.save(path)
        return schedule_file, problem

    def _layout(self, name: str, joint: torch.fx.GraphModule, analysis: GraphAnalysis, feed: Feed, write: float,
                progress: Progress) -> tuple[int, dict[str, int]] | None:
        """Whether the region is solved for Inductor's layout optimization, as `_solve` takes it: (the bytes
        of the channels-last copies it makes, each op's workspace measured channels-last), or None (off).
        'inductor': where Inductor would optimize the layout (graph.channels_last_copies); 'priced' (the
        default): there, and only where running the convolutions channels-last saves more time than the
        copies take (the inputs' copies and the weight gradients' copies back, `write` seconds per byte),
        both measured here and shown as progress (by hand on this EPYC, VGG-16's and UNet's convolutions
        ran no faster channels-last, and their compiled steps 13 % and 17 % faster with the layout off;
        MobileNetV2's 11 % faster with it on); 'off': never."""
        copies = 0 if self.layout == "off" else channels_last_copies(joint)
        if not copies:
            return None
        if self.layout == "priced":
            progress(f"{name}: timing convolutions contiguous and channels-last", 0, None, "")
            contiguous, channels_last = measure_convolution_layouts(joint, feed)
            copying = 2 * copies * write
            on = channels_last + copying < contiguous
            progress(f"{name}: convolutions {contiguous * 1e3:.2f} ms contiguous, {channels_last * 1e3:.2f} ms "
                     f"channels-last, copies {copying * 1e3:.2f} ms: layout optimization {'on' if on else 'off'}",
                     0, None, "")
            if not on:
                return None
        progress(f"{name}: measuring workspace channels-last", 0, None, "")
        return copies, measure_workspace(analysis, joint, feed, channels_last=True).per_op

    def _solve(self, name: str, problem: Problem, layout: tuple[int, dict[str, int]] | None,
               progress: Progress) -> tuple[ScheduleFile, Problem]:
        """The region's schedule and the problem it solves. Where the region runs its convolutions
        channels-last (see `_layout`), `layout` is (the bytes of the copies Inductor makes,
        graph.channels_last_copies; each op's workspace measured channels-last), else None. Its
        layout optimization then stays on, with the copies held for the whole step and the ops'
        channels-last workspace (MobileNetV2's depthwise convolution backward at 8x96x64x64 allocated
        12.0 MiB, its gradient, channels-last and 27.0 MiB contiguous); where the solve finds no
        schedule within the budget so, it is turned off and the problem is as profiled (a percentage
        budget is then of the region's peak without the copies)."""
        def solve(p: Problem) -> ScheduleFile:
            return solve_traced(p, self.budget, name, self.settings,
                                progress=lambda stage, *state: progress(f"{name}: {stage}", *state))

        if layout is not None:
            copies, workspace = layout
            laid_out = dataclasses.replace(with_workspace(problem, workspace), held=problem.held + copies,
                                           meta=dict(problem.meta, layout_optimization=True))
            try:
                return solve(laid_out), laid_out
            except (InfeasibleBudgetError, SolverFailedError):
                warnings.warn(
                    f"{name}: monet found no schedule within the budget {self.budget!r} with the channels-last "
                    f"copies of convolution inputs that Inductor's layout optimization makes ({format_bytes(copies)}) "
                    "held; it solves the region with that optimization off (no copies; convolutions in PyTorch's "
                    "layout, slower on CPU)", stacklevel=2)
        return solve(problem), problem

    def _progress(self):
        """The progress callback for one region's work, as `progress` asks: shown on stderr (True), none
        (False), or the caller's own."""
        if callable(self.progress):
            return contextlib.nullcontext(self.progress)
        if self.progress:
            from rich.console import Console

            return progress_display(Console(stderr=True))
        return contextlib.nullcontext(lambda *_: None)


def _real(x):
    """A region input to profile with: `x`, or where torch.compile passed a fake tensor (DDP's bucket
    split compiles its regions on fake inputs), a real one of its shape, strides and dtype: random
    floating-point values, zeros otherwise (valid as indices)."""
    if not isinstance(x, FakeTensor):
        return x
    with unset_fake_temporarily():
        real = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        return real.normal_() if real.is_floating_point() else real.zero_()


def _batch_spec(inputs: tuple, static: set[int]) -> InputSpec:
    """The region's largest input that is not a parameter or buffer (the batch), for its schedule file:
    the file's graph fingerprint covers every input's shape and dtype."""
    batch = [x for i, x in enumerate(inputs) if i not in static and x.dim() > 0] or [x for x in inputs if x.dim() > 0]
    if not batch:
        raise ValueError("this torch.compile region has no tensor input with a shape; monet's backend schedules "
                         "regions that take a batch")
    x = max(batch, key=lambda t: t.numel())
    return tensor_spec(x)


def backend(budget: str | int | float, settings: SolveSettings | None = None, *, cost_model: str = "measured",
            schedules: str | os.PathLike | None = None, progress: Progress | bool = True, layout: str = "priced",
            **changes) -> Backend:
    """A torch.compile backend that trains the model by monet schedules:
    `torch.compile(model, backend=monet.backend("50%"))`.

    `budget` is what `monet.solve` takes (bytes, '4GiB', '50%', 'least'), applied to every compiled region
    on its own: a percentage of that region's unconstrained peak, bytes, or the least peak the search
    finds for the region (its fusions counted, so it can differ from the least of `monet.solve`). A
    model without graph breaks is one region, and the budget is the step's; with graph breaks, a warning
    says that the regions' peaks add up (it counts the regions this backend compiled: use one backend
    per model).
    `settings` and the keyword `changes` are the solve settings (`time_limit`, `implementations`,
    `options`, ...; see SolveSettings), `cost_model` how op times are known ("measured" here, on the
    region's real inputs, or "analytic"); reruns of pointwise ops (and, on CPU, batch norm reruns from
    saved statistics) are priced as fused (no time). `layout`: whether Inductor's layout optimization
    (convolutions channels-last, their inputs copied so) runs: "priced" (the default) where Inductor
    would run it and the region's convolutions, timed here both ways whatever the cost model, save more
    than the copies cost; "inductor" wherever Inductor would; "off" never. At 'least' it is off.
    Options that Inductor cannot run (dropout replayed from the generator state) are left out of the
    solve. Each region's backward runs its large parameter gradients last where that lowers the peak
    (solver.order), as Inductor's own reordering does. `schedules`, a directory, keeps each region's
    schedule file, named after the region's graph fingerprint; a region whose file is there, solved at
    the same budget, reuses it without
    profiling or solving (with 'least', a file solved at 'least'). `progress`: True shows each region's
    profiling and solving on stderr, False nothing, or a callback progress(stage, done, total, detail).
    Shapes must be static (`dynamic=False`): a schedule is solved for one shape, and where torch.compile
    compiles a region again for new input shapes, a warning says so and the region is solved again.
    Peaks are predicted per ATen op, not per Inductor buffer; the backward is compiled in pieces cut
    where recomputations begin (graph.pieces), so that Inductor's fusion keeps the schedule's frees, and
    the compiled step can still measure a few % over the prediction (docs/guides/torch-compile.md).
    """
    return Backend(budget, settings_of(settings, **changes), cost_model=cost_model, schedules=schedules,
                   progress=progress, layout=layout)
