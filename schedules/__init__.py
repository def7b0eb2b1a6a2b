"""monet.schedules: the schedule file format, and precomputed schedules loadable by name."""

from .format import (
           FORMAT,
           VERSION,
           ScheduleFile,
           ScheduleFileError,
           bundled_names,
           load_schedule,
           write_atomic,
           write_json,
)

__all__ = ["FORMAT", "VERSION", "ScheduleFile", "ScheduleFileError", "bundled_names", "load_schedule", "write_atomic",
           "write_json"]
