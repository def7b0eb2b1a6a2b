"""Op times beyond measuring each op: analytic ones, and what fusion makes of reruns.

Analytic times are deterministic, for schedules that must be reproducible (tests, precomputed
schedules): an op's time is the roofline estimate max(flops / FLOP_RATE, bytes / BANDWIDTH)
plus a fixed launch overhead. Under Inductor, a pointwise op that the backward recomputes fuses
into the kernel that reads its output (where no matmul or convolution reads it), so its rerun costs
no time of its own, and a tensor that only
fused kernels read in the forward is written to memory only if it is saved, so saving it costs that
write (fused_reruns). A parameter gradient summed from contributions is written into one of them
(summed_in_place).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch._guards import detect_fake_mode
from torch.utils.flop_counter import FlopCounterMode

from monet.solver import Problem

from .analyze import GraphAnalysis, input_values
from .cudnn_batch_norm import NATIVE_FORWARD
from .profile import median_time

FLOP_RATE = 1e12  # FLOP/s
BANDWIDTH = 1e11  # bytes/s
LAUNCH = 5e-6  # s per op


def analytic_times(analysis: GraphAnalysis, gm: torch.fx.GraphModule) -> dict[str, float]:
    """Roofline seconds of every op in `analysis.problem`, keyed by op name."""
    problem = analysis.problem
    nodes = {n.name: n for n in gm.graph.nodes}
    fake_mode = detect_fake_mode(input_values(gm))
    costs = {}
    for op in problem.ops:
        node = nodes[op.name]
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        with fake_mode, FlopCounterMode(display=False) as counter:
            node.target(*args, **kwargs)
        moved = sum(problem.tensors[t].bytes for t in (*op.inputs, *op.outputs))
        costs[op.name] = max(counter.get_total_flops() / FLOP_RATE, moved / BANDWIDTH) + LAUNCH
    return costs


def write_time(device: torch.device, cost_model: str) -> float:
    """Seconds per byte that writing a tensor to memory takes: 1 / BANDWIDTH for the analytic cost
    model, else measured (the median of filling a 64 MiB buffer)."""
    if cost_model == "analytic":
        return 1 / BANDWIDTH
    buffer = torch.empty(1 << 24, device=device)
    seconds, _ = median_time(lambda: buffer.fill_(1.0), device, repeats=5, warmup=2)
    return seconds / (buffer.numel() * buffer.element_size())


def fused_reruns(problem: Problem, gm: torch.fx.GraphModule, options: dict[str, tuple[str, ...]] | None = None,
                 write: float = 0.0) -> Problem:
    """`problem` (of the joint graph `gm`) with the reruns of its pointwise forward ops priced at no
    time, as Inductor runs them: fused into the kernel that reads their output, which reads their
    inputs instead (Inductor's own partitioner recomputes such ops for the same reason). Their
    outputs still count as buffers of their own. Only where every op that reads their output can take
    it so (_fuses_its_inputs): a rerun that a matmul or a convolution reads is written to memory first,
    a kernel of its own, and keeps its price. Reruns an option prices itself keep that price,
    except under the `options` ({choice: options}, implementations.inductor_fused) whose reruns
    Inductor runs as pointwise kernels too (a batch norm rerun from its saved statistics).

    Saving costs `write` seconds per byte where the forward writes a tensor only to save it: one that
    a pointwise op or a training batch norm (which Inductor decomposes into reductions and pointwise
    ops) makes and that only pointwise ops read in the forward, so that Inductor fuses it into its
    readers' kernels unless it is saved (Tensor.keep_time)."""
    targets = {n.name: n.target for n in gm.graph.nodes}
    pointwise = {name for name, target in targets.items() if _pointwise(target)}
    options = options or {}

    def fused_into_readers(op) -> bool:  # (readers not in `gm` are monet's kernels: pointwise ops and sums)
        names = {problem.ops[r].name for t in op.outputs for r in problem.readers[t]}
        return all(_fuses_its_inputs(targets[name]) for name in names if name in targets)

    def fused_away(t) -> bool:
        if t.role != "activation" or t.producer is None:
            return False
        producer = problem.ops[t.producer]
        readers = [problem.ops[r] for r in problem.readers[t.id] if problem.ops[r].phase == "forward"]
        return ((producer.name in pointwise or targets.get(producer.name) == NATIVE_FORWARD)
                and all(r.name in pointwise for r in readers))

    def free(impl):
        return replace(impl, rerun_time=0.0) if impl.rerun_time is None else impl

    def priced(op):
        if op.phase != "forward" or not fused_into_readers(op):
            return op
        if op.name in pointwise:
            return replace(op, pytorch=free(op.pytorch), others=tuple(map(free, op.others)))
        fused = options.get(op.choice, ())
        if not fused:
            return op
        names = problem.choice_named[op.choice].options
        return replace(op, others=tuple(replace(impl, rerun_time=0.0) if names[i + 1] in fused else impl
                                        for i, impl in enumerate(op.others)))

    tensors = tuple(replace(t, keep_time=t.bytes * write) if write and fused_away(t) else t for t in problem.tensors)
    return replace(problem, tensors=tensors, ops=tuple(map(priced, problem.ops)))


def summed_in_place(problem: Problem, gm: torch.fx.GraphModule) -> Problem:
    """`problem` (of the joint graph `gm`) with each parameter gradient that a backward pointwise op
    sums from contributions (a weight used twice: GPT-2's embedding, tied to its LM head) made in the
    storage of a contribution of its size that the sum reads last, as Inductor makes it: it writes a
    pointwise kernel's result into an input buffer that dies there (across a cut, one donated to the
    piece: graph.pieces). Counted as a buffer of its own, that sum put GPT-2's predicted peak (2x128,
    keeping everything) 12.9 % over the measurement. Only there: Inductor writes other pointwise
    results into dying inputs too, where it does not fuse them away, which the problem's ATen ops do
    not show (unmeasured)."""
    targets = {n.name: n.target for n in gm.graph.nodes}
    readers = problem.readers

    def summed(op) -> bool:
        return (op.phase == "backward" and op.choice is None and len(op.outputs) == 1
                and problem.tensors[op.outputs[0]].role == "grad" and _pointwise(targets.get(op.name)))

    def overwritten(op) -> int | None:
        size = problem.out_bytes(op)
        return next((t for t in op.inputs if problem.tensors[t].role == "temp" and problem.tensors[t].bytes == size
                     and readers[t][-1] == op.id), None)

    ops = [replace(op, pytorch=replace(op.pytorch, overwrites=t))
           if summed(op) and (t := overwritten(op)) is not None else op for op in problem.ops]
    return replace(problem, ops=tuple(ops))


def _pointwise(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags


def _fuses_its_inputs(target) -> bool:
    """Whether Inductor computes an op's inputs inside the op's own kernels where they are pointwise: so
    it does for pointwise ops, reductions and the ops it decomposes into them (those without a lowering
    of their own: the backwards of norms, activations, dropout, softmax); not for matmuls, convolutions
    and the other ops it lowers to kernels that read their inputs from memory."""
    from torch._inductor.lowering import lowerings

    if not isinstance(target, torch._ops.OpOverload):
        return False
    return bool({torch.Tag.pointwise, torch.Tag.reduction} & set(target.tags)) or target not in lowerings


def channels_last_copies(gm: torch.fx.GraphModule) -> int:
    """Bytes of the channels-last copies that Inductor's layout optimization makes of the 4-D graph inputs
    (convolution weights, the batch) that the forward's convolutions read, where Inductor optimizes
    the layout of `gm` (a joint graph; on CPU, any graph with a convolution): the compiled forward makes
    them at its start and returns them for the backward, so they are counted for the whole step, an
    upper bound where the backward frees them early. A tensor already channels-last needs no copy."""
    from torch._inductor import config
    from torch._inductor.graph import GraphLowering

    with config.patch(layout_optimization=True):
        if not GraphLowering.decide_layout_opt(gm, is_inference=False):
            return 0
    copied = {}
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.convolution.default):
        for arg in node.args[:2]:
            value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) and arg.op == "placeholder" else None
            if (isinstance(value, torch.Tensor) and value.dim() == 4
                    and not value.is_contiguous(memory_format=torch.channels_last)):
                copied[arg.name] = value.numel() * value.element_size()
    return sum(copied.values())


def with_workspace(problem: Problem, per_op: dict[str, int]) -> Problem:
    """`problem` with the workspace of each op that `per_op` names, run PyTorch's way, set to its bytes there."""
    return replace(problem, ops=tuple(replace(op, pytorch=replace(op.pytorch, workspace=per_op[op.name]))
                                      if op.name in per_op else op for op in problem.ops))
