"""The schedule file: versioned JSON, validated on load, written atomically.

A schedule file names the graph it was made for (a fingerprint and the list of
its ops), the input and device, the budget and the prediction, how the solver
did, and the decisions: how ops run (each choice's option, and which of those
change gradients), the forward tensors to keep (with their sizes) and the
backward sequence, in which every forward op is a recomputation.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import jsonschema

from monet.errors import MonetError

FORMAT = "monet.schedule"
VERSION = 1
COST_MODELS = ("measured", "analytic")  # how op times were obtained: measured here, or from FLOPs and bytes
BUNDLED_DIR = Path(__file__).parent

DEVICES = ("cpu", "cuda")
INPUT_SCHEMA = {  # the input a schedule or problem was made for (InputSpec's fields)
    "type": "object", "required": ["shape", "dtype", "requires_grad"],
    "properties": {
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
        "dtype": {"type": "string"},
        "requires_grad": {"type": "boolean"},
    },
}

_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["format", "version", "model", "input", "device", "budget", "predicted", "solver",
                 "cost_model", "graph", "schedule"],
    "properties": {
        "format": {"const": FORMAT},
        "version": {"const": VERSION},
        "model": {"type": "string"},
        "input": INPUT_SCHEMA,
        "device": {"enum": list(DEVICES)},
        "budget": {"type": "integer", "minimum": 0},
        "predicted": {
            "type": "object", "required": ["peak", "time", "unconstrained_peak", "unconstrained_time"],
            "properties": {k: {"type": "number", "minimum": 0}
                           for k in ("peak", "time", "unconstrained_peak", "unconstrained_time")},
        },
        "solver": {"type": "object", "required": ["formulation", "status"]},
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
class ScheduleFile:
    """Everything a schedule file holds; `schedule` is in graph names."""

    model: str
    input: dict  # {"shape": [...], "dtype": str, "requires_grad": bool}
    device: str
    budget: int
    predicted: dict  # peak, time, unconstrained_peak, unconstrained_time (bytes, seconds)
    solver: dict
    cost_model: str
    graph: dict  # {"fingerprint": str, "ops": [[name, target, phase], ...]}
    # {"options": {choice: option}, "approximate": {choice: measured relative gradient error},
    #  "saved": {tensor: bytes}, "backward": [op]}
    schedule: dict
    format: str = FORMAT
    version: int = VERSION

    def to_dict(self) -> dict:
        return asdict(self)

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
        except jsonschema.ValidationError as exc:
            where = "/".join(map(str, exc.absolute_path)) or "top level"
            raise ScheduleFileError(f"{source} is corrupt at {where}: {exc.message}") from None
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


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
