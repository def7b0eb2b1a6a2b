"""What monet does on a GPU, measured in one short run (a lent GPU's time is scarce).

`python -m benchmarks.gpu_check -o DIR [--stages ...] [--schedules DIR] [--deadline S]` writes
DIR/results.json (one record per stage, rewritten as each ends; an earlier run's records in DIR are kept)
and, per stage:
- `cnn`, `transformer` (the bundled models): eager's step peak and time; a measured profile (written
  as a problem file, for solving anywhere); schedules at 100 % and 50 % (or 2 % over the least peak
  where 50 % is below it), each one's predicted and measured peak (`torch.cuda.max_memory_allocated`,
  first and second step; `max_memory_reserved` beside it) and step time, an op-by-op memory log of its
  step (`*.ops.json`: every ATen call in order with the bytes allocated after it and the allocator's peak
  during it) and a CUDA memory snapshot of the 50 % step; and every parameter's gradient error against
  a float64 run (see float64_errors).
- `profiles`: each of `--models` at MONeT's setting (MONAI ResNet-50 184, GoogLeNet 320, MobileNetV2 272,
  VGG-16 176 at 224x224; UNet 11 at 416x608), profiled here and written as NAME-bBATCH.problem.json, for
  solving elsewhere (or beside the GPU's next stages, on its host's cores).
- `solves`: `monet solve` of each profiled model at each of `--budgets`, every one in a process of its own
  on the host's cores, into DIR/schedules (logs beside); started here and waited for by `runs`, so the
  stages between (`cnn`, `transformer`) use the GPU meanwhile.
- `runs`: each of `--models` at MONeT's setting: eager, per-block checkpointing and the schedules in
  `--schedules` (default: what `solves` wrote), each one's peak and step time; the profile is the output
  folder's problem file where `profiles` wrote one, else a fresh one, written there.
- `compiled`: torch.compile's step of each of `--models` at `--compile-share` of its activation memory.
- `monet-compiled`: monet's torch.compile backend on each of `--models` at each of `--compiled-budgets`,
  beside eager.
- `resnet50-gradients`: ResNet-50 at batch 32, its 50 % schedule's gradient errors against float64.
- `batch-norm`: training batch norm's native kernels (the traced graph's) against cuDNN's (eager's).
Stages are not started once `--deadline` seconds have passed; a stage that fails is recorded and the
next one runs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import monet
import monet.models
from monet import MONeTWrapper, PeakMemory
from monet.graph.kernels import cudnn_benchmark

from .budgets import above_least
from .models import MODELS


class OpLog(TorchDispatchMode):
    """Every ATen call in order: (name, bytes allocated after it, the allocator's peak during it)."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[str, int, int]] = []
        self.peak = 0  # the whole block's (each op resets the allocator's peak)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **(kwargs or {}))
        peak = torch.cuda.max_memory_allocated()
        self.rows.append((str(func), torch.cuda.memory_allocated(), peak))
        self.peak = max(self.peak, peak)
        return out


@contextlib.contextmanager
def tf32(on: bool):
    """TF32 in cuBLAS's matrix products and cuDNN's convolutions on or off, as it was after. Set through
    `fp32_precision` ("tf32" or "ieee"): the legacy `torch.backends.cudnn.allow_tf32 = False` leaves
    cuDNN's convolution precision at "none" (seen on torch 2.13), not "ieee", and reading the legacy
    flag after the new one is set raises."""
    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    was = conv.fp32_precision, matmul.fp32_precision
    conv.fp32_precision = matmul.fp32_precision = "tf32" if on else "ieee"
    try:
        yield
    finally:
        conv.fp32_precision, matmul.fp32_precision = was


def step(module, x, weights):
    out = module(x)
    (out * weights).sum().backward()


def clear_grads(*modules):
    for m in modules:
        for p in m.parameters():
            p.grad = None


def median_step_seconds(module, x, weights, steps: int = 5) -> float:
    samples = []
    for _ in range(steps):
        clear_grads(module)
        torch.cuda.synchronize()
        began = time.perf_counter()
        step(module, x, weights)
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def measured_peak(module, x, weights, model) -> dict:
    """One step's peak, absolute and above what was allocated before it, and the reserve."""
    clear_grads(model)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with PeakMemory("cuda") as meter:
        step(module, x, weights)
    return {"peak": meter.peak, "before": before, "reserved": torch.cuda.max_memory_reserved()}


def grads(module, model, x, weights) -> dict[str, torch.Tensor]:
    clear_grads(model)
    step(module, x, weights)
    return {n: p.grad.detach().double().clone() for n, p in model.named_parameters()}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def float64_errors(model, x, schedule, weights) -> dict:
    """Per parameter, the relative error against a float64 eager run of the same model and batch of
    eager float32 (cuDNN's default algorithms, and with cudnn.benchmark: other kernels, other rounding)
    and of `model` trained by `schedule`, with TF32 on ("tf32") and off ("fp32"); "norm" is the float64
    gradient's norm (a convolution bias before a batch norm has a true gradient of 0, so its relative
    error says little)."""
    ref = copy.deepcopy(model).double()
    g64 = grads(ref, ref, x.double(), weights.double())
    del ref
    result = {}
    for on in (True, False):
        with tf32(on):
            eager_model = copy.deepcopy(model)
            ge = grads(eager_model, eager_model, x, weights)
            with cudnn_benchmark():
                gb = grads(eager_model, eager_model, x, weights)
            monet_model = copy.deepcopy(model)
            gm = grads(MONeTWrapper(monet_model, schedule, tuple(x.shape)), monet_model, x, weights)
        result["tf32" if on else "fp32"] = {
            n: {"eager": rel(ge[n], g64[n]), "eager_benchmark": rel(gb[n], g64[n]), "monet": rel(gm[n], g64[n]),
                "norm": g64[n].norm().item()} for n in g64}
    return result


def solved(problem, budget, time_limit: float):
    """(schedule, None) at `budget`, or where that is below every schedule, (the schedule at 2 % over the
    least peak found, that least)."""
    schedule, _, least = above_least(lambda at: monet.solve_problem_file(problem, at, time_limit=time_limit), budget)
    return schedule, least


def check_model(name: str, model, shape, budgets, out: Path, time_limit: float, record) -> None:
    torch.manual_seed(0)
    model = model.cuda().train()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen).cuda()
    with torch.no_grad():
        weights = torch.randn(model(x).shape, generator=gen).cuda()
    eager = copy.deepcopy(model)
    rec = {"shape": list(shape), "eager": measured_peak(eager, x, weights, eager)}
    rec["eager"]["seconds"] = median_step_seconds(eager, x, weights)
    del eager
    began = time.perf_counter()
    problem = monet.profile(model, shape, cost_model="measured")
    rec["profile_seconds"] = time.perf_counter() - began
    problem.save(out / f"{name}.problem.json")
    rec["runs"] = {}
    for budget in budgets:
        began = time.perf_counter()
        schedule, least = solved(problem, budget, time_limit)
        solve_seconds = time.perf_counter() - began
        tag = f"{name}-{budget.rstrip('%')}"
        schedule.save(out / f"{tag}.json")
        wrapped = MONeTWrapper(model, schedule, shape)
        run = rec["runs"].setdefault(budget, {} if least is None else {"infeasible": True, "least_peak": least})
        run.update(budget_bytes=schedule.budget, predicted=schedule.predicted.peak,
                   predicted_seconds=schedule.predicted.time, status=schedule.solver.status,
                   solve_seconds=solve_seconds)
        if budget == budgets[-1]:
            torch.cuda.memory._record_memory_history(stacks="python", max_entries=200_000)
        log = OpLog()
        with log:
            first = measured_peak(wrapped, x, weights, model)
        first["peak"] = log.peak  # the meter's reading was reset by the log
        if budget == budgets[-1]:
            torch.cuda.memory._dump_snapshot(str(out / f"{tag}.snapshot.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
        (out / f"{tag}.ops.json").write_text(json.dumps(log.rows))
        run["first"] = first
        run["second"] = measured_peak(wrapped, x, weights, model)
        run["seconds"] = median_step_seconds(wrapped, x, weights)
        (out / f"{tag}.graphs.py").write_text(
            "\n# ---- backward ----\n".join(wrapped.graphs[k].code for k in ("forward", "backward")))
        record(name, rec)
    rec["gradients"] = float64_errors(model, x, out / f"{name}-{budgets[-1].rstrip('%')}.json", weights)
    record(name, rec)


STAGES = ("cnn", "transformer", "profiles", "solves", "runs", "compiled", "monet-compiled", "resnet50-gradients",
          "batch-norm")
# MONeT's published settings (its paper's batch sizes; UNet at Checkmate's 416x608), which the
# `profiles`, `runs` and `compiled` stages use
MONET_SHAPE = {"resnet50": (184, 3, 224, 224), "googlenet": (320, 3, 224, 224), "mobilenet_v2": (272, 3, 224, 224),
               "vgg16": (176, 3, 224, 224), "unet": (11, 3, 416, 608)}


def _benchmark_model(name: str, shape):
    """A benchmark model on the GPU in training mode, a batch and output weights for its loss."""
    torch.manual_seed(0)
    model = MODELS[name].build().cuda().train()
    x = torch.randn(shape, device="cuda")
    with torch.no_grad():
        weights = torch.randn(model(x).shape, device="cuda")
    return model, x, weights


def _with_eager(name: str):
    """A benchmark model at MONeT's setting (as _benchmark_model) and a record of its eager step's peak and
    median time (3 steps)."""
    shape = MONET_SHAPE[name]
    model, x, weights = _benchmark_model(name, shape)
    rec = {"shape": list(shape), "eager": measured_peak(model, x, weights, model)}
    rec["eager"]["seconds"] = median_step_seconds(model, x, weights, steps=3)
    clear_grads(model)
    torch.cuda.empty_cache()
    return model, x, weights, rec


def problem_path(name: str, out: Path) -> Path:
    return out / f"{name}-b{MONET_SHAPE[name][0]}.problem.json"


def model_profile(name: str, out: Path, record, model=None):
    """A benchmark model at MONeT's setting profiled here (measured costs), written to `out`."""
    from monet.solver import keep_all, simulate

    shape = MONET_SHAPE[name]
    if model is None:
        model = _benchmark_model(name, shape)[0]
    began = time.perf_counter()
    problem = monet.profile(model, shape, cost_model="measured")
    rec = {"shape": list(shape), "profile_seconds": time.perf_counter() - began, "held": problem.problem.held,
           "keep_all_peak": simulate(problem.problem, keep_all(problem.problem)).peak}
    problem.save(problem_path(name, out))
    torch.cuda.empty_cache()
    record(f"{name}-profile", rec)
    return problem


class Solves:
    """The `solves` stage's processes: started by `start`, waited for (and their summaries recorded) by `wait`."""

    def __init__(self):
        self.running: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, folder: Path, problems: dict[str, Path], budgets, seconds: float) -> None:
        """Solve each of `problems` (name -> problem file) at each of `budgets` (%) into `folder`/NAME-BUDGET.json."""
        folder.mkdir(exist_ok=True)
        for name, problem in problems.items():
            for budget in budgets:
                tag, log = f"{name}-{budget}", folder / f"{name}-{budget}.log"
                command = [sys.executable, "-m", "monet.cli", "solve", "--problem", str(problem),
                           "--budget", f"{budget}%", "--time-limit", f"{seconds:g}", "-o", str(folder / f"{tag}.json")]
                with log.open("w") as file:
                    self.running.append((tag, subprocess.Popen(command, stdout=file, stderr=subprocess.STDOUT), log))

    def wait(self, record) -> None:
        done = {}
        for tag, process, log in self.running:
            process.wait()
            lines = [" ".join(line.replace("│", " ").split()) for line in log.read_text().splitlines()]
            done[tag] = {"returncode": process.returncode,
                         "summary": [line for line in lines if line.startswith(("predicted", "solver", "error"))]}
        self.running = []
        if done:
            record("solves", done)


def model_runs(name: str, out: Path, schedules: Path | None, record) -> None:
    """A benchmark model at MONeT's setting: eager, per-block checkpointing and monet's schedules in
    `schedules` named NAME-*.json (solved elsewhere from a problem profiled here; each is also replayed on
    the output folder's profile), each one's peak and step time."""
    from monet.schedules import load_problem, load_schedule
    from monet.solver import simulate

    from .competitors import checkpoint_blocks

    shape = MONET_SHAPE[name]
    model, x, weights, rec = _with_eager(name)
    record(name, rec)
    path = problem_path(name, out)
    problem = load_problem(path) if path.exists() else model_profile(name, out, record, model)
    blocks = copy.deepcopy(model)
    checkpoint_blocks(blocks, MODELS[name].blocks(blocks))
    rec["checkpoint-blocks"] = measured_peak(blocks, x, weights, blocks)
    rec["checkpoint-blocks"]["seconds"] = median_step_seconds(blocks, x, weights, steps=3)
    del blocks
    torch.cuda.empty_cache()
    record(name, rec)
    for path in sorted(schedules.glob(f"{name}-*.json")) if schedules else ():
        schedule = load_schedule(path)
        wrapped = MONeTWrapper(model, schedule, shape)
        run = {"budget": schedule.budget, "predicted": schedule.predicted.peak,
               "predicted_seconds": schedule.predicted.time, "status": schedule.solver.status,
               "replayed_here": simulate(problem.problem, schedule.schedule.on(problem.problem)).peak}
        run["first"] = measured_peak(wrapped, x, weights, model)
        run["second"] = measured_peak(wrapped, x, weights, model)
        run["seconds"] = median_step_seconds(wrapped, x, weights)
        rec[path.stem] = run
        del wrapped
        clear_grads(model)
        torch.cuda.empty_cache()
        record(name, rec)


def compiled_run(name: str, share: float, record) -> None:
    """torch.compile's training step of the same model at `share` of its activation memory."""
    from .competitors import compiled

    shape = MONET_SHAPE[name]
    model, x, weights = _benchmark_model(name, shape)
    began = time.perf_counter()
    module = compiled(model, share, lambda m: step(m, x, weights))
    rec = {"shape": list(shape), "share": share, "compile_seconds": time.perf_counter() - began}
    rec.update(measured_peak(module, x, weights, module))
    rec["seconds"] = median_step_seconds(module, x, weights)
    record(f"{name}-compiled", rec)


def monet_compiled_run(name: str, budgets, time_limit: float, record) -> None:
    """monet's torch.compile backend (`monet.backend`, measured costs) on a model at MONeT's setting at each
    of `budgets` (% of the compiled region's unconstrained peak), beside eager in the same process: each
    one's compile seconds (profiling and solving included), the region's predicted peak and time, the
    measured peak of a step after the compiling one, and the step time."""
    from monet.solver import SolveSettings

    from .competitors import monet_compiled

    model, x, weights, rec = _with_eager(name)
    record(f"{name}-monet-compiled", rec)

    def compiled_at(budget):
        torch._dynamo.reset()
        return monet_compiled(model, budget, lambda m: step(m, x, weights), SolveSettings(time_limit=time_limit),
                              "measured")

    for budget in budgets:
        began = time.perf_counter()
        (module, region), _, least = above_least(compiled_at, f"{budget}%")  # or 2 % over the least peak found
        run = {} if least is None else {"infeasible": True, "least_peak": least}
        run |= {"compile_seconds": time.perf_counter() - began, "budget": region.budget,
               "predicted": region.predicted.peak, "predicted_seconds": region.predicted.time,
               "status": region.solver.status, **measured_peak(module, x, weights, model)}
        run["seconds"] = median_step_seconds(module, x, weights)
        rec[f"{budget}%"] = run
        del module
        clear_grads(model)
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        record(f"{name}-monet-compiled", rec)


def gradients_at(name: str, shape, out: Path, time_limit: float, record) -> None:
    """A benchmark model at a batch whose float64 step fits: its 50 % schedule's gradient errors."""
    torch.manual_seed(0)
    model = MODELS[name].build().cuda().train()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen).cuda()
    with torch.no_grad():
        weights = torch.randn(copy.deepcopy(model)(x).shape, generator=gen).cuda()
    schedule, least = solved(monet.profile(model, shape), "50%", time_limit)
    rec = {"shape": list(shape), "predicted": schedule.predicted.peak, "status": schedule.solver.status,
           "least_peak": least, "gradients": float64_errors(model, x, schedule, weights)}
    record(f"{name}-gradients", rec)


def batch_norm_kernels(record) -> None:
    """Training batch norm at ResNet-50 b184's sizes: the graph's kernels (native, as monet runs the traced
    step) against cuDNN's (as eager PyTorch runs it): forward and backward milliseconds, cuDNN's reserve
    bytes, and how far cuDNN's results are from native's."""
    rows = {}
    for c, hw in ((64, 112), (256, 56), (512, 28), (1024, 14), (2048, 7)):
        rows[f"{c}x{hw}x{hw}"] = _batch_norm_pair(184, c, hw)
        record("batch-norm", rows)


def _batch_norm_pair(n: int, c: int, hw: int) -> dict:
    aten = torch.ops.aten
    x = torch.randn(n, c, hw, hw, device="cuda")
    w, b = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    g = torch.randn_like(x)

    def native():
        out, mean, invstd, _, _ = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
        return out, aten.native_batch_norm_backward(g, x, w, rm, rv, mean, invstd, True, 1e-5, [True] * 3), None

    def cudnn():
        out, mean, invstd, reserve = aten.cudnn_batch_norm(x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)
        return out, aten.cudnn_batch_norm_backward(x, g, w, rm, rv, mean, invstd, 1e-5, reserve), reserve

    row = {}
    for name, fn in (("native", native), ("cudnn", cudnn)):
        fn()
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        row[f"{name}_ms"] = (time.perf_counter() - began) / 10 * 1e3
    (out_n, grads_n, _), (out_c, grads_c, reserve) = native(), cudnn()
    row.update(reserve_bytes=reserve.numel() * reserve.element_size(), out_rel=rel(out_c, out_n),
               grad_rel=[rel(a, b) for a, b in zip(grads_c, grads_n)])
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--stages", nargs="+", choices=STAGES,
                        default=["runs", "cnn", "transformer", "resnet50-gradients", "compiled"])
    parser.add_argument("--models", nargs="+", default=["resnet50"], choices=sorted(MONET_SHAPE),
                        help="models the profiles, runs and compiled stages measure, at MONeT's settings. "
                             "Default: resnet50")
    parser.add_argument("--schedules", type=Path,
                        help="schedules (NAME-*.json) for the runs stage. Default: DIR/schedules (the solves stage's)")
    parser.add_argument("--budgets", nargs="+", type=int, default=[100, 50, 33],
                        help="budgets (%% of the unconstrained peak) the solves stage solves. Default: 100 50 33")
    parser.add_argument("--solve-seconds", type=float, default=90, help="the solves stage's time limit. Default: 90")
    parser.add_argument("--compile-share", type=float, default=0.5,
                        help="torch.compile's activation_memory_budget in the compiled stage. Default: 0.5")
    parser.add_argument("--compiled-budgets", nargs="+", type=int, default=[33],
                        help="budgets (%% of the region's unconstrained peak) of the monet-compiled stage. Default: 33")
    parser.add_argument("--deadline", type=float, default=240, help="seconds after which no stage starts")
    parser.add_argument("--time-limit", type=float, default=20, help="solver seconds per schedule")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA device")
    out = args.output
    out.mkdir(parents=True, exist_ok=True)
    earlier = out / "results.json"  # an earlier invocation's stages in this folder are kept
    results = json.loads(earlier.read_text()) if earlier.exists() else {}
    results.update({"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                    "device": torch.cuda.get_device_name(), "tf32": [torch.backends.cuda.matmul.fp32_precision,
                                                                   torch.backends.cudnn.conv.fp32_precision]})
    began = time.perf_counter()

    def record(stage, rec):
        results[stage] = rec
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        print(f"[{time.perf_counter() - began:.0f}s] {stage}: {json.dumps(rec, default=str)[:1500]}", flush=True)

    solves = Solves()
    stages = {
        "cnn": lambda: check_model("cnn", monet.models.ResidualCNN(), (32, 3, 64, 64), ["100%", "50%"], out,
                                   args.time_limit, record),
        "transformer": lambda: check_model("transformer", monet.models.Transformer(dim=256, depth=4, dropout=0.0),
                                           (16, 256, 256), ["100%", "50%"], out, args.time_limit, record),
        "profiles": lambda: [model_profile(name, out, record) for name in args.models],
        "solves": lambda: solves.start(out / "schedules", {name: problem_path(name, out) for name in args.models},
                                       args.budgets, args.solve_seconds),
        "runs": lambda: [solves.wait(record), *(model_runs(name, out, args.schedules or out / "schedules", record)
                                                for name in args.models)],
        "compiled": lambda: [compiled_run(name, args.compile_share, record) for name in args.models],
        "monet-compiled": lambda: [monet_compiled_run(name, args.compiled_budgets, args.time_limit, record)
                                   for name in args.models],
        "batch-norm": lambda: batch_norm_kernels(record),
        "resnet50-gradients": lambda: gradients_at("resnet50", (32, 3, 224, 224), out, args.time_limit, record),
    }
    for stage in args.stages:
        if time.perf_counter() - began > args.deadline:
            print(f"deadline: {stage} not started", flush=True)
            continue
        try:
            stages[stage]()
        except Exception as exc:  # a failed stage is a finding; the next one still runs
            results[stage + ":error"] = repr(exc)
            record(stage + ":error", repr(exc))
        torch.cuda.empty_cache()
    solves.wait(record)


if __name__ == "__main__":
    main()
