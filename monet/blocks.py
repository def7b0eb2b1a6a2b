"""monet block by block: a schedule for each block of a model, each block wrapped in MONeTWrapper in place.

This is how monet composes with FSDP2. `fully_shard` gathers a block's parameters in hooks around the
block's call (and again before its backward) and frees them after; monet's whole-model step runs ATen
ops without calling the blocks, so it cannot run inside a sharded model. A MONeTWrapper around each
block can: `fully_shard(wrapper)` gathers the block's parameters around the wrapper's call and its
backward, and the wrapper reads them from the block at each call, so each block's schedule runs on
whole parameters, and each block's problem counts them, while the other blocks' stay sharded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from monet.graph import Example, model_device, sharded_parameters
from monet.schedules import ScheduleFile, load_schedule
from monet.solver import SolveSettings

from .api import solve
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


def wrap_blocks(model: nn.Module, blocks: nn.ModuleList | nn.Sequential, inputs,
                budget: str | int | float | None = None, settings: SolveSettings | None = None, *,
                schedules: Sequence[ScheduleFile | str | os.PathLike] | None = None,
                **solve_options) -> list[ScheduleFile]:
    """Replace each block of `blocks` (a ModuleList or Sequential that `model` calls) by a MONeTWrapper
    running a schedule for what the block is called with when `model` runs on `inputs`; returns the
    schedules, in block order, to save and pass back as `schedules` (no solve then; every rank of a
    sharded run should run the same schedules).

    Without `schedules`, each block is solved on its own (monet.solve with `settings` and
    `solve_options`) within `budget`: bytes, a size string, or a share of that block's unconstrained
    peak ('50%'). Each block's problem holds its own parameters and gradients whole, its input and
    its output; what the blocks keep for the backward adds up across them, which no single schedule
    sees, so the whole step's peak is not predicted. Under FSDP2, shard the wrappers and then the
    root: `for b in blocks: fully_shard(b)`, `fully_shard(model)` (README, "Several processes")."""
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        raise TypeError(f"blocks is a {type(blocks).__name__}; give the ModuleList or Sequential of the model's "
                        "blocks, whose items the wrappers replace")
    if (budget is None) == (schedules is None):
        raise ValueError("give a budget (to solve each block) or schedules (one per block, as wrap_blocks returned "
                         "them), not both")
    if any(isinstance(block, MONeTWrapper) for block in blocks):
        raise ValueError("these blocks are already wrapped by monet")
    if sharded_parameters(model):
        raise ValueError("the model's parameters are already sharded (DTensors: fully_shard has run): call "
                         "monet.wrap_blocks on the unsharded model, then fully_shard each wrapper and the root")
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
