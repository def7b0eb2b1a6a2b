"""What a model is called with, as a schedule or problem file records it (no torch needed to read it).

`Inputs` is the positional and keyword arguments of the model's forward: any nesting of tuples,
lists and dicts whose leaves are tensors (an `InputSpec`: shape, dtype, whether it wants a
gradient) or Python constants (None, bool, int, float, str), which the trace bakes into the graph.
In JSON one positional tensor is written as its spec alone (as files before keyword inputs did);
anything else as {"args": [...], "kwargs": {...}} with each node tagged: a tensor's spec, or
{"tuple": [...]}, {"list": [...]}, {"dict": {...}}, {"value": constant}.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool")  # tensor dtypes monet traces
_FLOATS = ("float32", "float16", "bfloat16", "float64")
CONSTANTS = (type(None), bool, int, float, str)

INPUT_SCHEMA = {"type": "object"}  # checked in full by Inputs.from_json, which says where a node is wrong


@dataclass(frozen=True)
class InputSpec:
    """One input tensor: its shape, dtype and whether it wants a gradient."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    requires_grad: bool = False

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if any(s <= 0 for s in self.shape):
            raise ValueError(f"input shape must be positive integers, got {self.shape}")
        if self.dtype not in DTYPES:
            raise ValueError(f"input dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.requires_grad and self.dtype not in _FLOATS:
            raise ValueError(f"an input of dtype {self.dtype} cannot require a gradient")

    @property
    def torch_dtype(self):
        import torch  # only where a tensor is made: reading files needs no torch

        return getattr(torch, self.dtype)

    def example(self, device="cpu", seed: int = 0):
        """A tensor of this spec: standard normal for floats, zeros (valid token ids, class labels,
        an all-false mask) for integers and booleans."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        if self.dtype in _FLOATS:
            x = torch.randn(self.shape, generator=gen, dtype=self.torch_dtype)
        else:
            x = torch.zeros(self.shape, dtype=self.torch_dtype)
        return x.to(device).requires_grad_(self.requires_grad)

    def describe(self) -> str:
        grad = ", requires_grad" if self.requires_grad else ""
        return f"({', '.join(map(str, self.shape))}) {self.dtype}{grad}"

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "requires_grad": self.requires_grad}


@dataclass(frozen=True)
class Inputs:
    """The arguments a model is called with: `args` (a tuple) and `kwargs` (a dict), nested
    structures of InputSpec leaves and constants."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def tensor(cls, spec: InputSpec) -> Inputs:
        """One positional tensor, as `model(x)` takes it."""
        return cls((spec,))

    @property
    def single(self) -> InputSpec | None:
        """The one positional tensor, where that is all the model takes."""
        only = self.args[0] if len(self.args) == 1 and not self.kwargs else None
        return only if isinstance(only, InputSpec) else None

    def tensors(self) -> Iterator[tuple[str, InputSpec]]:
        """Each tensor leaf with its path (`x`, `attention_mask`, `args[1]['bias']`)."""
        for path, leaf in self.leaves():
            if isinstance(leaf, InputSpec):
                yield path, leaf

    def leaves(self) -> Iterator[tuple[str, Any]]:
        """Each leaf (an InputSpec or a constant) with its path, in order."""
        def walk(node, path):
            if isinstance(node, (tuple, list)):
                for i, item in enumerate(node):
                    yield from walk(item, f"{path}[{i}]")
            elif isinstance(node, dict):
                for key, item in node.items():
                    yield from walk(item, f"{path}[{key!r}]")
            else:
                yield path, node
        for i, arg in enumerate(self.args):
            yield from walk(arg, f"args[{i}]" if len(self.args) > 1 else "x")
        for key, arg in self.kwargs.items():
            yield from walk(arg, key)

    def example(self, device="cpu", seed: int = 0) -> tuple[tuple, dict]:
        """(args, kwargs) with a tensor of each spec (see InputSpec.example), for tracing and profiling."""
        made = iter(range(1 << 30))
        build = _mapper(lambda spec: spec.example(device, seed + next(made)))
        return tuple(build(a) for a in self.args), {k: build(v) for k, v in self.kwargs.items()}

    def describe(self) -> str:
        if self.single is not None:
            return self.single.describe()
        parts = [f"{path}: {leaf.describe() if isinstance(leaf, InputSpec) else repr(leaf)}"
                 for path, leaf in self.leaves()]
        return "{" + "; ".join(parts) + "}"

    def to_json(self) -> dict:
        if self.single is not None:
            return self.single.to_dict()
        return {"args": [_node_json(a) for a in self.args],
                "kwargs": {k: _node_json(v) for k, v in self.kwargs.items()}}

    @classmethod
    def from_json(cls, data: dict) -> Inputs:
        """The inputs a file records (see the module's docstring); ValueError says where a node is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"input must be an object, not {type(data).__name__}")
        if "shape" in data:
            return cls.tensor(_spec(data, "input"))
        if set(data) - {"args", "kwargs"} or not isinstance(data.get("args", []), list) \
                or not isinstance(data.get("kwargs", {}), dict):
            raise ValueError("input must be a tensor's {shape, dtype, requires_grad} or {\"args\": [...], "
                             "\"kwargs\": {...}}")
        return cls(tuple(_node(a, f"input args[{i}]") for i, a in enumerate(data.get("args", []))),
                   {k: _node(v, f"input kwargs[{k!r}]") for k, v in data.get("kwargs", {}).items()})


def _mapper(leaf: Callable[[InputSpec], Any]) -> Callable[[Any], Any]:
    def build(node):
        if isinstance(node, InputSpec):
            return leaf(node)
        if isinstance(node, (tuple, list)):
            return type(node)(build(item) for item in node)
        if isinstance(node, dict):
            return {k: build(v) for k, v in node.items()}
        return node
    return build


def _node_json(node) -> dict:
    if isinstance(node, InputSpec):
        return node.to_dict()
    if isinstance(node, (tuple, list)):
        return {type(node).__name__: [_node_json(item) for item in node]}
    if isinstance(node, dict):
        return {"dict": {k: _node_json(v) for k, v in node.items()}}
    return {"value": node}


def _spec(data: dict, where: str) -> InputSpec:
    if set(data) != {"shape", "dtype", "requires_grad"} or not isinstance(data["shape"], list) \
            or not all(isinstance(s, int) for s in data["shape"]) or not isinstance(data["requires_grad"], bool):
        raise ValueError(f"{where}: a tensor is {{\"shape\": [ints], \"dtype\": str, \"requires_grad\": bool}}")
    return InputSpec(tuple(data["shape"]), data["dtype"], data["requires_grad"])


def _node(data, where: str):
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {data!r}")
    if "shape" in data:
        return _spec(data, where)
    if len(data) != 1:
        raise ValueError(f"{where}: expected a tensor or one of tuple, list, dict, value; got keys {sorted(data)}")
    (kind, body), = data.items()
    if kind in ("tuple", "list") and isinstance(body, list):
        items = [_node(item, f"{where}[{i}]") for i, item in enumerate(body)]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict" and isinstance(body, dict):
        return {k: _node(v, f"{where}[{k!r}]") for k, v in body.items()}
    if kind == "value" and isinstance(body, CONSTANTS):
        return body
    raise ValueError(f"{where}: {kind!r} of {body!r} is not a tuple, list, dict or constant")
