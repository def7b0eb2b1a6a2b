"""monet.schedules: the schedule file format, and precomputed schedules loadable by name."""

from .format import (
           BUNDLED_DIR,
           FORMAT,
           VERSION,
           ScheduleFile,
           ScheduleFileError,
           bundled_names,
           load_schedule,
           write_atomic,
           write_json,
)

__all__ = ["BUNDLED_DIR", "FORMAT", "VERSION", "ScheduleFile", "ScheduleFileError", "bundled_names", "load_schedule",
           "write_atomic", "write_json"]
