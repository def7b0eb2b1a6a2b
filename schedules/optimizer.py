"""The optimizer a training step ends with, as schedule and problem files record it (no torch needed)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

SHORT_NAMES = {"sgd": "torch.optim.SGD", "adam": "torch.optim.Adam", "adamw": "torch.optim.AdamW"}
OPTIMIZER_SCHEMA = {
    "type": "object", "required": ["name", "options", "micro_batches"], "additionalProperties": False,
    "properties": {"name": {"type": "string"}, "options": {"type": "object"},
                   "micro_batches": {"type": "integer", "minimum": 1}},
}


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer class by its import path, the options it is built with (JSON values), and how
    many micro-batches accumulate their gradients before each of its steps."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    micro_batches: int = 1

    def __post_init__(self):
        if not isinstance(self.micro_batches, int) or isinstance(self.micro_batches, bool) or self.micro_batches < 1:
            raise ValueError(f"micro_batches must be a positive integer, got {self.micro_batches!r}")

    @classmethod
    def of(cls, optimizer, micro_batches: int = 1) -> OptimizerSpec:
        """`optimizer` as users name it: 'sgd', 'adam' or 'adamw' (PyTorch's defaults; SGD at lr 0.01),
        an optimizer class, or (class, {options})."""
        options: dict[str, Any] = {}
        if isinstance(optimizer, tuple) and len(optimizer) == 2 and isinstance(optimizer[1], dict):
            optimizer, options = optimizer
        if isinstance(optimizer, str):
            if optimizer.lower() not in SHORT_NAMES:
                raise ValueError(f"optimizer {optimizer!r}: use one of {', '.join(SHORT_NAMES)}, an optimizer class, "
                                 "or (class, {options})")
            name = SHORT_NAMES[optimizer.lower()]
            options = {"lr": 0.01, **options} if name.endswith(".SGD") else options
        elif isinstance(optimizer, type):
            name = f"{optimizer.__module__}.{optimizer.__qualname__}"
            if optimizer.__module__.startswith("torch.optim."):  # torch.optim.adam.Adam -> torch.optim.Adam
                name = f"torch.optim.{optimizer.__qualname__}"
        else:
            raise TypeError(f"optimizer of type {type(optimizer).__name__}: use 'sgd', 'adam', 'adamw', an optimizer "
                            "class, or (class, {options})")
        spec = cls(name, dict(options), micro_batches)
        spec.load()  # fail here, not after tracing, on a class that cannot be imported back
        return spec

    def load(self):
        """The optimizer class this names."""
        module, _, attr = self.name.rpartition(".")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(f"optimizer {self.name}: cannot import it ({exc})") from None

    def build(self, params):
        """The optimizer this names, over `params`, with its options."""
        return self.load()(params, **self.options)

    def describe(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        batches = f", {self.micro_batches} micro-batches per step" if self.micro_batches > 1 else ""
        return f"{self.name.rpartition('.')[2]}({options}){batches}"

    def to_dict(self) -> dict:
        return {"name": self.name, "options": dict(self.options), "micro_batches": self.micro_batches}

    @classmethod
    def from_dict(cls, data: dict) -> OptimizerSpec:
        return cls(data["name"], dict(data["options"]), data["micro_batches"])
