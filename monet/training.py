"""Measured training steps: the same loop for plain PyTorch and for MONeT, side by side."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from collections.abc import Callable

import torch
from torch import nn

from .memory import PeakMemory, resident_bytes


@dataclass(frozen=True)
class StepStats:
    peak: int  # bytes, forward + loss + backward of one step
    step_time: float  # seconds, median of full steps (forward, backward, optimizer)


def measure_training(module: nn.Module, params: nn.Module, x: torch.Tensor,
                     loss_fn: Callable[[torch.Tensor], torch.Tensor], steps: int = 5, warmup: int = 1) -> StepStats:
    """Train `module` with SGD on one batch: peak memory of a step and median step time.

    `params` is the module whose parameters train (the model itself, also when wrapped);
    `loss_fn` maps the output to a scalar loss.
    """
    optimizer = torch.optim.SGD(params.parameters(), lr=0.01)  # stateless: no optimizer memory

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(module(x)).backward()
        optimizer.step()

    module.train()
    for _ in range(warmup):
        step()
    optimizer.zero_grad(set_to_none=True)
    with PeakMemory(x.device, resident_bytes(params, x)) as meter:
        loss_fn(module(x)).backward()
    optimizer.step()
    times = []
    for _ in range(steps):
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        start = time.perf_counter()
        step()
        if x.device.type == "cuda":
            torch.cuda.synchronize(x.device)
        times.append(time.perf_counter() - start)
    return StepStats(meter.peak, statistics.median(times))
