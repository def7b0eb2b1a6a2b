"""Real arguments for a model's forward, from what users hand monet, and the `Inputs` they make."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from monet.schedules import Inputs, InputSpec
from monet.schedules.inputs import CONSTANTS


@dataclass(frozen=True)
class Example:
    """`model(*args, **kwargs)`'s arguments: tensors, constants, and tuples, lists and dicts of them."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, inputs, *, dtype: str | torch.dtype | None = None, requires_grad: bool | None = None,
           device: torch.device | str = "cpu") -> Example:
        """`inputs` as monet.solve and MONeTWrapper take them: a shape (ints: one tensor of `dtype`, a
        torch dtype or its name, default float32, standard normal or zeros, wanting a gradient if
        `requires_grad`), an InputSpec or Inputs (made on `device`), an example tensor, a tuple of
        positional inputs, a dict of keyword inputs, or an Example. Given tensors are used as they are:
        `dtype` and `requires_grad` are for shapes only."""
        if isinstance(inputs, Sequence) and inputs and all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in inputs):
            if isinstance(dtype, torch.dtype):
                dtype = str(dtype).removeprefix("torch.")
            return cls((InputSpec(tuple(inputs), dtype or "float32", bool(requires_grad)).example(device),))
        if dtype is not None or requires_grad is not None:
            raise ValueError("input_dtype and input_requires_grad describe an input given as a shape; the inputs "
                             "given here are tensors with their own dtype and requires_grad")
        if isinstance(inputs, Example):
            return inputs
        if isinstance(inputs, Inputs):
            return cls(*inputs.example(device))
        if isinstance(inputs, InputSpec):
            return cls((inputs.example(device),))
        if isinstance(inputs, torch.Tensor):
            return cls((inputs,))
        if isinstance(inputs, dict):
            return cls((), dict(inputs))
        if isinstance(inputs, tuple):
            return cls(inputs)
        raise TypeError(f"inputs of type {type(inputs).__name__}: give an input shape (ints), an example tensor, a "
                        "tuple of positional inputs or a dict of keyword inputs")

    @property
    def flat(self) -> list:
        """The leaves in the order AOTAutograd numbers the user inputs of a traced graph."""
        return pytree.tree_leaves((self.args, self.kwargs))

    def spec(self) -> Inputs:
        """What these arguments are, for a schedule file and to check a call against it."""
        return Inputs(tuple(_spec(a, f"args[{i}]") for i, a in enumerate(self.args)),
                      {k: _spec(v, k) for k, v in self.kwargs.items()})


def tensor_spec(x: torch.Tensor) -> InputSpec:
    return InputSpec(tuple(x.shape), str(x.dtype).removeprefix("torch."), x.requires_grad)


def _spec(node, where: str):
    if isinstance(node, torch.Tensor):
        try:
            return tensor_spec(node)
        except ValueError as exc:
            raise ValueError(f"input {where}: {exc}") from None
    if isinstance(node, (tuple, list)) and type(node) in (tuple, list):
        return type(node)(_spec(item, f"{where}[{i}]") for i, item in enumerate(node))
    if isinstance(node, dict):
        if not all(isinstance(k, str) for k in node):
            raise TypeError(f"input {where} is a dict with keys that are not strings; monet records inputs as JSON")
        return {k: _spec(v, f"{where}[{k!r}]") for k, v in node.items()}
    if isinstance(node, CONSTANTS):
        return node
    raise TypeError(f"input {where} is a {type(node).__name__}: monet takes tensors, tuples, lists and dicts of "
                    "them, and constants (None, bool, int, float, str)")
