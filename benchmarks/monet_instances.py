"""MONeT's published instances (utsaslab/monet-schedules): read them, and Gurobi's 24 h results.

MONeT (ICLR 2021) published, per model and memory budget, a pickle of `[SolverInfo, Solution]`
(classes of MONeT's package) and the log of its Gurobi run. This module reads both without
MONeT's code: the pickle through an unpickler that lets in only numpy, a few builtins and plain
stand-ins for MONeT's classes, and the log with a parser of Gurobi 9's summary lines (or, for a
log cut short, its last line of branch-and-bound progress).

    python -m benchmarks.monet_instances [--folder ../shared/monet-instances]

writes benchmarks/results/monet-instances.md: each instance's size and Gurobi's objective, bound
and time, in MONeT's units (0.01 ms). Converting an instance to monet's Problem, and solving it
here for the comparison of issue 14, is not done yet (see the README's "MONeT's instances").
"""

from __future__ import annotations

import argparse
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FOLDER = Path(__file__).resolve().parents[2] / "shared" / "monet-instances"
OUT = Path(__file__).resolve().parent / "results" / "monet-instances.md"
LOGS = {"vgg16": "monet_vgg16_icmn_176_{budget}.out", "un": "monet_unet_icmn_11_{budget}",
        "googlenet": "monet_googlenet_in_320_{budget}"}
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


def table(folder: Path) -> str:
    rows = ["| model | batch | budget (GB) | nodes (fwd / stages) | MONeT's runtime_expected | "
            "Gurobi objective | Gurobi bound | Gurobi s | Gurobi's run |",
            "|---|---|---|---|---|---|---|---|---|"]

    def text(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    for inst in instances(folder):
        log = log_of(inst, folder)
        gurobi = read_log(log) if log else Gurobi(None, None, None, "no log")
        rows.append(f"| {inst.model} | {inst.batch} | {inst.budget_gb:g} | {inst.forward} / {inst.stages} | "
                    f"{text(float(inst.solution.runtime_expected))} | {text(gurobi.objective)} | "
                    f"{text(gurobi.bound)} | {text(gurobi.seconds)} | {gurobi.status} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    text = ("# MONeT's published instances and Gurobi's 24 h results\n\n"
            f"Read by `python -m benchmarks.monet_instances` from {args.folder.name}/ (units: 0.01 ms). "
            "monet's own solve of these instances is not in this table yet: the conversion to monet's "
            "problem is not built.\n\n" + table(args.folder))
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
