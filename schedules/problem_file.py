"""The problem file: a traced and profiled training step, to solve anywhere.

`monet profile` (or `monet.profile`) traces a model at an input on the machine it will train
on, measures every op (and every other way an op can run), and writes the result here:
versioned JSON, validated on load, written atomically, and sealed by a digest of its content.
`monet solve --problem` and `monet pareto --problem` solve it on any machine; the model's code
is not needed, nor torch (see monet.api.solve_problem_file). A schedule solved from it
names the graph's fingerprint, so MONeTWrapper runs it only on the model it was profiled from.

Layout (version 1):

    {"format": "monet.problem", "version": 1,
     "meta": {"model", "input": (as schedules.inputs writes it), "device", "cost_model",
              "torch", "fingerprint", "autocast"?, ...},  # how and where it was profiled; the graph's hash
     "implementations": bool,                     # were other ways to run ops profiled
     "digest": "sha256:...",                      # of the problem (meta included), canonical JSON
     "problem": {"version", "tensors", "ops", "choices", "update"?, "held"?}}   # solver.Problem.to_dict() less meta
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import jsonschema

from monet.solver import Problem
from monet.solver.problem import PHASES, PROBLEM_VERSION, ROLES, ProblemError

from .format import AUTOCAST_DTYPES, COST_MODELS, DEVICES, ScheduleFileError, write_atomic
from .format import FORMAT as SCHEDULE_FORMAT
from .inputs import INPUT_SCHEMA, Inputs
from .optimizer import OPTIMIZER_SCHEMA

PROBLEM_FORMAT = "monet.problem"
PROBLEM_FILE_VERSION = 1

_INT = {"type": "integer", "minimum": 0}
_IDS = {"type": "array", "items": _INT}
_TIME = {"type": "number", "minimum": 0}
_IMPL = {
    "type": "object", "required": ["inputs", "time"], "additionalProperties": False,
    "properties": {
        "inputs": _IDS, "time": _TIME, "workspace": _INT, "runs": {"type": "boolean"},
        "rerun_time": {"type": ["number", "null"], "minimum": 0}, "keeps": _IDS,
        "recomputable": {"type": ["boolean", "null"]}, "overwrites": {"type": ["integer", "null"], "minimum": 0},
    },
}
_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["format", "version", "meta", "implementations", "digest", "problem"],
    "properties": {
        "format": {"const": PROBLEM_FORMAT},
        "version": {"const": PROBLEM_FILE_VERSION},
        "meta": {
            "type": "object", "required": ["model", "input", "device", "cost_model", "torch", "fingerprint"],
            "properties": {
                "model": {"type": "string"},
                "input": INPUT_SCHEMA,
                "device": {"enum": list(DEVICES)},
                "autocast": {"enum": list(AUTOCAST_DTYPES)},
                "optimizer": OPTIMIZER_SCHEMA,
                "cost_model": {"enum": list(COST_MODELS)},
                "torch": {"type": "string"},
                "fingerprint": {"type": "string", "minLength": 1},
            },
        },
        "implementations": {"type": "boolean"},
        "digest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
        "problem": {
            "type": "object", "required": ["version", "tensors", "ops", "choices"], "additionalProperties": False,
            "properties": {
                "version": {"const": PROBLEM_VERSION},
                "tensors": {"type": "array", "items": {
                    "type": "object", "required": ["id", "name", "bytes", "role"], "additionalProperties": False,
                    "properties": {
                        "id": _INT, "name": {"type": "string"}, "bytes": _INT, "role": {"enum": list(ROLES)},
                        "producer": {"type": ["integer", "null"], "minimum": 0},
                        "shape": {"type": ["array", "null"], "items": _INT},
                        "dtype": {"type": ["string", "null"]}, "keep_time": _TIME,
                    },
                }},
                "ops": {"type": "array", "items": {
                    "type": "object", "required": ["id", "name", "target", "phase", "inputs", "outputs", "time"],
                    "additionalProperties": False,
                    "properties": {
                        "id": _INT, "name": {"type": "string"}, "target": {"type": "string"},
                        "phase": {"enum": list(PHASES)}, "inputs": _IDS, "outputs": _IDS, "time": _TIME,
                        "workspace": _INT, "recomputable": {"type": "boolean"}, "runs": {"type": "boolean"},
                        "choice": {"type": ["string", "null"]}, "others": {"type": "array", "items": _IMPL},
                        "rerun_time": {"type": ["number", "null"], "minimum": 0}, "keeps": _IDS,
                        "overwrites": {"type": ["integer", "null"], "minimum": 0},
                    },
                }},
                "update": {"type": "object", "required": ["state", "workspace"], "additionalProperties": False,
                           "properties": {"state": _INT, "workspace": _INT}},
                "held": _INT,
                "choices": {"type": "array", "items": {
                    "type": "object", "required": ["name", "options"], "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string"},
                        "options": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                        "approximate": {"type": "array", "items": {"type": "string"}},
                        "errors": {"type": "array", "items": {"type": "number"}},
                    },
                }},
            },
        },
    },
}


class ProblemFileError(ScheduleFileError):
    """A problem file that is missing, corrupt, changed since it was written, or of another version."""


def problem_digest(problem: Problem) -> str:
    """'sha256:...' of the problem (its meta included) as canonical JSON: the same problem, the same digest."""
    text = json.dumps(problem.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ProblemFile:
    """A profiled training step: the framework-free `problem` (its `meta` says which model, input,
    device and cost model, and the graph's fingerprint), and whether `implementations` (other ways
    to run ops) were profiled."""

    problem: Problem
    implementations: bool = True
    format: str = PROBLEM_FORMAT
    version: int = PROBLEM_FILE_VERSION

    def __post_init__(self):
        missing = [k for k in ("model", "input", "device", "cost_model", "fingerprint") if k not in self.problem.meta]
        if missing:
            raise ProblemFileError(f"the problem's meta lacks {', '.join(missing)}; profile it with monet.profile")
        try:  # meta as it reads back from the file (lists for tuples), so that a loaded file equals its source
            meta = json.loads(json.dumps(self.problem.meta, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ProblemFileError(f"the problem's meta is not plain JSON data: {exc}") from None
        if meta != self.problem.meta:
            object.__setattr__(self, "problem", replace(self.problem, meta=meta))

    @property
    def meta(self) -> dict:
        return self.problem.meta

    @property
    def model(self) -> str:
        return self.meta["model"]

    @property
    def input(self) -> Inputs:
        return Inputs.from_json(self.meta["input"])

    @property
    def device(self) -> str:
        return self.meta["device"]

    @property
    def cost_model(self) -> str:
        return self.meta["cost_model"]

    @property
    def fingerprint(self) -> str:
        return self.meta["fingerprint"]

    @property
    def digest(self) -> str:
        return problem_digest(self.problem)

    def to_dict(self) -> dict:
        problem = self.problem.to_dict()
        meta = copy.deepcopy(problem.pop("meta"))  # the caller's to change, not this problem's
        return {"format": self.format, "version": self.version, "meta": meta,
                "implementations": self.implementations, "digest": problem_digest(self.problem),
                "problem": problem}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the file atomically (temporary file, then rename), with the umask's mode."""
        return write_atomic(path, json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")

    @classmethod
    def from_dict(cls, data: object, source: str = "problem") -> ProblemFile:
        if isinstance(data, dict) and data.get("format") == SCHEDULE_FORMAT:
            raise ProblemFileError(f"{source} is a monet schedule, not a problem file; a schedule runs in "
                                   "MONeTWrapper, a problem file (from `monet profile`) is what `--problem` solves")
        if not isinstance(data, dict) or data.get("format") != PROBLEM_FORMAT:
            raise ProblemFileError(f"{source} is not a monet problem file (no \"format\": \"{PROBLEM_FORMAT}\")")
        version = data.get("version")
        if version != PROBLEM_FILE_VERSION:
            if isinstance(version, int) and not isinstance(version, bool) and version > PROBLEM_FILE_VERSION:
                raise ProblemFileError(f"{source} has problem format version {version}, newer than this monet "
                                       f"reads (version {PROBLEM_FILE_VERSION}); update monet to solve it")
            raise ProblemFileError(f"{source} has problem format version {version!r}, but this monet reads "
                                   f"version {PROBLEM_FILE_VERSION}; profile the model again with `monet profile`")
        try:
            jsonschema.validate(data, _SCHEMA)
            Inputs.from_json(data["meta"]["input"])
        except jsonschema.ValidationError as exc:
            where = "/".join(map(str, exc.absolute_path)) or "top level"
            raise ProblemFileError(f"{source} is corrupt at {where}: {exc.message}") from None
        except ValueError as exc:
            raise ProblemFileError(f"{source} is corrupt at meta/input: {exc}") from None
        try:
            problem = Problem.from_dict({**data["problem"], "meta": data["meta"]})
        except ProblemError as exc:
            raise ProblemFileError(f"{source} holds an inconsistent problem: {exc}") from None
        made = cls(problem, data["implementations"])
        if made.digest != data["digest"]:
            raise ProblemFileError(f"{source} was changed after monet wrote it: its content does not match its "
                                   f"digest ({data['digest'][:19]}...); profile the model again")
        return made


def load_problem(source: str | os.PathLike) -> ProblemFile:
    """Read and check a problem file (as `monet profile` writes). Needs neither torch nor the model."""
    path = Path(source)
    if not path.is_file():
        raise ProblemFileError(f"problem file {str(source)!r} not found")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProblemFileError(f"{path} is not valid JSON ({exc}); the file is corrupt") from None
    return ProblemFile.from_dict(data, str(path))
