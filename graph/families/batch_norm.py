"""Batch norm in training: backward from its output (approximate), and reruns from the
statistics its forward saved."""

from __future__ import annotations

import operator

import torch
from torch import fx

from monet.solver.edit import Alternative, ChoiceSpec

from .. import kernels
from ..cudnn_batch_norm import TRAINING_BACKWARDS, TRAINING_FORWARDS
from ..profile import measure_call
from .base import RERUN, Measured, Site, check_exact, one_op_choice, producer_of, relative_error, tensor_of


class BatchNormFromOutput:
    """Training batch norm's backward from its input (PyTorch) or from its output, which the next
    op reads anyway, with the normalised input rebuilt from the output, weight and bias.

    The rebuild is exact to rounding for a fresh model, but (out - bias) cancels when |bias|
    outgrows |weight * normalised input|: after three momentum-SGD steps at lr 0.1 the bundled
    CNN's weights drifted 1.8e-3 from PyTorch's. So it counts as approximate (opt-in), with its
    error on the profiling batch reported."""

    name, options, approximate = "batch_norm", ("input", "output"), ("output",)

    def find(self, gm, analysis):
        return [site for node in gm.graph.nodes
                if node.op == "call_function" and node.target in TRAINING_BACKWARDS
                for site in [self.match(node, analysis)] if site]

    def match(self, node, analysis):
        grad, _, weight, _, _, mean, invstd, train = node.args[:8]
        forward = mean.args[0] if isinstance(mean, fx.Node) and mean.target is operator.getitem else None
        if not train or forward is None or forward.target not in TRAINING_FORWARDS:
            return None
        bias = forward.args[2]
        out = [user for user in forward.users if user.target is operator.getitem and user.args[1] == 0]
        names = [tensor_of(analysis, n) for n in (grad, out[0] if out else None, weight, bias, mean, invstd)]
        op = producer_of(analysis, names[4])
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
        error = relative_error(got, value)
        return {self.options[1]: Measured(alt=(time, workspace), error=error)}

    def shapes(self, site, node, fake_mode):
        return {self.options[1]: Measured()}

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
    it skips is most of a batch norm's time on CPU. Where the forward is cuDNN's (CUDA, see
    cudnn_batch_norm), the option stands only if its kernel gives cuDNN's output bit for bit on the
    profiling run (check_exact decides, per batch norm)."""

    name, options, approximate = "batch_norm_rerun", ("full", "stats"), ()

    @staticmethod
    def fused_reruns(device: torch.device) -> tuple[str, ...]:
        """Options whose rerun Inductor fuses into the kernel that reads it: the rerun from saved
        statistics, where its kernel is the eval-mode batch norm, which Inductor decomposes into
        elementwise ops (CUDA's batch_norm_elemt it calls as an ATen kernel)."""
        return () if device.type == "cuda" else ("stats",)

    def find(self, gm, analysis):
        return [site for node in gm.graph.nodes if node.op == "call_function" and node.target in TRAINING_FORWARDS
                for site in [self.match(node, analysis)] if site]

    def match(self, node, analysis):
        x, weight, bias, _, _, training = node.args[:6]
        stats = {user.args[1]: user for user in node.users if user.target is operator.getitem}
        names = [tensor_of(analysis, n) for n in (x, stats.get(0), stats.get(1), stats.get(2))]
        op = producer_of(analysis, names[1])
        if not training or not isinstance(weight, fx.Node) or not isinstance(bias, fx.Node) or None in names \
                or op is None or not op.recomputable:
            return None
        return Site(self.name, f"{node.name}:rerun", (node.name,), tuple(names))

    def measure(self, site, node, node_args, value, device):
        _, mean, invstd, _, _ = value

        def rerun():
            return kernels.batch_norm_from_stats(*node_args, mean, invstd)

        # first outside the measurement: the kernel is asked its roundings once, on small probes
        check_exact(rerun()[0], value[0], "batch norm rerun from saved statistics")
        time, workspace, _ = measure_call(rerun, device)
        return {self.options[1]: Measured(alt=(time, workspace))}

    def shapes(self, site, node, fake_mode):
        return {self.options[1]: Measured()}

    def spec(self, site, problem, measured):
        time, workspace = measured[self.options[1]].alt
        return one_op_choice(site, problem, self.options,
                             lambda op: (op.time, max(op.workspace, workspace), time, site.tensors[2:]))

    def rewrite(self, graph, nodes, site, option):
        """The forward is unchanged; a rerun of this node runs the kernel on the saved statistics."""
        nodes[site.nodes[0]].meta[RERUN] = (kernels.batch_norm_from_stats,
                                            tuple(nodes[name] for name in site.tensors[2:]))
        return []
