"""How ops can run: families of alternative implementations, found in the joint graph.

A site is one place a family applies: a ReLU and its backward, a max-pool and its
backward, a dropout and its backward, a GELU and its backward, one convolution.
For each site the family names a choice and its options (the first is PyTorch's
own), measures what the other options add or change on real tensors, describes
that to the solver (a ChoiceSpec), and rewrites the joint graph when a schedule
picks another option. Options that fail to run on this machine are left out, and so are
exact options whose kernels do not give PyTorch's result bit for bit on the profiling run.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import fx
from torch._guards import detect_fake_mode

from monet.solver import Problem
from monet.solver.edit import Alternative, ChoiceSpec, NewOp, NewTensor, add_choices

from . import kernels
from .analyze import GraphAnalysis, allocation_bytes
from .cost_model import BANDWIDTH, LAUNCH
from .profile import measure_call, run_graph

aten = torch.ops.aten
RERUN = "monet_rerun"  # node meta: (kernel, extra args) that a rerun of the node runs instead


@dataclass(frozen=True)
class Site:
    family: str
    choice: str
    nodes: tuple[str, ...]  # graph nodes: the forward node (new ops follow it), then the backward node
    tensors: tuple[str, ...]  # problem tensors the backward node reads under PyTorch's option
    params: tuple = ()  # constants the kernels need


@dataclass
class _Measured:
    """What an option's kernels cost: the new forward op, the alternative backward op."""

    new: tuple[float, int] | None = None
    alt: tuple[float, int] = (0.0, 0)
    out: NewTensor | None = None
    error: float | None = None  # an approximate option's relative error against PyTorch's backward


def _tensor(analysis: GraphAnalysis, node) -> str | None:
    """The problem tensor a graph value holds (through views), if exactly one."""
    refs = analysis.node_tensors.get(node.name, ()) if isinstance(node, fx.Node) else ()
    return analysis.problem.tensors[refs[0]].name if len(refs) == 1 else None


def _producer(analysis: GraphAnalysis, tensor: str | None):
    if tensor is None:
        return None
    t = analysis.problem.tensor_named(tensor)
    return None if t.producer is None else analysis.problem.ops[t.producer]


def _relative_error(got, reference) -> float:
    """Largest relative (Frobenius) difference of a result, or of each tensor in a tuple of them."""
    pairs = zip(got, reference) if isinstance(got, (tuple, list)) else [(got, reference)]
    return max(((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in pairs if a is not None)


class NotExact(RuntimeError):
    """An exact option's kernels did not give PyTorch's result bit for bit on the profiling run;
    the option is left out."""


def _check_exact(got, reference, what: str) -> None:
    """Raise NotExact unless `got` is `reference` bit for bit (NaN where it has NaN): an exact
    option must give the same numbers as PyTorch in every dtype, not numbers close to them."""
    pairs = zip(got, reference) if isinstance(got, (tuple, list)) else [(got, reference)]
    for a, b in pairs:
        if a is None and b is None:
            continue
        if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype or not (
                torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all())):
            raise NotExact(f"{what} does not reproduce PyTorch's result bit for bit")


def _pair(value) -> tuple[int, int]:
    value = tuple(value)
    return value * 2 if len(value) == 1 else value


class _BackwardFromCompact:
    """A backward op that can read a compact form of one of its tensors instead, made in the
    forward right after the tensor by `pack_kernel`. Subclasses say where the tensor is among
    the backward op's arguments (`compact_arg`) and how to call the kernels."""

    name = ""
    options: tuple[str, ...] = ()
    approximate: tuple[str, ...] = ()
    backward_target = None
    compact_arg = 1
    pack_kernel = None
    backward_kernel = None

    def match(self, node: fx.Node, analysis: GraphAnalysis) -> Site | None:
        raise NotImplementedError

    def backward_args(self, site: Site, node_args: tuple, packed) -> tuple:
        return (node_args[0], packed, *site.params)

    def pack_args(self, site: Site, value) -> tuple:
        return (value,)

    def find(self, gm: fx.GraphModule, analysis: GraphAnalysis) -> list[Site]:
        return [site for node in gm.graph.nodes
                if node.op == "call_function" and node.target is self.backward_target
                for site in [self.match(node, analysis)] if site]

    def measure(self, site: Site, node: fx.Node, node_args: tuple, value, device: torch.device
                ) -> dict[str, _Measured]:
        """The options' costs, on the node's real arguments; `value` is what the node itself made."""
        pack, backward = type(self).pack_kernel, type(self).backward_kernel
        t_new, ws_new, packed = measure_call(lambda: pack(*self.pack_args(site, node_args[self.compact_arg])),
                                             device)
        t_alt, ws_alt, grad = measure_call(lambda: backward(*self.backward_args(site, node_args, packed)), device)
        out = NewTensor(f"{site.tensors[-1]}__{self.options[1]}",
                        allocation_bytes(packed.untyped_storage().nbytes(), device.type),
                        tuple(packed.shape), str(packed.dtype).removeprefix("torch."))
        error = None
        if self.options[1] in self.approximate:
            error = _relative_error(grad, value)
        else:
            _check_exact(grad, value, f"{self.name} option {self.options[1]!r}")
        return {self.options[1]: _Measured((t_new, ws_new), (t_alt, ws_alt), out, error)}

    def shapes(self, site: Site, node: fx.Node, fake_mode) -> dict[str, _Measured]:
        """The option's new tensor, sized on fake tensors; no costs."""
        value = fx.node.map_arg(node.args[self.compact_arg], lambda n: n.meta["val"])
        with fake_mode:
            packed = type(self).pack_kernel(*self.pack_args(site, value))
        device = packed.device.type
        out = NewTensor(f"{site.tensors[-1]}__{self.options[1]}", allocation_bytes(packed.untyped_storage().nbytes(),
                        device), tuple(packed.shape), str(packed.dtype).removeprefix("torch."))
        return {self.options[1]: _Measured((0.0, 0), (0.0, 0), out)}

    def spec(self, site: Site, problem: Problem, measured: dict[str, _Measured]) -> ChoiceSpec:
        m = measured[self.options[1]]
        source = problem.tensor_named(site.tensors[-1])
        new_op = NewOp(m.out.name, f"monet.{type(self).pack_kernel.__name__}", problem.ops[source.producer].name,
                       (source.name,), (m.out,), ((0.0, 0, False), (*m.new, True)))
        backward = problem.op_named(site.nodes[1])
        alternative = Alternative(site.nodes[1], (
            (tuple(problem.tensors[t].name for t in backward.inputs), backward.time, backward.workspace),
            ((site.tensors[0], m.out.name), *m.alt)))
        errors = tuple(m.error for _ in self.approximate) if m.error is not None else ()
        return ChoiceSpec(site.choice, self.options, self.approximate, errors, (new_op,), (alternative,))

    def rewrite(self, graph: fx.Graph, nodes: dict[str, fx.Node], site: Site, option: str) -> list[fx.Node]:
        """Pack right after the node that holds the tensor (in the forward), read the pack in the backward."""
        source = nodes[site.tensors[-1]]
        with graph.inserting_after(source):
            packed = graph.create_node("call_function", type(self).pack_kernel, self.pack_args(site, source),
                                       name=f"{site.tensors[-1]}__{option}")
        backward = nodes[site.nodes[1]]
        backward.target = type(self).backward_kernel
        backward.args = self.backward_args(site, backward.args, packed)
        backward.kwargs = {}
        return [packed]


class ReluMask(_BackwardFromCompact):
    """ReLU's backward from its output (PyTorch), or from a 1-bit mask packed 8 per byte."""

    name, options = "relu", ("output", "mask")
    backward_target = aten.threshold_backward.default
    pack_kernel, backward_kernel = kernels.relu_mask, kernels.relu_backward_from_mask

    def match(self, node, analysis):
        grad, out, threshold = node.args
        op = _producer(analysis, _tensor(analysis, out))
        if threshold != 0 or op is None or op.target != "aten.relu.default" or not _tensor(analysis, grad):
            return None
        return Site(self.name, f"{op.name}:backward", (op.name, node.name),
                    (_tensor(analysis, grad), _tensor(analysis, out)))


class DropoutMask(_BackwardFromCompact):
    """Dropout's backward from its bool mask (PyTorch, a byte per element), from the mask packed
    8 per byte, or from the mask drawn again from the generator state saved before the dropout
    (`replay`: nothing of the mask is kept; the backward redraws it, exactly). Under `replay` the
    dropout itself may also rerun from that state, so its output need not be kept either."""

    name, options = "dropout", ("bytes", "bits", "replay")
    backward_target = aten.native_dropout_backward.default
    pack_kernel, backward_kernel = kernels.dropout_mask, kernels.dropout_backward_from_mask

    def match(self, node, analysis):
        grad, mask, scale = node.args
        op = _producer(analysis, _tensor(analysis, mask))
        if op is None or op.target != "aten.native_dropout.default" or not _tensor(analysis, grad):
            return None
        source, p = mask.args[0].args[:2]
        if _producer(analysis, _tensor(analysis, source)) is None:
            return None
        return Site(self.name, f"{op.name}:mask", (op.name, node.name),
                    (_tensor(analysis, grad), _tensor(analysis, mask)), (scale, p))

    def backward_args(self, site, node_args, packed):
        return (node_args[0], packed, site.params[0])

    def _state(self, site: Site, device: torch.device) -> NewTensor:
        """The saved generator state: device memory only where the generator keeps it there."""
        state = kernels.rng_state(torch.empty(0, device=device))
        on_device = allocation_bytes(state.untyped_storage().nbytes(), device.type) if state.device == device else 0
        return NewTensor(f"{site.tensors[-1]}__{self.options[2]}", on_device, tuple(state.shape), "uint8")

    def measure(self, site, node, node_args, value, device):
        found = super().measure(site, node, node_args, value, device)
        grad = node_args[0]
        t_new, ws_new, state = measure_call(lambda: kernels.rng_state(grad), device)
        t_alt, ws_alt, _ = measure_call(lambda: kernels.dropout_backward_replay(grad, state, site.params[1]), device)
        return {**found, self.options[2]: _Measured((t_new, ws_new), (t_alt, ws_alt), self._state(site, device))}

    def shapes(self, site, node, fake_mode):
        state = self._state(site, node.meta["val"].device)
        return {**super().shapes(site, node, fake_mode), self.options[2]: _Measured((0.0, 0), (0.0, 0), state)}

    def spec(self, site, problem, measured):
        bits, replay = measured[self.options[1]], measured[self.options[2]]
        source = problem.tensor_named(site.tensors[-1])
        dropout = problem.ops[source.producer]
        before = problem.ops[problem.tensors[dropout.inputs[0]].producer]
        pack = NewOp(bits.out.name, f"monet.{kernels.dropout_mask.__name__}", dropout.name, (source.name,),
                     (bits.out,), ((0.0, 0, False), (*bits.new, True), (0.0, 0, False)))
        state = NewOp(replay.out.name, f"monet.{kernels.rng_state.__name__}", before.name,
                      (problem.tensors[dropout.inputs[0]].name,), (replay.out,),
                      ((0.0, 0, False), (0.0, 0, False), (*replay.new, True)))
        backward = problem.op_named(site.nodes[1])
        alternative = Alternative(site.nodes[1], (
            (tuple(problem.tensors[t].name for t in backward.inputs), backward.time, backward.workspace),
            ((site.tensors[0], bits.out.name), *bits.alt),
            ((site.tensors[0], replay.out.name), *replay.alt)))
        reads = tuple(problem.tensors[t].name for t in dropout.inputs)
        rerun = Alternative(dropout.name, ((reads, dropout.time, dropout.workspace),) * 2
                            + ((reads, dropout.time, dropout.workspace, None, (replay.out.name,), True),))
        return ChoiceSpec(site.choice, self.options, new_ops=(pack, state), alternatives=(alternative, rerun))

    def rewrite(self, graph, nodes, site, option):
        if option != self.options[2]:
            return super().rewrite(graph, nodes, site, option)
        dropout = nodes[site.nodes[0]]
        with graph.inserting_before(dropout):
            state = graph.create_node("call_function", kernels.rng_state, (dropout.args[0],),
                                      name=f"{site.tensors[-1]}__{option}")
        dropout.meta[RERUN] = (kernels.dropout_rerun, (state,))
        backward = nodes[site.nodes[1]]
        backward.target = kernels.dropout_backward_replay
        backward.args = (backward.args[0], state, site.params[1])
        backward.kwargs = {}
        return [state]


class PoolOffsets(_BackwardFromCompact):
    """Max-pool's backward from its input and int64 argmax indices (PyTorch), or from the
    argmax's offset inside its window, one byte per output element."""

    name, options = "max_pool", ("indices", "offsets")
    backward_target = aten.max_pool2d_with_indices_backward.default
    compact_arg = 7
    pack_kernel, backward_kernel = kernels.pool_offsets, kernels.pool_backward_from_offsets

    def match(self, node, analysis):
        grad, source, kernel, stride, padding, dilation, ceil_mode, indices = node.args
        op = _producer(analysis, _tensor(analysis, indices))
        kernel = _pair(kernel)
        if (op is None or op.target != "aten.max_pool2d_with_indices.default" or ceil_mode
                or any(d != 1 for d in dilation) or kernel[0] * kernel[1] > 256 or not _tensor(analysis, grad)):
            return None
        hw = tuple(source.meta["val"].shape[-2:])
        params = (hw, kernel, _pair(stride) if stride else kernel, _pair(padding))
        return Site(self.name, f"{op.name}:backward", (op.name, node.name),
                    (_tensor(analysis, grad), _tensor(analysis, indices)), params)

    def pack_args(self, site, value):
        return (value, *site.params)


class _ActivationCodes(_BackwardFromCompact):
    """A smooth activation's backward from its input (PyTorch), or, approximate and only when
    enabled, from a 2-bit code of the input's interval with the derivative piecewise constant."""

    options, approximate = ("exact", "2bit"), ("2bit",)
    pack_kernel, backward_kernel = kernels.activation_codes, kernels.backward_from_codes
    forward_target = ""
    levels: tuple[float, ...] = ()

    def exact_form(self, node: fx.Node) -> bool:
        return len(node.args) == 2

    def match(self, node, analysis):
        grad, source = node.args[:2]
        x = _tensor(analysis, source)
        if not self.exact_form(node) or not x:
            return None
        problem = analysis.problem
        forward = [problem.ops[r] for r in problem.readers[problem.tensor_named(x).id]
                   if problem.ops[r].target == self.forward_target]
        if not forward or not _tensor(analysis, grad):
            return None
        return Site(self.name, f"{forward[0].name}:backward", (forward[0].name, node.name),
                    (_tensor(analysis, grad), x), (self.levels,))


class GeluCodes(_ActivationCodes):
    """GELU (the exact erf form) from its input or from 2-bit codes."""

    name, forward_target, levels = "gelu", "aten.gelu.default", kernels.GELU_LEVELS
    backward_target = aten.gelu_backward.default

    def exact_form(self, node):
        return node.kwargs.get("approximate", "none") == "none" and len(node.args) == 2


class SiluCodes(_ActivationCodes):
    """SiLU (swish) from its input or from 2-bit codes."""

    name, forward_target, levels = "silu", "aten.silu.default", kernels.SILU_LEVELS
    backward_target = aten.silu_backward.default


class BatchNormFromOutput:
    """Training batch norm's backward from its input (PyTorch) or from its output, which the next
    op reads anyway, with the normalised input rebuilt from the output, weight and bias.

    The rebuild is exact to rounding for a fresh model, but (out - bias) cancels when |bias|
    outgrows |weight * normalised input|: after three momentum-SGD steps at lr 0.1 the bundled
    CNN's weights drifted 1.8e-3 from PyTorch's. So it counts as approximate (opt-in), with its
    error on the profiling batch reported."""

    name, options, approximate = "batch_norm", ("input", "output"), ("output",)
    _forward = aten._native_batch_norm_legit_functional.default

    def find(self, gm, analysis):
        return [site for node in gm.graph.nodes
                if node.op == "call_function" and node.target is aten.native_batch_norm_backward.default
                for site in [self.match(node, analysis)] if site]

    def match(self, node, analysis):
        grad, _, weight, _, _, mean, invstd, train = node.args[:8]
        forward = mean.args[0] if isinstance(mean, fx.Node) and mean.target is operator.getitem else None
        if not train or forward is None or forward.target is not self._forward:
            return None
        bias = forward.args[2]
        out = [user for user in forward.users if user.target is operator.getitem and user.args[1] == 0]
        names = [_tensor(analysis, n) for n in (grad, out[0] if out else None, weight, bias, mean, invstd)]
        op = _producer(analysis, names[4])
        if not isinstance(weight, fx.Node) or not isinstance(bias, fx.Node) or None in names or op is None:
            return None
        return Site(self.name, f"{op.name}:backward", (op.name, node.name), tuple(names))

    def measure(self, site, node, node_args, value, device):
        grad, x, weight, _, _, mean, invstd, _, eps, mask = node_args
        shape = (1, -1) + (1,) * (x.dim() - 2)
        out = (x - mean.view(shape)) * (invstd * weight).view(shape)  # the output under a zero bias
        bias = torch.zeros_like(weight)
        time, workspace, got = measure_call(
            lambda: kernels.batch_norm_backward_from_output(grad, out, weight, bias, mean, invstd, eps, mask), device)
        error = _relative_error(got, value)
        return {self.options[1]: _Measured(alt=(time, workspace), error=error)}

    def shapes(self, site, node, fake_mode):
        return {self.options[1]: _Measured()}

    def spec(self, site, problem, measured):
        op = problem.op_named(site.nodes[1])
        inputs = tuple(problem.tensors[t].name for t in op.inputs)
        alternative = Alternative(op.name, ((inputs, op.time, op.workspace),
                                            (site.tensors, *measured[self.options[1]].alt)))
        error = measured[self.options[1]].error
        return ChoiceSpec(site.choice, self.options, self.approximate, () if error is None else (error,),
                          alternatives=(alternative,))

    def rewrite(self, graph, nodes, site, option):
        node = nodes[site.nodes[1]]
        grad, out, weight, bias, mean, invstd = (nodes[name] for name in site.tensors)
        node.target = kernels.batch_norm_backward_from_output
        node.args = (grad, out, weight, bias, mean, invstd, *node.args[8:10])
        return []


class BatchNormRerun:
    """How a training batch norm reruns in the backward: as in the forward (PyTorch: batch
    statistics computed again) or from the statistics the forward saved (the normalisation
    alone). The second keeps those statistics saved (a few bytes per channel) and gives the
    forward's output bit for bit in every dtype (see kernels.batch_norm_from_stats); the reduction
    it skips is most of a batch norm's time on CPU."""

    name, options, approximate = "batch_norm_rerun", ("full", "stats"), ()
    _forward = aten._native_batch_norm_legit_functional.default

    def find(self, gm, analysis):
        return [site for node in gm.graph.nodes if node.op == "call_function" and node.target is self._forward
                for site in [self.match(node, analysis)] if site]

    def match(self, node, analysis):
        x, weight, bias, _, _, training = node.args[:6]
        stats = {user.args[1]: user for user in node.users if user.target is operator.getitem}
        names = [_tensor(analysis, n) for n in (x, stats.get(0), stats.get(1), stats.get(2))]
        op = _producer(analysis, names[1])
        if not training or not isinstance(weight, fx.Node) or not isinstance(bias, fx.Node) or None in names \
                or op is None or not op.recomputable:
            return None
        return Site(self.name, f"{node.name}:rerun", (node.name,), tuple(names))

    def measure(self, site, node, node_args, value, device):
        _, mean, invstd, _, _ = value

        def rerun():
            return kernels.batch_norm_from_stats(*node_args, mean, invstd)

        # first outside the measurement: the kernel is asked its roundings once, on small probes
        _check_exact(rerun()[0], value[0], "batch norm rerun from saved statistics")
        time, workspace, _ = measure_call(rerun, device)
        return {self.options[1]: _Measured(alt=(time, workspace))}

    def shapes(self, site, node, fake_mode):
        return {self.options[1]: _Measured()}

    def spec(self, site, problem, measured):
        op = problem.op_named(site.nodes[0])
        inputs = tuple(problem.tensors[t].name for t in op.inputs)
        time, workspace = measured[self.options[1]].alt
        alternative = Alternative(op.name, ((inputs, op.time, op.workspace),
                                            (inputs, op.time, max(op.workspace, workspace), time, site.tensors[2:])))
        return ChoiceSpec(site.choice, self.options, alternatives=(alternative,))

    def rewrite(self, graph, nodes, site, option):
        """The forward is unchanged; a rerun of this node runs the kernel on the saved statistics."""
        nodes[site.nodes[0]].meta[RERUN] = (kernels.batch_norm_from_stats,
                                            tuple(nodes[name] for name in site.tensors[2:]))
        return []


class ConvAlgorithm:
    """How a convolution (forward or backward) runs: on CPU oneDNN (PyTorch's pick) or PyTorch's own
    kernels; on CUDA cuDNN's default algorithm or the one cudnn.benchmark times fastest.

    Another algorithm sums in another order, and the difference can grow through a network: on the
    test CNN, PyTorch's native CPU path moved parameter gradients by up to 1 % against oneDNN's
    (each op alone agrees to 1e-6). So the other algorithm counts as approximate, is only chosen
    when approximate options are allowed, and reports the op's own relative difference."""

    name = "convolution"
    _targets = {aten.convolution.default: (kernels.convolution_native, kernels.convolution_benchmarked),
                aten.convolution_backward.default: (kernels.convolution_backward_native,
                                                     kernels.convolution_backward_benchmarked)}

    def __init__(self, device: torch.device):
        self.device = device
        self.options = ("cudnn", "cudnn-benchmark") if device.type == "cuda" else ("onednn", "native")
        self.approximate = self.options[1:]

    def find(self, gm, analysis):
        if self.device.type == "cpu" and not (torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()):
            return []
        return [Site(self.name, f"{node.name}:algorithm", (node.name,), ()) for node in gm.graph.nodes
                if node.op == "call_function" and node.target in self._targets]

    def _kernel(self, target):
        native, benchmarked = self._targets[target]
        return benchmarked if self.device.type == "cuda" else native

    def measure(self, site, node, node_args, value, device):
        time, workspace, got = measure_call(lambda: self._kernel(node.target)(*node_args), device)
        error = _relative_error(got, value)
        return {self.options[1]: _Measured(alt=(time, workspace), error=error)}

    def shapes(self, site, node, fake_mode):
        return {self.options[1]: _Measured()}

    def spec(self, site, problem, measured):
        op = problem.op_named(site.nodes[0])
        inputs = tuple(problem.tensors[t].name for t in op.inputs)
        alternative = Alternative(op.name, ((inputs, op.time, op.workspace), (inputs, *measured[self.options[1]].alt)))
        error = measured[self.options[1]].error
        return ChoiceSpec(site.choice, self.options, self.approximate, () if error is None else (error,),
                          alternatives=(alternative,))

    def rewrite(self, graph, nodes, site, option):
        node = nodes[site.nodes[0]]
        node.target = self._kernel(node.target)
        return []


def families(device: torch.device, *, times_measured: bool = True) -> list:
    """The families that apply on `device`. Convolution algorithms only compete on measured times
    (the analytic cost model cannot tell them apart)."""
    found = [ReluMask(), DropoutMask(), PoolOffsets(), GeluCodes(), SiluCodes(), BatchNormFromOutput(),
             BatchNormRerun()]
    return found + [ConvAlgorithm(device)] if times_measured else found


def structure(analysis: GraphAnalysis, gm: fx.GraphModule) -> Problem:
    """The analysed problem with every site's choice, sized but not costed: what a schedule's
    names refer to, without running the model."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    fake_mode = detect_fake_mode([n.meta["val"] for n in placeholders])
    nodes = {n.name: n for n in gm.graph.nodes}
    specs = []
    for family in families(placeholders[0].meta["val"].device):
        for site in family.find(gm, analysis):
            specs.append(family.spec(site, analysis.problem, family.shapes(site, nodes[site.nodes[-1]], fake_mode)))
    return add_choices(analysis.problem, specs)


def choice_specs(analysis: GraphAnalysis, gm: fx.GraphModule, model: torch.nn.Module, x: torch.Tensor,
                 problem: Problem, *, times_measured: bool = True) -> list[ChoiceSpec]:
    """Every site's choice, its options measured on real tensors (with analytic times for the new
    kernels unless `times_measured`). Options whose kernels fail here, or (exact options) do not
    give PyTorch's result bit for bit, are left out."""
    by_family = {f.name: f for f in families(x.device, times_measured=times_measured)}
    sites = {site.nodes[-1]: site for f in by_family.values() for site in f.find(gm, analysis)}
    measured: dict[str, dict[str, _Measured]] = {}

    def after(node, args, value):
        site = sites.get(node.name)
        if site is None:
            return
        try:
            found = by_family[site.family].measure(site, node, args, value, x.device)
        except Exception:  # noqa: BLE001 - an option that does not run here is left out
            return
        if not times_measured:
            for m in found.values():
                if m.out:
                    m.new = (_roofline(m.out.bytes + problem.tensor_named(site.tensors[-1]).bytes), m.new[1])
                m.alt = (_roofline(sum(problem.tensor_named(t).bytes for t in site.tensors)), m.alt[1])
        measured[site.choice] = found

    run_graph(gm, model, x, after)
    return [by_family[site.family].spec(site, problem, measured[site.choice])
            for site in sites.values() if site.choice in measured]


def _roofline(moved: int) -> float:
    return moved / BANDWIDTH + LAUNCH


def rewrite(gm: fx.GraphModule, analysis: GraphAnalysis, options: dict[str, str]) -> None:
    """Rewrite the joint graph of `gm` (as analysed) so that every site runs as `options` says."""
    graph = gm.graph
    placeholders = list(graph.find_nodes(op="placeholder"))
    nodes = {n.name: n for n in graph.nodes}
    fake_mode = detect_fake_mode([n.meta["val"] for n in placeholders])
    for family in families(placeholders[0].meta["val"].device):
        for site in family.find(gm, analysis):
            option = options.get(site.choice, family.options[0])
            if option == family.options[0]:
                continue
            for new in family.rewrite(graph, nodes, site, option):
                args = fx.node.map_arg(new.args, lambda n: n.meta["val"])
                with fake_mode:
                    new.meta["val"] = new.target(*args)
                nodes[new.name] = new
