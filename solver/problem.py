"""The framework-free memory problem: tensors with sizes and operators with costs.

A `Problem` is what the graph stage hands to the solver. It names no framework
type, so problems from anywhere can be written to JSON and solved without torch.

Execution model (shared by the simulator, the solvers and the runtime):
  * forward ops run once, in order; a forward tensor is freed after its last
    forward reader unless it is *saved* for the backward pass;
  * the backward phase runs a sequence of ops: every backward op once, in
    order, with forward ops interleaved where the schedule *recomputes* them;
  * every copy of a tensor is freed right after its last reader;
  * an op that runs in place (`Impl.overwrites`) makes its output in its input's storage, so
    that copy of the input ends there: it must not be saved, nor read again (a backward op
    overwrites only a backward intermediate that nothing reads after it).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property

from monet.errors import MonetError

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
    """One allocation: a storage of `bytes` bytes made by op `producer` (shape and dtype for people).
    `keep_time`: seconds that saving it for the backward adds to the step (a compiled step writes
    a tensor that only fused kernels read in the forward only because it is saved)."""

    id: int
    name: str
    bytes: int
    role: str
    producer: int | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    keep_time: float = 0.0


@dataclass(frozen=True)
class Impl:
    """How an op runs under one option of its choice (or whether it runs at all)."""

    inputs: tuple[int, ...]
    time: float
    workspace: int = 0
    runs: bool = True
    rerun_time: float | None = None  # seconds when the backward reruns it, if not `time`
    keeps: tuple[int, ...] = ()  # tensors a rerun reads besides `inputs`: always saved under this option
    recomputable: bool | None = None  # may the backward rerun it under this option (None: as the op says)
    overwrites: int | None = None  # an input whose storage the output takes (in place): it dies at every run


    @property
    def recompute_time(self) -> float:
        return self.time if self.rerun_time is None else self.rerun_time

    @property
    def backward_reads(self) -> tuple[int, ...]:
        """What it reads when it runs in the backward phase (a rerun also reads `keeps`)."""
        return self.inputs + self.keeps


@dataclass(frozen=True)
class Choice:
    """A decision taken once per step, such as how one ReLU's backward gets its mask.
    The first option is PyTorch's own; `approximate` options change the gradients, by the
    relative error `errors` (one per approximate option, as measured when profiling; may be empty)."""

    name: str
    options: tuple[str, ...]
    approximate: tuple[str, ...] = ()
    errors: tuple[float, ...] = ()

    def error(self, option: str) -> float | None:
        """The measured relative gradient error of an approximate option, if known."""
        if option not in self.approximate or len(self.errors) != len(self.approximate):
            return None
        return self.errors[self.approximate.index(option)]


@dataclass(frozen=True)
class Op:
    """One operator run: allocates `outputs`, and runs as `pytorch` says (reads its `inputs`,
    takes its `time` seconds and `workspace` temporary bytes while it runs).

    With a `choice`, `pytorch` describes the op under the choice's first option and `others`
    under each further option; outputs never change. An `others` entry whose `recomputable` is
    None may rerun as `pytorch` says; `pytorch.recomputable` is True unless set.
    """

    id: int
    name: str
    target: str
    phase: str
    outputs: tuple[int, ...]
    pytorch: Impl
    choice: str | None = None
    others: tuple[Impl, ...] = ()

    def __post_init__(self):
        if self.pytorch.recomputable is None:
            object.__setattr__(self, "pytorch", replace(self.pytorch, recomputable=True))

    # The op as PyTorch runs it (its choice's first option).
    inputs = property(lambda self: self.pytorch.inputs)
    time = property(lambda self: self.pytorch.time)
    workspace = property(lambda self: self.pytorch.workspace)
    runs = property(lambda self: self.pytorch.runs)
    rerun_time = property(lambda self: self.pytorch.rerun_time)
    keeps = property(lambda self: self.pytorch.keeps)
    overwrites = property(lambda self: self.pytorch.overwrites)
    recomputable = property(lambda self: self.pytorch.recomputable)

    def impl(self, option: int = 0) -> Impl:
        """The op under option `option` of its choice (0: the first, PyTorch's)."""
        if option == 0:
            return self.pytorch
        impl = self.others[option - 1]
        return impl if impl.recomputable is not None else replace(impl, recomputable=self.recomputable)

    @cached_property
    def impls(self) -> tuple[Impl, ...]:
        return tuple(self.impl(j) for j in range(len(self.others) + 1))

    @property
    def may_rerun(self) -> bool:
        """Whether the backward may rerun it under some option (random ops only from a saved state)."""
        return any(impl.recomputable for impl in self.impls)

    def to_dict(self) -> dict:
        """As problem files write it: the `pytorch` fields beside the op's own."""
        first = self.pytorch
        return {"id": self.id, "name": self.name, "target": self.target, "phase": self.phase,
                "inputs": first.inputs, "outputs": self.outputs, "time": first.time, "workspace": first.workspace,
                "recomputable": first.recomputable, "runs": first.runs, "choice": self.choice,
                "others": tuple(_impl_to_dict(impl) for impl in self.others), "rerun_time": first.rerun_time,
                "keeps": first.keeps, **_in_place(first)}

    @classmethod
    def from_dict(cls, data: dict) -> Op:
        """The inverse of `to_dict` (missing optional fields take their defaults)."""
        first = {key: value for key, value in data.items() if key in _IMPL_FIELDS}
        own = {key: value for key, value in data.items() if key not in _IMPL_FIELDS}
        return cls(**{**own, "outputs": tuple(own["outputs"]),
                      "others": tuple(_impl_from_dict(i) for i in own.get("others", ()))},
                   pytorch=_impl_from_dict(first))


_IMPL_FIELDS = frozenset(f.name for f in fields(Impl))


def _in_place(impl: Impl) -> dict:
    """`overwrites`, written only where set: files (and their digests) of ops that run in place only."""
    return {} if impl.overwrites is None else {"overwrites": impl.overwrites}


def _tensor_to_dict(tensor: Tensor) -> dict:
    """`keep_time` written only where set: files (and their digests) of problems that price saving only."""
    return {key: value for key, value in asdict(tensor).items() if key != "keep_time" or value}


def _impl_to_dict(impl: Impl) -> dict:
    return {key: value for key, value in asdict(impl).items() if key != "overwrites"} | _in_place(impl)


def _impl_from_dict(data: dict) -> Impl:
    return Impl(**{**data, "inputs": tuple(data["inputs"]), "keeps": tuple(data.get("keeps", ()))})


class ProblemError(MonetError, ValueError):
    """A problem that is malformed or inconsistent."""


@dataclass(frozen=True)
class Update:
    """The optimizer's part of a training step, outside the traced graph. `state`: bytes held for
    the whole step (the optimizer's state from the step before; gradients accumulated from earlier
    micro-batches). `workspace`: bytes `optimizer.step()` allocates over everything held when the
    backward ends (parameters, buffers, the batch, outputs, gradients, the state)."""

    state: int = 0
    workspace: int = 0

    def __post_init__(self):
        if min(self.state, self.workspace) < 0:
            raise ProblemError(f"optimizer bytes must be non-negative, got {self}")


@dataclass(frozen=True)
class Problem:
    """Tensors and ops of one training step; forward ops precede backward ops. With `update`, the
    step ends with the optimizer's: its state is held throughout, and its own peak counts."""

    tensors: tuple[Tensor, ...]
    ops: tuple[Op, ...]
    meta: dict = field(default_factory=dict, compare=False)
    choices: tuple[Choice, ...] = ()
    update: Update | None = None
    held: int = 0  # bytes libraries hold throughout the step (CUDA: cuBLAS workspaces), measured where profiled

    def __post_init__(self):
        object.__setattr__(self, "tensors", tuple(self.tensors))
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "choices", tuple(self.choices))
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
        """Bytes held for the whole step: parameters, buffers, the input batch, the optimizer's state and
        what libraries hold."""
        state = self.update.state if self.update else 0
        return sum(t.bytes for t in self.tensors if t.role in PERSISTENT_ROLES) + state + self.held

    @cached_property
    def floor(self) -> int:
        """Bytes every schedule holds at its peak or before: persistent_bytes and the parameters' gradients."""
        return self.persistent_bytes + sum(t.bytes for t in self.tensors if t.role == "grad")

    @cached_property
    def update_peak(self) -> int | None:
        """The peak of the optimizer's step (None without one), the same under every schedule: what the
        step holds when the backward ends (persistent bytes, outputs, gradients) and the step's workspace."""
        if self.update is None:
            return None
        held = sum(t.bytes for t in self.tensors if t.role in ("output", "grad"))
        return self.persistent_bytes + held + self.update.workspace

    @cached_property
    def readers(self) -> tuple[tuple[int, ...], ...]:
        """For each tensor, the ids of the ops that read it under some option, in op order."""
        out: list[list[int]] = [[] for _ in self.tensors]
        for op in self.ops:
            for t in dict.fromkeys(t for impl in op.impls if impl.runs for t in impl.inputs):
                out[t].append(op.id)
        return tuple(tuple(r) for r in out)

    @cached_property
    def choice_named(self) -> dict[str, Choice]:
        return {c.name: c for c in self.choices}

    def option_index(self, op: Op, options: dict[str, str]) -> int:
        """Which of `op`'s impls `options` (choice name -> option) selects; 0 when unset."""
        if op.choice is None or op.choice not in options:
            return 0
        return self.choice_named[op.choice].options.index(options[op.choice])

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
        if self.held < 0:
            raise ProblemError(f"held bytes must be non-negative, got {self.held}")
        for i, t in enumerate(self.tensors):
            if t.id != i:
                raise ProblemError(f"tensor {t.name!r} has id {t.id}, expected {i}")
            if t.role not in ROLES:
                raise ProblemError(f"tensor {t.name!r} has unknown role {t.role!r}")
            if t.bytes < 0:
                raise ProblemError(f"tensor {t.name!r} has negative size")
        for c in self.choices:
            if len(c.options) < 2 or len(set(c.options)) != len(c.options) or not set(c.approximate) <= set(c.options):
                raise ProblemError(f"choice {c.name!r} needs two or more distinct options")
            if c.options[0] in c.approximate:
                raise ProblemError(f"choice {c.name!r}: the first option must be exact (PyTorch's own)")
        seen_backward = False
        in_place: list[tuple[Op, Impl]] = []  # checked once every op's inputs are known to exist
        produced = {t.id: None for t in self.tensors if t.producer is None}  # tensor -> (choice, options) or None
        for i, op in enumerate(self.ops):
            if op.id != i:
                raise ProblemError(f"op {op.name!r} has id {op.id}, expected {i}")
            if op.phase not in PHASES:
                raise ProblemError(f"op {op.name!r} has unknown phase {op.phase!r}")
            if op.phase == "backward":
                seen_backward = True
            elif seen_backward:
                raise ProblemError(f"forward op {op.name!r} comes after a backward op")
            if op.choice is not None:
                if op.choice not in self.choice_named:
                    raise ProblemError(f"op {op.name!r} depends on unknown choice {op.choice!r}")
                if len(op.others) != len(self.choice_named[op.choice].options) - 1:
                    raise ProblemError(f"op {op.name!r} needs one implementation per option of {op.choice!r}")
            elif op.others or not op.runs:
                raise ProblemError(f"op {op.name!r} has alternatives but no choice")
            for option, impl in enumerate(op.impls):
                if impl.keeps and (not impl.recomputable or op.phase != "forward"):
                    raise ProblemError(f"op {op.name!r} keeps tensors for reruns it cannot have")
                if not impl.runs:
                    continue
                for t in impl.inputs:
                    if not 0 <= t < len(self.tensors):
                        raise ProblemError(f"op {op.name!r} reads unknown tensor {t}")
                    made = produced.get(t, ())
                    if made is not None and (not made or made[0] != op.choice or option not in made[1]):
                        raise ProblemError(f"op {op.name!r} reads {self.tensors[t].name!r} before it exists")
                if impl.overwrites is not None:
                    in_place.append((op, impl))
            runs = tuple(j for j, impl in enumerate(op.impls) if impl.runs)
            for t in op.outputs:
                if self.tensors[t].producer != op.id:
                    raise ProblemError(f"op {op.name!r} outputs {self.tensors[t].name!r} it does not produce")
                produced[t] = None if len(runs) == len(op.impls) else (op.choice, runs)
        for t in self.tensors:
            if t.producer is None and t.role not in (*PERSISTENT_ROLES, "tangent"):
                raise ProblemError(f"tensor {t.name!r} ({t.role}) has no producer")
        for op, impl in in_place:
            self._check_in_place(op, impl)

    def _check_in_place(self, op: Op, impl: Impl) -> None:
        refusal = self.in_place_refusal(op, impl.inputs, impl.overwrites)
        if refusal:
            raise ProblemError(refusal)

    def in_place_refusal(self, op: Op, inputs: tuple[int, ...], t: int) -> str | None:
        """Why `op`, reading `inputs`, may not overwrite tensor `t` (None: it may). An op may overwrite
        an input when it makes one tensor of the input's size and reads the input last: a forward op an
        activation, last in the forward (backward ops may read it later: from a rerun's copy, as the
        schedule must arrange); a backward op a backward intermediate (temp), last of all."""
        if t not in inputs or len(op.outputs) != 1:
            return f"op {op.name!r} overwrites {t} but is not a one-output op reading it"
        tensor = self.tensors[t]
        role, kind = ("activation", "an activation") if op.phase == "forward" else ("temp", "a backward intermediate")
        if tensor.role != role or tensor.bytes != self.tensors[op.outputs[0]].bytes:
            return f"op {op.name!r} overwrites {tensor.name!r}, which is not {kind} of its output's size"
        later = [self.ops[r].name for r in self.readers[t] if r > op.id and self.ops[r].phase == op.phase]
        if later:
            return f"op {op.name!r} overwrites {tensor.name!r}, which {', '.join(later)} read later"
        return None

    def restrict(self, options: dict[str, str]) -> Problem:
        """The same problem (ids, choices, names) in which an op whose choice `options` fixes may
        rerun only as that option allows: the options left out no longer widen where ops can rerun
        (and so the formulations' size), and they are never chosen anyway."""
        ops = []
        for op in self.ops:
            if op.choice in options:
                chosen = self.choice_named[op.choice].options.index(options[op.choice])
                impls = [impl if j == chosen else replace(impl, recomputable=False, keeps=(), rerun_time=None)
                         for j, impl in enumerate(op.impls)]
                op = replace(op, pytorch=impls[0], others=tuple(impls[1:]))
            ops.append(op)
        return replace(self, ops=tuple(ops))

    def without(self, excluded: dict[str, Collection[str]]) -> Problem:
        """The same problem (ids, names) in which the choices named in `excluded` no longer offer
        the options it lists for them (options a choice does not have are ignored). PyTorch's own
        option stays; a choice left with it alone is gone, its ops running as PyTorch's, unless some
        op of it runs under other options only (fix it through the solve settings then)."""
        kept: dict[str, tuple[int, ...]] = {}
        choices = []
        for c in self.choices:
            keep = tuple(i for i, o in enumerate(c.options) if i == 0 or o not in excluded.get(c.name, ()))
            if len(keep) < len(c.options):
                kept[c.name] = keep
                options = tuple(c.options[i] for i in keep)
                pairs = [(o, e) for o, e in zip(c.approximate, c.errors or (None,) * len(c.approximate))
                         if o in options]
                c = replace(c, options=options, approximate=tuple(o for o, _ in pairs),
                            errors=tuple(e for _, e in pairs) if c.errors else ())
            if len(keep) > 1:
                choices.append(c)
        ops = []
        for op in self.ops:
            if op.choice in kept and len(kept[op.choice]) == 1:
                if not op.runs:
                    raise ProblemError(f"excluding {sorted(excluded[op.choice])} leaves choice {op.choice!r} one "
                                       f"option, under which {op.name!r} does not run; fix it to "
                                       f"{self.choice_named[op.choice].options[0]!r} instead")
                op = replace(op, choice=None, others=())
            elif op.choice in kept:
                op = replace(op, others=tuple(op.impls[i] for i in kept[op.choice][1:]))
            ops.append(op)
        return replace(self, ops=tuple(ops), choices=tuple(choices))

    def resolve(self, options: dict[str, str]) -> Problem:
        """The plain problem (no choices) in which every op runs as `options` says; ops that do
        not run are left out with their outputs. Names are kept, ids are renumbered."""
        runs = {op.id: op.impl(self.option_index(op, options)) for op in self.ops}
        kept_ops = [op for op in self.ops if runs[op.id].runs]
        kept_tensors = [t for t in self.tensors if t.producer is None or runs[t.producer].runs]
        tid = {t.id: i for i, t in enumerate(kept_tensors)}
        oid = {op.id: i for i, op in enumerate(kept_ops)}
        tensors = [replace(t, id=tid[t.id], producer=None if t.producer is None else oid[t.producer])
                   for t in kept_tensors]
        ops = [Op(oid[op.id], op.name, op.target, op.phase, tuple(tid[t] for t in op.outputs),
                  replace(runs[op.id], inputs=tuple(tid[t] for t in runs[op.id].inputs),
                          keeps=tuple(tid[t] for t in runs[op.id].keeps),
                          overwrites=None if runs[op.id].overwrites is None else tid[runs[op.id].overwrites]))
               for op in kept_ops]
        return replace(self, tensors=tuple(tensors), ops=tuple(ops), choices=())

    def reordered(self, backward: Sequence[int]) -> Problem:
        """The same problem with its backward ops in the order `backward` (their ids; each once, every
        op after what it reads): ops renumbered, names kept."""
        if sorted(backward) != [op.id for op in self.backward_ops]:
            raise ProblemError("a backward order must list every backward op once")
        order = [op.id for op in self.forward_ops] + list(backward)
        oid = {old: new for new, old in enumerate(order)}
        tensors = tuple(replace(t, producer=None if t.producer is None else oid[t.producer]) for t in self.tensors)
        ops = tuple(replace(self.ops[old], id=new) for new, old in enumerate(order))
        return replace(self, tensors=tensors, ops=ops)

    # ---- JSON ------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": PROBLEM_VERSION,
            "meta": self.meta,
            "tensors": [_tensor_to_dict(t) for t in self.tensors],
            "ops": [op.to_dict() for op in self.ops],
            "choices": [asdict(c) for c in self.choices],
            **({"update": asdict(self.update)} if self.update else {}),
            **({"held": self.held} if self.held else {}),
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
            ops = [Op.from_dict(op) for op in data["ops"]]
            choices = [Choice(c["name"], tuple(c["options"]), tuple(c.get("approximate", ())),
                              tuple(c.get("errors", ())))
                       for c in data.get("choices", ())]
            update = Update(**data["update"]) if data.get("update") is not None else None
        except (KeyError, TypeError) as exc:
            raise ProblemError(f"malformed problem: {exc}") from exc
        return cls(tensors, ops, data.get("meta", {}), choices, update, data.get("held", 0))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Problem:
        return cls.from_dict(json.loads(text))
