"""Regenerate the precomputed schedules in schedules/: the benchmark models at their full input
shapes and standard budgets, solved with the analytic cost model.

Analytic op times (FLOPs and bytes) are the same on every machine, so a schedule made here carries
to another CPU machine; workspace is measured on this one (the traced problems are cached in
`.cache/`). A schedule is named `MODEL-bBATCH-SIZE-PCTpct` (`resnet50-b32-224-50pct`) and loads by
that name: `MONeTWrapper(model, "resnet50-b32-224-50pct", (32, 3, 224, 224))`. A budget below
what the solver can reach is reported and skipped. `schedules/zoo.md` lists what was made.

    python -m benchmarks.zoo                                  # every model, 30 % 50 % 70 %
    python -m benchmarks.zoo --models resnet50 --budgets 40% --time-limit 300
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from benchmarks.models import MODELS
from benchmarks.problems import cached_problem, shape_tag
from monet.api import solve_traced
from monet.schedules import BUNDLED_DIR, ScheduleFile, load_schedule, write_atomic
from monet.solver import InfeasibleBudgetError, SolverFailedError, SolveSettings, format_bytes

console = Console()
ZOO_MODELS = [name for name in MODELS if name != "cnn"]


def schedule_name(tag: str, budget: str) -> str:
    return f"{tag}-{budget.rstrip('%')}pct"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=ZOO_MODELS, choices=list(MODELS), metavar="MODEL",
                        help=f"default: {' '.join(ZOO_MODELS)}")
    parser.add_argument("--budgets", nargs="+", default=["30%", "50%", "70%"],
                        help="percentages; default: 30%% 50%% 70%%")
    parser.add_argument("--time-limit", type=float, default=120.0, help="solver seconds per schedule. Default: 120")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to trace; default: cpu")
    parser.add_argument("--cache", default=".cache", help="folder for traced problems. Default: .cache")
    parser.add_argument("-o", "--output", type=Path, default=BUNDLED_DIR, help="folder. Default: the bundled schedules")
    args = parser.parse_args(argv)
    if bad := [b for b in args.budgets if not b.endswith("%")]:
        parser.error(f"budgets must be percentages (they name the files): {bad}")

    for name in args.models:
        bench = MODELS[name]
        tag = shape_tag(bench, bench.input_shape)
        console.log(f"{tag}: tracing and profiling (analytic times, measured workspace), or from {args.cache}/")
        problem = cached_problem(bench, bench.input_shape, device=args.device, cache=args.cache)
        for budget in args.budgets:
            target = schedule_name(tag, budget)
            try:
                made = solve_traced(problem, budget, problem.meta["model"], SolveSettings(time_limit=args.time_limit))
            except (InfeasibleBudgetError, SolverFailedError) as exc:
                console.log(f"{target}: no schedule ({exc})")
                continue
            console.log(f"wrote {made.save(args.output / f'{target}.json')}: {_row(target, made)}")
    console.log(f"wrote {write_index(args.output)}")
    return 0


def _row(name: str, made: ScheduleFile) -> str:
    p, s = made.predicted, made.solver
    share = p.peak / p.unconstrained_peak
    return (f"| {name} | {made.model} {'x'.join(map(str, made.input.single.shape))} | {made.device} | "
            f"{format_bytes(p.peak)} of {format_bytes(p.unconstrained_peak)} ({share:.0%}) "
            f"| {p.time / p.unconstrained_time - 1:+.2%} | {s.status}, gap {s.gap:.2%}, "
            f"{s.solve_time_s:.0f} s |")


def write_index(folder: Path) -> Path:
    """zoo.md: one row per schedule file in `folder`, read back from the files."""
    rows = [_row(path.stem, load_schedule(path)) for path in sorted(folder.glob("*.json"))]
    return write_atomic(folder / "zoo.md", "\n".join([
        "# Precomputed schedules", "",
        "Made by `python -m benchmarks.zoo` (analytic op times, measured workspace). Overhead: predicted step "
        "time over keeping everything. Load one by name: `MONeTWrapper(model, NAME, input_shape)`.", "",
        "| name | model, input | device | predicted peak | predicted overhead | solver |", "|---|---|---|---|---|---|",
        *rows]) + "\n")


if __name__ == "__main__":
    sys.exit(main())
