"""The solver on full-size graphs: ResNet-50 (batch 32, 224x224) and DistilBERT (batch 8, 384 tokens).

Each model is traced once with analytic op times (deterministic; workspace is measured) and the
problem is cached as JSON. At each budget the monet ILP and Checkmate's MILP get the same time
limit; the table gives each one's predicted step time, its proven bound and gap, the replayed
peak and the solver's wall time. Results also go to a JSON file and a markdown table next to it.

    python -m benchmarks.solver_scale                       # both models, 30 % 50 % 70 %, 60 s each
    python -m benchmarks.solver_scale --models resnet50 --budgets 50% --no-checkmate
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.models import MODELS
from benchmarks.problems import cached_problem
from monet.budget import parse_budget
from monet.schedules import write_atomic, write_json
from monet.solver import (
    InfeasibleBudgetError,
    Problem,
    SolverFailedError,
    SolveSettings,
    checkmate,
    keep_all,
    simulate,
    solve,
)

console = Console()


def traced(name: str, cache: Path) -> Problem:
    """The model's problem at full size with analytic times, from the cache or traced now (minutes on a CPU)."""
    bench = MODELS[name]
    console.log(f"{name}: tracing at {bench.input_shape} (analytic times, measured workspace), or from {cache}/")
    return cached_problem(bench, bench.input_shape, cache=cache)


def run(strategy: str, problem: Problem, budget: int, time_limit: float) -> dict:
    start = time.perf_counter()
    try:
        solution = (solve(problem, budget, SolveSettings(time_limit=time_limit)) if strategy == "monet"
                    else checkmate(problem, budget, time_limit=time_limit))
    except (InfeasibleBudgetError, SolverFailedError) as exc:
        return {"status": "infeasible" if isinstance(exc, InfeasibleBudgetError) else "no schedule",
                "error": str(exc), "wall_s": time.perf_counter() - start}
    return {"status": solution.status, "time_s": solution.replay.time, "bound_s": solution.bound,
            "gap": solution.gap, "peak": solution.peak, "horizon": solution.horizon,
            "formulation": solution.formulation, "wall_s": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,distilbert",
                        help="comma-separated, from: " + ", ".join(MODELS) + ". Default: %(default)s")
    parser.add_argument("--budgets", nargs="+", default=["30%", "50%", "70%"], help="default: 30%% 50%% 70%%")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve. Default: 60")
    parser.add_argument("--no-checkmate", action="store_true", help="skip Checkmate's MILP")
    parser.add_argument("--cache", default=".cache", help="folder for traced problems. Default: .cache")
    parser.add_argument("-o", "--output", default="solver_scale.json", help="results file. Default: %(default)s")
    args = parser.parse_args(argv)

    strategies = ["monet"] + ([] if args.no_checkmate else ["checkmate"])
    rows = []
    for name in args.models.split(","):
        problem = traced(name, Path(args.cache))
        full = simulate(problem, keep_all(problem))
        console.log(f"{name}: {len(problem.forward_ops)} forward and {len(problem.backward_ops)} backward ops, "
                    f"{len(problem.choices)} choices; unconstrained {full.peak / 2**30:.2f} GiB, {full.time:.3f} s")
        for text in args.budgets:
            budget = parse_budget(text, full.peak)
            for strategy in strategies:
                row = {"model": name, "budget": text, "budget_bytes": budget, "strategy": strategy,
                       "unconstrained_peak": full.peak, "unconstrained_time_s": full.time,
                       **run(strategy, problem, budget, args.time_limit)}
                rows.append(row)
                console.log({k: v for k, v in row.items() if k != "error"})
    write_json(args.output, {"time_limit_s": args.time_limit, "rows": rows})
    markdown = write_atomic(Path(args.output).with_suffix(".md"), _markdown(rows))
    console.print(_table(rows))
    console.log(f"wrote {args.output} and {markdown}")
    return 0


COLUMNS = ("model", "budget", "strategy", "status", "step time", "overhead", "bound", "gap", "peak", "solve")


def _cells(r: dict) -> list[str]:
    head = [r["model"], r["budget"], r["strategy"], r["status"]]
    if "time_s" not in r:
        return head + ["-"] * 5 + [f"{r['wall_s']:.1f} s"]
    return head + [f"{r['time_s']:.4f} s", f"{r['time_s'] / r['unconstrained_time_s'] - 1:+.2%}",
                   f"{r['bound_s']:.4f} s", f"{r['gap']:.2%}", f"{r['peak'] / r['unconstrained_peak']:.1%}",
                   f"{r['wall_s']:.1f} s"]


def _table(rows: list[dict]) -> Table:
    table = Table(title="solver at scale (predicted step time; gap = proven distance from the formulation's best)")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("model", "budget", "strategy", "status") else "right")
    for r in rows:
        table.add_row(*_cells(r))
    return table


def _markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
