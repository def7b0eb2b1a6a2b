"""Trace a model's training step into one joint forward+backward torch.fx graph.

AOTAutograd's `aot_export_joint_with_descriptors` traces the module with fake
tensors (nothing runs, no state changes) and labels every graph input and
output: which parameter, buffer, user input, tangent, buffer update or
gradient it is. The same traced object later compiles into the runtime with a
partitioner of ours, so the graph we solve on is the graph we run.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch.aot_autograd import (
    aot_compile_joint_with_descriptors,
    aot_export_joint_with_descriptors,
)

from monet.errors import MonetError

_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
}


class TraceError(MonetError, RuntimeError):
    """The model's training step could not be traced into one graph."""


@dataclass(frozen=True)
class InputSpec:
    """The one tensor a model takes: its shape, dtype and whether it wants a gradient."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    requires_grad: bool = False

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if not self.shape or any(s <= 0 for s in self.shape):
            raise ValueError(f"input shape must be positive integers, got {self.shape}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"input dtype {self.dtype!r} is not one of {', '.join(_DTYPES)}")
        if self.requires_grad and not self.torch_dtype.is_floating_point:
            raise ValueError(f"an input of dtype {self.dtype} cannot require a gradient")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def example(self, device: torch.device | str = "cpu", seed: int = 0) -> torch.Tensor:
        """A batch of this spec: standard normal for floats, zeros (valid token ids) for integers."""
        gen = torch.Generator().manual_seed(seed)
        if self.torch_dtype.is_floating_point:
            x = torch.randn(self.shape, generator=gen, dtype=self.torch_dtype)
        else:
            x = torch.zeros(self.shape, dtype=self.torch_dtype)
        return x.to(device).requires_grad_(self.requires_grad)

    def describe(self) -> str:
        grad = ", requires_grad" if self.requires_grad else ""
        return f"({', '.join(map(str, self.shape))}) {self.dtype}{grad}"


def model_device(model: nn.Module) -> torch.device:
    for tensor in [*model.parameters(), *model.buffers()]:
        return tensor.device
    return torch.device("cpu")


class TracedStep:
    """A model's joint training-step graph, kept open so it can be compiled once.

    Use as a context manager; `compile` must be called inside it.
    """

    def __init__(self, model: nn.Module, spec: InputSpec):
        self.model = model
        self.spec = spec
        self.device = model_device(model)
        self._stack = contextlib.ExitStack()
        was_training = model.training
        model.train()
        try:
            self._joint = aot_export_joint_with_descriptors(self._stack, model, (spec.example(self.device),))
        except Exception as exc:
            self._stack.close()
            raise TraceError(
                f"could not trace the training step of {type(model).__name__} at input {spec.describe()}: "
                f"{type(exc).__name__}: {str(exc).rstrip('.')}. monet needs a model whose forward traces into "
                "one graph (no Python control flow that depends on tensor values)"
            ) from exc
        finally:
            model.train(was_training)

    @property
    def graph_module(self) -> torch.fx.GraphModule:
        return self._joint.graph_module

    @property
    def param_names(self) -> list[str]:
        return list(self._joint.params_spec)

    @property
    def buffer_names(self) -> list[str]:
        return list(self._joint.buffers_spec)

    def compile(self, partition_fn):
        """The training step as one callable `f(*params, *buffers, x)` split by `partition_fn`."""
        return aot_compile_joint_with_descriptors(
            self._joint, partition_fn=partition_fn, fw_compiler=boxed_nop, bw_compiler=boxed_nop
        )

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> TracedStep:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
