"""The schedule file: versioned JSON, validated on load, written atomically, and sealed by a digest of its
content (an edited prediction or schedule is refused).

A schedule file names the graph it was made for (a fingerprint and the list of
its ops), the input and device (and the torch.autocast dtype, where it was traced under
one; and whether Inductor runs its convolutions channels-last, where monet's backend compiled it so),
the budget and the prediction, how the solver did, and the decisions: how ops run
(each choice's option, and which of those change gradients), the forward tensors to keep
(with their sizes) and the backward sequence, in which every forward op is a recomputation.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jsonschema

from monet.errors import MonetError
from monet.solver import Problem, Schedule, Solution, SolverRecord, keep_all, simulate
from monet.solver.simulate import Replay

from .inputs import INPUT_SCHEMA, Inputs
from .optimizer import OPTIMIZER_SCHEMA, OptimizerSpec

FORMAT = "monet.schedule"
VERSION = 2  # 2: sealed by "digest"
COST_MODELS = ("measured", "analytic")  # how op times were obtained: measured here, or from FLOPs and bytes
BUNDLED_DIR = Path(__file__).parent

DEVICES = ("cpu", "cuda")
AUTOCAST_DTYPES = ("bfloat16", "float16")  # torch.autocast's dtypes a step can be traced under
_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["format", "version", "model", "input", "device", "budget", "predicted", "solver",
                 "cost_model", "graph", "schedule", "digest"],
    "properties": {
        "format": {"const": FORMAT},
        "version": {"const": VERSION},
        "digest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
        "model": {"type": "string"},
        "input": INPUT_SCHEMA,
        "device": {"enum": list(DEVICES)},
        "autocast": {"enum": list(AUTOCAST_DTYPES)},
        "layout_optimization": {"type": "boolean"},
        "optimizer": OPTIMIZER_SCHEMA,
        "budget": {"type": "integer", "minimum": 0},
        "predicted": {
            "type": "object", "required": ["peak", "time", "unconstrained_peak", "unconstrained_time"],
            "properties": {k: {"type": "number", "minimum": 0}
                           for k in ("peak", "time", "unconstrained_peak", "unconstrained_time", "floor")},
        },
        "solver": {
            "type": "object", "required": ["formulation", "status"], "additionalProperties": False,
            "properties": {
                "formulation": {"type": "string"}, "status": {"type": "string"},
                "horizon": {"type": ["integer", "string", "null"]},
                **{k: {"type": ["number", "null"]} for k in ("objective_s", "bound_s", "gap", "solve_time_s")},
                "note": {"type": ["string", "null"]}, "warnings": {"type": "array", "items": {"type": "string"}},
                "implementations": {"type": ["boolean", "null"]}, "approximate_allowed": {"type": ["boolean", "null"]},
                "problem": {"type": ["string", "null"]}, "least": {"type": ["boolean", "null"]},
            },
        },
        "cost_model": {"enum": list(COST_MODELS)},
        "graph": {
            "type": "object", "required": ["fingerprint", "ops"],
            "properties": {
                "fingerprint": {"type": "string"},
                "ops": {"type": "array", "items": {
                    "type": "array", "prefixItems": [{"type": "string"}, {"type": "string"},
                                                     {"enum": ["forward", "backward"]}],
                    "minItems": 3, "maxItems": 3}},
            },
        },
        "schedule": {
            "type": "object", "required": ["saved", "backward"],
            "properties": {
                "options": {"type": "object", "additionalProperties": {"type": "string"}},
                "approximate": {"type": "object", "additionalProperties": {"type": ["number", "null"]}},
                "saved": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
                "backward": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
}


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` atomically (a temporary file in the same folder, then a rename), so that a
    failed or interrupted write leaves nothing half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it; mkstemp's is private (0600)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_writable(path: str | os.PathLike, what: str = "output", *, folder: bool = False) -> Path:
    """Fail now, before any work, if `path` cannot be written: a file path that names a folder (or,
    with `folder`, a folder path that names a file), or a nearest existing folder in which nothing
    can be made (missing folders below it are made when written)."""
    path = Path(path)
    if path.is_dir() and not folder:
        raise ScheduleFileError(f"{what} {str(path)!r} is a folder; give a file path such as {path / 'out.json'}")
    if path.exists() and not path.is_dir() and folder:
        raise ScheduleFileError(f"{what} {str(path)!r} is a file; give a folder")
    existing = path if folder and path.is_dir() else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ScheduleFileError(f"{what} {str(path)!r} cannot be written: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):  # what a write will do (permissions, read-only disks)
            pass
    except OSError as exc:
        raise ScheduleFileError(f"{what} {str(path)!r} cannot be written: {existing}: "
                                f"{exc.strerror or exc}") from None
    return path


def write_json(path: str | os.PathLike, data: object) -> Path:
    """Write `data` as JSON atomically (see write_atomic)."""
    return write_atomic(path, json.dumps(data, indent=1) + "\n")


class ScheduleFileError(MonetError, ValueError):
    """A schedule file that is missing, corrupt, of an unknown version, or that cannot be written."""


@dataclass(frozen=True)
class Prediction:
    """What the simulator predicts for the schedule, and for keeping everything (bytes, seconds)."""

    peak: int
    time: float
    unconstrained_peak: int
    unconstrained_time: float
    floor: int | None = None  # what no schedule frees: parameters, their gradients, buffers and inputs

    @property
    def activation_share(self) -> float | None:
        """The peak's part above the floor over keeping everything's: the share of activation memory."""
        if self.floor is None or self.unconstrained_peak <= self.floor:
            return None
        return (self.peak - self.floor) / (self.unconstrained_peak - self.floor)


@dataclass(frozen=True)
class GraphRecord:
    """The graph a schedule was made for: its fingerprint, its ops as (name, target, phase), and
    the dtypes of the model's parameters (empty in files written before they were recorded)."""

    fingerprint: str
    ops: tuple[tuple[str, str, str], ...]
    param_dtypes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"fingerprint": self.fingerprint, "ops": [list(op) for op in self.ops],
                **({"param_dtypes": list(self.param_dtypes)} if self.param_dtypes else {})}

    @classmethod
    def from_dict(cls, data: dict) -> GraphRecord:
        return cls(data["fingerprint"], tuple(tuple(op) for op in data["ops"]), tuple(data.get("param_dtypes", ())))


@dataclass(frozen=True)
class Decisions:
    """A schedule in graph names: each choice's option (and, for those that change gradients, the
    relative error measured when profiling), the forward tensors kept (with their sizes) and the
    backward sequence, in which every forward op is a recomputation."""

    saved: dict[str, int]
    backward: tuple[str, ...]
    options: dict[str, str] = field(default_factory=dict)
    approximate: dict[str, float | None] = field(default_factory=dict)

    @classmethod
    def of(cls, problem: Problem, schedule: Schedule) -> Decisions:
        options = dict(sorted(schedule.options.items()))
        return cls(saved={t.name: t.bytes for t in sorted((problem.tensors[i] for i in schedule.saved),
                                                          key=lambda t: t.name)},
                   backward=tuple(problem.ops[i].name for i in schedule.backward),
                   options=options,
                   approximate={c: problem.choice_named[c].error(o) for c, o in options.items()
                                if o in problem.choice_named[c].approximate})

    def on(self, problem: Problem) -> Schedule:
        """These decisions as a Schedule of `problem` (ScheduleError if it lacks a name)."""
        return Schedule.from_names(problem, self.saved, self.backward, self.options)

    def to_dict(self) -> dict:
        return {"options": self.options, "approximate": self.approximate, "saved": self.saved,
                "backward": list(self.backward)}

    @classmethod
    def from_dict(cls, data: dict) -> Decisions:
        return cls(dict(data["saved"]), tuple(data["backward"]), dict(data.get("options", {})),
                   dict(data.get("approximate", {})))


@dataclass(frozen=True)
class ScheduleFile:
    """Everything a schedule file holds: which model, input, device and graph it is for, its budget,
    what it is predicted to cost, what made it, and its decisions."""

    model: str
    input: Inputs
    device: str
    budget: int
    predicted: Prediction
    solver: SolverRecord
    cost_model: str
    graph: GraphRecord
    schedule: Decisions
    autocast: str | None = None  # the dtype of the torch.autocast the step was traced and runs under
    optimizer: OptimizerSpec | None = None  # the optimizer whose update the budget and prediction cover
    layout_optimization: bool = False  # Inductor's channels-last convolutions, their copies held (monet.backend)
    format: str = FORMAT
    version: int = VERSION

    @classmethod
    def of(cls, problem: Problem, schedule: Schedule, model: str, *, budget: int, solver: SolverRecord,
           replay: Replay | None = None, unconstrained: Replay | None = None) -> ScheduleFile:
        """Any schedule of `problem` (the ILP's, or a baseline's) as the file MONeTWrapper runs.
        `replay` (of `schedule`) and `unconstrained` (of keep_all(problem)), where the caller has them,
        spare simulating them again."""
        unconstrained = simulate(problem, keep_all(problem)) if unconstrained is None else unconstrained
        replay = simulate(problem, schedule) if replay is None else replay
        meta = problem.meta
        return cls(
            model=model, input=Inputs.from_json(meta["input"]), device=meta["device"], budget=budget,
            predicted=Prediction(replay.peak, replay.time, unconstrained.peak, unconstrained.time, problem.floor),
            solver=solver, cost_model=meta["cost_model"],
            graph=GraphRecord(meta["fingerprint"], tuple((op.name, op.target, op.phase) for op in problem.ops),
                              tuple(sorted({t.dtype for t in problem.tensors if t.role == "param" and t.dtype}))),
            schedule=Decisions.of(problem, schedule), autocast=meta.get("autocast"),
            optimizer=OptimizerSpec.from_dict(meta["optimizer"]) if meta.get("optimizer") else None,
            layout_optimization=bool(meta.get("layout_optimization")))

    @classmethod
    def from_solution(cls, problem: Problem, solution: Solution, model: str, *, unconstrained: Replay | None = None,
                      **record) -> ScheduleFile:
        """The solver's result as a file, from its own replay; `record` adds to its SolverRecord
        (the settings that shaped it, the problem file it came from)."""
        return cls.of(problem, solution.schedule, model, budget=int(solution.budget), solver=solution.record(**record),
                      replay=solution.replay, unconstrained=unconstrained)

    def to_dict(self) -> dict:
        content = self._content()
        return {**content, "digest": schedule_digest(content)}

    def _content(self) -> dict:
        predicted = {k: v for k, v in asdict(self.predicted).items() if v is not None}
        return {"model": self.model, "input": self.input.to_json(), "device": self.device, "budget": self.budget,
                "predicted": predicted, "solver": self.solver.to_dict(), "cost_model": self.cost_model,
                "graph": self.graph.to_dict(), "schedule": self.schedule.to_dict(), "format": self.format,
                "version": self.version, **({"autocast": self.autocast} if self.autocast else {}),
                **({"optimizer": self.optimizer.to_dict()} if self.optimizer else {}),
                **({"layout_optimization": True} if self.layout_optimization else {})}

    def save(self, path: str | os.PathLike) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: object, source: str = "schedule") -> ScheduleFile:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ScheduleFileError(f"{source} is not a monet schedule file (no \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise ScheduleFileError(
                f"{source} has schedule format version {data.get('version')!r}, but this monet reads "
                f"version {VERSION}; re-solve it with `monet solve`"
            )
        try:
            jsonschema.validate(data, _SCHEMA)
            made = cls(model=data["model"], input=Inputs.from_json(data["input"]), device=data["device"],
                       budget=data["budget"], predicted=Prediction(**data["predicted"]),
                       solver=SolverRecord.from_dict(data["solver"]), cost_model=data["cost_model"],
                       graph=GraphRecord.from_dict(data["graph"]), schedule=Decisions.from_dict(data["schedule"]),
                       autocast=data.get("autocast"),
                       optimizer=OptimizerSpec.from_dict(data["optimizer"]) if "optimizer" in data else None,
                       layout_optimization=data.get("layout_optimization", False))
        except jsonschema.ValidationError as exc:
            where = "/".join(map(str, exc.absolute_path)) or "top level"
            raise ScheduleFileError(f"{source} is corrupt at {where}: {exc.message}") from None
        except (TypeError, ValueError) as exc:  # a field the schema leaves open, of the wrong kind
            raise ScheduleFileError(f"{source} is corrupt: {exc}") from None
        if schedule_digest({k: v for k, v in data.items() if k != "digest"}) != data["digest"]:
            raise ScheduleFileError(f"{source} was changed after monet wrote it: its content does not match its "
                                    f"digest ({data['digest'][:19]}...); solve the schedule again")
        return made


def schedule_digest(content: dict) -> str:
    """'sha256:...' of a schedule file's content (all but its digest) as canonical JSON."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def bundled_names() -> list[str]:
    """Names of the precomputed schedules shipped in this package."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.json"))


def load_schedule(source: str | os.PathLike) -> ScheduleFile:
    """Read a schedule from a path, or a bundled schedule by name."""
    path = Path(source)
    if not path.exists() and not path.suffix and (BUNDLED_DIR / f"{path.name}.json").exists():
        path = BUNDLED_DIR / f"{path.name}.json"
    if not path.exists():
        names = ", ".join(bundled_names()) or "none"
        raise ScheduleFileError(f"schedule {str(source)!r} not found: no such file, and no bundled schedule of "
                                f"that name (bundled: {names})")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScheduleFileError(f"{path} is not valid JSON ({exc}); the file is corrupt") from None
    return ScheduleFile.from_dict(data, str(path))
