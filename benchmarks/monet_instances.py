"""MONeT's published instances (utsaslab/monet-schedules): read them, and Gurobi's 24 h results.

MONeT (ICLR 2021) published, per model and memory budget, a pickle of `[SolverInfo, Solution]`
(classes of MONeT's package) and the log of its Gurobi run. This module reads both without
MONeT's code: the pickle through an unpickler that lets in only numpy, a few builtins and plain
stand-ins for MONeT's classes, and the log with a parser of Gurobi 9's summary lines (or, for a
log cut short, its last line of branch-and-bound progress).

    python -m benchmarks.monet_instances [--folder ../shared/monet-instances]

writes benchmarks/results/monet-instances.md: each instance's size and Gurobi's objective, bound
and time, in MONeT's units (0.01 ms); Gurobi's own schedule converted (benchmarks.monet_convert)
and replayed in monet's simulator (time against `runtime_expected`, peak against the budget); and
monet's solves of the converted instance, from the records in monet-instances-solves.jsonl.

    python -m benchmarks.monet_instances --solve 60 [--solve 300] [--only vgg16] [--deadline S]

solves each instance (SETTINGS: the compact formulation, then the general one from its schedule
with reruns at most 40 stages ahead, then unbounded; GoogLeNet: LADDERS; implementation choices on,
gap 1e-4; HiGHS's heuristic effort 1 unless --heuristic-effort says otherwise; a neighbourhood search
beside the search in a second process unless --workers 1) at each time limit
and appends one record per solve to that file (a rerun replaces an instance's record at the same
limit); --deadline stops starting new solves after S seconds.
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
from rich.console import Console

from monet.progress import progress_display
from monet.solver import SolveSettings

FOLDER = Path(__file__).resolve().parents[2] / "shared" / "monet-instances"
OUT = Path(__file__).resolve().parent / "results" / "monet-instances.md"
SOLVES = OUT.with_name("monet-instances-solves.jsonl")
LOGS = {"vgg16": "monet_vgg16_icmn_176_{budget}.out", "un": "monet_unet_icmn_11_{budget}",
        "googlenet": "monet_googlenet_in_320_{budget}"}
HIGHS_EFFORT = 0.05  # HiGHS's own mip_heuristic_effort: the solves recorded before the setting existed
EFFORT = 1.0  # what the solves here use: the time limit cuts every UNet solve, where effort finds better schedules
# The compact formulation chooses what to keep and how ops run at the horizon its size allows; the general
# one, started from its schedule, reruns tensors several times as MONeT's ILP may: first at most 40 stages
# ahead (a third of the unbounded formulation's size on UNet: it proves UNet 9 GB optimal), then at any
# distance (VGG-16 7 GB needs it). Each rung gets an equal share of the time left; one that stalls for a sixth
# of it stops and leaves the rest to the next (solver.solve's STALL_SHARE; README, "GPU-size problems, and
# MONeT's instances").
SETTINGS = SolveSettings(formulation=("compact", "general", "general"), horizon=("auto", 40, None),
                         implementations=True, gap=1e-4)
# GoogLeNet's automatic horizon is 10-30 of its 280 stages, and its better schedules rerun further ahead: its
# first rung is the compact formulation at most 60 stages ahead, whose checkpointing-alone solve finds them (5 GB:
# 90,514 at 51 s, where the automatic horizon's rung ended at 91,064, +0.72 %, and a 60-stage rung started from
# that schedule found nothing better in its share; by hand, 2026-12-04), the general one at any distance the
# last. UNet 5 GB with a compact 60-stage rung after the automatic one ended at +11.2 % (was +1.47 %), so it is
# GoogLeNet's alone: settings chosen per model, by measurement.
# A neighbourhood search after the search (SolveSettings.polish) is no model's setting: on UNet it trades
# instances (README, "MONeT's instances"). Beside the search, in a second process (SolveSettings.workers),
# it takes no time from the ladder: each solve uses two cores (WORKERS), so run one solve at a time.
WORKERS = 2
LADDERS = {"googlenet": SETTINGS.but(formulation=("compact", "general"), horizon=(60, None))}
SAFE = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"), ("collections", "defaultdict"), ("builtins", "set"),
        ("builtins", "getattr")}


class _StandInType(type):
    """MONeT's classes become plain ones; a class attribute (a nested class) is another stand-in."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandInType(f"{cls.__name__}.{name}", (StandIn,), {"module": cls.module})


class StandIn(metaclass=_StandInType):
    """An object of one of MONeT's classes: its attributes, nothing else."""

    module = ""

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        self.__dict__.update(state if isinstance(state, dict) else {"state": state})

    @property
    def kind(self) -> str:
        return type(self).__name__


class _Reader(pickle.Unpickler):
    def find_class(self, module, name):
        if module in ("monet", "__main__") or module.startswith("monet."):  # some were pickled by a script
            return _StandInType(name, (StandIn,), {"module": module})
        if (module, name) in SAFE:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of MONeT's instance format")


@dataclass(frozen=True)
class Gurobi:
    """Gurobi's result in a log: objective and bound (MONeT's units), seconds, and how the run
    ended ("optimal", "time limit", "infeasible", or "cut short" when the log ends mid-search and
    the figures are its last progress line)."""

    objective: float | None
    bound: float | None
    seconds: float | None
    status: str


@dataclass(frozen=True)
class Instance:
    path: Path
    model: str
    batch: int
    mode: str
    budget_gb: float
    info: StandIn  # MONeT's SolverInfo
    solution: StandIn  # Gurobi's decisions (r, s, p, m, rf, ip) and runtime_expected

    @property
    def forward(self) -> int:
        """Forward nodes, the loss included (MONeT's V)."""
        return int(self.info.loss) + 1

    @property
    def stages(self) -> int:
        """Stages: the forward pass and one per backward node (MONeT's T)."""
        return len(self.info.nodes) - int(self.info.loss)


_NAME = re.compile(r"solution_(?P<model>[a-z0-9]+)_(?P<batch>\d+)_(?P<mode>.+)_(?P<budget>\d+\.\d+)\.pkl")


def read_instance(path: Path) -> Instance:
    """One `solution_*.pkl`; raises ValueError when it is not MONeT's format."""
    match = _NAME.fullmatch(path.name)
    if not match:
        raise ValueError(f"{path.name}: not named like solution_<model>_<batch>_<mode>_<budget>.pkl")
    with path.open("rb") as file:
        info, solution = _Reader(file).load()
    if not (isinstance(info, StandIn) and info.kind == "SolverInfo" and isinstance(solution, StandIn)):
        raise ValueError(f"{path.name}: not a [SolverInfo, Solution] pair")
    instance = Instance(path, match["model"], int(match["batch"]), match["mode"], float(match["budget"]),
                        info, solution)
    if np.shape(solution.r) != (instance.stages, instance.forward):
        raise ValueError(f"{path.name}: R is {np.shape(solution.r)}, not stages x forward nodes "
                         f"{(instance.stages, instance.forward)}")
    return instance


_SUMMARY = re.compile(r"Best objective (\S+), best bound (\S+), gap")
_EXPLORED = re.compile(r"^Explored .* in ([\d.]+) seconds")
_PROGRESS = re.compile(r"^\s*[H*]?\s*\d+\s+\d+\s.*?\s([\d.e+-]+)\s+([\d.e+-]+)\s+[\d.]+%.*\s(\d+)s$")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # Gurobi writes "-" where it has no value


_STATUS = {"Optimal solution found": "optimal", "Time limit reached": "time limit",
           "Model is infeasible": "infeasible", "Solve interrupted": "interrupted"}


def read_log(path: Path) -> Gurobi:
    """Gurobi's result in one log: the last run in it that was not interrupted (a log may hold a
    finished run and then an interrupted rerun of the same model)."""
    kept = Gurobi(None, None, None, "no run")
    objective = bound = seconds = None
    status = "cut short"
    for line in path.read_text(errors="replace").splitlines():
        if match := _SUMMARY.search(line):
            objective, bound = _number(match[1]), _number(match[2])
            if status != "interrupted":
                kept = Gurobi(objective, bound, seconds, status)
            objective = bound = seconds = None
            status = "cut short"
        elif match := _EXPLORED.search(line):
            seconds = float(match[1])
        elif any(line.startswith(prefix) for prefix in _STATUS):
            status = next(name for prefix, name in _STATUS.items() if line.startswith(prefix))
        elif match := _PROGRESS.search(line):
            objective, bound, seconds = _number(match[1]), _number(match[2]), float(match[3])
    if objective is not None:  # a run the log ends in the middle of
        kept = Gurobi(objective, bound, seconds, "cut short")
    return kept


def log_of(instance: Instance, folder: Path) -> Path | None:
    pattern = LOGS.get(instance.model)
    if pattern is None:
        return None
    budget = instance.budget_gb
    for text in (f"{budget:02.0f}" if budget == int(budget) else f"{budget:g}", f"{budget:g}"):
        path = folder / pattern.format(budget=text)
        if path.exists():
            return path
    return None


def instances(folder: Path) -> list[Instance]:
    found = [read_instance(path) for path in folder.glob("solution_*.pkl")]
    return sorted(found, key=lambda inst: (inst.model, inst.budget_gb))


def replay_check(inst: Instance) -> dict:
    """Gurobi's own schedule converted and replayed: time (0.01 ms) and peak against the budget."""
    from monet.solver import simulate

    from .monet_convert import UNIT, budget_bytes, convert, gurobi_objective, gurobi_schedule

    converted = convert(inst)
    schedule, notes = gurobi_schedule(inst, converted)
    replay = simulate(converted.problem, schedule)
    terms = gurobi_objective(inst)
    return {"time": replay.time / UNIT, "terms": terms, "peak": replay.peak, "budget": budget_bytes(inst),
            "peak_at": replay.peak_at, "notes": notes}


def solve_instance(inst: Instance, time_limit: float, heuristic_effort: float = EFFORT, workers: int = WORKERS,
                   progress=None) -> dict:
    """monet's solve of the converted instance (SETTINGS, or its model's LADDERS, in `workers` processes):
    objective and bound in 0.01 ms, or what failed. `progress` (monet.api's Progress) hears the solver."""
    from monet.solver import solve
    from monet.solver.polish import PATIENCE
    from monet.solver.solve import STALL_GAP, STALL_SHARE

    from .monet_convert import UNIT, budget_bytes, convert

    converted = convert(inst)
    began = time.perf_counter()
    settings = LADDERS.get(inst.model, SETTINGS).but(time_limit=time_limit, heuristic_effort=heuristic_effort,
                                                     workers=workers)
    record = {"model": inst.model, "budget_gb": inst.budget_gb, "time_limit": time_limit,
              "heuristic_effort": heuristic_effort, "workers": workers, "stall_share": STALL_SHARE,
              "neighbourhoods_free_options": workers > 1, "fastest_kernels_first": True,
              "worker_patience": PATIENCE if workers > 1 else None, "freed_before_backward_op": "compact,general",
              "last_rung_stall_gap": STALL_GAP,
              "in_place": len(converted.place_choice), "intermediate_reruns": len(converted.rerun_intermediates),
              "formulation": ",".join(settings.formulation),
              "horizon": ",".join(str(h).lower() for h in settings.horizon)}
    try:
        sol = solve(converted.problem, budget_bytes(inst), settings, progress=progress)
    except Exception as exc:  # an infeasible or failed solve is a result to report
        record.update(status=type(exc).__name__, message=str(exc)[:300], seconds=time.perf_counter() - began)
        return record
    record.update(status=sol.status, objective=sol.objective / UNIT, bound=sol.bound / UNIT,
                  seconds=time.perf_counter() - began, peak=sol.replay.peak, budget=budget_bytes(inst),
                  replayed=sol.replay.time / UNIT, note=getattr(sol, "note", None))
    return record


def read_solves(path: Path) -> dict[tuple[str, float, float], dict]:
    records = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                records[(rec["model"], rec["budget_gb"], rec["time_limit"])] = rec
    return records


def _rungs(record: dict) -> str:
    """A solve's formulations, each with its horizon where the record names one per rung of a ladder."""
    formulations = record.get("formulation", "compact").split(",")
    horizons = record.get("horizon", "").split(",")
    if len(formulations) < 2 or len(horizons) != len(formulations):
        return ",".join(formulations)  # as the solves recorded before horizons were named in cells
    return ",".join(f"{f} ({h})" for f, h in zip(formulations, horizons, strict=True))


def table(folder: Path, solves: dict | None = None) -> str:
    solves = solves or {}
    rows = ["| model | batch | budget (GB) | nodes (fwd / stages) | Gurobi 24 h objective | Gurobi bound | "
            "Gurobi's run | Gurobi's schedule replayed (vs objective; peak / budget) | "
            "monet 60 s: objective (vs Gurobi), bound, status, s, heuristic effort, formulations | "
            "monet 300 s: the same |",
            "|---|---|---|---|---|---|---|---|---|---|"]

    def text(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    def solved(inst: Instance, limit: float, reference: float | None) -> str:
        rec = solves.get((inst.model, inst.budget_gb, limit))
        if rec is None:
            return "not run"
        effort = f", effort {rec.get('heuristic_effort', HIGHS_EFFORT):g}, {_rungs(rec)}"
        if rec.get("workers", 1) > 1:
            effort += f", {rec['workers']} processes"
        if rec.get("stall_share"):
            effort += f", stalled rungs stop ({Fraction(rec['stall_share']).limit_denominator(12)})"
        if rec.get("neighbourhoods_free_options"):
            effort += ", neighbourhoods free every option"
        if rec.get("fastest_kernels_first"):
            effort += ", fastest kernels first"
        if rec.get("worker_patience"):
            effort += f", workers keep their path for {rec['worker_patience']} pieces"
        if rec.get("freed_before_backward_op"):  # True: by the general formulation only (until 2026-12-04)
            where = "general" if rec["freed_before_backward_op"] is True else rec["freed_before_backward_op"]
            effort += f", copies only reruns read freed before the backward op ({where.replace(',', ' and ')})"
        if rec.get("last_rung_stall_gap"):
            effort += (f", the last rung stalled with its gap over {rec['last_rung_stall_gap']:.0%} hands on to a "
                       "neighbourhood search")
        if rec.get("in_place"):
            effort += f", {rec['in_place']} in-place choices"
        if rec.get("intermediate_reruns"):
            effort += f", {rec['intermediate_reruns']} intermediates may rerun"
        if "objective" not in rec:
            return f"{rec['status']} after {rec['seconds']:.0f} s{effort}"
        versus = f" ({rec['objective'] / reference - 1:+.2%})" if reference else ""
        return (f"{text(rec['objective'])}{versus}, {text(rec['bound'])}, {rec['status']}, "
                f"{rec['seconds']:.0f}{effort}")

    for inst in instances(folder):
        log = log_of(inst, folder)
        gurobi = read_log(log) if log else Gurobi(None, None, None, "no log")
        check = replay_check(inst)
        expected = float(inst.solution.runtime_expected)
        replayed = (f"{text(check['time'])} ({check['time'] / expected - 1:+.2%}; "
                    f"{check['peak'] / check['budget']:.3f})")
        rows.append(f"| {inst.model} | {inst.batch} | {inst.budget_gb:g} | {inst.forward} / {inst.stages} | "
                    f"{text(gurobi.objective)} | {text(gurobi.bound)} | {gurobi.status} | {replayed} | "
                    f"{solved(inst, 60.0, gurobi.objective)} | {solved(inst, 300.0, gurobi.objective)} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--solves", type=Path, default=SOLVES)
    parser.add_argument("--solve", type=float, action="append", default=[], help="solve at this time limit (s)")
    parser.add_argument("--only", default="", help="comma-separated models (vgg16, un, googlenet)")
    parser.add_argument("--budgets", default="", help="comma-separated budgets (GB)")
    parser.add_argument("--heuristic-effort", type=float, default=EFFORT,
                        help=f"HiGHS's mip_heuristic_effort for the solves (default {EFFORT:g})")
    parser.add_argument("--workers", type=int, default=WORKERS,
                        help=f"processes per solve: the search, and searches beside it (default {WORKERS})")
    parser.add_argument("--deadline", type=float, default=None, help="start no solve after this many seconds")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    for limit in args.solve:
        for inst in instances(args.folder):
            if args.only and inst.model not in args.only.split(","):
                continue
            if args.budgets and inst.budget_gb not in [float(b) for b in args.budgets.split(",")]:
                continue
            if args.deadline is not None and time.perf_counter() - began > args.deadline:
                break
            named = f"{inst.model} {inst.budget_gb:g} GB, {limit:g} s: "
            with progress_display(Console(stderr=True)) as progress:
                record = solve_instance(inst, limit, args.heuristic_effort, args.workers,
                                        lambda stage, *state, named=named: progress(named + stage, *state))
            print(json.dumps(record), flush=True)
            with args.solves.open("a") as file:
                file.write(json.dumps(record) + "\n")
    text = ("# MONeT's published instances: Gurobi's 24 h results and monet's\n\n"
            f"Written by `python -m benchmarks.monet_instances` from {args.folder.name}/ and the solves recorded in "
            f"{args.solves.name} (units: MONeT's 0.01 ms). Gurobi ran MONeT's ILP 24 h on 12 threads (P100 "
            "profile); monet solves the converted instance (benchmarks/monet_convert.py) with implementation "
            "choices, on this machine's shared cores, with the formulations and horizons each cell names (one; or "
            "a ladder, each rung started from the best schedule so far on an equal share of the time left; where a "
            "cell says \"stalled rungs stop (s)\", a rung before the last stops after s of its share without a "
            "better schedule; where it says the last rung hands on, the last does so too while its gap is over that "
            "share of the step time, and a neighbourhood search in the general formulation takes the time left), "
            "HiGHS's heuristic effort and, where a cell says \"2 processes\", a neighbourhood search beside the "
            "search in a second process (one solve at a time then; where it says \"neighbourhoods free every "
            "option\", each piece of that search freed how every op runs, and the ladder's rungs started from its "
            "schedules where faster; before, a piece freed only the choices of the ops it freed; where it says "
            "\"workers keep their path for N pieces\", the search beside went on from a faster schedule handed "
            "over only after N pieces in a row found none faster, before, at once). Where a cell "
            "names \"in-place choices\", the conversion offered MONeT's in-place ReLUs as choices, and where it "
            "says \"intermediates may rerun\", "
            "MONeT's intermediate nodes (masks, pool indices) could rerun under their path; a cell without them "
            "solved a conversion before it did (every schedule of that one is a schedule of this one). "
            "\"Gurobi's schedule "
            "replayed\" is Gurobi's own solution converted to a monet schedule and replayed in monet's "
            "simulator: its step time against Gurobi's objective, and its peak over the budget. monet's bound "
            "is for its own formulation, not MONeT's (README, \"MONeT's instances\").\n\n"
            + table(args.folder, read_solves(args.solves)))
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
