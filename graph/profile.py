"""Measure the ops of a joint graph on this machine: time and workspace.

The graph runs node by node on real tensors (a Feed: the model's parameters, a
batch, random tangents), freeing each value after its last use as the runtime would.
Workspace is what an op allocates beyond its outputs while it runs: on CPU from
the allocator's events (torch.profiler with profile_memory), on CUDA from the
caching allocator's peak, both read by graph.peak.DevicePeak (the meter PeakMemory
uses); on CUDA also what libraries keep once an op has run (cuBLAS workspaces), with
the backward's ops run on autograd's thread as in training. Time is the median of
repeated runs after warm-up.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import statistics
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch
from torch._functorch._aot_autograd import descriptors as d

from monet.solver import Problem

from .analyze import GraphAnalysis, allocation_bytes
from .peak import DevicePeak

OP_MARK = "monet.op:"


@dataclass(frozen=True)
class Feed:
    """Real values for a joint graph's inputs: `module`'s parameters and buffers (by name) and the
    user inputs by position (a traced model's batch, or the tensors torch.compile passes a region)."""

    module: torch.nn.Module
    inputs: tuple  # tensors and constants, as AOTAutograd numbers a graph's user inputs

    @property
    def device(self) -> torch.device:
        for tensor in (*self.inputs, *self.module.parameters(), *self.module.buffers()):
            if isinstance(tensor, torch.Tensor):
                return tensor.device
        return torch.device("cpu")

    def values(self, gm: torch.fx.GraphModule, seed: int, *, channels_last: bool = False) -> dict[str, torch.Tensor]:
        """A value for each placeholder of `gm` (the joint graph is functional: nothing is written);
        tangents are random. `channels_last`: the 4-D parameters and inputs in that layout, as Inductor's
        layout optimization copies them (graph.channels_last_copies), so that the graph's convolutions
        run channels-last."""
        gen = torch.Generator().manual_seed(seed)
        values = {}
        for node in gm.graph.find_nodes(op="placeholder"):
            desc, val = node.meta.get("desc"), node.meta.get("val")
            if isinstance(desc, d.ParamAOTInput):
                values[node.name] = self.module.get_parameter(desc.target).detach()
            elif isinstance(desc, d.BufferAOTInput):
                values[node.name] = self.module.get_buffer(desc.target).detach()
            elif isinstance(desc, d.PlainAOTInput):  # a user input: a tensor, or a constant the graph bakes in
                value = self.inputs[desc.idx]
                values[node.name] = value.detach() if isinstance(value, torch.Tensor) else value
            else:
                values[node.name] = torch.randn(val.shape, generator=gen, dtype=val.dtype).to(val.device)
            value = values[node.name]
            if channels_last and isinstance(desc, (d.ParamAOTInput, d.PlainAOTInput)) and isinstance(
                    value, torch.Tensor) and value.dim() == 4:
                values[node.name] = value.contiguous(memory_format=torch.channels_last)
        return values


def _last_uses(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, list[str]]:
    last: dict[str, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        for arg in node.all_input_nodes:
            last[arg.name] = node
    out: dict[torch.fx.Node, list[str]] = {}
    for name, node in last.items():
        out.setdefault(node, []).append(name)
    return out


def _walk(gm, values, on_op: Callable[[torch.fx.Node, Callable[[], object]], object],
          after: Callable[[torch.fx.Node, tuple, object], None] | None = None, *,
          backward: Collection[str] = (), device: torch.device | None = None):
    """Run the graph in order, freeing after last use; `on_op` runs each compute node, and
    `after(node, args, value)` sees its real arguments and result. From the first node named in
    `backward` on, the nodes run on autograd's thread for `device`, where a training step's backward runs."""
    env = dict(values)
    frees = _last_uses(gm)
    nodes = list(gm.graph.nodes)

    def run(part):
        for node in part:
            if node.op == "get_attr":  # a tensor constant (see monet.graph.capture)
                env[node.name] = operator.attrgetter(node.target)(gm)
            elif node.op == "call_function":
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n.name])
                env[node.name] = on_op(node, functools.partial(node.target, *args, **kwargs))
                if after:
                    after(node, args, env[node.name])
            for name in frees.get(node, ()):
                if node.op != "output":
                    env.pop(name, None)

    cut = next((i for i, node in enumerate(nodes) if node.name in backward), len(nodes))
    run(nodes[:cut])
    if cut < len(nodes):
        on_autograd_thread(lambda: run(nodes[cut:]), device)


class _OnAutogradThread(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fn):
        ctx.fn = fn
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.fn()
        return grad, None


def on_autograd_thread(fn: Callable[[], None], device: torch.device) -> None:
    """Call `fn` where autograd runs the backward of `device`'s tensors (CUDA: the device's own thread,
    whose cuBLAS handle has workspaces of its own), and return when it has run."""
    x = torch.zeros((), device=device, requires_grad=True)
    with torch.enable_grad():
        _OnAutogradThread.apply(x, fn).backward()


def run_graph(gm: torch.fx.GraphModule, feed: Feed, after: Callable[[torch.fx.Node, tuple, object], None], *,
              seed: int = 0) -> None:
    """Run the joint graph on `feed`'s tensors; `after(node, args, value)` follows every compute node."""
    with torch.no_grad():
        _walk(gm, feed.values(gm, seed), lambda node, call: call(), after)


def measure_call(call: Callable[[], object], device: torch.device, *, repeats: int = 3,
                 warmup: int = 1) -> tuple[float, int, object]:
    """(median seconds, workspace bytes, result) of `call`; workspace as for graph ops."""
    with DevicePeak(device) as meter:
        result = call()
    seconds, _ = median_time(call, device, repeats, warmup)
    return seconds, max(0, meter.rise - meter.made), result


def median_time(call: Callable[[], object], device: torch.device, repeats: int,
                warmup: int) -> tuple[float, object]:
    """(median seconds over `repeats` runs after `warmup`, the last run's result) of `call`."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        out = call()
        _sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), out


def measure_times(analysis: GraphAnalysis, gm: torch.fx.GraphModule, feed: Feed, *, repeats: int = 3,
                  warmup: int = 1, seed: int = 0,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """Median seconds of every op in `analysis.problem` over `repeats` runs after `warmup`."""
    ops = {op.name for op in analysis.problem.ops}
    device = feed.device
    times: dict[str, float] = {}

    def timed(node, call):
        if node.name not in ops:
            return call()
        times[node.name], out = median_time(call, device, repeats, warmup)
        if progress:
            progress(len(times), len(ops))
        return out

    with torch.no_grad():
        _walk(gm, feed.values(gm, seed), timed)
    return times


CONVOLUTIONS = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)


def measure_convolution_layouts(gm: torch.fx.GraphModule, feed: Feed, *, repeats: int = 3, warmup: int = 1,
                                seed: int = 0) -> tuple[float, float]:
    """Seconds that the convolutions of `gm` (forward and backward) take with their 4-D operands in
    PyTorch's contiguous layout and channels-last, as Inductor's layout optimization runs them: each
    convolution timed both ways on the same values, the runs alternating so that the machine's drift
    falls on both (medians of `repeats` after `warmup`, summed over the graph's convolutions)."""
    def channels_last(x):
        return x.contiguous(memory_format=torch.channels_last) if isinstance(x, torch.Tensor) and x.dim() == 4 else x

    device, total = feed.device, [0.0, 0.0]

    def timed(node, call):
        if node.target not in CONVOLUTIONS:
            return call()
        laid_out = functools.partial(node.target, *map(channels_last, call.args), **call.keywords)
        for _ in range(warmup):
            call(), laid_out()
        samples = [median_time(run, device, 1, 0)[0] for _ in range(repeats) for run in (call, laid_out)]
        total[0] += statistics.median(samples[0::2])
        total[1] += statistics.median(samples[1::2])
        return call()

    with torch.no_grad():
        _walk(gm, feed.values(gm, seed), timed)
    return total[0], total[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Workspace:
    """What ops allocate beyond their outputs: `per_op`, bytes while each op runs, and `held`, bytes
    libraries keep from an op's first call on (CUDA: cuBLAS and cuBLASLt allocate a workspace for each
    thread and stream that runs a matrix product, and keep it; the forward runs on the caller's thread
    and the backward on autograd's, so a step with matrix products holds two or more)."""

    per_op: dict[str, int]
    held: int = 0
    # outputs whose storage is larger than their shape (tensor name -> bytes), measured on CPU: PyTorch's
    # CPU mse_loss returns its 0-dim loss in the buffer of the elementwise losses, which lives as long as it
    stored: dict[str, int] = field(default_factory=dict)


def measure_workspace(analysis: GraphAnalysis, gm: torch.fx.GraphModule, feed: Feed, *,
                      seed: int = 0, channels_last: bool = False) -> Workspace:
    """Bytes each op of `analysis.problem` allocates beyond its outputs while it runs, and what the
    libraries hold after the step (see Workspace); `channels_last` as in Feed.values, with the graph's
    views run as reshapes (see _views_reshaped)."""
    values = feed.values(gm, seed, channels_last=channels_last)
    with torch.no_grad(), _views_reshaped(gm) if channels_last else contextlib.nullcontext():
        if feed.device.type == "cuda":
            return _workspace_cuda(analysis.problem, gm, values, feed.device)
        return _workspace_cpu(analysis.problem, gm, values, feed.device)


@contextlib.contextmanager
def _views_reshaped(gm: torch.fx.GraphModule):
    """`gm`'s views run as reshapes inside: the graph was traced on contiguous tensors, and a view of a
    channels-last one (VGG-16's flattened feature map) may need a copy, which Inductor's lowering makes
    and eager's view refuses; the copy is then measured as that op's workspace."""
    views = [(node, node.target) for node in gm.graph.nodes
             if node.target in (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)]
    for node, _ in views:
        node.target = torch.ops.aten.reshape.default
    try:
        yield
    finally:
        for node, target in views:
            node.target = target


def _workspace_cuda(problem: Problem, gm, values: dict, device) -> Workspace:
    """Each op's allocator peak over what it leaves allocated, forward ops on this thread and backward ops
    on autograd's; `held`: what stays allocated after the whole walk, with the matrix-product workspaces
    released before it (and the backward thread's made for both kinds of product, as a rerun of a forward
    product there would make them)."""
    ops = {op.name for op in problem.ops}
    result: dict[str, int] = {}

    def on_op(node, call):
        if node.name not in ops:
            return call()
        with DevicePeak(device) as meter:
            out = call()
        result[node.name] = max(0, meter.rise - meter.made)
        return out

    _release_blas_workspaces(device)
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    _walk(gm, values, on_op, backward={op.name for op in problem.backward_ops}, device=device)
    if torch.cuda.memory_allocated(device) > start:  # the step runs matrix products
        on_autograd_thread(lambda: _products(device), device)
    torch.cuda.synchronize(device)
    return Workspace(result, torch.cuda.memory_allocated(device) - start)


def _products(device: torch.device) -> None:
    """One matrix product of each kind cuBLAS runs (plain; with a bias, cuBLASLt's), which makes this
    thread's workspaces for them."""
    a = torch.ones(8, 8, device=device)
    torch.mm(a, a)
    torch.addmm(a[0], a, a)


def _release_blas_workspaces(device: torch.device) -> None:
    """Release the matrix-product workspaces of this thread and autograd's (their maps are global in some
    PyTorch versions and per thread in others), so that the next walk makes, and measures, them again."""
    release = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if release is not None:
        release()
        on_autograd_thread(release, device)


def _workspace_cpu(problem: Problem, gm, values: dict, device) -> Workspace:
    ops = {op.name: op for op in problem.ops}
    tensors = {t.name: t for t in problem.tensors}
    stored: dict[str, int] = {}
    result: dict[str, int] = {}

    def marked(node, call):
        if node.name not in ops:
            return call()
        with torch.profiler.record_function(OP_MARK + node.name):
            return call()

    def after(node, args, value):
        if node.name in ops and node.name in tensors and isinstance(value, torch.Tensor):
            held = allocation_bytes(value.untyped_storage().nbytes(), "cpu")
            read = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            if held > tensors[node.name].bytes and value.untyped_storage().data_ptr() not in read:
                stored[node.name] = held

    with DevicePeak(device) as meter:
        _walk(gm, values, marked, after)
    new_bytes = {op.name: sum(stored.get(problem.tensors[t].name, problem.tensors[t].bytes) for t in op.outputs)
                 for op in problem.ops}
    for name, deltas in meter.events.by_region(OP_MARK).items():
        peak, running = 0, 0
        for delta in deltas:
            running += allocation_bytes(delta, "cpu") if delta > 0 else delta
            peak = max(peak, running)
        result[name] = max(0, peak - new_bytes[name])
    return Workspace({name: result.get(name, 0) for name in ops}, stored=stored)
