"""monet: train PyTorch models in less memory.

Trace the training step (monet.graph), solve what to keep and what to recompute
under a memory budget (monet.solver), and run the step by that schedule
(MONeTWrapper).
"""

from monet.graph import InputSpec
from monet.schedules import ScheduleFile, ScheduleFileError, load_schedule
from monet.solver import InfeasibleBudgetError

from .api import solve
from .memory import PeakMemory, resident_bytes
from .runtime import ScheduleMismatchError
from .wrapper import MONeTWrapper

__all__ = [
    "InfeasibleBudgetError", "InputSpec", "MONeTWrapper", "PeakMemory", "ScheduleFile", "ScheduleFileError",
    "ScheduleMismatchError", "load_schedule", "resident_bytes", "solve",
]
