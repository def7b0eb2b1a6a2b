"""Convolution: which algorithm runs (approximate, opt-in)."""

from __future__ import annotations

import torch

from .. import kernels
from ..profile import measure_call
from .base import Measured, Site, aten, one_op_choice, relative_error


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
        error = relative_error(got, value)
        return {self.options[1]: Measured(alt=(time, workspace), error=error)}

    def shapes(self, site, node, fake_mode):
        return {self.options[1]: Measured()}

    def spec(self, site, problem, measured):
        error = measured[self.options[1]].error
        return one_op_choice(site, problem, self.options, lambda op: measured[self.options[1]].alt, self.approximate,
                             () if error is None else (error,))

    def rewrite(self, graph, nodes, site, option):
        node = nodes[site.nodes[0]]
        node.target = self._kernel(node.target)
        return []
