"""monet.solver: framework-free problems, schedules, the simulator and the ILP.

Nothing here imports torch: a problem written to JSON anywhere can be solved here.
"""

from .baselines import chen_greedy, chen_sqrt, revolve
from .checkmate import checkmate
from .options import SolveSettings
from .problem import Choice, Impl, Op, Problem, ProblemError, Tensor, Update
from .result import InfeasibleBudgetError, LeastPeak, Solution, SolverFailedError, SolverRecord, format_bytes
from .schedule import Schedule, ScheduleError, keep_all, validate
from .simulate import Replay, simulate
from .solve import FORMULATIONS, least_peak, solve

__all__ = [
    "Choice", "Impl", "InfeasibleBudgetError", "LeastPeak", "Op", "Problem", "ProblemError", "Replay", "Schedule",
    "ScheduleError", "Solution", "SolveSettings", "SolverFailedError", "SolverRecord", "Tensor", "Update",
    "format_bytes", "keep_all", "least_peak", "simulate", "solve", "validate", "FORMULATIONS", "checkmate",
    "chen_greedy", "chen_sqrt", "revolve",
]
