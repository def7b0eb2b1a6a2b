"""Peak memory against step time, measured: monet next to PyTorch's own ways and Checkmate.

For each model: trace and profile it once, build every competitor (see benchmarks/competitors.py)
over copies of the same weights, then train them side by side on one batch in one process
(one peak-measured step each, then the median of several timed steps taken in rounds). Writes
MODEL.csv, .json, .md and .png per model to `-o`, and results.md there: every model table in that
folder, each naming the machine.

    python -m benchmarks.run --quick                      # every model at a small input; minutes per model on a CPU
    python -m benchmarks.run --quick cnn --budgets 50% 70%
    python -m benchmarks.run resnet50 --device cuda       # full size (batch 32, 224x224), for a GPU
    python -m benchmarks.run resnet50 --device cuda --batch 184   # MONeT's setting

Budgets are percentages of the unconstrained peak as monet predicts it, byte sizes, or `least`
(the least peak monet's solver reaches; monet-compiled seeks its own there); torch.compile gets the
same share as its activation_memory_budget.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from rich.console import Console

from benchmarks.competitors import BUDGETED, FAMILIES, build
from benchmarks.models import MODELS
from benchmarks.problems import cached_problem, shape_tag
from benchmarks.report import beaten_by, machine, write_model
from monet.budget import parse_budget
from monet.graph import InputSpec
from monet.schedules import write_atomic
from monet.solver import Problem, Schedule, SolveSettings, keep_all, least_peak, simulate
from monet.training import compare_training

console = Console()
MONET = ("monet", "monet-checkpointing", "monet-compiled")


def loss_fn(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


def resolve_budgets(texts: list[str], problem: Problem, full_peak: int,
                    time_limit: float) -> tuple[list[int], dict[int, Schedule], int | None]:
    """Budgets in bytes, ascending, without repeats; 'least' is the least peak monet's solver
    finds, given with the schedule that reaches it (where monet's joint search then starts), and
    returned on its own (None without 'least')."""
    budgets, starts, found = set(), {}, None
    for text in texts:
        if text == "least":
            least = least_peak(problem, SolveSettings(time_limit=time_limit))
            budgets.add(least.found)
            found = least.found
            if least.schedule is not None:
                starts[least.found] = least.schedule
        else:
            budgets.add(parse_budget(text, full_peak))
    return sorted(budgets), starts, found


def input_shape(bench, quick: bool, batch: int | None) -> tuple[int, ...]:
    """The model's quick or full input shape, with `batch` as its batch size where given."""
    shape = bench.quick_shape if quick else bench.input_shape
    return shape if batch is None else (batch, *shape[1:])


def bench_model(name: str, args: argparse.Namespace) -> None:
    """Trace, build, measure and write the results of one model."""
    bench = MODELS[name]
    shape = input_shape(bench, args.quick, args.batch)
    tag = shape_tag(bench, shape)
    torch.manual_seed(0)
    model = bench.build().to(args.device)
    spec = InputSpec(shape, bench.input_dtype)
    x = spec.example(args.device)
    console.log(f"{tag}: tracing and profiling ({args.cost_model} op times)")
    problem = cached_problem(bench, shape, cost_model=args.cost_model, device=args.device, cache=args.cache,
                             model=model)
    full = simulate(problem, keep_all(problem))
    budgets, starts, least = resolve_budgets(args.budgets, problem, full.peak, args.time_limit)
    console.log(f"{tag}: {len(problem.ops)} ops, unconstrained {full.peak / 2**20:.2f} MiB predicted; budgets "
                + ", ".join(f"{b / full.peak:.0%}" for b in budgets))

    def example(module: torch.nn.Module) -> None:
        loss_fn(module(x)).backward()
        module.zero_grad(set_to_none=True)

    entries = build(bench, model, problem, full.peak, budgets, starts=starts, least=least,
                    families=tuple(args.competitors),
                    time_limit=args.time_limit, example=example, cost_model=args.cost_model,
                    log=lambda m: console.log(f"{tag}: {m}"))
    console.log(f"{tag}: training {sum(e.module is not None for e in entries)} competitors side by side")
    stats = compare_training({e.name: e.module for e in entries if e.module is not None}, x, loss_fn,
                             steps=args.steps, warmup=args.warmup)
    rows = []
    for e in entries:
        measured = stats.get(e.name)
        rows.append({
            "model": name, "name": e.name, "competitor": e.family, "budget": e.budget,
            "budget_pct": None if e.budget is None else 100 * e.budget / full.peak, "status": e.status,
            "predicted_peak": e.predicted and e.predicted[0], "predicted_time_s": e.predicted and e.predicted[1],
            "measured_peak": measured and measured.peak, "step_time_s": measured and measured.step_time,
            "solve_time_s": e.solve_time,
        })
    for row in rows:
        if row["competitor"] in MONET:
            row["beaten_by"] = beaten_by(row, rows)
    header = {
        "title": f"{name}, input {'x'.join(map(str, shape))} ({'quick' if args.quick else 'full'} size), "
                 f"{args.device}",
        "machine": machine(args.device),
        "settings": (f"{args.cost_model} op costs; solver {args.time_limit:g} s per schedule; median of "
                     f"{args.steps} steps after {args.warmup} warm-up; budgets are shares of monet's predicted "
                     f"unconstrained peak ({full.peak / 2**20:.2f} MiB)."),
        "model": name, "input_shape": list(shape), "device": args.device, "unconstrained_peak": full.peak,
        "unconstrained_time_s": full.time,
    }
    for path in write_model(args.output, tag, header, rows):
        console.log(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("models", nargs="*", metavar="MODEL",
                        help=f"default: every one but cnn ({', '.join(MODELS)})")
    parser.add_argument("--quick", action="store_true", help="small inputs (each model's quick shape)")
    parser.add_argument("--batch", type=int, help="batch size instead of the shape's own (MONeT's settings: "
                                                  "resnet50 184, googlenet 320, mobilenet_v2 272, vgg16 176)")
    parser.add_argument("--budgets", nargs="+", help="default: least 50%% 100%% (quick); least 30%% 50%% 70%% 100%%")
    parser.add_argument("--competitors", nargs="+", default=list(FAMILIES), metavar="NAME",
                        help=f"default: all ({', '.join(FAMILIES)}); {', '.join(BUDGETED)} run at every budget")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="default: cpu")
    parser.add_argument("--cost-model", default="measured", choices=["measured", "analytic"],
                        help="op times monet plans with. Default: measured")
    parser.add_argument("--time-limit", type=float, help="solver seconds per schedule. Default: 20 quick, 120 full")
    parser.add_argument("--steps", type=int, help="timed steps per competitor. Default: 3 quick, 10 full")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first. Default: 1")
    parser.add_argument("--cache", default=".cache", help="folder for traced problems (analytic). Default: .cache")
    parser.add_argument("-o", "--output", type=Path, default=Path("benchmark-results"),
                        help="folder for the results. Default: benchmark-results")
    args = parser.parse_args(argv)
    args.models = args.models or [m for m in MODELS if m != "cnn"]
    if unknown := [m for m in args.models if m not in MODELS]:
        parser.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    if unknown := [c for c in args.competitors if c not in FAMILIES]:
        parser.error(f"unknown competitors {unknown}; choose from {', '.join(FAMILIES)}")
    args.budgets = args.budgets or (["least", "50%", "100%"] if args.quick else ["least", "30%", "50%", "70%", "100%"])
    for text in args.budgets:
        if text != "least":
            try:
                parse_budget(text, 1)
            except ValueError as exc:
                parser.error(str(exc))
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device here")
    args.time_limit = args.time_limit or (20.0 if args.quick else 120.0)
    args.steps = args.steps or (3 if args.quick else 10)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be at least 1 and --warmup at least 0")
    if args.batch is not None and args.batch < 1:
        parser.error("--batch must be at least 1")

    for name in args.models:
        bench_model(name, args)
    console.log(f"wrote {write_summary(args.output)}")
    return 0


def write_summary(folder: Path) -> Path:
    """results.md: every model table in `folder` (this run's and earlier ones'), in MODELS order."""
    order = {name: i for i, name in enumerate(MODELS)}
    tables = sorted((p for p in folder.glob("*.md") if p.name != "results.md"),
                    key=lambda p: (order.get(p.stem.split("-b")[0], len(order)), p.stem))
    return write_atomic(folder / "results.md", "\n".join(p.read_text() for p in tables))


if __name__ == "__main__":
    sys.exit(main())
