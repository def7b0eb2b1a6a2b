"""The seed study's experiment: DistilBERT question answering trained with SGD and Adam, in float32
and mixed precision, eager, with PyTorch's per-layer checkpointing and with monet at a budget.

`python -m benchmarks.optimizers [--device cuda] [--batch B --length L] [--budget 50%]` builds
DistilBertForQuestionAnswering from its default config (66.4 M parameters, no download), feeds it
keyword inputs (token ids, attention mask, start and end positions as labels: the loss is computed
inside) and, for every optimizer and precision, measures one whole training step (zeroing the
gradients, forward, backward, optimizer step) from the second step on, when the optimizer's
state exists: peak memory (monet.memory.PeakMemory) and the median step time. monet's schedule
is solved for that whole step (`optimizer=`, `autocast=`), so its prediction is comparable with
the measured peak. Mixed precision is torch.autocast at bfloat16 on CPU and float16 on CUDA (with
torch.amp.GradScaler). Default size: 2x64 on CPU, where bfloat16 matrix products are slow (this
project's CPU: 13 s a step at 2x64 against 0.3 s in float32) and parameters, gradients and Adam's
state outweigh the activations, so that 50 % is out of reach and monet runs at its least peak
(the table says so); 8x384 is about where 50 % becomes reachable (`--precisions float32` skips the
slow bfloat16 runs). 16x384 on CUDA (the seed does not state its batch). A budget below the least
peak is reported with it, and monet runs 2 % above it. Writes optimizers-<size>-<device>.{json,csv,
md,png} to `-o`.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import statistics
import time
from pathlib import Path

import torch

import monet
from monet.memory import PeakMemory, resident_bytes
from monet.report import markdown_table, write_report
from monet.schedules import OptimizerSpec, check_writable
from monet.solver import format_bytes

from .budgets import above_least
from .report import machine, peak_step_plot

OPTIMIZERS = ("sgd", "adam")
METHODS = ("eager", "checkpointing", "monet")


def distilbert_qa(seed: int = 0):
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    torch.manual_seed(seed)
    return DistilBertForQuestionAnswering(DistilBertConfig())


def batch(size: int, length: int, device: str) -> dict:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 30000, (size, length), generator=gen)
    starts = torch.randint(0, length // 2, (size,), generator=gen)
    ends = starts + torch.randint(0, length // 2, (size,), generator=gen)
    inputs = {"input_ids": ids, "attention_mask": torch.ones(size, length, dtype=torch.int64),
              "start_positions": starts, "end_positions": ends}
    return {k: v.to(device) for k, v in inputs.items()}


def run(model, module, inputs: dict, optimizer: str, autocast: torch.dtype | None, steps: int) -> tuple[int, float]:
    """(peak bytes of a steady whole step, median seconds of `steps` steps) of training `module`
    (whose parameters are `model`'s)."""
    device = inputs["input_ids"].device
    opt = OptimizerSpec.of(optimizer)
    optim = opt.build(model.parameters())
    scaler = torch.amp.GradScaler(device.type, enabled=autocast == torch.float16)

    def step():
        optim.zero_grad(set_to_none=True)
        return update()

    def update():
        with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
            out = module(**inputs)
        scaler.scale(out.loss).backward()
        scaler.step(optim)
        scaler.update()
        return out

    model.train()
    del step().loss  # the first step makes the optimizer's state
    state = [v for s in optim.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    optim.zero_grad(set_to_none=True)  # before the meter: on CPU it sees no frees of older blocks
    with PeakMemory(device, resident_bytes(model, *inputs.values(), *state)) as meter:
        out = update()
    del out
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - began)
    return meter.peak, statistics.median(times)


def bench(args: argparse.Namespace) -> list[dict]:
    inputs = batch(args.batch, args.length, args.device)
    base = distilbert_qa().to(args.device)
    mixed = torch.bfloat16 if args.device == "cpu" else torch.float16
    rows = []
    precisions = [(name, autocast) for kind, name, autocast in
                  (("float32", "float32", None), ("mixed", str(mixed).removeprefix("torch."), mixed))
                  if kind in args.precisions]
    for optimizer in OPTIMIZERS:
        for precision, autocast in precisions:
            eager_row = None
            for method in METHODS:
                model = copy.deepcopy(base)
                row = {"optimizer": optimizer, "precision": precision, "method": method, "budget": None,
                       "predicted_peak": None, "note": ""}
                module = model
                if method == "checkpointing":
                    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                elif method == "monet":
                    row["budget"] = args.budget
                    began = time.perf_counter()
                    solve = functools.partial(monet.solve, copy.deepcopy(model), inputs, optimizer=optimizer,
                                              autocast=None if autocast is None else row["precision"],
                                              cost_model=args.cost_model, time_limit=args.time_limit)
                    schedule, _, least = above_least(solve, args.budget)
                    if least is not None:
                        row["note"] = f"{args.budget} infeasible: least peak {format_bytes(least)}"
                        row["budget"] = format_bytes(schedule.budget)
                    row["predicted_peak"] = schedule.predicted.peak
                    row["note"] = (row["note"] + "; " if row["note"] else "") + (
                        f"{schedule.solver.status}, solved in {time.perf_counter() - began:.0f} s")
                    module = monet.MONeTWrapper(model, schedule, inputs)
                row["peak"], row["step"] = run(model, module, inputs, optimizer, autocast, args.steps)
                eager_row = eager_row or row
                row["peak_vs_eager"] = row["peak"] / eager_row["peak"]
                row["step_vs_eager"] = row["step"] / eager_row["step"]
                print(f"{optimizer} {precision} {method}: peak {format_bytes(row['peak'])} "
                      f"({row['peak_vs_eager']:.0%}), step {row['step']:.2f} s ({row['step_vs_eager']:.0%}) "
                      f"{row['note']}", flush=True)
                rows.append(row)
                del model, module
                gc.collect()
    return rows


def markdown(header: dict, rows: list[dict]) -> str:
    cells = [(r["optimizer"], r["precision"], r["method"], r["budget"] or "",
              format_bytes(r["predicted_peak"]) if r["predicted_peak"] else "", format_bytes(r["peak"]),
              f"{r['peak_vs_eager']:.0%}", f"{r['step']:.3f} s", f"{r['step_vs_eager']:.0%}", r["note"])
             for r in rows]
    intro = (f"DistilBertForQuestionAnswering (default config), batch {header['batch']}x{header['length']}, "
             f"{header['machine']}; one whole step (zero_grad, forward, backward, optimizer step) once the "
             f"optimizer's state exists; step time the median of {header['steps']} steps; monet solved with "
             f"the {header['cost_model']} cost model, {header['time_limit']:g} s per solve.")
    return markdown_table(f"Optimizers and precision: {header['tag']}",
                          ("optimizer", "precision", "method", "budget", "predicted peak", "measured peak",
                           "peak vs eager", "step", "step vs eager", "note"), cells, intro=intro,
                          align=["---"] * 4 + ["---:"] * 5 + ["---"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.optimizers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch", type=int, help="batch size. Default: 2 on CPU, 16 on CUDA")
    parser.add_argument("--length", type=int, help="sequence length. Default: 64 on CPU, 384 on CUDA")
    parser.add_argument("--precisions", default="float32,mixed",
                        help="float32, mixed (autocast: bfloat16 on CPU, float16 on CUDA) or both. Default: both")
    parser.add_argument("--budget", default="50%", help="monet's budget for the whole step. Default: %(default)s")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run. Default: %(default)s")
    parser.add_argument("--time-limit", type=float, default=60, help="seconds per monet solve. Default: %(default)s")
    parser.add_argument("--cost-model", choices=("measured", "analytic"), default="analytic",
                        help="how monet knows op times (workspace is measured either way). Default: %(default)s")
    parser.add_argument("-o", "--output", type=Path, default=Path("benchmarks/results/optimizers"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    args.batch = args.batch or (2 if args.device == "cpu" else 16)
    args.length = args.length or (64 if args.device == "cpu" else 384)
    args.precisions = args.precisions.split(",")
    if not args.precisions or not set(args.precisions) <= {"float32", "mixed"}:
        parser.error("--precisions: float32, mixed, or float32,mixed")
    check_writable(args.output, folder=True)
    tag = f"distilbert-qa-b{args.batch}-{args.length}-{args.device}"
    rows = bench(args)
    header = {"tag": tag, "batch": args.batch, "length": args.length, "machine": machine(args.device),
              "steps": args.steps, "cost_model": args.cost_model, "time_limit": args.time_limit,
              "budget": args.budget}
    png = peak_step_plot({f"{r['optimizer']} {r['precision']} {r['method']}": r for r in rows},
                         title=f"DistilBERT QA {args.batch}x{args.length}, {args.device}", figsize=(12, 5))
    for path in write_report(args.output, f"optimizers-{tag}", rows, markdown(header, rows), png, header=header):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
