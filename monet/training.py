"""Measured training steps: plain PyTorch and MONeT side by side, in one process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .memory import PeakMemory, resident_bytes


@dataclass(frozen=True)
class StepStats:
    peak: int  # bytes, forward + loss + backward of one step
    step_time: float  # seconds, median of full steps (forward, backward, optimizer)


def compare_training(runs: dict[str, nn.Module], x: torch.Tensor,
                     loss_fn: Callable[[torch.Tensor], torch.Tensor], steps: int = 5,
                     warmup: int = 1) -> dict[str, StepStats]:
    """Train each run with SGD on the batch `x`: the peak memory of one step, and the median
    time of `steps` steps taken in rounds (one step of every run per round), so that every
    run sees the same machine load. A MONeTWrapper's parameters are its model's. The model's
    output stays referenced through the backward, as in a usual training loop (`out = model(x)`)
    and as monet's simulator counts it.
    """
    optimizers = {name: torch.optim.SGD(module.parameters(), lr=0.01) for name, module in runs.items()}

    def step(name: str) -> None:
        module = runs[name]
        optimizers[name].zero_grad(set_to_none=True)
        out = module(x)
        loss_fn(out).backward()
        optimizers[name].step()

    peaks = {}
    for name, module in runs.items():
        module.train()
        for _ in range(warmup):
            step(name)
        optimizers[name].zero_grad(set_to_none=True)
        with PeakMemory(x.device, resident_bytes(module, x)) as meter:
            out = module(x)
            loss_fn(out).backward()
            del out  # freed here, not during the next run's measured step
        optimizers[name].step()
        peaks[name] = meter.peak
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(steps):
        for name in runs:
            _sync(x.device)
            start = time.perf_counter()
            step(name)
            _sync(x.device)
            times[name].append(time.perf_counter() - start)
    return {name: StepStats(peaks[name], statistics.median(times[name])) for name in runs}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
