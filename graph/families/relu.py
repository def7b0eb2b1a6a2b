"""ReLU: backward from the output, or from a 1-bit mask."""

from __future__ import annotations

from .. import kernels
from .base import BackwardFromCompact, Site, aten, producer_of, tensor_of


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
