"""Dropout's backward scales gradients by the number eager PyTorch multiplies by on CPU.

A trace records `dropout` as `native_dropout` (its decomposition), whose backward is
`native_dropout_backward(grad, mask, 1 / (1 - p))` with the scale in double precision. Eager on
CPU runs dropout another way: it draws a noise tensor in the input's dtype (the same mask),
divides it by 1 - p in that dtype and multiplies; its backward multiplies the gradient by that
noise. The forward values are the same, but in bfloat16 or float16 the noise holds 1 / (1 - p)
rounded to the dtype (1/0.9: 1.109375 in bfloat16), so each backward through a dropout scaled the
gradient 0.16 % differently from eager, and a traced bfloat16 step's gradients drifted ~2e-2 from
eager autocast's over GPT-2's 19 dropouts. This pass gives each low-precision CPU dropout backward
eager's rounded scale, which makes it equal to eager's. CUDA eager runs `native_dropout` itself,
as traced, and float32's scales agree already: both are left as they are.
"""

from __future__ import annotations

import torch

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def eager_scale(scale: float, dtype: torch.dtype) -> float:
    """`scale` as eager's CPU dropout holds it in a tensor of `dtype`."""
    return torch.tensor(scale, dtype=dtype).item()


def match_eager_dropout(gm: torch.fx.GraphModule) -> None:
    """Give every CPU `native_dropout_backward` of a bfloat16 or float16 gradient eager's scale."""
    for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten.native_dropout_backward.default):
        grad, mask, scale = node.args
        val = grad.meta.get("val")
        if val is None or val.device.type != "cpu" or val.dtype not in _LOW_PRECISION:
            continue
        node.args = (grad, mask, eager_scale(scale, val.dtype))
    gm.recompile()
