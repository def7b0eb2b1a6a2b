"""ReLU: backward from the output, or from a 1-bit mask; the forward out of place, or in place."""

from __future__ import annotations

from .. import kernels
from ..profile import measure_call
from .base import BackwardFromCompact, Measured, Site, aten, one_op_choice, producer_of, tensor_of


class ReluMask(BackwardFromCompact):
    """ReLU's backward from its output (PyTorch), or from a 1-bit mask packed 8 per byte."""

    name, options = "relu", ("output", "mask")
    backward_target = aten.threshold_backward.default
    pack_kernel, backward_kernel = kernels.relu_mask, kernels.relu_backward_from_mask

    def match(self, node, analysis):
        grad, out, threshold = node.args
        op = producer_of(analysis, tensor_of(analysis, out))
        if threshold != 0 or op is None or op.target != "aten.relu.default" or not tensor_of(analysis, grad):
            return None
        return Site(self.name, f"{op.name}:backward", (op.name, node.name),
                    (tensor_of(analysis, grad), tensor_of(analysis, out)))


class ReluInPlace:
    """ReLU's forward into a new tensor (PyTorch's functional graph), or over its input (MONeT's
    in-place ReLU: `relu_`), where the input is an activation of the output's size that no later
    forward op reads. In place, the input's storage becomes the output's, so the two are never live
    together; the input is then not saved, and a backward op that reads it reads a rerun's copy
    (the solver arranges both: `Impl.overwrites`)."""

    name, options = "relu_in_place", ("out", "in")
    # Under Inductor the ReLU runs as PyTorch's (Inductor reuses a dead input's buffer itself, or fuses the ReLU away)
    pytorch_when_compiled = ("in",)

    def find(self, gm, analysis):
        return [site for node in gm.graph.nodes if node.op == "call_function" and node.target is aten.relu.default
                for site in [self.match(node, analysis)] if site]

    def match(self, node, analysis):
        source, out = tensor_of(analysis, node.args[0]), tensor_of(analysis, node)
        problem = analysis.problem
        if source is None or out is None or node.name not in analysis.node_tensors:
            return None
        op = problem.op_named(node.name)
        if op.phase != "forward" or problem.in_place_refusal(op, op.inputs, problem.tensor_named(source).id):
            return None
        return Site(self.name, f"{node.name}:place", (node.name,), (source, out))

    def measure(self, site, node, node_args, value, device):
        x = node_args[0].clone()
        time, workspace, _ = measure_call(lambda: aten.relu_.default(x), device)
        return {self.options[1]: Measured(alt=(time, workspace))}

    def shapes(self, site, node, fake_mode):
        return {self.options[1]: Measured()}

    def spec(self, site, problem, measured):
        time, workspace = measured[self.options[1]].alt
        return one_op_choice(site, problem, self.options, lambda op: (time, workspace, None, (), None, site.tensors[0]))

    def rewrite(self, graph, nodes, site, option):
        nodes[site.nodes[0]].target = aten.relu_.default
        return []
