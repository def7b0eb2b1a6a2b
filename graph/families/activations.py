"""GELU and SiLU: backward from the input, or (approximate) from a 2-bit code of it."""

from __future__ import annotations

from torch import fx

from .. import kernels
from .base import BackwardFromCompact, Site, aten, tensor_of


class _ActivationCodes(BackwardFromCompact):
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
        x = tensor_of(analysis, source)
        if not self.exact_form(node) or not x:
            return None
        problem = analysis.problem
        forward = [problem.ops[r] for r in problem.readers[problem.tensor_named(x).id]
                   if problem.ops[r].target == self.forward_target]
        if len(forward) != 1 or not tensor_of(analysis, grad):
            return None  # one input, several activations of it (diffusers' time embedding): each pack would clash
        return Site(self.name, f"{forward[0].name}:backward", (forward[0].name, node.name),
                    (tensor_of(analysis, grad), x), (self.levels,))


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
