"""Joint implementation choice against checkpointing alone, solved and measured side by side.

For one model and input shape: trace and profile once, then at each budget solve twice on the
same costed problem (the ILP with every op run as PyTorch runs it, then the joint ILP started
from that schedule),
train one step of each schedule next to plain PyTorch, and print predicted and measured peaks
and step times. Results also go to a JSON file.

    python benchmarks/ablation.py cnn --budgets 30% 50% 70%
    python benchmarks/ablation.py distilbert --input-shape 8,384 --time-limit 120
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
from rich.console import Console
from rich.table import Table

from monet.api import solve_traced, trace_problem
from monet.catalog import BUNDLED, input_dtype, load_model
from monet.cli import parse_shape
from monet.graph import InputSpec
from monet.schedules import write_json
from monet.solver import InfeasibleBudgetError, SolverFailedError, SolveSettings, format_bytes, keep_all, simulate
from monet.training import compare_training
from monet.wrapper import MONeTWrapper

console = Console()
VARIANTS = {"checkpointing": False, "joint": True}  # in this order: the joint search starts from checkpointing's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help=f"bundled model ({', '.join(BUNDLED)}) or package.module:factory")
    parser.add_argument("--input-shape", type=parse_shape, help="default: the bundled model's")
    parser.add_argument("--input-dtype", help="default: the bundled model's, else float32")
    parser.add_argument("--budgets", nargs="+", default=["30%", "50%", "70%"], help="default: 30%% 50%% 70%%")
    parser.add_argument("--time-limit", type=float, default=60.0, help="solver seconds per solve. Default: 60")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps per run. Default: 3")
    parser.add_argument("-o", "--output", default="ablation.json", help="results file. Default: ablation.json")
    args = parser.parse_args(argv)

    bundled = BUNDLED.get(args.model)
    shape = args.input_shape or (bundled.input_shape if bundled else None)
    if shape is None:
        parser.error("--input-shape is needed for a model that is not bundled")
    spec = InputSpec(shape, args.input_dtype or input_dtype(args.model))
    torch.manual_seed(0)
    model, _ = load_model(args.model)
    console.log(f"tracing and profiling {args.model} at {spec}")
    problem = trace_problem(model, spec)
    unconstrained = simulate(problem, keep_all(problem))
    console.log(f"{len(problem.ops)} ops, {len(problem.choices)} implementation choices; unconstrained peak "
                f"{format_bytes(unconstrained.peak)}, step {unconstrained.time * 1e3:.1f} ms (predicted)")

    runs, rows = {"PyTorch": copy.deepcopy(model)}, []
    for budget in args.budgets:
        alone = None
        for variant, implementations in VARIANTS.items():
            row = {"budget": budget, "variant": variant}
            try:
                schedule = solve_traced(problem, budget, type(model).__name__,
                                        SolveSettings(time_limit=args.time_limit, implementations=implementations),
                                        start=alone)
            except (InfeasibleBudgetError, SolverFailedError) as exc:
                rows.append({**row, "error": str(exc)})
                console.log(f"{budget} {variant}: {exc}")
                continue
            alone = alone or schedule
            chosen = {c: o for c, o in schedule.schedule.options.items()
                      if o != problem.choice_named[c].options[0]}
            rows.append({**row, "budget_bytes": schedule.budget, "predicted_peak": schedule.predicted.peak,
                         "predicted_time": schedule.predicted.time, "solver": schedule.solver.to_dict(),
                         "options_changed": chosen})
            console.log(f"{budget} {variant}: predicted {format_bytes(schedule.predicted.peak)}, "
                        f"{schedule.predicted.time * 1e3:.1f} ms, {len(chosen)} ops run differently "
                        f"({schedule.solver.status}, {schedule.solver.solve_time_s:.1f} s)")
            runs[f"{budget} {variant}"] = MONeTWrapper(copy.deepcopy(model), schedule, shape)

    console.log("training one step of each, side by side")
    x = spec.example()
    stats = compare_training(runs, x, lambda out: out.float().square().mean(), steps=args.steps)
    base = stats["PyTorch"]
    for row in rows:
        run = stats.get(f"{row['budget']} {row['variant']}")
        if run:
            row.update(measured_peak=run.peak, step_time=run.step_time)
    write_json(args.output, {"model": args.model, "input": {"shape": list(shape), "dtype": spec.dtype},
                             "pytorch": {"peak": base.peak, "step_time": base.step_time},
                             "unconstrained_predicted": {"peak": unconstrained.peak, "time": unconstrained.time},
                             "rows": rows})
    table = Table(title=f"{args.model} {'x'.join(map(str, shape))}: joint choice vs checkpointing alone "
                        f"(PyTorch: {format_bytes(base.peak)}, {base.step_time * 1e3:.0f} ms)")
    for col in ("budget", "variant", "predicted peak", "measured peak", "predicted time", "measured step", "changed"):
        table.add_column(col, justify="left" if col in ("budget", "variant") else "right")
    for row in rows:
        if "error" in row:
            table.add_row(row["budget"], row["variant"], "infeasible" if "below" in row["error"] else "no schedule",
                          "-", "-", "-", "-")
            continue
        table.add_row(row["budget"], row["variant"], format_bytes(row["predicted_peak"]),
                      format_bytes(row["measured_peak"]), f"{row['predicted_time'] * 1e3:.1f} ms",
                      f"{row['step_time'] * 1e3:.0f} ms ({row['step_time'] / base.step_time - 1:+.0%})",
                      str(len(row["options_changed"])))
    console.print(table)
    console.log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
