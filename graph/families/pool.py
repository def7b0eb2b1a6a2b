"""Max-pool 2d: backward from int64 argmax indices, or from 1-byte window offsets."""

from __future__ import annotations

from .. import kernels
from .base import BackwardFromCompact, Site, aten, pair, producer_of, tensor_of


class PoolOffsets(BackwardFromCompact):
    """Max-pool's backward from its input and int64 argmax indices (PyTorch), or from the
    argmax's offset inside its window, one byte per output element."""

    name, options = "max_pool", ("indices", "offsets")
    backward_target = aten.max_pool2d_with_indices_backward.default
    compact_arg = 7
    pack_kernel, backward_kernel = kernels.pool_offsets, kernels.pool_backward_from_offsets

    def match(self, node, analysis):
        grad, source, kernel, stride, padding, dilation, ceil_mode, indices = node.args
        op = producer_of(analysis, tensor_of(analysis, indices))
        kernel = pair(kernel)
        if (op is None or op.target != "aten.max_pool2d_with_indices.default" or ceil_mode
                or any(d != 1 for d in dilation) or kernel[0] * kernel[1] > 256 or not tensor_of(analysis, grad)):
            return None
        hw = tuple(source.meta["val"].shape[-2:])
        params = (hw, kernel, pair(stride) if stride else kernel, pair(padding))
        return Site(self.name, f"{op.name}:backward", (op.name, node.name),
                    (tensor_of(analysis, grad), tensor_of(analysis, indices)), params)

    def pack_args(self, site, value):
        return (value, *site.params)
