"""The `monet` command: demo, solve, pareto, profile, inspect.

Only what a command needs is imported, and only once its arguments are checked: help and
argument errors come at once, and a bad argument never costs a trace or a solve.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from monet.errors import MonetError
from monet.schedules import (
    AUTOCAST_DTYPES,
    COST_MODELS,
    Inputs,
    InputSpec,
    ProblemFile,
    ScheduleFile,
    ScheduleFileError,
    check_writable,
    load_problem,
    load_schedule,
)
from monet.schedules.optimizer import SHORT_NAMES, OptimizerSpec
from monet.solver import FORMULATIONS, InfeasibleBudgetError, SolveSettings, format_bytes, keep_all, simulate

from .budget import check_budget
from .catalog import BUNDLED, check_model_name, input_dtype, load_inputs, load_model
from .pareto import STRATEGIES, Point, check_strategies, parse_budget_range, sweep, title, write_results
from .progress import interrupted, progress_display, wrote

console = Console()
err = Console(stderr=True)


def _progress():
    """The progress display on stderr, handed to monet.solve as its progress callback (monet.progress)."""
    return progress_display(err)


def parse_shape(text: str) -> tuple[int, ...]:
    """An input shape as people type it: 32,3,224,224 or 32x3x224x224."""
    try:
        shape = tuple(int(s) for s in text.replace("x", ",").split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"input shape {text!r} is not comma-separated integers") from None
    if not shape or any(s <= 0 for s in shape):
        raise argparse.ArgumentTypeError(f"input shape {text!r} must be positive integers")
    return shape


def _horizon(text: str) -> int | None | str | tuple:
    """A horizon, or comma-separated horizons (a ladder, see SolveSettings)."""
    if "," in text:
        return tuple(_horizon(part) for part in text.split(","))
    if text in ("auto", "none"):
        return None if text == "none" else text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"horizon {text!r} is not a number of stages, 'none' or 'auto'")
    return int(text)


def _formulation(text: str) -> str | tuple:
    """A formulation, or comma-separated formulations (a ladder, see SolveSettings)."""
    names = tuple(text.split(","))
    unknown = [name for name in names if name not in FORMULATIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"formulation {unknown[0]!r} is not one of {', '.join(FORMULATIONS)}")
    return names if len(names) > 1 else names[0]


DEFAULT = SolveSettings()  # every solver setting's default, written once (monet.solver.options)


def _cost_model_option(parser: argparse.ArgumentParser, default: str | None = "measured") -> None:
    """--cost-model; `default` None where it is filled in once the command knows it traces (see _model_or_problem)."""
    parser.add_argument("--cost-model", choices=COST_MODELS, default=default,
                        help="op times: measured on this machine, or analytic (from FLOPs and bytes; "
                             "deterministic). Workspace is measured either way. Default: measured")


def _settings_options(parser: argparse.ArgumentParser, *, time_limit_help: str = "solver time limit; the best "
                      "schedule found by then is returned", per_strategy: bool = False) -> None:
    """The flags of SolveSettings's fields, their defaults read from it; `_settings` reads them back.
    `per_strategy` (pareto): whether to choose implementations is each strategy's, so no flag for it."""
    parser.add_argument("--time-limit", type=float, default=DEFAULT.time_limit, metavar="SECONDS",
                        help=f"{time_limit_help}. Default: {DEFAULT.time_limit:g}")
    parser.add_argument("--formulation", type=_formulation, default=DEFAULT.formulation,
                        help="compact: each tensor recomputed at most once (scales); general: any number "
                             "of times (lower budgets and faster schedules; grows as tensors x stages); auto: "
                             "general for small graphs with nothing else to choose, else compact; "
                             "comma-separated: each in turn from the best schedule so far (compact,general "
                             f"with --horizon auto,none). Default: {DEFAULT.formulation}")
    parser.add_argument("--gap", type=float, default=DEFAULT.gap * 100, metavar="PERCENT",
                        help="stop once the predicted step time is proven within this %% of the best possible "
                             f"in the formulation. Default: {DEFAULT.gap * 100:g}")
    parser.add_argument("--horizon", type=_horizon, default=DEFAULT.horizon,
                        help="how many backward stages ahead of its use an op may rerun: a number, 'none' "
                             "(unbounded) or 'auto' (as long as the graph's size allows); comma-separated: each in "
                             f"turn. Default: {DEFAULT.horizon}")
    parser.add_argument("--heuristic-effort", type=float, default=DEFAULT.heuristic_effort, metavar="SHARE",
                        help="share (0 to 1) of HiGHS's search spent looking for schedules rather than proving "
                             "bounds: more helps large models that reach the time limit. "
                             f"Default: {DEFAULT.heuristic_effort:g} (HiGHS's)")
    parser.add_argument("--polish", type=float, default=DEFAULT.polish, metavar="SHARE",
                        help="share (0 to below 1) of the time limit kept, after the search, for a neighbourhood "
                             "search that improves its schedule (HiGHS on pieces of the general formulation): "
                             "finds faster schedules on the largest models. Default: "
                             f"{DEFAULT.polish:g} (none)")
    parser.add_argument("--workers", type=int, default=DEFAULT.workers, metavar="N",
                        help="processes the solve may use: each beyond the first runs that neighbourhood search "
                             "beside the search, on the best schedule either has found, for the whole time limit "
                             f"(HiGHS uses one core). Default: {DEFAULT.workers}")
    parser.add_argument("--solver-log", action="store_true", help="show HiGHS's log while solving")
    if not per_strategy:
        parser.add_argument("--checkpointing-only", action="store_true",
                            help="only choose what to keep and recompute; run every op as PyTorch does")
    parser.add_argument("--allow-approximate", action="store_true",
                        help="also consider options that change gradients slightly (2-bit GELU derivative, "
                             "other convolution algorithms); their measured error is recorded in the schedule")


def _settings(args) -> SolveSettings:
    """The SolveSettings that the command line gives (what _settings_options added; the rest default)."""
    return SolveSettings(time_limit=args.time_limit, formulation=args.formulation, gap=args.gap / 100,
                         horizon=args.horizon, heuristic_effort=args.heuristic_effort, polish=args.polish,
                         workers=args.workers, solver_log=args.solver_log,
                         implementations=not getattr(args, "checkpointing_only", False),
                         allow_approximate=args.allow_approximate)


def _solve_options(parser: argparse.ArgumentParser) -> None:
    _cost_model_option(parser)
    _settings_options(parser)


def _model_options(parser: argparse.ArgumentParser, problem: str | None = None) -> None:
    """MODEL and the input and device to trace it at; `problem` says what --problem FILE does instead
    (None: the command has no --problem, and MODEL and --input-shape are required)."""
    model_help = f"bundled model ({', '.join(BUNDLED)}) or package.module:factory"
    if problem:
        parser.add_argument("model", nargs="?", help=f"{model_help}; or give --problem instead")
        parser.add_argument("--problem", metavar="FILE", help=problem)
    else:
        parser.add_argument("model", help=model_help)
    parser.add_argument("--input-shape", type=parse_shape,
                        help="one input tensor of this shape, e.g. 32,3,224,224 (needed with MODEL unless --inputs "
                             "or MODEL's factory give example inputs)")
    parser.add_argument("--inputs", metavar="MODULE:FUNCTION",
                        help="example inputs: package.module:function returning a tensor, a tuple of positional "
                             "inputs or a dict of keyword inputs (a factory MODEL may also return (model, inputs))")
    parser.add_argument("--input-dtype", help="dtype of the --input-shape tensor. Default: the bundled model's, "
                                              "else float32")
    parser.add_argument("--input-requires-grad", action="store_true",
                        help="the --input-shape tensor needs a gradient too (costs memory)")
    parser.add_argument("--device", help="device to trace and profile on. Default: cpu")
    parser.add_argument("--autocast", choices=AUTOCAST_DTYPES,
                        help="trace and train the step under torch.autocast at this dtype (mixed precision; "
                             "bfloat16 on CPU). Default: off")
    parser.add_argument("--optimizer", choices=sorted(SHORT_NAMES),
                        help="the step ends with this optimizer's update (PyTorch's defaults; SGD at lr 0.01): the "
                             "budget and prediction cover its state and its step. Default: none counted")
    parser.add_argument("--micro-batches", type=int,
                        help="backward passes whose gradients accumulate before each optimizer step. Default: 1")


def _as_flags(text: str) -> str:
    """A library message or note, with the settings it names (`time_limit`, `formulation='general'`:
    SolveSettings fields in backticks) said as this command's flags (--time-limit, --formulation general)."""
    return re.sub(r"`(\w+)(?:='([^']*)')?`",
                  lambda m: f"--{m[1].replace('_', '-')}" + (f" {m[2]}" if m[2] is not None else ""), text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="monet", description="Train PyTorch models in less memory: solve "
                                     "what to keep and what to recompute under a memory budget.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="solve and train the bundled CNN at 50%% of its peak, next to PyTorch")
    demo.add_argument("--budget", default="50%", help="budget, as bytes (4GiB), %% of the unconstrained "
                      "peak, or 'least'. Default: 50%%")
    demo.add_argument("--input-shape", type=parse_shape, default=BUNDLED["cnn"].input_shape,
                      help="batch shape. Default: %(default)s")
    demo.add_argument("--steps", type=int, default=10, help="timed training steps per run. Default: 10")
    _solve_options(demo)

    solve_p = sub.add_parser("solve", help="solve a schedule for a model, input shape and budget")
    _model_options(solve_p, "solve a problem file from `monet profile` instead of tracing MODEL here (input, "
                   "device and costs are the file's)")
    solve_p.add_argument("--budget", required=True,
                         help="bytes (4GiB, 512MB), %% of the unconstrained peak (50%%), %% of its activation memory "
                              "(50%%act: of the peak above parameters, gradients, buffers and inputs), or 'least' "
                              "(the least peak the "
                              "search finds in --time-limit, then the fastest schedule there in as long again)")
    solve_p.add_argument("-o", "--output", required=True, help="schedule file to write (JSON)")
    solve_p.add_argument("--ablation", action="store_true",
                         help="also solve with checkpointing alone on the same profile, start the joint "
                              "search from that schedule, and compare")
    _solve_options(solve_p)
    solve_p.set_defaults(cost_model=None)  # "measured" with MODEL (see _model_or_problem); --problem has its own

    pareto = sub.add_parser("pareto", help="sweep budgets: predicted time against peak memory, per strategy")
    _model_options(pareto, "sweep a problem file from `monet profile` instead of tracing MODEL here")
    pareto.add_argument("--budgets", default="30%:100%:10%",
                        help="START:END:STEP or a list (40%%,2GiB), sizes or %% of the unconstrained peak. "
                             "Default: %(default)s")
    pareto.add_argument("--strategies", default=",".join(STRATEGIES),
                        help="comma-separated, from: " + ", ".join(STRATEGIES) + ". Default: all")
    _cost_model_option(pareto, None)  # "measured" with MODEL (see _model_or_problem); --problem has its own
    _settings_options(pareto, time_limit_help="time limit of each solver run", per_strategy=True)
    pareto.add_argument("-o", "--output", default="pareto", help="folder for pareto.csv, .md and .png. "
                        "Default: %(default)s")

    profile_p = sub.add_parser("profile", help="trace and profile a model once, to solve later or on another "
                               "machine (solve --problem, pareto --problem)")
    _model_options(profile_p)
    profile_p.add_argument("-o", "--output", required=True, help="problem file to write (JSON)")
    _cost_model_option(profile_p)
    profile_p.add_argument("--checkpointing-only", action="store_true",
                           help="profile only what checkpointing needs; every op runs as in PyTorch")

    inspect = sub.add_parser("inspect", help="show what a schedule keeps and recomputes")
    inspect.add_argument("schedule", help="schedule file, or the name of a bundled schedule")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _warn
        try:
            return {"demo": _demo, "solve": _solve, "pareto": _pareto, "inspect": _inspect,
                    "profile": _profile}[args.command](args)
        except (MonetError, ValueError) as exc:
            err.print(f"[red]error:[/red] {escape(_as_flags(str(exc)))}", soft_wrap=True)  # paths stay whole
            return 2
        except KeyboardInterrupt:  # Ctrl-C: one line, status 130, nothing written
            return interrupted(err)


def _warn(message, category, *_) -> None:
    err.print(f"[yellow]warning:[/yellow] {escape(str(message))}", soft_wrap=True)


def _check(args, *, output_folder: bool = False) -> None:
    """Every argument of a command that traces or solves, checked before any of that work starts."""
    if getattr(args, "model", None) is not None:
        check_model_name(args.model)
    if getattr(args, "budget", None) is not None:
        check_budget(args.budget)
    if getattr(args, "time_limit", 1) <= 0:
        raise ValueError(f"--time-limit {args.time_limit:g} must be a positive number of seconds")
    if not 0 <= getattr(args, "gap", 0) < 100:
        raise ValueError(f"--gap {args.gap:g} must be a percentage from 0 to 100")
    if not 0 <= getattr(args, "heuristic_effort", 0) <= 1:
        raise ValueError(f"--heuristic-effort {args.heuristic_effort:g} must be a share from 0 to 1")
    if not 0 <= getattr(args, "polish", 0) < 1:
        raise ValueError(f"--polish {args.polish:g} must be a share from 0 to below 1 (of the time limit)")
    if getattr(args, "workers", 1) < 1:
        raise ValueError(f"--workers {args.workers} must be 1 or more processes")
    if getattr(args, "steps", 1) <= 0:
        raise ValueError(f"--steps {args.steps} must be positive")
    if getattr(args, "output", None) is not None:
        check_writable(args.output, "-o", folder=output_folder)


def _device(name: str):
    """The torch device `--device` names, if this torch can run on it."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"--device {name!r} is not a device name ({exc}); use cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name}: monet runs on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
        raise ValueError(f"--device {name}: {why} (torch {torch.__version__}); use --device cpu, or a CUDA build "
                         "of torch on a machine with a GPU")
    return device


def _load(args):
    """The model named on the command line, on its device, and the inputs to trace it with: an input
    spec from --input-shape, or example inputs from --inputs or the model's factory (on that device)."""
    import torch
    from torch.utils import _pytree as pytree

    device = _device(args.device or "cpu")
    model, given = load_model(args.model)
    named = [flag for flag, used in (("--input-shape", args.input_shape), ("--inputs", args.inputs),
                                     (f"{args.model}'s factory", given is not None)) if used]
    if len(named) != 1:
        got = f"got {', '.join(named)}" if named else "none given"
        raise ValueError(f"`monet {args.command} {args.model}` takes its inputs from one of --input-shape (e.g. "
                         f"32,3,224,224), --inputs or a factory that returns (model, inputs); {got}")
    if args.input_shape is None and (args.input_dtype or args.input_requires_grad):
        raise ValueError("--input-dtype and --input-requires-grad describe the --input-shape tensor; example inputs "
                         "carry their own")
    if args.input_shape is not None:
        return model.to(device), InputSpec(args.input_shape, args.input_dtype or input_dtype(args.model),
                                           args.input_requires_grad)
    inputs = load_inputs(args.inputs) if args.inputs else given
    return model.to(device), pytree.tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, inputs)


def _save(made, path: str) -> Path:
    """Write a schedule or problem file. The checks before the work make a failure rare; if it fails
    all the same, the result is kept in a temporary folder and the error says where."""
    try:
        return wrote(made.save(path))
    except OSError as exc:
        kept = made.save(Path(tempfile.mkdtemp(prefix="monet-")) / (Path(path).name or "out.json"))
        raise ScheduleFileError(f"could not write {path}: {exc.strerror or exc}; the result is kept in {kept}") \
            from None


def _solve(args) -> int:
    _model_or_problem(args)
    if args.ablation and args.checkpointing_only:
        raise ValueError("--ablation compares with --checkpointing-only; give one of them")
    _check(args)
    from monet.solver import SolverFailedError

    from .api import solve_problem_file, solve_traced, trace_problem

    if args.problem:
        made = load_problem(args.problem)
    else:
        model, inputs = _load(args)
        name = type(model).__name__
    settings = _settings(args)
    with _progress() as progress:
        if args.problem:
            def solve_it(settings: SolveSettings, **call) -> ScheduleFile:
                return solve_problem_file(made, args.budget, settings, **call)
        else:
            problem = trace_problem(model, inputs, autocast=args.autocast, optimizer=args.optimizer,
                                    micro_batches=args.micro_batches or 1, cost_model=args.cost_model,
                                    implementations=settings.implementations, progress=progress)

            def solve_it(settings: SolveSettings, **call) -> ScheduleFile:
                return solve_traced(problem, args.budget, name, settings, **call)
        alone = None
        if args.ablation:  # checkpointing alone first: the joint search starts from its schedule
            try:
                alone = solve_it(settings.but(implementations=False),
                                 progress=lambda stage, *state: progress(f"(ablation) {stage}", *state))
            except (InfeasibleBudgetError, SolverFailedError) as exc:
                alone = exc
        schedule = solve_it(settings, start=alone if isinstance(alone, ScheduleFile) else None, progress=progress)
    path = _save(schedule, args.output)
    _print_summary(schedule)
    if args.ablation:
        _print_ablation(schedule, alone)
    console.print(f"wrote {path}")
    return 0


def _print_ablation(joint: ScheduleFile, alone: ScheduleFile | Exception) -> None:
    table = Table(title="predicted: joint choice against checkpointing alone (same profile and budget)")
    for col in ("", "peak", "step", "ops changed", "solver"):
        table.add_column(col, justify="left" if not col else "right")
    for label, s in (("joint", joint), ("checkpointing alone", alone)):
        if isinstance(s, Exception):
            table.add_row(label, "-", "-", "-", str(s).split(";")[0])
            continue
        pred = s.predicted
        table.add_row(label, format_bytes(pred.peak),
                      f"{pred.time * 1e3:.1f} ms ({pred.time / pred.unconstrained_time - 1:+.1%})",
                      str(len(s.schedule.options)), f"{s.solver.status}, {s.solver.solve_time_s:.1f} s")
    console.print(table)


def _inspect(args) -> int:
    schedule = load_schedule(args.schedule)
    _print_summary(schedule)
    saved = schedule.schedule.saved
    phase = {name: ph for name, _, ph in schedule.graph.ops}
    reruns = Counter(name for name in schedule.schedule.backward if phase.get(name) == "forward")
    table = Table(title="kept for the backward (largest first)")
    table.add_column("tensor")
    table.add_column("size", justify="right")
    for name, size in sorted(saved.items(), key=lambda kv: -kv[1])[:15]:
        table.add_row(name, format_bytes(size))
    if len(saved) > 15:
        table.add_row(f"... {len(saved) - 15} more", format_bytes(sum(sorted(saved.values())[:-15])))
    console.print(table)
    console.print(f"recomputed in the backward: {sum(reruns.values())} op runs of {len(reruns)} ops"
                  + (": " + ", ".join(f"{n} x{c}" if c > 1 else n for n, c in reruns.items()) if reruns else ""))
    options = schedule.schedule.options
    kinds = Counter(f"{choice.rpartition(':')[2]} {option}" for choice, option in options.items())
    console.print(f"run otherwise than PyTorch: {len(options)} ops"
                  + (": " + ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items())) if kinds else ""))
    for choice, error in schedule.schedule.approximate.items():
        measured = f"relative error {error:.2g} when profiled" if error is not None else "error not measured"
        console.print(f"[yellow]approximate:[/yellow] {choice} runs {options[choice]} ({measured})")
    return 0


def _pareto(args) -> int:
    _model_or_problem(args)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    check_strategies(strategies)
    parse_budget_range(args.budgets, 1 << 40)  # a malformed range fails now, not after tracing
    _check(args, output_folder=True)
    if args.problem:
        problem = load_problem(args.problem).problem
    else:
        from .api import trace_problem

        model, inputs = _load(args)
        with _progress() as progress:
            problem = trace_problem(model, inputs, autocast=args.autocast, optimizer=args.optimizer,
                                    micro_batches=args.micro_batches or 1, cost_model=args.cost_model,
                                    implementations="monet" in strategies, progress=progress)
    full = simulate(problem, keep_all(problem))
    budgets = parse_budget_range(args.budgets, full.peak)
    runs = sum(len(budgets) if STRATEGIES[s][1] else 1 for s in strategies if s in STRATEGIES)
    with _progress() as progress:
        done = []

        def on_point(point: Point) -> None:
            done.append(point)
            progress(f"sweeping ({point.strategy})", len(done), runs)

        points = sweep(problem, budgets, strategies, _settings(args), on_point=on_point)
    heading = title(problem.meta)
    paths = write_results(points, (full.peak, full.time), args.output, heading)
    table = Table(title=heading, box=box.SIMPLE_HEAD)
    for col in ("strategy", "budget", "peak", "predicted time", "overhead", "status"):
        table.add_column(col, justify="left" if col in ("strategy", "status") else "right")
    for p in points:
        table.add_row(p.strategy, "-" if p.budget is None else format_bytes(p.budget),
                      "-" if p.peak is None else format_bytes(p.peak),
                      "-" if p.time is None else f"{p.time * 1e3:.1f} ms",
                      "-" if p.time is None else f"{p.time / full.time - 1:+.1%}", p.status)
    console.print(table)
    console.print("wrote " + ", ".join(str(p) for p in paths))
    return 0


# options of `solve` and `pareto` that profiling takes: with --problem, the file has fixed them
_PROFILE_OPTIONS = {"input_shape": "--input-shape", "inputs": "--inputs", "input_dtype": "--input-dtype",
                    "input_requires_grad": "--input-requires-grad", "device": "--device", "autocast": "--autocast",
                    "optimizer": "--optimizer", "micro_batches": "--micro-batches",
                    "cost_model": "--cost-model"}


def _model_or_problem(args) -> None:
    """`solve` and `pareto` trace MODEL here or read --problem FILE: one of the two. With MODEL, fill in
    the defaults of what profiling takes; with --problem, none of that may be given."""
    if (args.model is None) == (args.problem is None):
        raise ValueError(f"`monet {args.command}` takes a MODEL to trace here or --problem FILE (from `monet "
                         f"profile`), {'not both' if args.model else 'and got neither'}")
    if args.problem:
        given = [flag for dest, flag in _PROFILE_OPTIONS.items() if getattr(args, dest, None) not in (None, False)]
        if given:
            raise ValueError(f"{', '.join(given)} cannot go with --problem: the problem file was profiled "
                             "with its input, device and cost model (give them to `monet profile`)")
        return
    args.cost_model = args.cost_model or "measured"


def _profile(args) -> int:
    _check(args)
    from .api import profile

    model, inputs = _load(args)
    with _progress() as progress:
        made = profile(model, inputs, autocast=args.autocast, optimizer=args.optimizer,
                       micro_batches=args.micro_batches or 1, cost_model=args.cost_model,
                       implementations=not args.checkpointing_only, progress=progress)
    path = _save(made, args.output)
    _print_problem(made)
    console.print(f"wrote {path}", soft_wrap=True)
    console.print(f"solve it here or elsewhere: monet solve --problem {path} --budget 50% -o schedule.json",
                  soft_wrap=True, markup=False, highlight=False)
    return 0


def _print_problem(made: ProblemFile) -> None:
    problem = made.problem
    full = simulate(problem, keep_all(problem))
    table = Table(show_header=False, title=f"{made.model} problem")
    table.add_row("input", _input_row(made.input))
    autocast = f", autocast {made.meta['autocast']}" if made.meta.get("autocast") else ""
    if made.meta.get("optimizer"):
        table.add_row("optimizer", OptimizerSpec.from_dict(made.meta["optimizer"]).describe())
    table.add_row("device / costs",
                  f"{made.device}{autocast} / {made.cost_model} (torch {made.meta.get('torch', '?')})")
    table.add_row("ops", f"{len(problem.forward_ops)} forward, {len(problem.backward_ops)} backward")
    table.add_row("ways to run ops", f"{len(problem.choices)} choices" if made.implementations
                  else "not profiled (checkpointing only)")
    table.add_row("unconstrained", f"peak {format_bytes(full.peak)}, step {full.time * 1e3:.1f} ms")
    table.add_row("graph fingerprint", made.fingerprint)
    console.print(table)


def _input_row(inputs: Inputs) -> str:
    spec = inputs.single
    if spec is None:
        return inputs.describe()
    return f"{'x'.join(map(str, spec.shape))} {spec.dtype}" + (" (needs grad)" if spec.requires_grad else "")


def _print_summary(schedule: ScheduleFile) -> None:
    pred, solver = schedule.predicted, schedule.solver
    table = Table(show_header=False, title=f"{schedule.model} schedule")
    table.add_row("input", _input_row(schedule.input))
    autocast = f", autocast {schedule.autocast}" if schedule.autocast else ""
    table.add_row("device / costs", f"{schedule.device}{autocast} / {schedule.cost_model}")
    if schedule.optimizer:
        table.add_row("optimizer", f"{schedule.optimizer.describe()}: its state and step are in the peak")
    table.add_row("budget", format_bytes(schedule.budget))
    table.add_row("predicted peak", f"{format_bytes(pred.peak)} ({pred.peak / pred.unconstrained_peak:.0%} "
                                    f"of {format_bytes(pred.unconstrained_peak)} unconstrained)")
    if pred.activation_share is not None:
        table.add_row("activation memory", f"{pred.activation_share:.0%} of keeping everything's (the peak above "
                                           f"{format_bytes(pred.floor)} of parameters, gradients, buffers and inputs)")
    overhead = pred.time / pred.unconstrained_time - 1
    table.add_row("predicted step time", f"{pred.time * 1e3:.1f} ms ({overhead:+.1%})")
    gap = f", within {solver.gap:.2%} of its bound" if solver.gap is not None else ""
    table.add_row("solver", f"{solver.formulation}: {solver.status}{gap}, {solver.solve_time_s or 0:.2f} s")
    saved = schedule.schedule.saved
    table.add_row("kept tensors", f"{len(saved)} ({format_bytes(sum(saved.values()))})")
    console.print(table)
    if solver.note:  # a heuristic result: what it is and what would help
        console.print(f"[yellow]note:[/yellow] {escape(_as_flags(solver.note))}", soft_wrap=True)


def _demo(args) -> int:
    _check(args)
    import copy

    import torch
    import torch.nn.functional as F

    from .api import solve
    from .training import compare_training
    from .wrapper import MONeTWrapper

    torch.manual_seed(0)
    model, _ = load_model("cnn")
    shape = args.input_shape
    console.print(f"monet demo: {BUNDLED['cnn'].about}, batch {'x'.join(map(str, shape))} on CPU")
    x = torch.randn(shape)
    target = torch.randint(0, 10, (shape[0],))

    def loss(out):
        return F.cross_entropy(out, target)

    runs = {"PyTorch": (copy.deepcopy(model), None)}
    for budget in ("100%", args.budget):
        run_model = copy.deepcopy(model)
        with _progress() as progress:
            schedule = solve(run_model, shape, budget, _settings(args), cost_model=args.cost_model,
                             progress=progress)
        runs[f"monet {budget}"] = (MONeTWrapper(run_model, schedule, shape), schedule)
    stats = compare_training({name: module for name, (module, _) in runs.items()}, x, loss, args.steps)
    rows = [(name, schedule, stats[name], schedule.solver.solve_time_s if schedule else None)
            for name, (_, schedule) in runs.items()]
    base = rows[0][2].step_time
    table = Table(title="peak memory and time of one training step (forward, backward, SGD)", box=box.SIMPLE_HEAD,
                  pad_edge=False, padding=(0, 1))
    for col in ("run", "budget", "predicted", "measured", "step", "overhead", "solve"):
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=True)
    for name, schedule, stats, solve_time in rows:
        table.add_row(
            name,
            format_bytes(schedule.budget) if schedule else "-",
            format_bytes(schedule.predicted.peak) if schedule else "-",
            format_bytes(stats.peak),
            f"{stats.step_time * 1e3:.0f} ms",
            f"{stats.step_time / base - 1:+.1%}",
            f"{solve_time:.1f} s" if solve_time is not None else "-",
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
