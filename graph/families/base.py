"""What every family shares: a site, what an option costs, exactness checks, and the
family of backward ops that read a compact form of a tensor (masks, offsets, codes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from monet.solver import Problem
from monet.solver.edit import Alternative, ChoiceSpec, NewOp, NewTensor

from ..analyze import GraphAnalysis, allocation_bytes
from ..profile import measure_call

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
class Measured:
    """What an option's kernels cost: the new forward op, the alternative backward op."""

    new: tuple[float, int] | None = None
    alt: tuple[float, int] = (0.0, 0)
    out: NewTensor | None = None
    error: float | None = None  # an approximate option's relative error against PyTorch's backward


def tensor_of(analysis: GraphAnalysis, node) -> str | None:
    """The problem tensor a graph value holds (through views), if exactly one."""
    refs = analysis.node_tensors.get(node.name, ()) if isinstance(node, fx.Node) else ()
    return analysis.problem.tensors[refs[0]].name if len(refs) == 1 else None


def producer_of(analysis: GraphAnalysis, tensor: str | None):
    if tensor is None:
        return None
    t = analysis.problem.tensor_named(tensor)
    return None if t.producer is None else analysis.problem.ops[t.producer]


def relative_error(got, reference) -> float:
    """Largest relative (Frobenius) difference of a result, or of each tensor in a tuple of them."""
    pairs = zip(got, reference) if isinstance(got, (tuple, list)) else [(got, reference)]
    return max(((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in pairs if a is not None)


class NotExact(RuntimeError):
    """An exact option's kernels did not give PyTorch's result bit for bit on the profiling run;
    the option is left out."""


def check_exact(got, reference, what: str) -> None:
    """Raise NotExact unless `got` is `reference` bit for bit (NaN where it has NaN): an exact
    option must give the same numbers as PyTorch in every dtype, not numbers close to them."""
    pairs = zip(got, reference) if isinstance(got, (tuple, list)) else [(got, reference)]
    for a, b in pairs:
        if a is None and b is None:
            continue
        if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype or not (
                torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all())):
            raise NotExact(f"{what} does not reproduce PyTorch's result bit for bit")


def one_op_choice(site: Site, problem: Problem, options: tuple[str, ...], other, approximate: tuple[str, ...] = (),
                  errors: tuple[float, ...] = ()) -> ChoiceSpec:
    """The choice of a family whose second option runs the site's op (its first node) another way:
    `other(op)` gives that option's (time, workspace, ...) as `Alternative` takes them after the inputs."""
    op = problem.op_named(site.nodes[0])
    inputs = tuple(problem.tensors[t].name for t in op.inputs)
    alternative = Alternative(op.name, ((inputs, op.time, op.workspace), (inputs, *other(op))))
    return ChoiceSpec(site.choice, options, approximate, errors, alternatives=(alternative,))


def pair(value) -> tuple[int, int]:
    value = tuple(value)
    return value * 2 if len(value) == 1 else value


class BackwardFromCompact:
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
                ) -> dict[str, Measured]:
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
            error = relative_error(grad, value)
        else:
            check_exact(grad, value, f"{self.name} option {self.options[1]!r}")
        return {self.options[1]: Measured((t_new, ws_new), (t_alt, ws_alt), out, error)}

    def shapes(self, site: Site, node: fx.Node, fake_mode) -> dict[str, Measured]:
        """The option's new tensor, sized on fake tensors; no costs."""
        value = fx.node.map_arg(node.args[self.compact_arg], lambda n: n.meta["val"])
        with fake_mode:
            packed = type(self).pack_kernel(*self.pack_args(site, value))
        device = packed.device.type
        out = NewTensor(f"{site.tensors[-1]}__{self.options[1]}", allocation_bytes(packed.untyped_storage().nbytes(),
                        device), tuple(packed.shape), str(packed.dtype).removeprefix("torch."))
        return {self.options[1]: Measured((0.0, 0), (0.0, 0), out)}

    def spec(self, site: Site, problem: Problem, measured: dict[str, Measured]) -> ChoiceSpec:
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
