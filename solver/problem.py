"""The framework-free memory problem: tensors with sizes and operators with costs.

A `Problem` is what the graph stage hands to the solver. It names no framework
type, so problems from anywhere can be written to JSON and solved without torch.

Execution model (shared by the simulator, the solvers and the runtime):
  * forward ops run once, in order; a forward tensor is freed after its last
    forward reader unless it is *saved* for the backward pass;
  * the backward phase runs a sequence of ops: every backward op once, in
    order, with forward ops interleaved where the schedule *recomputes* them;
  * every copy of a tensor is freed right after its last reader.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property

PROBLEM_VERSION = 1

# Where a tensor comes from, which fixes how long it lives:
#   param, buffer, input  graph inputs held by the caller for the whole step
#   tangent               gradient of a model output, made before the backward
#   activation            forward result; freed after last use unless saved
#   state                 new value of a buffer (running stats); lives to the end of the forward
#   output                model output, held by the caller to the end of the step
#   grad                  gradient returned by the backward, held to the end of the step
#   temp                  backward intermediate, freed after last use
ROLES = ("param", "buffer", "input", "tangent", "activation", "state", "output", "grad", "temp")
PERSISTENT_ROLES = ("param", "buffer", "input")
PHASES = ("forward", "backward")


@dataclass(frozen=True)
class Tensor:
    """One allocation: a storage of `bytes` bytes made by op `producer` (shape and dtype for people)."""

    id: int
    name: str
    bytes: int
    role: str
    producer: int | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None


@dataclass(frozen=True)
class Op:
    """One operator run: reads `inputs`, allocates `outputs`, takes `time` seconds
    and `workspace` temporary bytes while it runs."""

    id: int
    name: str
    target: str
    phase: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    time: float
    workspace: int = 0
    recomputable: bool = True


class ProblemError(ValueError):
    """A problem that is malformed or inconsistent."""


@dataclass(frozen=True)
class Problem:
    """Tensors and ops of one training step; forward ops precede backward ops."""

    tensors: tuple[Tensor, ...]
    ops: tuple[Op, ...]
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "tensors", tuple(self.tensors))
        object.__setattr__(self, "ops", tuple(self.ops))
        self._check()

    # ---- structure -------------------------------------------------------
    @cached_property
    def forward_ops(self) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.phase == "forward")

    @cached_property
    def backward_ops(self) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.phase == "backward")

    @cached_property
    def persistent_bytes(self) -> int:
        """Bytes held for the whole step: parameters, buffers and the input batch."""
        return sum(t.bytes for t in self.tensors if t.role in PERSISTENT_ROLES)

    @cached_property
    def readers(self) -> tuple[tuple[int, ...], ...]:
        """For each tensor, the ids of the ops that read it, in op order."""
        out: list[list[int]] = [[] for _ in self.tensors]
        for op in self.ops:
            for t in op.inputs:
                out[t].append(op.id)
        return tuple(tuple(r) for r in out)

    def out_bytes(self, op: Op) -> int:
        return sum(self.tensors[t].bytes for t in op.outputs)

    def op_named(self, name: str) -> Op:
        return self._op_by_name[name]

    def tensor_named(self, name: str) -> Tensor:
        return self._tensor_by_name[name]

    @cached_property
    def _op_by_name(self) -> dict[str, Op]:
        return {op.name: op for op in self.ops}

    @cached_property
    def _tensor_by_name(self) -> dict[str, Tensor]:
        return {t.name: t for t in self.tensors}

    def _check(self) -> None:
        for i, t in enumerate(self.tensors):
            if t.id != i:
                raise ProblemError(f"tensor {t.name!r} has id {t.id}, expected {i}")
            if t.role not in ROLES:
                raise ProblemError(f"tensor {t.name!r} has unknown role {t.role!r}")
            if t.bytes < 0:
                raise ProblemError(f"tensor {t.name!r} has negative size")
        seen_backward = False
        produced = {t.id for t in self.tensors if t.producer is None}
        for i, op in enumerate(self.ops):
            if op.id != i:
                raise ProblemError(f"op {op.name!r} has id {op.id}, expected {i}")
            if op.phase not in PHASES:
                raise ProblemError(f"op {op.name!r} has unknown phase {op.phase!r}")
            if op.phase == "backward":
                seen_backward = True
            elif seen_backward:
                raise ProblemError(f"forward op {op.name!r} comes after a backward op")
            for t in op.inputs:
                if not 0 <= t < len(self.tensors):
                    raise ProblemError(f"op {op.name!r} reads unknown tensor {t}")
                if t not in produced:
                    raise ProblemError(f"op {op.name!r} reads {self.tensors[t].name!r} before it exists")
            for t in op.outputs:
                if self.tensors[t].producer != op.id:
                    raise ProblemError(f"op {op.name!r} outputs {self.tensors[t].name!r} it does not produce")
                produced.add(t)
        for t in self.tensors:
            if t.producer is None and t.role not in (*PERSISTENT_ROLES, "tangent"):
                raise ProblemError(f"tensor {t.name!r} ({t.role}) has no producer")

    # ---- JSON ------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": PROBLEM_VERSION,
            "meta": self.meta,
            "tensors": [asdict(t) for t in self.tensors],
            "ops": [asdict(op) for op in self.ops],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Problem:
        if data.get("version") != PROBLEM_VERSION:
            raise ProblemError(
                f"problem format version {data.get('version')!r} is not supported (expected {PROBLEM_VERSION})"
            )
        try:
            tensors = [Tensor(**{**t, "shape": None if t.get("shape") is None else tuple(t["shape"])})
                       for t in data["tensors"]]
            ops = [
                Op(**{**op, "inputs": tuple(op["inputs"]), "outputs": tuple(op["outputs"])})
                for op in data["ops"]
            ]
        except (KeyError, TypeError) as exc:
            raise ProblemError(f"malformed problem: {exc}") from exc
        return cls(tensors, ops, data.get("meta", {}))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Problem:
        return cls.from_dict(json.loads(text))
