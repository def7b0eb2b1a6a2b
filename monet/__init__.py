"""monet: train PyTorch models in less memory.

Trace the training step (monet.graph), solve what to keep and what to recompute
under a memory budget (monet.solver), and run the step by that schedule
(MONeTWrapper). The public names below load on first use, so that
`import monet.solver` stays free of torch.
"""

from importlib import import_module

_EXPORTS = {
    "MONeTWrapper": "monet.wrapper",
    "WithLoss": "monet.loss",
    "backend": "monet.compiler",
    "MonetError": "monet.errors",
    "ScheduleMismatchError": "monet.runtime",
    "solve": "monet.api",
    "wrap_blocks": "monet.blocks",
    "solve_blocks": "monet.blocks",
    "profile": "monet.api",
    "solve_problem_file": "monet.api",
    "PeakMemory": "monet.memory",
    "resident_bytes": "monet.memory",
    "InputSpec": "monet.schedules",
    "ScheduleFile": "monet.schedules",
    "ScheduleFileError": "monet.schedules",
    "load_schedule": "monet.schedules",
    "ProblemFile": "monet.schedules",
    "ProblemFileError": "monet.schedules",
    "load_problem": "monet.schedules",
    "InfeasibleBudgetError": "monet.solver",
    "SolveSettings": "monet.solver",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'monet' has no attribute {name!r}")
