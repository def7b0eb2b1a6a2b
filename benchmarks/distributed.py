"""monet under DistributedDataParallel against eager and per-block checkpointing, and FSDP2 beside them.

`python -m benchmarks.distributed [--ranks 2] [--layers 8] [--batch B --length L] [--budget 50%]` builds GPT-2
(transformers, from a small config: no download) with labels inside, and for each method spawns the
ranks over gloo on 127.0.0.1 (CPU) and trains: forward and backward of each rank's shard (B
sequences of L tokens), the gradients all-reduced (DDP) or reduce-scattered (FSDP2), then an SGD
step. Each rank measures a steady step's peak (monet.memory.PeakMemory, from the third step on) and
the median time of the steps after it; the table shows the largest over the ranks. Methods: under
DDP, eager, transformers' per-layer checkpointing, and MONeTWrapper with a schedule solved here for
one rank's shard at `--budget` (for the whole step, SGD's included; where that is below the least
peak, 2 % above the least); under FSDP2 (`fully_shard` on every block and the root), eager,
checkpointing, and monet block by block (monet.solve_blocks with `shards`: the blocks' schedules
solved together here for one rank's step under FSDP2 at `--budget`, the same fallback;
monet.wrap_blocks runs them). Writes
distributed-<size>-cpu.{json,csv,md,png} to `-o`.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import monet
from monet.memory import PeakMemory
from monet.report import markdown_table, write_report
from monet.schedules import check_writable
from monet.solver import format_bytes

from .budgets import above_least
from .report import machine, peak_step_plot

METHODS = (("ddp", "eager"), ("ddp", "checkpointing"), ("ddp", "monet"),
           ("fsdp2", "eager"), ("fsdp2", "checkpointing"), ("fsdp2", "monet"))
WARMUP = 2  # steps before the measured one: DDP rebuilds its buckets after the first


def gpt2(layers: int = 8, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=2048, n_embd=256, n_layer=layers, n_head=4, n_positions=512, use_cache=False)
    return GPT2LMHeadModel(config)


def shard(rank: int, batch: int, length: int) -> dict:
    """Rank `rank`'s inputs: its own token ids, the labels inside."""
    ids = torch.randint(0, 2048, (batch, length), generator=torch.Generator().manual_seed(100 + rank))
    return {"input_ids": ids, "labels": ids}


def _local_bytes(model: torch.nn.Module, inputs: dict) -> int:
    """Bytes resident before a step: each parameter's local storage (a shard under FSDP2) and the batch."""
    tensors = [getattr(p, "_local_tensor", p) for p in model.parameters()] + list(inputs.values())
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def _rank(rank: int, world: int, port: int, args: dict, schedule_file: str | list[str] | None, out: str,
          stacks_after: float) -> None:
    """One rank: wrap, train, and write (peak, median step seconds) to `out`/rank<rank>.pt; a rank still
    running after `stacks_after` seconds writes its threads' stacks to `out`/rank<rank>.stacks."""
    stacks = open(f"{out}/rank{rank}.stacks", "w")  # noqa: SIM115 (open until the process exits)
    faulthandler.dump_traceback_later(stacks_after, file=stacks)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        model = gpt2(args["layers"])
        inputs = shard(rank, args["batch"], args["length"])
        if args["method"] == "checkpointing":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        module = model
        if schedule_file and args["parallel"] == "fsdp2":
            monet.wrap_blocks(model, model.transformer.h, inputs, schedules=schedule_file)
        elif schedule_file:
            module = monet.MONeTWrapper(model, schedule_file, inputs)
        if args["parallel"] == "ddp":
            module = torch.nn.parallel.DistributedDataParallel(module)
        else:
            from torch.distributed.fsdp import fully_shard

            for block in model.transformer.h:
                fully_shard(block)
            fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            out = module(**inputs)  # held through the backward, as training loops hold it (and monet predicts)
            out.loss.backward()
            optimizer.step()

        for _ in range(WARMUP):
            step()
            optimizer.zero_grad(set_to_none=True)
        with PeakMemory("cpu", _local_bytes(model, inputs)) as meter:
            step()
        times = []
        for _ in range(args["steps"]):
            optimizer.zero_grad(set_to_none=True)
            began = time.perf_counter()
            step()
            times.append(time.perf_counter() - began)
        torch.save((meter.peak, statistics.median(times)), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no teardown of the model, DDP and gloo objects: it hung once in CI after the result was written


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, args: dict, schedule_file: str | list[str] | None, timeout: float) -> list[tuple[int, float]]:
    """(peak, median step seconds) of each rank; the ranks are killed if they outlive `timeout`, and the error
    then holds the stacks of those still running, as they were 30 s before."""
    with tempfile.TemporaryDirectory() as out:
        context = mp.get_context("spawn")
        port = _free_port()
        procs = [context.Process(target=_rank, args=(rank, world, port, args, schedule_file, out,
                                                       max(0.5 * timeout, timeout - 30)))
                 for rank in range(world)]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        try:
            for proc in procs:
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if any(proc.exitcode != 0 for proc in procs):
                codes = [proc.exitcode for proc in procs]
                running = [Path(out, f"rank{rank}.stacks") for rank, proc in enumerate(procs) if proc.exitcode is None]
                stacks = "".join(f"\n{path.stem}'s stacks:\n{path.read_text()}" for path in running if path.exists())
                raise RuntimeError(f"ranks exited with {codes} (None: still running after {timeout:g} s){stacks}")
            return [torch.load(f"{out}/rank{rank}.pt") for rank in range(world)]
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join()


def bench(args: argparse.Namespace) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for parallel, method in METHODS:
            row = {"parallel": parallel, "method": method, "budget": None, "predicted_peak": None, "note": ""}
            schedule_file = None
            if method == "monet" and parallel == "ddp":
                began = time.perf_counter()
                solve = functools.partial(monet.solve, gpt2(args.layers), shard(0, args.batch, args.length),
                                          optimizer="sgd", cost_model=args.cost_model, time_limit=args.time_limit)
                schedule = _solved(solve, args.budget, row)
                schedule_file = f"{folder}/gpt2.json"
                schedule.save(schedule_file)
                row["predicted_peak"] = schedule.predicted.peak
                row["note"] += f"{schedule.solver.status}, solved in {time.perf_counter() - began:.0f} s"
            if method == "monet" and parallel == "fsdp2":
                began, model = time.perf_counter(), gpt2(args.layers)
                solve = functools.partial(monet.solve_blocks, model, model.transformer.h,
                                          shard(0, args.batch, args.length), shards=args.ranks,
                                          cost_model=args.cost_model, time_limit=args.time_limit)
                plan = _solved(solve, args.budget, row)
                schedule_file = [f"{folder}/gpt2-block{i}.json" for i in range(len(plan.schedules))]
                for schedule, path in zip(plan.schedules, schedule_file):
                    schedule.save(path)
                row["predicted_peak"] = plan.peak
                row["note"] += (f"{plan.schedules[0].solver.status}, "
                                f"solved in {time.perf_counter() - began:.0f} s")
            found = run_ranks(args.ranks, {"parallel": parallel, "method": method, "batch": args.batch,
                                           "length": args.length, "steps": args.steps, "layers": args.layers},
                               schedule_file, args.timeout)
            row["peak"], row["step"] = max(p for p, _ in found), max(t for _, t in found)
            rows.append(row)
            print(f"{parallel} {method}: peak {format_bytes(row['peak'])}, step {row['step']:.3f} s {row['note']}",
                  flush=True)
    for row in rows:
        eager = next(r for r in rows if r["parallel"] == row["parallel"] and r["method"] == "eager")
        row["peak_vs_eager"] = row["peak"] / eager["peak"] if row["peak"] else None
        row["step_vs_eager"] = row["step"] / eager["step"] if row["step"] else None
    return rows


def _solved(solve, budget: str, row: dict):
    """`solve(budget)`, or where that is below the least peak (parameters outweigh activations), `solve` 2 % above
    the least; `row` says which."""
    found, used, least = above_least(solve, budget)
    row["budget"] = budget
    if least is not None:
        row["budget"], row["note"] = format_bytes(used), f"{budget} infeasible: least peak {format_bytes(least)}; "
    return found


def markdown(header: dict, rows: list[dict]) -> str:
    def cell(value, text):
        return "" if value is None else text(value)

    cells = [(r["parallel"], r["method"], r["budget"] or "", cell(r["predicted_peak"], format_bytes),
              cell(r["peak"], format_bytes), cell(r["peak_vs_eager"], "{:.0%}".format),
              cell(r["step"], "{:.3f} s".format), cell(r["step_vs_eager"], "{:.0%}".format), r["note"])
             for r in rows]
    intro = (f"GPT-2 ({header['layers']} layers, width 256, vocabulary 2048, from its config), {header['ranks']} "
             f"ranks over gloo on 127.0.0.1, each a shard of {header['batch']}x{header['length']} tokens, labels "
             f"inside; {header['machine']}. "
             f"One step: forward, backward (DDP's all-reduce, FSDP2's gathers and reduce-scatters), SGD's step. "
             f"Peak: a steady step's, the largest over the ranks (each rank's local parameters, batch and what the "
             f"step allocates); step: the median of {header['steps']} steps, the slowest rank's. vs eager: against "
             f"eager under the same parallelism. monet solved for one rank's shard and the whole step under DDP, "
             f"and for one rank's step under FSDP2 (monet.solve_blocks with shards, then monet.wrap_blocks; "
             f"SGD's step not counted) ({header['cost_model']} cost model, {header['time_limit']:g} s each).")
    return markdown_table(f"Several processes: {header['tag']}",
                          ("parallelism", "method", "budget", "predicted peak", "measured peak", "peak vs eager",
                           "step", "step vs eager", "note"), cells, intro=intro,
                          align=["---"] * 3 + ["---:"] * 5 + ["---"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.distributed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes. Default: %(default)s")
    parser.add_argument("--layers", type=int, default=8, help="GPT-2's blocks. Default: %(default)s")
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank. Default: %(default)s")
    parser.add_argument("--length", type=int, default=256, help="tokens per sequence. Default: %(default)s")
    parser.add_argument("--budget", default="50%", help="monet's budget per rank. "
                        "Default: %(default)s")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per rank. Default: %(default)s")
    parser.add_argument("--time-limit", type=float, default=60, help="seconds for monet's solve. Default: %(default)s")
    parser.add_argument("--cost-model", choices=("measured", "analytic"), default="analytic",
                        help="how monet knows op times (workspace is measured either way). Default: %(default)s")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per method's ranks. Default: %(default)s")
    parser.add_argument("-o", "--output", type=Path, default=Path("benchmarks/results/distributed"))
    args = parser.parse_args(argv)
    if min(args.ranks, args.layers, args.batch, args.length, args.steps) < 1:
        parser.error("--ranks, --layers, --batch, --length and --steps must be positive")
    check_writable(args.output, folder=True)
    tag = f"gpt2{'' if args.layers == 8 else f'-{args.layers}layers'}-{args.ranks}x{args.batch}-{args.length}-cpu"
    rows = bench(args)
    header = {"tag": tag, "layers": args.layers, "ranks": args.ranks, "batch": args.batch, "length": args.length,
              "machine": machine("cpu"), "steps": args.steps, "cost_model": args.cost_model,
              "time_limit": args.time_limit, "budget": args.budget}
    png = peak_step_plot({f"{r['parallel']} {r['method']}": r for r in rows if r["peak"]}, peak="peak per rank (MiB)",
                         title=f"GPT-2, {args.ranks} ranks x {args.batch}x{args.length}, cpu (gloo)", figsize=(11, 4))
    for path in write_report(args.output, f"distributed-{tag}", rows, markdown(header, rows), png, header=header):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
