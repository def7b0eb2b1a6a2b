"""The competitors of a benchmark: one trainable module each, all over copies of one model.

Every competitor is built from a deep copy of the same model (same weights) and trains the
same way (forward, loss, backward, SGD step), so that `monet.training.compare_training`
can measure them side by side:

- `eager`: plain PyTorch;
- `checkpoint-blocks`: `torch.utils.checkpoint` (non-reentrant) around each repeated block;
- `checkpoint-sequential`: `checkpoint_sequential` over the model's chain in sqrt(n) segments;
- `torch.compile`: Inductor, with `torch._functorch.config.activation_memory_budget` set to
  the budget's share of the unconstrained peak while the graph is partitioned;
- `chen-sqrt`, `checkmate`: those schedules of monet's problem, run by monet's runtime;
- `monet-checkpointing`, `monet`: monet's ILP without and with operator alternatives;
- `monet-compiled`: `torch.compile(model, backend=monet.backend(budget))`: monet's ILP solved on the
  compiled region's joint graph (profiled anew), its forward and backward compiled by Inductor; at
  the `least` budget, `monet.backend("least")`: the least peak of the region's own problem; at 100 %
  or more, `monet.backend("100%")`: the region's own unconstrained peak.

The four schedule competitors are the strategies of `monet.solver.strategies` by those names (the
registry `monet pareto` sweeps); the others are not schedules and live here.

A competitor that cannot be built (no schedule within the budget, a compiler failure) is an
`Entry` without a module whose status says why.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import monet
from benchmarks.models import BenchModel
from monet.schedules import ScheduleFile
from monet.solver import InfeasibleBudgetError, Problem, Schedule, SolverFailedError, SolveSettings
from monet.solver.strategies import STRATEGIES
from monet.wrapper import MONeTWrapper

FAMILIES = ("eager", "checkpoint-blocks", "checkpoint-sequential", "torch.compile", "chen-sqrt", "checkmate",
            "monet-checkpointing", "monet", "monet-compiled")
SCHEDULES = ("chen-sqrt", "checkmate", "monet-checkpointing", "monet")  # strategies of monet.solver.strategies
BUDGETED = ("torch.compile", *(family for family in SCHEDULES if STRATEGIES[family].budgeted), "monet-compiled")


@dataclass
class Entry:
    """One competitor at one budget (None: it takes none), in bytes; `name` says both
    ("monet@50%": the budget as a share of the unconstrained peak monet predicts);
    `predicted` is (peak, seconds) for schedules."""

    name: str
    family: str
    budget: int | None
    module: nn.Module | None
    status: str
    predicted: tuple[int, float] | None = None
    solve_time: float | None = None


def checkpoint_blocks(model: nn.Module, blocks: list[nn.Module]) -> nn.Module:
    """`model` with each block's forward run under non-reentrant torch.utils.checkpoint."""
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block.forward)
    return model


def _checkpointed(forward: Callable, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


class CheckpointSequential(nn.Module):
    """`model`'s forward as checkpoint_sequential over `chain` in round(sqrt(n)) segments."""

    def __init__(self, model: nn.Module, chain: list[Callable]):
        super().__init__()
        self.model, self.chain = model, chain
        self.segments = max(1, round(math.sqrt(len(chain))))

    def forward(self, x):
        return checkpoint_sequential(self.chain, self.segments, x, use_reentrant=False)


def compiled(model: nn.Module, share: float, example: Callable[[nn.Module], None]) -> nn.Module:
    """torch.compile (Inductor) with activation_memory_budget = `share` while its partitioner
    runs; `example(module)` runs one training step, so the compilation happens here. Each share
    gets its own backend function, so Dynamo compiles every copy anew instead of reusing
    another budget's graphs."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        with torch._functorch.config.patch(activation_memory_budget=share):
            return compile_fx(gm, example_inputs)

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    module = torch.compile(model, backend=backend)
    with torch._functorch.config.patch(activation_memory_budget=share):
        example(module)
    return module


def monet_compiled(model: nn.Module, budget: int | str, example: Callable[[nn.Module], None],
                   settings: SolveSettings, cost_model: str) -> tuple[nn.Module, ScheduleFile]:
    """torch.compile with monet's backend at `budget` (bytes, or 'least'); `example(module)` runs one training step,
    so the profiling, the solve and the compilation happen here (a solver error is raised as itself,
    not as Dynamo's wrapper of it). The schedule file is the first region's: the benchmark models
    compile to one."""
    backend = monet.backend(budget, settings, cost_model=cost_model, progress=False)
    module = torch.compile(model, backend=backend)
    try:
        example(module)
    except torch._dynamo.exc.BackendCompilerFailed as exc:
        raise exc.inner_exception from exc
    if not backend.regions:
        raise RuntimeError("torch.compile compiled no training region")
    return module, backend.regions[0]


def build(bench: BenchModel, model: nn.Module, problem: Problem, full_peak: int, budgets: list[int], *,
          starts: dict[int, Schedule] | None = None, least: int | None = None,
          families: tuple[str, ...] = FAMILIES, time_limit: float,
          example: Callable[[nn.Module], None], cost_model: str = "measured",
          log: Callable[[str], None] = print) -> list[Entry]:
    """Every competitor in `families`, over deep copies of `model`, at each budget for those that
    take one. `problem` is the model's traced problem, whose keep-all schedule peaks at `full_peak`;
    `starts` gives schedules (of monet's joint search) that fit some budgets, where it starts. `least`,
    the least peak monet's search found on `problem`, is a budget that monet-compiled replaces by its
    own least (`monet.backend("least")`: its region's problem counts Inductor's fusions), and so is a
    budget of `full_peak` or more, by its own unconstrained one (`monet.backend("100%")`: its region
    also holds Inductor's channels-last copies, so `full_peak` can bind there; torch.compile gets 1.0)."""
    starts = starts or {}
    shape = tuple(problem.meta["input"]["shape"])
    model_name = type(model).__name__
    alone: dict[int, Schedule] = {}  # checkpointing's schedule per budget: else where the joint search starts

    def planned(family: str, budget: int | None = None) -> tuple[nn.Module, ScheduleFile]:
        """A schedule strategy of the solver's registry, run by monet's runtime."""
        start = (starts.get(budget) or alone.get(budget)) if family == "monet" else None
        made = STRATEGIES[family].run(problem, budget, SolveSettings(time_limit=time_limit), start=start)
        if family == "monet-checkpointing":
            alone[budget] = made.schedule
        file = ScheduleFile.of(problem, made.schedule, model_name, budget=full_peak if budget is None else budget,
                               solver=made.solver)
        return MONeTWrapper(copy.deepcopy(model), file, shape), file

    def sequential() -> tuple[nn.Module, None]:
        if bench.chain is None:
            raise NotApplicable("the model is not a chain (skip connections cross every cut)")
        copied = copy.deepcopy(model)
        return CheckpointSequential(copied, bench.chain(copied)), None

    def blocks() -> tuple[nn.Module, None]:
        copied = copy.deepcopy(model)
        return checkpoint_blocks(copied, bench.blocks(copied)), None

    makers: dict[str, Callable[..., tuple[nn.Module, ScheduleFile | None]]] = {
        "eager": lambda: (copy.deepcopy(model), None),
        "checkpoint-blocks": blocks,
        "checkpoint-sequential": sequential,
        "torch.compile": lambda b: (compiled(copy.deepcopy(model), min(1.0, b / full_peak), example), None),
        "monet-compiled": lambda b: monet_compiled(copy.deepcopy(model), b, example,
                                                   SolveSettings(time_limit=time_limit), cost_model),
        **{family: functools.partial(planned, family) for family in SCHEDULES},
    }
    if unknown := [f for f in families if f not in makers]:
        raise ValueError(f"unknown competitors {unknown}; choose from {', '.join(FAMILIES)}")
    entries = []
    for family in families:
        for budget in budgets if family in BUDGETED else [None]:
            if family == "monet-compiled" and budget == least:
                budget = "least"
            elif family == "monet-compiled" and budget is not None and budget >= full_peak:
                budget = "100%"
            name = (family if budget is None else f"{family}@{budget}" if isinstance(budget, str)
                    else f"{family}@{100 * budget / full_peak:.3g}%")
            entries.append(_entry(name, family, budget, makers[family]))
            log(f"{name}: {entries[-1].status}")
    return entries


class NotApplicable(Exception):
    """The competitor does not apply to this model."""


def _entry(name: str, family: str, budget: int | str | None,
           make: Callable[..., tuple[nn.Module, ScheduleFile | None]]) -> Entry:
    """Build one competitor; a failure to build is its row's status, not a crash of the benchmark.
    A budget given as text ('least', '100%') is recorded as the bytes its schedule file was solved at
    (None where none was)."""
    known = None if isinstance(budget, str) else budget
    try:
        module, made = make() if budget is None else make(budget)
    except NotApplicable as exc:
        return Entry(name, family, known, None, f"n/a: {exc}")
    except InfeasibleBudgetError as exc:
        return Entry(name, family, known, None, f"infeasible: {exc}")
    except SolverFailedError as exc:
        return Entry(name, family, known, None, f"no schedule: {exc}")
    except Exception as exc:  # noqa: BLE001 - a compiler or runtime failure is a result to report
        return Entry(name, family, known, None, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    if made is None:
        return Entry(name, family, known, module, "ok")
    return Entry(name, family, made.budget if isinstance(budget, str) else budget, module, made.solver.status,
                 (made.predicted.peak, made.predicted.time), made.solver.solve_time_s)
