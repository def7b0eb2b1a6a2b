"""monet.schedules: the schedule file format, precomputed schedules loadable by name, and the
problem file (a profiled training step, solved anywhere)."""

from .format import (
           AUTOCAST_DTYPES,
           BUNDLED_DIR,
           COST_MODELS,
           FORMAT,
           VERSION,
           Decisions,
           GraphRecord,
           Prediction,
           ScheduleFile,
           ScheduleFileError,
           SolverRecord,
           bundled_names,
           check_writable,
           load_schedule,
           write_atomic,
           write_json,
)
from .inputs import Inputs, InputSpec
from .optimizer import OptimizerSpec
from .problem_file import (
           PROBLEM_FILE_VERSION,
           PROBLEM_FORMAT,
           ProblemFile,
           ProblemFileError,
           load_problem,
           problem_digest,
)

__all__ = ["AUTOCAST_DTYPES", "BUNDLED_DIR", "COST_MODELS", "FORMAT", "PROBLEM_FILE_VERSION", "PROBLEM_FORMAT",
           "VERSION", "Decisions", "GraphRecord", "InputSpec", "Inputs", "OptimizerSpec", "Prediction", "ProblemFile",
           "ProblemFileError", "ScheduleFile", "ScheduleFileError", "SolverRecord", "bundled_names", "check_writable",
           "load_problem", "load_schedule", "problem_digest", "write_atomic", "write_json"]
