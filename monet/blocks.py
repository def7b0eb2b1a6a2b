"""monet block by block: a schedule for each block of a model, each block wrapped in MONeTWrapper in place.

`solve_blocks` solves the blocks' schedules together, as one step (on one process, or one rank under
FSDP2), and `wrap_blocks` wraps each block in place. This is how monet composes with FSDP2.
`fully_shard` gathers a block's parameters in hooks around the block's call (and again before its
backward) and frees them after; monet's whole-model step runs ATen ops without calling the blocks,
so it cannot run inside a sharded model. A MONeTWrapper around each block can: `fully_shard(wrapper)`
gathers the block's parameters around the wrapper's call and its backward, and the wrapper reads them
from the block at each call, so each block's schedule runs on whole parameters while the other
blocks' stay sharded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from monet.graph import Example, model_device, sharded_parameters
from monet.schedules import ScheduleFile, load_schedule
from monet.solver import Replay, SolveSettings
from monet.solver.options import settings_of
from monet.solver.stack import stack
from monet.solver.step import solve_step, step_unconstrained

from .api import solve, trace_problem
from .budget import parse_budget
from .wrapper import MONeTWrapper


def block_inputs(model: nn.Module, blocks: Sequence[nn.Module], inputs) -> list[Example]:
    """What each of `blocks` is called with when `model` is called on `inputs` (as monet.solve takes
    them), from one training-mode forward with the random generators restored after it. Tensors are
    detached copies that want a gradient where the block's argument did."""
    device = model_device(model)
    example = Example.of(inputs, device=device)
    seen: dict[int, Example] = {}

    def keep(index: int):
        def hook(_module, args, kwargs):
            copy = tree_map_only(torch.Tensor, lambda t: t.detach().clone().requires_grad_(t.requires_grad),
                                 (args, kwargs))
            seen.setdefault(index, Example(*copy))
        return hook

    handles = [block.register_forward_pre_hook(keep(i), with_kwargs=True) for i, block in enumerate(blocks)]
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.enable_grad():
            model(*example.args, **example.kwargs)
    finally:
        for handle in handles:
            handle.remove()
    missing = [i for i in range(len(blocks)) if i not in seen]
    if missing:
        raise ValueError(f"blocks {missing} were not called when the model ran on these inputs: pass the modules the "
                         "model's forward calls (a ModuleList or Sequential of its blocks)")
    return [seen[i] for i in range(len(blocks))]


@dataclass(frozen=True)
class BlockSchedules:
    """A schedule per block, solved together for the blocks' step (`solve_blocks`), and that step's
    prediction: `replay` is the step as the blocks run their schedules, `unconstrained` the step with
    every block keeping everything, on one process or on one rank under FSDP2 (`shards` ranks)."""

    schedules: tuple[ScheduleFile, ...]
    budget: int
    replay: Replay
    unconstrained: Replay
    shards: int = 1

    @property
    def peak(self) -> int:
        return self.replay.peak


def solve_blocks(model: nn.Module, blocks: nn.ModuleList | nn.Sequential, inputs, budget: str | int | float,
                 settings: SolveSettings | None = None, *, shards: int = 1, cost_model: str = "measured",
                 autocast: str | None = None, progress=None, **changes) -> BlockSchedules:
    """One schedule per block of `blocks`, solved together so that the blocks' step (every forward in
    order, every backward in reverse) peaks within `budget`: bytes, a size string, or a share of that
    step's unconstrained peak ('50%'). Each block's problem is traced as `monet.solve` traces it
    (`settings` and `changes` as it takes them), the problems are stacked into one
    (monet.solver.stack: each block's output is the next one's input, and is kept), and one ILP
    chooses what every block keeps, reruns and how its ops run. Pass `.schedules` to `wrap_blocks`;
    `.peak` is the step's predicted peak, for the blocks alone (not what the model runs around them).
    With `shards` > 1 the step is one rank's under FSDP2 over that many ranks (`fully_shard` on each
    wrapper and the root, FSDP2's defaults): parameters sharded, gathered around each block's
    forward and backward, gradients reduce-scattered (monet.solver.fsdp.sharded says which buffers
    it counts); otherwise every parameter and gradient is held whole for the whole step."""
    settings = settings_of(settings, **changes)
    _check_blocks(model, blocks)
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards {shards!r} must be the number of ranks FSDP2 shards over (1: no sharding)")
    problems = [trace_problem(block, example, cost_model=cost_model, autocast=autocast, progress=progress,
                              implementations=settings.implementations or bool(settings.options))
                for block, example in zip(blocks, block_inputs(model, list(blocks), inputs))]
    stacked = stack(problems)
    unconstrained = step_unconstrained(stacked, shards)
    step = solve_step(stacked, parse_budget(budget, unconstrained.peak), settings, world=shards,
                      unconstrained=unconstrained, progress=progress)
    record = step.solution.record(implementations=settings.implementations,
                                  approximate_allowed=settings.allow_approximate)
    files = tuple(ScheduleFile.of(problem, schedule, type(block).__name__, budget=step.solution.budget, solver=record)
                  for problem, schedule, block in zip(problems, step.schedules, blocks))
    return BlockSchedules(files, step.solution.budget, step.replay, step.unconstrained, shards)


def _check_blocks(model: nn.Module, blocks) -> None:
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        raise TypeError(f"blocks is a {type(blocks).__name__}; give the ModuleList or Sequential of the model's "
                        "blocks, whose items the wrappers replace")
    if any(isinstance(block, MONeTWrapper) for block in blocks):
        raise ValueError("these blocks are already wrapped by monet")
    if sharded_parameters(model):
        raise ValueError("the model's parameters are already sharded (DTensors: fully_shard has run): call "
                         "monet.wrap_blocks (or solve_blocks) on the unsharded model, then fully_shard each wrapper "
                         "and the root")


def wrap_blocks(model: nn.Module, blocks: nn.ModuleList | nn.Sequential, inputs,
                budget: str | int | float | None = None, settings: SolveSettings | None = None, *,
                schedules: Sequence[ScheduleFile | str | os.PathLike] | None = None,
                **solve_options) -> list[ScheduleFile]:
    """Replace each block of `blocks` (a ModuleList or Sequential that `model` calls) by a MONeTWrapper
    running a schedule for what the block is called with when `model` runs on `inputs`; returns the
    schedules, in block order, to save and pass back as `schedules` (no solve then; every rank of a
    sharded run should run the same schedules). `solve_blocks(...).schedules`, solved together for
    the blocks' step, are the schedules to pass.

    Without `schedules`, each block is solved on its own (monet.solve with `settings` and
    `solve_options`) within `budget`: bytes, a size string, or a share of that block's unconstrained
    peak ('50%'). Each block's problem holds its own parameters and gradients whole, its input and
    its output; what the blocks keep for the backward adds up across them, which no single schedule
    sees, so the whole step's peak is not predicted. Under FSDP2, shard the wrappers and then the
    root: `for b in blocks: fully_shard(b)`, `fully_shard(model)` (README, "Several processes")."""
    _check_blocks(model, blocks)
    if (budget is None) == (schedules is None):
        raise ValueError("give a budget (to solve each block) or schedules (one per block, as wrap_blocks returned "
                         "them), not both")
    examples = block_inputs(model, list(blocks), inputs)
    if schedules is not None:
        if len(schedules) != len(blocks):
            raise ValueError(f"{len(schedules)} schedules for {len(blocks)} blocks: give one per block, in order")
        files = [s if isinstance(s, ScheduleFile) else load_schedule(s) for s in schedules]
    else:
        files = [solve(block, example, budget, settings, **solve_options) for block, example in zip(blocks, examples)]
    for i, (block, file, example) in enumerate(zip(list(blocks), files, examples)):
        blocks[i] = MONeTWrapper(block, file, example)
    return files
