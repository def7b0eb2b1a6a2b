"""One entry point for every formulation: a schedule within a budget, or the least peak."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable

import numpy as np

from .beside import Beside
from .chain import Chained, chain_schedules, find_chain
from .compact import Compact
from .formulation import Formulation
from .general import General
from .heuristics import (
    Start,
    fastest_kernels,
    fastest_options,
    lean_options,
    rebuildable_options,
    rerun_options,
    warm_starts,
)
from .options import SolveSettings, settings_of
from .polish import SECONDS, neighbourhood_search
from .problem import Problem
from .result import InfeasibleBudgetError, LeastPeak, Solution, SolverFailedError, format_bytes
from .schedule import Schedule, ScheduleError, keep_all
from .simulate import Replay, simulate
from .stages import Stages

FORMULATIONS = ("auto", "compact", "general")
GENERAL_UP_TO = 40  # forward ops; "auto" poses smaller problems without choices to make in the general formulation
HORIZONS = (None, 120, 80, 60, 40, 30, 20, 15, 10)
START_SHARE = 0.1  # of a solve's time limit: lengthening the horizon for a heuristic start stops past it
START_CAP = 0.25  # of a solve's time limit: the first search for a heuristic start stops past it (on a
# 32-layer Llama it took 25 s, twice, of a 20 s limit)
CHAIN_SHARE = 0.1  # of a solve's time limit: the chain's schedules past the first option set's stop past it
CHAIN_CAP = 0.5  # of a solve's time limit: past it, no more chain schedules (but the first per-block one)
STALL_SHARE = 1 / 6  # of a ladder rung's share: a rung that finds nothing better for so long stops (a third
# left MONeT's UNet at 5 GB, 300 s, at 131,434 units; a sixth hands the time to a neighbourhood search sooner)
STALL_GAP = 0.01  # of the step time: the ladder's last rung stops where it stalls only with its gap above this
RERUN_SLOTS = 2100  # "auto" horizon: the longest one whose (op, stage) rerun pairs stay within this

# progress(stage, done, total, detail): what the solver is doing, for a progress display. `total` is
# None while the length of a stage is unknown; while HiGHS runs, `done` and `total` are seconds
# (elapsed and the time limit) and `detail` says the best schedule so far, its gap and the time left.
Progress = Callable[[str, float, float | None, str], None]


def _quiet(stage: str, done: float, total: float | None, detail: str) -> None:
    """The progress callback when none is given."""


def auto_horizon(problem: Problem) -> int | None:
    """The longest horizon (None: unbounded) whose rerun windows have at most RERUN_SLOTS
    (op, stage) pairs: the compact formulation's size grows with them."""
    for horizon in HORIZONS:
        if Stages(problem, horizon).rerun_slots <= RERUN_SLOTS:
            return horizon
    return HORIZONS[-1]


def _pose(problem: Problem, settings: SolveSettings) -> tuple[str, Problem, dict[str, str]]:
    """(formulation, the problem it is posed on, fixed options): `problem` restricted to the fixed
    options (without implementations, every choice is fixed to PyTorch's own option)."""
    formulation = settings.formulation
    fixed = _fixed(problem, settings)
    if formulation not in FORMULATIONS:
        raise ValueError(f"formulation {formulation!r} is not one of {', '.join(FORMULATIONS)}")
    if not settings.implementations:
        fixed = {c.name: fixed.get(c.name, c.options[0]) for c in problem.choices}
    if formulation == "auto":
        choosing = len(fixed) < len(problem.choices)
        formulation = "general" if len(problem.forward_ops) <= GENERAL_UP_TO and not choosing else "compact"
    return formulation, problem.restrict(fixed), fixed


def _fixed(problem: Problem, settings: SolveSettings) -> dict[str, str]:
    """`settings.options` (choice -> option fixed), checked against `problem`'s choices."""
    fixed = dict(settings.options or {})
    unknown = [c for c in fixed if c not in problem.choice_named]
    if unknown:
        raise ValueError(f"unknown choices {unknown[:3]}: this problem's choices are named like "
                         f"{[c.name for c in problem.choices[:3]]}")
    for name, option in fixed.items():
        choice = problem.choice_named[name]
        if option not in choice.options:
            raise ValueError(f"choice {name!r} has no option {option!r}; its options are {list(choice.options)}")
        if option in choice.approximate and not settings.allow_approximate:
            raise ValueError(f"option {option!r} of {name!r} changes gradients; allow approximate options to use it")
    return fixed


def _start(posed: Problem, budget: int | None, option_sets: list[dict[str, str]], horizon: int | None | str,
           report: Callable[[float, float | None, str], None] = lambda *_: None,
           incumbent: Schedule | None = None, until: float | None = None,
           first: float | None = None) -> tuple[int | None, Start | None]:
    """The horizon to pose the formulation with, and the heuristic schedule to start from (see warm_starts).
    An "auto" horizon that admits no heuristic schedule within the budget is lengthened until one does
    (or, past `until`, a time.perf_counter() deadline, no longer: each try simulates hundreds of schedules,
    and the solver needs the time), and then until it admits `incumbent` (the best schedule so far, of
    `posed`'s ids: a longer solve starts from it). The first search stops at `first`, a deadline too, with
    what it has found by then. `report(done, total, detail)` hears of each horizon tried."""
    if horizon != "auto":
        report(0, None, "")
        return horizon, warm_starts(posed, budget, option_sets, horizon, first)
    chosen = auto_horizon(posed)
    longer = list(reversed(HORIZONS[:HORIZONS.index(chosen)]))
    report(0, 1 + len(longer), _horizon_text(chosen))
    found = warm_starts(posed, budget, option_sets, chosen, first)
    for tried, horizon in enumerate(longer, 1):
        if found:
            break
        if until is not None and time.perf_counter() > until:
            report(tried, 1 + len(longer), f"none fits with {_horizon_text(chosen)}; no time left to try longer ones")
            break
        report(tried, 1 + len(longer), f"none fits with {_horizon_text(chosen)}; trying {_horizon_text(horizon)}")
        found = warm_starts(posed, budget, option_sets, horizon)
        chosen = horizon if found else chosen
    if incumbent is not None and not Stages(posed, chosen).admits(incumbent):
        chosen = next((h for h in reversed(HORIZONS[:HORIZONS.index(chosen)]) if Stages(posed, h).admits(incumbent)),
                      None)
        report(len(longer), 1 + len(longer), f"{_horizon_text(chosen)}, which the best schedule so far needs")
        found = warm_starts(posed, budget, option_sets, chosen) or found
    return chosen, found


def _unpose(schedule: Schedule, posed: Problem, problem: Problem, fixed: dict[str, str]) -> Schedule:
    """A schedule of the posed problem as one of `problem`, running ops as `fixed` says where it names no option."""
    options = {c: o for c, o in {**fixed, **schedule.options}.items() if problem.choice_named[c].options[0] != o}
    return schedule.remap(posed, problem, options)


def _as_start(formulation: Formulation, schedule: Schedule, replay: Replay) -> Start:
    """A schedule found before (of the posed problem's ids) as the compact formulation's starting point."""
    tensor_win, op_win = formulation.stages.windows  # unsaved tensors whose op cannot rerun are not made
    problem = formulation.problem
    dropped = frozenset(t for t in tensor_win if t not in schedule.saved and problem.tensors[t].producer in op_win
                        and schedule.impl(problem, problem.ops[problem.tensors[t].producer]).recomputable)
    return Start(dropped, dict(schedule.options), schedule, replay)


def _general_warm(formulation: General, problem: Problem, fixed: dict[str, str],
                  fitting: list[tuple[Schedule, Replay]], found: Start | None) -> dict[int, float] | None:
    """The general formulation's starting values: the fastest of the schedules so far (`fitting`, of
    `problem`) that run ops as `fixed` says, and the heuristic's (`found`, of the posed problem), that
    its horizon admits."""
    posed = formulation.problem
    same = [(replay.time, schedule.remap(problem, posed)) for schedule, replay in fitting
            if _runs_as(schedule, problem, fixed)]
    starts = sorted(same + ([(found.replay.time, found.schedule)] if found else []), key=lambda pair: pair[0])
    return next((values for _, schedule in starts for values in [formulation.warm_from(schedule)]
                 if values is not None), None)


def _runs_as(schedule: Schedule, problem: Problem, fixed: dict[str, str]) -> bool:
    """Whether `schedule` (of `problem`) runs ops as `fixed` says."""
    return all(schedule.options.get(c, problem.choice_named[c].options[0]) == o for c, o in fixed.items())


def _horizon_text(horizon: int | None) -> str:
    return "reruns at any distance" if horizon is None else f"reruns at most {horizon} stages ahead"


def _formulate(kind: str, posed: Problem, budget: int | None, settings: SolveSettings, fixed: dict[str, str],
               horizon: int | None) -> Formulation:
    """The `kind` formulation ("compact" or "general") of `posed` within `budget` (None: the least peak)."""
    if kind == "compact":
        return Compact(posed, budget, allow_approximate=settings.allow_approximate, options=fixed, horizon=horizon)
    return General(posed, budget, horizon, allow_approximate=settings.allow_approximate, options=fixed)


def solve(problem: Problem, budget: int, settings: SolveSettings | None = None, *, start: Schedule | None = None,
          progress: Progress | None = None, unconstrained: Replay | None = None, **changes) -> Solution:
    """The fastest schedule whose replayed peak stays within `budget` bytes, solved as `settings`
    (a SolveSettings; default: SolveSettings()) say, with `changes` to them as keyword arguments
    (`solve(problem, budget, time_limit=10)`).

    `implementations` lets the solver choose how ops run (the problem's choices) jointly with
    what to keep; off, every choice takes its first option (checkpointing alone). Options that
    change gradients are only considered with `allow_approximate`. `options` (choice -> option)
    fixes some choices, whatever the other settings.
    `formulation`: "compact" (each tensor rebuilt at most once; scales), "general" (any number of
    reruns; grows as tensors x stages) or "auto" (general for graphs of up to GENERAL_UP_TO forward
    ops with nothing to choose, else compact); both choose implementations. `horizon` bounds how
    early an op may rerun, in stages (None: unbounded; "auto": as long as the problem's size allows).
    A list of horizons (e.g. [15, None]), of formulations (e.g. ["compact", "general"]), or of both
    in step, solves at each rung in turn, each on an equal share of the time left and started from
    the best schedule so far, and returns the last, which is never slower; a rung before the last
    whose search finds no better schedule for STALL_SHARE of its share stops and leaves the rest to
    the rungs after it; the last stops so too where its gap is still over STALL_GAP, and leaves the rest
    to a neighbourhood search, as `polish` would (HiGHS's search of the whole ILP rarely finds more there).
    The solver starts from the fastest of Chen's greedy schedules that fits (or the fastest one shaved to fit),
    with ops run as PyTorch runs them, in their leanest way or in the way they rerun fastest, or from `start` (a
    schedule of this problem) where that fits and is faster; where none fits, from the first schedule that a
    least-peak search finds within the budget (on up to half the time left; from `start` where it peaks lower
    than the heuristics' schedules, and in a ladder from the lowest peak an earlier rung reached); when the
    compact formulation chooses implementations it first solves checkpointing alone on a third of the time limit
    and starts from that (in a ladder, at the first rung only: later rungs start from what beat it), where a
    heuristic schedule of checkpointing alone fits (without one, that third went to a search that rarely found
    any: a BERT Adam step at 50 % ended heuristic, +34 %, at 15 s; now +11.5 %); when the general formulation
    chooses implementations whose options trade time for workspace (convolution algorithms:
    heuristics.fastest_kernels), it first solves with the fastest of them fixed on a third of the time limit and
    starts from that where faster (in a ladder, at general rungs with reruns at any distance only).
    It stops when the predicted step time is proven within `gap` (relative) of the best possible in the
    formulation, or at `time_limit` seconds with the best schedule found and its proven gap (HiGHS
    can overrun it on the largest problems: docs/limits.md). Same input, same seed: same schedule, unless
    the time limit cuts the search.
    On a model whose forward repeats a block (solver/chain.py), the chain's schedules (per-block, selective and
    Chen's checkpointing, Rotor's) stand where the search finds nothing faster; where no rerun horizon of the
    settings poses per-block checkpointing, at and below its peak they are returned without the ILP
    (formulation "chain", _beyond_horizon).
    When the search finds no schedule in time but a heuristic one fits, that one is returned
    (status "heuristic", with a `note` on what would help). The simulator judges HiGHS's answer:
    where they disagree (HiGHS calls the ILP infeasible after accepting a start that is a solution
    of it; its schedule replays over the budget or at another step time than it priced; its bound
    exceeds a solution it accepted), the solution says so in `warnings` and is not "optimal" (a
    schedule over the budget is never returned). Raises InfeasibleBudgetError (stating
    the least peak; at once, before any search, where the budget is below what every schedule holds) when no
    schedule of the formulation fits, and SolverFailedError when time runs
    out before any schedule is found (stating the least peak found, a budget from which a schedule
    is sure, and that more time may help; finding these takes up to another `time_limit`).
    With `workers` > 1, neighbourhood searches run beside the search in processes of their own for the
    whole time limit (solver/beside.py), from each faster schedule the search finds; the search goes its
    own way (so it finds what it finds alone, on its own core), and the fastest of all is returned (a
    worker's as the general formulation's, with a note). `polish` keeps a share of the time
    limit for one after the search instead.
    `solver_log` shows HiGHS's log; `progress` (see Progress) hears what the solver is doing.
    `unconstrained`, the replay of keep_all(problem) where the caller has it, spares simulating it again.
    Ctrl-C (KeyboardInterrupt) stops the solver within a second.
    """
    settings, began, progress = settings_of(settings, **changes), time.perf_counter(), progress or _quiet
    if budget < max(problem.floor, problem.update_peak or 0):  # known without a search
        raise InfeasibleBudgetError(budget, None, settings.formulation, problem.floor, problem.update_peak)
    baseline = keep_all(problem, _fixed(problem, settings))
    baseline = (baseline, unconstrained if unconstrained is not None and not settings.options
                else simulate(problem, baseline))
    kept = _kept(problem, budget, settings, baseline, began)
    if kept is not None:
        return kept
    workers = settings.workers - 1
    chained = _chained(problem, budget, settings, progress, began)
    spent = time.perf_counter() - began if chained.checkpointed is not None else 0.0  # the chain's time comes off
    searching = settings.but(time_limit=max(1.0, settings.time_limit * (1 - settings.polish) - spent))
    beyond = _beyond_horizon(problem, settings, chained)
    given = simulate(problem, start) if start is not None else None
    if given is not None and given.peak <= budget:  # a budget the start meets is never refused
        chained = dataclasses.replace(chained, schedules=(*chained.schedules, (start, given)))
    if beyond and budget < chained.schedules[0][1].peak and not chained.within(budget):
        least = chained.schedules[0]
        raise InfeasibleBudgetError(budget, LeastPeak(least[1].peak, 0, least[0], None, least[1].peak), "chain",
                                    problem.floor)
    if beyond and budget <= chained.checkpointed[1].peak and chained.within(budget):
        return _chain_solution(chained, budget, began)
    chained = chained.within(budget)
    with (Beside(problem, budget, settings, workers, settings.time_limit) if workers
          else contextlib.nullcontext()) as beside:
        if isinstance(settings.horizon, (list, tuple)) or isinstance(settings.formulation, (list, tuple)):
            solution = _ladder(problem, budget, searching, start, progress, baseline, beside, chained)
        else:
            solution = _solve(problem, budget, searching, start, progress, baseline, explain=True, beside=beside,
                              chained=chained)
        # the search stopped early without a proof: a ladder's last rung that stalled (STALL_GAP), whether or not
        # the simulator confirmed its answer (MONeT's UNet at 5 GB ended "unverified" so at 126 s of 300, unpolished)
        stalled = solution.status != "optimal" and began + settings.time_limit - time.perf_counter() > SECONDS
        solution = _fastest_beside(problem, solution, beside)
        if settings.polish or stalled:
            solution = _polished(problem, budget, settings, solution, began + settings.time_limit, progress)
            solution = _fastest_beside(problem, solution, beside)
    return solution


def _kept(problem: Problem, budget: int, settings: SolveSettings, baseline: tuple[Schedule, Replay],
          began: float) -> Solution | None:
    """Keeping everything, each choice at its fastest option (fastest_options), where that fits `budget` and
    no saved tensor costs time to keep: nothing reruns and no op runs faster, so no schedule is faster
    (proven, gap 0; no search)."""
    schedule, replay = baseline
    if settings.implementations and problem.choices:
        fastest = fastest_options(problem, allow_approximate=settings.allow_approximate)
        options = {**fastest, **_fixed(problem, settings)}
        try:
            schedule = keep_all(problem, options)
            replay = simulate(problem, schedule)
        except ScheduleError:  # an option that overwrites what keeping everything keeps
            return None
    if replay.peak > budget or any(problem.tensors[t].keep_time for t in schedule.saved):
        return None  # a saved copy that costs time (a compiled forward's) may be faster rerun
    note = "keeping every tensor, each op in its fastest way, fits the budget: no schedule is faster"
    return Solution(schedule, replay, budget, "keep-all", "optimal", replay.time, replay.time, 0.0,
                    time.perf_counter() - began, None, note)


def _chained(problem: Problem, budget: int | None, settings: SolveSettings, progress: Progress,
             began: float) -> Chained:
    """The schedules of the problem's chain of repeated blocks (solver/chain.py), with ops run so that
    blocks rebuild whole (rebuildable_options: dropout rerun, fastest, first for a budget; dropout replayed,
    leanest, first for the least peak) and as the heuristics run them (_option_sets); those past the first
    set until CHAIN_SHARE of the time limit from time.perf_counter() `began`, and none past CHAIN_CAP."""
    if find_chain(problem) is None:
        return Chained()
    progress("checkpointing the repeated blocks", 0, None, "")
    _, posed, fixed = _pose(problem, settings.but(formulation="compact"))
    sets = _option_sets(posed, settings)
    if settings.implementations and posed.choices:
        first = {choice.name: choice.options[0] for choice in posed.choices}
        first_fastest = (True, False) if budget is not None else (False, True)  # a least peak: leanest first
        candidates = [{**rebuildable_options(posed, allow_approximate=settings.allow_approximate, fastest=fastest),
                       **fixed} for fastest in first_fastest] + sets
        sets = []
        for options in candidates:  # each distinct set once, blocks rebuilt whole first
            if all({**first, **options} != {**first, **other} for other in sets):
                sets.append(options)
    return chain_schedules(problem, budget, sets, began + CHAIN_SHARE * settings.time_limit,
                           began + CHAIN_CAP * settings.time_limit)


def _beyond_horizon(problem: Problem, settings: SolveSettings, chained: Chained) -> bool:
    """Whether the problem is a chain of blocks whose per-block checkpointing (of the blocks alone,
    Chained.blockwise) no rerun horizon of `settings` poses ("auto": auto_horizon's): a rebuilt block's
    tensors live through the block's whole backward, so at and below per-block checkpointing's peak the
    formulations find little or nothing (a 16-layer Llama: least 24.6 MiB with reruns at most 10 stages
    ahead, 11.2 MiB on the chain) in more than their time limit (finding a heuristic start alone took 25 s
    at 32 layers). There the chain's schedules stand alone."""
    if chained.checkpointed is None:
        return False
    horizons = settings.horizon if isinstance(settings.horizon, (list, tuple)) else [settings.horizon]
    for horizon in horizons:
        horizon = auto_horizon(problem) if horizon == "auto" else horizon
        if horizon is None or Stages(problem, horizon).admits(chained.blockwise):
            return False
    return True


def _chain_solution(chained: Chained, budget: int, began: float) -> Solution:
    """The fastest of the chain's schedules (and the start) within `budget`, where _beyond_horizon: the flat
    ILP is not run."""
    schedule, replay = min(chained.within(budget), key=lambda pair: pair[1].time)
    note = (f"a checkpointing schedule of the model's {chained.blocks} repeated blocks (per-block checkpointing, "
            "Chen's segments, selective checkpointing or Rotor's dynamic programme over the chain; solver/chain.py), "
            "or the start given where faster: "
            "at or below per-block checkpointing's peak the ILP is not run where its rerun horizon cannot pose "
            "per-block checkpointing, so no bound is claimed")
    return Solution(schedule, replay, budget, "chain", "heuristic", replay.time, 0.0, 1.0 if replay.time > 0 else 0.0,
                    time.perf_counter() - began, None, note)


def _fastest_beside(problem: Problem, solution: Solution, beside: Beside | None) -> Solution:
    """`solution`, or the schedule a worker beside the search found where that is faster."""
    fastest = beside.fastest() if beside is not None else None
    if fastest is None or not beside.found or fastest[1].time >= solution.replay.time:
        return solution
    return _found_beside(problem, solution, fastest[0], beside.bound, time.perf_counter(),
                         "found by a neighbourhood search beside the search, faster than")


def _polished(problem: Problem, budget: int, settings: SolveSettings, solution: Solution, until: float,
              progress: Progress) -> Solution:
    """`solution` improved by a neighbourhood search (solver/polish.py) in the general formulation, reruns at
    any distance, until time.perf_counter() `until`; itself where the search finds nothing faster or it is
    already proven optimal there, or where building that formulation took more than half the time (a deep
    model's: each piece of so large a formulation overruns its time, and the limit would not hold)."""
    if solution.status == "optimal" and solution.formulation == "general" and solution.horizon is None:
        return solution
    began = time.perf_counter()
    total = until - began
    progress("polishing: building the ILP", 0, None, "")
    formulation, posed, unpose, bound = neighbourhoods(problem, budget, settings, until)
    reference = solution.replay.time

    def report(best: Replay, tried: int) -> None:
        elapsed = time.perf_counter() - began
        progress("polishing", elapsed, total, f"{tried} neighbourhoods, best so far {best.time / reference - 1:+.2%} "
                                              f"step time; {max(0.0, total - elapsed):.0f} s left")

    found = None
    if until - time.perf_counter() >= total / 2:
        found = neighbourhood_search(formulation, solution.schedule.remap(problem, posed), budget, until,
                                     seed=settings.seed, heuristic_effort=settings.heuristic_effort, report=report)
    if found is None:
        return dataclasses.replace(solution, solve_time=solution.solve_time + time.perf_counter() - began)
    return _found_beside(problem, solution, unpose(found[0]), bound, began, "polished by a neighbourhood search from")


def neighbourhoods(problem: Problem, budget: int, settings: SolveSettings, until: float | None = None
                   ) -> tuple[General, Problem, Callable[[Schedule], Schedule], float]:
    """Where neighbourhood searches run: the general formulation, reruns at any distance; the problem it
    is posed on; how a schedule of that becomes one of `problem`; and its LP relaxation's bound on any
    schedule's time (0 where not solved within SECONDS, or not tried where less than SECONDS is left before
    time.perf_counter() `until`: on a deep model the relaxation can take twice its time limit)."""
    _, posed, fixed = _pose(problem, settings.but(formulation="general", horizon=None))
    formulation = General(posed, budget, None, allow_approximate=settings.allow_approximate, options=fixed)
    bound = 0.0
    if until is None or until - time.perf_counter() >= SECONDS:
        relaxed = formulation.milp.solve(relax=True, time_limit=SECONDS)
        bound = formulation.fixed_time + max(0.0, relaxed.objective) / 1e3 if relaxed.status == "optimal" else 0.0
    return formulation, posed, lambda schedule: _unpose(schedule, posed, problem, fixed), bound


def _found_beside(problem: Problem, solution: Solution, schedule: Schedule, bound: float, began: float,
                  how: str) -> Solution:
    """`solution` replaced by a faster schedule that a neighbourhood search found from it (general
    formulation, reruns at any distance), with `bound`, that formulation's LP relaxation's. The general
    formulation at that horizon poses every schedule, so its bounds hold for any: the greater stands where
    `solution` is that formulation's, else the lesser (a shorter horizon's bound holds for its schedules only)."""
    replay = simulate(problem, schedule)
    if replay.peak > solution.budget:
        raise SolverFailedError(f"internal error: the neighbourhood search's schedule replays to {replay.peak} "
                                f"bytes, over the budget of {solution.budget}")
    everywhere = solution.formulation == "general" and solution.horizon is None
    bound = min(max(solution.bound, bound) if everywhere else min(solution.bound, bound), replay.time)
    note = (f"{how} the {solution.formulation} formulation's schedule ({solution.replay.time:.6g} s; status "
            f"{solution.status})")
    return Solution(schedule, replay, solution.budget, "general", "time_limit", replay.time, bound,
                    (replay.time - bound) / replay.time if replay.time > 0 else 0.0,
                    solution.solve_time + time.perf_counter() - began, None, note, solution.warnings)


def _rungs(settings: SolveSettings) -> list[tuple[str, int | None | str]]:
    """The (formulation, horizon) pairs of a ladder: `settings.formulation` and `settings.horizon` in
    step where both are lists (of one length), else the one list with the other setting at each rung."""
    formulations, horizons = settings.formulation, settings.horizon
    if isinstance(formulations, (list, tuple)) and isinstance(horizons, (list, tuple)):
        if len(formulations) != len(horizons):
            raise ValueError(f"a list of formulations {list(formulations)} and a list of horizons {list(horizons)} "
                             "go in step, so they must be as long")
        rungs = list(zip(formulations, horizons))
    elif isinstance(formulations, (list, tuple)):
        rungs = [(formulation, horizons) for formulation in formulations]
    else:
        rungs = [(formulations, horizon) for horizon in horizons]
    if not rungs:
        raise ValueError("a list of formulations or horizons must name at least one")
    return rungs


def _rung_text(formulation: str, horizon: int | None | str, settings: SolveSettings) -> str:
    """A ladder rung, for progress: what changes from rung to rung."""
    parts = ([formulation] if isinstance(settings.formulation, (list, tuple)) else []) + (
        [_horizon_text(horizon) if horizon != "auto" else "auto horizon"]
        if isinstance(settings.horizon, (list, tuple)) else [])
    return ", ".join(parts) + ": "


def _ladder(problem: Problem, budget: int, settings: SolveSettings, start: Schedule | None, progress: Progress,
            baseline: tuple[Schedule, Replay], beside: Beside | None,
            chained: list[tuple[Schedule, Replay]] = ()) -> Solution:
    """`solve` at each rung of the ladder (see _rungs) in turn, each on an equal share of the time left and
    started from the best schedule so far (a neighbourhood search's beside it where that is faster; until one
    fits, the least-peak search's schedule of least peak), each stopped where it stalls (STALL_SHARE; the
    last only with its gap over STALL_GAP); the last solution, which is no slower than any before it."""
    rungs = _rungs(settings)
    began, best, warnings = time.perf_counter(), None, []
    lowest = start  # until a rung finds a schedule within the budget: the one of least peak found so far
    for i, (formulation, horizon) in enumerate(rungs):
        share = (settings.time_limit - (time.perf_counter() - began)) / (len(rungs) - i)
        last = i == len(rungs) - 1
        rung_start = best.schedule if best else lowest
        found = beside.fastest() if best is not None and beside is not None else None
        if found is not None and found[1].time < best.replay.time:
            rung_start = found[0]
        try:
            solution = _solve(problem, budget,
                              settings.but(time_limit=max(1.0, share), formulation=formulation, horizon=horizon),
                              rung_start, progress, baseline, explain=last,
                              label=_rung_text(formulation, horizon, settings), alone=best is None,
                              kernels_first=formulation == "general" and horizon is None,
                              beside=beside,
                              stall=STALL_SHARE * share, stall_gap=STALL_GAP if last else 0.0, chained=chained)
        except (_NoSchedule, SolverFailedError) as failed:
            least = getattr(failed, "least", None)
            if least is not None and least.schedule is not None:
                lowest = least.schedule  # the next rung's least-peak search goes on from it
            if not last or best is not None:
                continue
            raise
        warnings += [w for w in solution.warnings if w not in warnings]
        if beside is not None:
            beside.offer(solution.schedule, solution.replay)
        if best is None or solution.replay.time <= best.replay.time:
            best = solution
    if best is None:  # only the last rung may explain, and it raised; unreachable
        raise SolverFailedError(f"no schedule at any of the rungs {rungs}")
    return dataclasses.replace(best, solve_time=time.perf_counter() - began, warnings=tuple(warnings))


class _NoSchedule(Exception):
    """The formulation proved the budget infeasible (not explained: no least-peak search)."""


class _Reached(Exception):
    """The least-peak search found a schedule within its target, or a worker beside it did (it stops there)."""


def _solve(problem: Problem, budget: int, settings: SolveSettings, start: Schedule | None, progress: Progress,
           baseline: tuple[Schedule, Replay], *, explain: bool, label: str = "", seek: bool = True,
           alone: bool = True, kernels_first: bool = True, beside: Beside | None = None,
           stall: float | None = None, stall_gap: float = 0.0,
           chained: list[tuple[Schedule, Replay]] = ()) -> Solution:
    """`solve` at one horizon; `baseline` is keep_all(problem, settings.options) and its replay. An
    infeasible budget raises InfeasibleBudgetError stating the least peak when `explain`, else
    _NoSchedule at once. Where no schedule at hand fits, a least-peak search finds one first (see
    _least_within) when `seek`; else _NoSchedule is raised at once, HiGHS not run without a start
    (checkpointing alone before the joint search: that search seeks one itself). `alone` lets the
    compact formulation, choosing implementations, solve checkpointing alone first (a ladder's later
    rungs start from a schedule that already beats it); `kernels_first` lets the general formulation,
    choosing implementations, solve with the fastest kernels fixed first (in a ladder, at its general rungs
    with reruns at any distance only: on MONeT's UNet at 9 GB, the rung at 40 stages found nothing faster so).
    Stages are reported to `progress` named after `label`; `beside` hears of each schedule found (the
    starting one, HiGHS's incumbents). HiGHS stops where it finds no better schedule for `stall` seconds
    while its gap exceeds `stall_gap` (a share of keeping everything's step time). `chained`: the chain's
    schedules within the budget (_chained), which stand where the search finds nothing faster."""
    began = time.perf_counter()
    options, time_limit = settings.options or {}, settings.time_limit
    baseline, baseline_replay = baseline
    if (baseline_replay.peak <= budget and not (settings.implementations and problem.choices) and not options
            and not any(t.keep_time for t in problem.tensors)):
        # nothing to recompute, nothing else to choose and nothing costs to save: optimal by definition
        return Solution(baseline, baseline_replay, budget, settings.formulation, "optimal", baseline_replay.time,
                        baseline_replay.time, 0.0, time.perf_counter() - began)
    kind, posed, fixed = _pose(problem, settings)
    given = [start] if start is not None else []
    if alone and kind == "compact" and len(fixed) < len(problem.choices):
        # Checkpointing alone first, on a third of the time: the joint search starts from it, so
        # choosing implementations never ends slower than not choosing them.
        try:
            alone = settings.but(formulation=kind, implementations=False, time_limit=time_limit / 3)
            given.append(_solve(problem, budget, alone, start, progress, (baseline, baseline_replay), explain=False,
                                label=label + "checkpointing alone: ", seek=False).schedule)
        except (_NoSchedule, SolverFailedError):
            pass
    fastest = {c: o for c, o in fastest_kernels(problem, allow_approximate=settings.allow_approximate).items()
               if c not in fixed} if kernels_first and kind == "general" and settings.implementations else {}
    if fastest and not (
            start is not None and all(start.options.get(c, problem.choice_named[c].options[0]) == o
                                      for c, o in fastest.items())):
        # The fastest kernels first, on a third of the time: with them fixed, HiGHS finds the room they need
        # (MONeT's UNet at 9 GB: the search with them free stalled 0.6 % above the one it found so in 100 s).
        try:
            given.append(_solve(problem, budget, settings.but(formulation=kind, options={**options, **fastest},
                                                              time_limit=time_limit / 3),
                                start, progress, (baseline, baseline_replay), explain=False,
                                label=label + "fastest kernels: ", seek=False).schedule)
        except (_NoSchedule, SolverFailedError):
            pass
    # The best schedule so far (a start given, or checkpointing alone's) that the simulator finds within
    # the budget: the search starts from it (compact), and never returns a slower one.
    fitting = [(candidate, replay) for candidate in given
               for replay in [simulate(problem, candidate)] if replay.peak <= budget]
    incumbent = min(fitting, key=lambda pair: pair[1].time, default=None)
    def start_from(incumbent, heuristics=True):
        return _start(posed, budget, _option_sets(posed, settings) if heuristics else [], settings.horizon,
                      lambda *state: progress(label + "finding a starting schedule", *state),
                      incumbent[0] if incumbent else None, time.perf_counter() + START_SHARE * time_limit,
                      time.perf_counter() + START_CAP * time_limit)

    horizon, found = start_from(incumbent)
    if not seek and found is None and incumbent is None:
        raise _NoSchedule
    sought = None  # the least-peak search's result, where it ran
    if seek and found is None and incumbent is None and not chained:
        # No heuristic schedule fits, and HiGHS's own heuristics may find none in time: the least-peak
        # search, stopped at its first schedule within the budget, gives the search one to start from,
        # or proves that none fits.
        seeking = settings.but(horizon=horizon, time_limit=max(1.0, time_limit - (time.perf_counter() - began)) / 2)
        sought = _least_within(problem, budget, seeking, progress, label, None if options else baseline_replay, start,
                               beside)
        replay = simulate(problem, sought.schedule) if sought is not None and sought.schedule is not None else None
        if replay is not None and replay.peak <= budget:
            # the simulator judges: the search's schedule can fit a budget below the least its rows meet
            # (they count with a safety margin, and can overcount)
            incumbent = (sought.schedule, replay)
            horizon, found = start_from(incumbent, heuristics=False)  # none fitted: only the horizon to settle
        elif sought is not None and sought.bound > budget:
            if not explain:
                raise _NoSchedule
            raise InfeasibleBudgetError(budget, _judged(problem, sought), kind, problem.floor)
    progress(label + "building the ILP", 0, None, "")
    formulation = _formulate(kind, posed, budget, settings, fixed, horizon)
    if kind == "compact" and incumbent and (found is None or incumbent[1].time < found.replay.time):
        found = _as_start(formulation, *incumbent)
    elif found:  # the heuristic's drops leave kept what its schedule does not save, which the ILP would count
        found = _as_start(formulation, found.schedule, found.replay)
    warm = formulation.warm_start(found.dropped, found.options) if found else None
    if isinstance(formulation, General):
        warm = _general_warm(formulation, problem, fixed, [incumbent] if incumbent else [], found)
    reference = baseline_replay.time  # no schedule is much faster than keeping everything, so the gap holds
    def step_time(objective: float, bound: float) -> str:
        """The best schedule so far as its predicted step time against keeping everything, and its gap."""
        best, least = formulation.fixed_time + objective / 1e3, formulation.fixed_time + max(0.0, bound) / 1e3
        text = f"best so far {best / reference - 1:+.1%} step time"
        return text + (f", gap {(best - least) / best:.1%}" if np.isfinite(bound) and best > 0 else ", no bound yet")

    if beside is not None and incumbent:
        beside.offer(*incumbent)
    if beside is not None and found:
        beside.offer(_unpose(found.schedule, posed, problem, fixed))
    result = formulation.milp.solve(
        time_limit=max(1.0, time_limit - (time.perf_counter() - began)), seed=settings.seed, warm=warm,
        verbose=settings.solver_log, heuristic_effort=settings.heuristic_effort, abs_gap=settings.gap * reference * 1e3,
        progress=_watch(progress, label + "solving", began, time_limit, step_time), stall=stall,
        stall_above=stall_gap * reference * 1e3,
        incumbent=None if beside is None else lambda values: beside.offer(
            _unpose(formulation.schedule(values), posed, problem, fixed)))
    # Schedules of `problem` that the simulator finds within the budget without HiGHS: the starting
    # schedule, and (the general formulation does not start from it) the best one so far.
    fallbacks = []
    if found:
        first = _unpose(found.schedule, posed, problem, fixed)
        fallbacks.append((first, simulate(problem, first)))
    if incumbent and kind != "compact":
        fallbacks.append(incumbent)
    if chained:
        fallbacks.append(min(chained, key=lambda pair: pair[1].time))
    outside = found is not None and not formulation.stages.admits(found.schedule)  # a start the ILP cannot pose
    if result.values is None and fallbacks:
        # A schedule fits (the simulator says so) where the formulation found nothing, in time or (its
        # rows can overcount, its horizon exclude) at all: it stands, with the formulation's bound where
        # it has one, and a warning where HiGHS had accepted it as a solution of the ILP it calls infeasible.
        schedule, replay = min(fallbacks, key=lambda pair: pair[1].time)
        if any(schedule is other for other, _ in chained):
            solution = _solution(schedule, replay, budget, formulation, "heuristic", replay.time, 0.0, began)
            return dataclasses.replace(solution, note=_chain_note(result.status, formulation.name))
        warnings = []
        if result.status == "infeasible" and result.warm == "accepted":
            warnings.append("HiGHS contradicted itself: it called the ILP infeasible after accepting the starting "
                            "schedule as a solution of it (the simulator replays that schedule to "
                            f"{replay.peak} bytes, within the budget of {budget})")
        bound = formulation.fixed_time + (max(0.0, result.bound) / 1e3 if np.isfinite(result.bound) else 0.0)
        solution = _solution(schedule, replay, budget, formulation, "heuristic", replay.time,
                             0.0 if warnings else bound, began)
        searched = sought is not None and incumbent is not None and incumbent[0] is sought.schedule
        note = _heuristic_note(result.status, time_limit, result.seconds, solution.gap, formulation.name,
                               formulation.stages.horizon if outside else False, searched)
        return dataclasses.replace(solution, note=_with_warnings(note, warnings), warnings=tuple(warnings))
    if result.values is None and not explain:
        raise _NoSchedule if result.status == "infeasible" else SolverFailedError(
            f"HiGHS stopped ({result.status}) before finding any schedule within {time_limit:g} s", sought)
    if result.values is None:
        unconstrained = baseline_replay if not options else simulate(problem, keep_all(problem))
        try:
            least = sought or least_peak(problem, settings.but(horizon=horizon), progress=progress,
                                         unconstrained=unconstrained)
        except SolverFailedError:
            if result.status == "infeasible":
                raise
            least = None
        if result.status == "infeasible" or (least is not None and least.bound > budget):
            raise InfeasibleBudgetError(budget, _judged(problem, least), formulation.name, problem.floor)
        raise SolverFailedError(_no_schedule_message(budget, unconstrained.peak, time_limit, least), least)
    schedule = _unpose(formulation.schedule(result.values), posed, problem, fixed)
    replay = simulate(problem, schedule)
    objective = formulation.fixed_time + result.objective / 1e3
    bound = formulation.fixed_time + max(0.0, result.bound) / 1e3
    warnings = _audit(result, formulation, replay, objective, bound, budget)
    fastest = replay.time if replay.peak <= budget else np.inf
    if warnings or replay.time < objective:
        objective = replay.time  # the simulator judges (and where HiGHS's schedule reran ops no one read, it is faster)
    # Keeping everything, or the starting schedule, stands where the replay finds it no slower: the
    # rows' safety margin can hide an exact fit, and HiGHS stops anywhere within the gap.
    others = [(baseline, baseline_replay)] + fallbacks
    replaced = False
    for other, other_replay in others:
        chain = any(other is mine for mine, _ in chained)  # stands only where faster: it gives up the bound
        if other_replay.peak <= budget and (other_replay.time < fastest
                                            or (other_replay.time == fastest and not chain)):
            schedule, replay, objective, fastest, replaced = (other, other_replay, other_replay.time,
                                                              other_replay.time, True)
    if not np.isfinite(fastest):
        raise SolverFailedError("; ".join(warnings) + ", and no other schedule at hand fits")
    note = ""
    if replaced and any(schedule is other for other, _ in chained):
        solution = _solution(schedule, replay, budget, formulation, "heuristic", replay.time, 0.0, began)
        return dataclasses.replace(solution, note=_chain_note(result.status, formulation.name),
                                   warnings=tuple(warnings))
    if outside and replaced and not warnings:
        note = (f"this is the starting schedule: it reruns ops further ahead of their use than the horizon of "
                f"{formulation.stages.horizon} stages allows, so it lies outside the ILP posed; the bound holds for "
                "the ILP's schedules only. A longer `horizon` would pose it")
    status = ("heuristic" if replaced else "unverified") if warnings else result.status
    solution = _solution(schedule, replay, budget, formulation, status, objective, 0.0 if warnings else bound, began)
    return dataclasses.replace(solution, note=_with_warnings(note, warnings), warnings=tuple(warnings))


def _judged(problem: Problem, least: LeastPeak | None) -> LeastPeak | None:
    """`least` at the peak the simulator replays its schedule to, where that is lower: the rows count
    with a safety margin (1e-5 of the budget) and can overcount, and the simulator decides."""
    peak = simulate(problem, least.schedule).peak if least is not None and least.schedule is not None else None
    if peak is None or peak >= least.found:
        return least
    return dataclasses.replace(least, found=peak, bound=min(least.bound, peak))


def _least_within(problem: Problem, budget: int, settings: SolveSettings, progress: Progress, label: str,
                  unconstrained: Replay | None, start: Schedule | None, beside: Beside | None) -> LeastPeak | None:
    """The least-peak search from `start` (a schedule over the budget, or None), stopped at its first
    schedule within `budget`, or at one that a worker beside it found (each seeks one too; see
    Beside.seek); None if it finds no schedule at any budget in `settings.time_limit`."""
    stage = label + "a first schedule within the budget: "

    def watch(inner: str, *state) -> None:
        if beside is not None and beside.fastest() is not None:
            raise _Reached
        progress(stage + inner, *state)

    if beside is not None:
        beside.seek(settings, start)
    try:
        return least_peak(problem, settings, target=budget, unconstrained=unconstrained, start=start, progress=watch)
    except SolverFailedError:
        return None
    except _Reached:
        schedule, replay = beside.fastest()
        return LeastPeak(replay.peak, 0, schedule, None, None)


TIME_TOLERANCE = 1e-5  # relative: HiGHS's price of a schedule and the simulator's step time agree within this


def _audit(result, formulation: Formulation, replay, objective: float, bound: float, budget: int) -> list[str]:
    """Where HiGHS's answer (a schedule priced at `objective` s, a bound of `bound` s) contradicts the
    simulator's `replay` of that schedule, or HiGHS itself: one line each, for people."""
    warnings = []
    tolerance = TIME_TOLERANCE * max(abs(objective), abs(replay.time), 1e-12)
    if replay.peak > budget:
        warnings.append(f"HiGHS's schedule ({result.status}) replays to a peak of {replay.peak} bytes "
                        f"({format_bytes(replay.peak)}), over the budget of {budget} bytes: the simulator judges "
                        "peaks, so it is not returned")
    elif abs(objective - replay.time) > tolerance and (replay.time > objective or not _priced_with_dead_reruns(
            formulation, result.values, objective, tolerance)):
        warnings.append(f"HiGHS ({result.status}) priced its schedule at {objective:.6g} s of step time, and the "
                        f"simulator replays it at {replay.time:.6g} s")
    if bound > objective + tolerance:
        warnings.append(f"HiGHS's bound of {bound:.6g} s exceeds the step time it found, {objective:.6g} s")
    if result.warm == "accepted":
        accepted = formulation.fixed_time + result.warm_objective / 1e3
        if bound > accepted + tolerance:
            warnings.append(f"HiGHS's bound of {bound:.6g} s exceeds {accepted:.6g} s, the step time of the "
                            "starting schedule that it accepted as a solution of the same ILP")
    return warnings


def _priced_with_dead_reruns(formulation: Formulation, values: np.ndarray, objective: float,
                              tolerance: float) -> bool:
    """Whether HiGHS's schedule replays at its price `objective` (s) with the reruns that no op reads kept:
    the schedule returned drops them, so it replays faster without contradicting HiGHS (on MONeT's UNet at
    5 GB a time-limited rung's schedule replayed 1.4 ms under its price so, and was reported unverified)."""
    try:
        unpruned = simulate(formulation.problem, formulation.schedule(values, prune=False))
    except ScheduleError:
        return False
    return abs(unpruned.time - objective) <= tolerance


def _with_warnings(note: str, warnings: list[str]) -> str:
    """The note for people, with the warnings (the CLI shows the note)."""
    if not warnings:
        return note
    text = ("the simulator does not confirm HiGHS's answer: " + "; ".join(warnings) +
            ". The schedule returned replays within the budget; its step time is the simulator's")
    return f"{text}. {note}" if note else text


def _watch(progress: Progress, stage: str, began: float, time_limit: float,
           describe: Callable[[float, float], str]) -> Callable[[float, float], None]:
    """The Milp progress callback that reports `stage`: seconds since `began` out of `time_limit`,
    `describe(objective, bound)` of the best solution so far, and the seconds left."""

    def tick(objective: float, bound: float) -> None:
        elapsed = time.perf_counter() - began
        found = describe(objective, bound) if np.isfinite(objective) else "no schedule yet"
        progress(stage, elapsed, time_limit, f"{found}; {max(0.0, time_limit - elapsed):.0f} s left")

    return tick


def _heuristic_note(status: str, time_limit: float, highs_seconds: float, gap: float, formulation: str,
                    outside: int | None | bool = False, searched: bool = False) -> str:
    """What a heuristic result is and what would help, for people. `outside`: the horizon that the
    starting schedule reruns beyond (False: it does not); `searched`: the starting schedule is the
    least-peak search's, not a heuristic's."""
    what = "the least-peak search's schedule" if searched else "the heuristic's starting schedule"
    if status == "infeasible" and outside is not False:
        why = (f"the starting schedule reruns ops further ahead of their use than the horizon of {outside} stages "
               "allows, so it is no solution of the ILP posed, which has none at this budget: a limit of the "
               "horizon, not of the budget (the simulator finds the starting schedule within it)")
        helps = "a longer `horizon`"
    elif status == "infeasible":
        why = (f"the {formulation} formulation admits no schedule at this budget (its memory rows count "
               f"conservatively; the simulator finds {what} within it)")
        helps = "a higher budget"
        if formulation == "compact":
            helps += ", `formulation='general'` or a longer `horizon`"
    else:
        why = (f"the search found no schedule within the time limit of {time_limit:g} s (HiGHS had {highs_seconds:.0f} "
               "s of it; the stages before it took the rest)")
        helps = f"a longer `time_limit` than {time_limit:g} s, or a higher budget"
    return (f"this is {what}: {why}; its step time is {gap:.0%} above the bound on the "
            f"best. What would help: {helps}")


def _chain_note(status: str, formulation: str) -> str:
    """What a result that is one of the chain's schedules (solver/chain.py) is, for people."""
    why = ("admits no faster schedule within its rerun horizon" if status == "infeasible"
           else f"found no faster schedule ({status})")
    return (f"this is a checkpointing schedule of the model's repeated blocks (per-block, selective or Chen's "
            f"checkpointing, or Rotor's; solver/chain.py): the {formulation} formulation {why}, and its bound "
            "holds for its own schedules only, so none is claimed")


def _no_schedule_message(budget: int, unconstrained: int, time_limit: float, least: LeastPeak | None) -> str:
    """Why no schedule came back within `budget`, and what would work."""

    def size(n: int) -> str:
        return f"{n} bytes ({format_bytes(n)}, {n / unconstrained:.0%} of the unconstrained peak)"

    text = f"the search found no schedule within {time_limit:g} s at the budget of {size(budget)}"
    if least is None:
        return text + f", nor at any budget in another {time_limit:g} s; a longer `time_limit` may find one"
    helps = []
    if least.sure is not None:
        helps.append(f"a budget of at least {size(least.sure)}: from there up a heuristic schedule fits, which the "
                     "search starts from, so it always returns a schedule")
    if least.found <= budget:
        helps.append(f"a longer `time_limit`: the least peak found is {size(least.found)}, so schedules within "
                     "this budget exist")
    else:
        helps.append(f"a longer `time_limit` with a budget of at least the least peak found, {size(least.found)}")
    return f"{text}. What would work: {'; or '.join(helps)}"


def _solution(schedule: Schedule, replay: Replay, budget: int, formulation: Formulation, status: str,
              objective: float, bound: float, began: float) -> Solution:
    """The Solution for `schedule`, whose replay is `replay`; its peak must fit."""
    if replay.peak > budget:
        raise SolverFailedError(f"internal error: the {formulation.name} schedule replays to {replay.peak} bytes, "
                                f"over the budget of {budget}")
    bound = min(objective, bound)
    return Solution(schedule, replay, budget, formulation.name, status, objective, bound,
                    (objective - bound) / objective if objective > 0 else 0.0, time.perf_counter() - began,
                    formulation.stages.horizon)


def _option_sets(posed: Problem, settings: SolveSettings) -> list[dict[str, str]]:
    """How ops run in the heuristic starting points: as fixed (else as PyTorch), leanest, and rerun
    fastest (where that differs from the others)."""
    options = settings.options or {}
    sets = [options if posed.choices else {}]
    if posed.choices and settings.implementations:
        first = {choice.name: choice.options[0] for choice in posed.choices}
        for chosen in (lean_options, rerun_options):
            found = {**chosen(posed, allow_approximate=settings.allow_approximate), **options}
            if all({**first, **found} != {**first, **other} for other in sets):
                sets.append(found)
    return sets


def least_peak(problem: Problem, settings: SolveSettings | None = None, *, progress: Progress | None = None,
               unconstrained: Replay | None = None, target: int | None = None, start: Schedule | None = None,
               **changes) -> LeastPeak:
    """The least budget (bytes) that the formulation can meet, as its memory rows count it, solving as
    `settings` with `changes` say (their gap does not apply: the least peak is sought until proven or
    the time limit, or with `target` (bytes) until a schedule is found that the rows, or the simulator,
    put within it: the rows can overcount, and the simulator judges). `unconstrained`,
    the replay of keep_all(problem) where the caller has it, spares simulating it again. `start`, a
    schedule found before (a lower peak than the heuristics reach, say), is where the search starts
    when its peak is the lowest at hand and the formulation poses it. The least peak of the model's chain of
    blocks (solver/chain.py) stands where it is lower, with no bound; where no rerun horizon of the settings
    poses per-block checkpointing, it is returned without the search."""
    settings = settings_of(settings, **changes)
    began, progress, time_limit = time.perf_counter(), progress or _quiet, settings.time_limit
    unconstrained = simulate(problem, keep_all(problem)) if unconstrained is None else unconstrained
    kind, posed, fixed = _pose(problem, settings)
    chain = _chained(problem, None, settings, progress, began) if target is None else Chained()
    chained = [(replay.peak, schedule) for schedule, replay in chain.schedules[:1]]
    if _beyond_horizon(problem, settings, chain):  # the formulations' search reaches no lower, nor in time
        return LeastPeak(chained[0][0], 0, chained[0][1], None, chained[0][0])
    alone = None
    if target is None and kind == "compact" and len(fixed) < len(problem.choices):
        # Checkpointing alone first, on a third of the time, as solve does: the joint search starts from
        # its least peak and keeps it if it finds none lower, so choosing implementations never ends higher.
        # Not when seeking a first schedule within `target` for solve: solve's own checkpointing-alone
        # phase has found none there, and a third of the time gone to it left a bfloat16 DistilBERT
        # step at 50 % without a schedule in 40 s.
        try:
            alone_settings = settings.but(formulation=kind, implementations=False, time_limit=time_limit / 3)
            alone = least_peak(problem, alone_settings, unconstrained=unconstrained,
                               progress=lambda stage, *state: progress("checkpointing alone: " + stage, *state))
        except SolverFailedError:
            pass
        time_limit = max(1.0, time_limit - (time.perf_counter() - began))
    # Schedules at hand (of `problem`) with their peaks: the caller's start, checkpointing alone's
    given = [(simulate(problem, start).peak, start)] if start is not None and _runs_as(start, problem, fixed) else []
    given += [(alone.found, alone.schedule)] if alone and alone.schedule else []
    incumbent = min(given, key=lambda pair: pair[0], default=(None, None))
    horizon, heuristic = _start(posed, None, _option_sets(posed, settings), settings.horizon,
                                lambda *state: progress("least peak: finding a starting schedule", *state),
                                None if incumbent[1] is None else incumbent[1].remap(problem, posed))
    progress("least peak: building the ILP", 0, None, "")
    formulation = _formulate(kind, posed, None, settings, fixed, horizon)
    start = heuristic
    if incumbent[1] is not None and (heuristic is None or incumbent[0] < heuristic.replay.peak):
        start = _as_start(formulation, incumbent[1].remap(problem, posed), simulate(problem, incumbent[1]))
    elif heuristic:  # as in _solve: drop what the schedule does not save
        start = _as_start(formulation, heuristic.schedule, heuristic.replay)
    sure = heuristic.replay.peak if heuristic else None  # what a solve at any budget from there starts from
    warm = None
    if start is not None:
        warm = (formulation.warm_from(start.schedule) if isinstance(formulation, General)
                else formulation.warm_start(start.dropped, start.options))
    unconstrained = unconstrained.peak

    def peak(objective: float, bound: float) -> str:
        least = formulation.memory.least_budget(objective)
        return f"least so far {format_bytes(least)} ({least / unconstrained:.0%} of the unconstrained peak)"

    reached: list[tuple[int, Schedule]] = []

    def judge(values: np.ndarray) -> None:
        """Stops the search at a schedule of HiGHS's that the simulator replays within `target`: the rows
        can count a copy past its last reader, so they may still put it above."""
        schedule = _unpose(formulation.schedule(values), posed, problem, fixed)
        replayed = simulate(problem, schedule).peak
        if replayed <= target:
            reached.append((replayed, schedule))
            raise _Reached

    try:
        result = formulation.milp.solve(time_limit=time_limit, seed=settings.seed, verbose=settings.solver_log,
                                        heuristic_effort=settings.heuristic_effort, warm=warm,
                                        target=None if target is None else formulation.memory.units(target),
                                        progress=_watch(progress, "least peak: solving", began, time_limit, peak),
                                        incumbent=None if target is None else judge)
    except _Reached:
        if not reached:  # the caller's progress stopped the search (a worker beside it found a schedule)
            raise
        least, schedule = reached[-1]
        return LeastPeak(least, 0, schedule, horizon if kind == "compact" else None, sure)
    # (peak, schedule): the heuristic schedule's peak stands if HiGHS does no better
    found = [(start.replay.peak, _unpose(start.schedule, posed, problem, fixed))] if start else []
    found += given
    if result.values is not None:
        found.append((formulation.memory.least_budget(result.values[formulation.memory.peak]),
                      _unpose(formulation.schedule(result.values), posed, problem, fixed)))
    if not found + chained:
        raise SolverFailedError(f"HiGHS found no schedule at any budget within {time_limit:g} s ({result.status})")
    least, schedule = min(found + chained, key=lambda pair: pair[0])
    bound = formulation.memory.least_budget(result.bound) if np.isfinite(result.bound) else 0
    bound = least if result.status == "optimal" else min(least, bound)
    if not found or least < min(peak for peak, _ in found):
        bound = 0  # the chain's schedule lies outside the formulation: its bound says nothing of it
    sure = min((peak for peak in [sure, *(peak for peak, _ in chained)] if peak is not None), default=None)
    return LeastPeak(least, bound, schedule, horizon if kind == "compact" else None, sure)
