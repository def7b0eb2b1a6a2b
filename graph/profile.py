"""Measure the ops of a joint graph on this machine: time and workspace.

The graph runs node by node on real tensors (a Feed: the model's parameters, a
batch, random tangents), freeing each value after its last use as the runtime would.
Workspace is what an op allocates beyond its outputs while it runs: on CPU from
the allocator's events (torch.profiler with profile_memory), on CUDA from the
caching allocator's peak, both read by graph.peak.DevicePeak (the meter PeakMemory
uses). Time is the median of repeated runs after warm-up.
"""

from __future__ import annotations

import functools
import operator
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

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

    def values(self, gm: torch.fx.GraphModule, seed: int) -> dict[str, torch.Tensor]:
        """A value for each placeholder of `gm` (the joint graph is functional: nothing is written);
        tangents are random."""
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
          after: Callable[[torch.fx.Node, tuple, object], None] | None = None):
    """Run the graph in order, freeing after last use; `on_op` runs each compute node, and
    `after(node, args, value)` sees its real arguments and result."""
    env = dict(values)
    frees = _last_uses(gm)
    for node in gm.graph.nodes:
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
    seconds, _ = _median_time(call, device, repeats, warmup)
    return seconds, max(0, meter.rise - meter.made), result


def _median_time(call: Callable[[], object], device: torch.device, repeats: int,
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
        times[node.name], out = _median_time(call, device, repeats, warmup)
        if progress:
            progress(len(times), len(ops))
        return out

    with torch.no_grad():
        _walk(gm, feed.values(gm, seed), timed)
    return times


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_workspace(analysis: GraphAnalysis, gm: torch.fx.GraphModule, feed: Feed, *,
                      seed: int = 0) -> dict[str, int]:
    """Bytes each op of `analysis.problem` allocates beyond its outputs while it runs."""
    with torch.no_grad():
        return _workspace(analysis.problem, gm, feed, seed, feed.device)


def _workspace(problem: Problem, gm, feed: Feed, seed, device) -> dict[str, int]:
    ops = {op.name: op for op in problem.ops}
    new_bytes = {op.name: problem.out_bytes(op) for op in problem.ops}
    result: dict[str, int] = {}
    if device.type == "cuda":
        def on_op(node, call):
            if node.name not in ops:
                return call()
            with DevicePeak(device) as meter:
                out = call()
            result[node.name] = max(0, meter.rise - new_bytes[node.name])
            return out

        _walk(gm, feed.values(gm, seed), on_op)
        return result

    def marked(node, call):
        if node.name not in ops:
            return call()
        with torch.profiler.record_function(OP_MARK + node.name):
            return call()

    with DevicePeak(device) as meter:
        _walk(gm, feed.values(gm, seed), marked)
    for name, deltas in meter.events.by_region(OP_MARK).items():
        peak, running = 0, 0
        for delta in deltas:
            running += allocation_bytes(delta, "cpu") if delta > 0 else delta
            peak = max(peak, running)
        result[name] = max(0, peak - new_bytes[name])
    return {name: result.get(name, 0) for name in ops}
