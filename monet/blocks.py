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

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten

from monet.graph import Example, model_device, sharded_parameters
from monet.schedules import ScheduleFile, load_schedule
from monet.solver import Problem, Replay, SolveSettings
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
    return [call.example for call in _calls(model, blocks, inputs)[0]]


@dataclass(frozen=True)
class _Call:
    """One block's call in the model's forward: its arguments (`example`), its output's structure
    (`spec`, with its leaves: tensors as None), where the tensor passed on sits among the arguments'
    and the output's tensors (`into`, `out`; None where not exactly one wants a gradient), and a copy
    of the tensor it passes on (`result`)."""

    example: Example
    spec: Any
    leaves: tuple
    into: int | None
    out: int | None
    result: torch.Tensor | None


def _calls(model: nn.Module, blocks: Sequence[nn.Module], inputs) -> tuple[list[_Call], bool]:
    """Each block's call when `model` runs on `inputs` (see block_inputs), and whether the model
    returns more than the last block's output (then it runs something after its blocks)."""
    device = model_device(model)
    example = Example.of(inputs, device=device)
    seen: dict[int, Example] = {}
    outputs: dict[int, Any] = {}
    returned = {}

    def keep(index: int):
        def hook(_module, args, kwargs):
            copy = tree_map_only(torch.Tensor, lambda t: t.detach().clone().requires_grad_(t.requires_grad),
                                 (args, kwargs))
            seen.setdefault(index, Example(*copy))
        return hook

    def out(index: int):
        def hook(_module, _args, _kwargs, output):
            outputs.setdefault(index, output)
        return hook

    handles = [block.register_forward_pre_hook(keep(i), with_kwargs=True) for i, block in enumerate(blocks)]
    handles += [block.register_forward_hook(out(i), with_kwargs=True) for i, block in enumerate(blocks)]
    handles.append(model.register_forward_hook(lambda _m, _a, output: returned.setdefault("output", output)))
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
    calls = []
    for i in range(len(blocks)):
        call = seen[i]
        leaves, spec = tree_flatten(outputs[i])
        args = tree_flatten((call.args, call.kwargs))[0]
        out = _wanting_gradient(leaves)
        result = None if out is None else leaves[out].detach().clone().requires_grad_()
        calls.append(_Call(call, spec, tuple(None if isinstance(x, torch.Tensor) else x for x in leaves),
                           _wanting_gradient(args), out, result))
    last = outputs[len(blocks) - 1]
    after = [id(t) for t in tree_flatten(returned["output"])[0]] != [id(t) for t in tree_flatten(last)[0]]
    return calls, after


def _wanting_gradient(leaves: list) -> int | None:
    wanting = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.requires_grad]
    return wanting[0] if len(wanting) == 1 else None


class _Reached(Exception):
    """Raised by the first block's stand-in: the head's output is its argument."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value


class _StandIn(nn.Module):
    """A block replaced while its model's head or tail is traced: returns the block's output structure
    with `passed(tensor passed in)` as the tensor passed on, and no parameters of its own."""

    def __init__(self, call: _Call, passed):
        super().__init__()
        self.call, self.passed = call, passed

    def forward(self, *args, **kwargs):
        into = tree_flatten((args, kwargs))[0][self.call.into] if self.call.into is not None else None
        leaves = list(self.call.leaves)
        leaves[self.call.out] = self.passed(into)
        return tree_unflatten(leaves, self.call.spec)


class _Head(nn.Module):
    """The model up to its first block: returns what the first block is called with (its tensor passed in)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        try:
            self.model(*args, **kwargs)
        except _Reached as reached:
            return reached.value
        raise RuntimeError("the model returned without calling its first block")


class _Tail(nn.Module):
    """The model after its last block, taking that block's output (`passed`) first, then the model's inputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, passed, *args, **kwargs):
        self.passed = passed
        try:
            return self.model(*args, **kwargs)
        finally:
            del self.passed


@contextlib.contextmanager
def _standing_in(blocks, stand_ins: list[nn.Module]):
    saved = list(blocks)
    for i, stand_in in enumerate(stand_ins):
        blocks[i] = stand_in
    try:
        yield
    finally:
        for i, block in enumerate(saved):
            blocks[i] = block


def _rooted(problem: Problem, prefix: str = "", within: str = "") -> Problem:
    """`problem` with its parameters named as the model names them: its module at `prefix`, or
    itself the model's attribute `within` (a _Head's or _Tail's)."""
    names = {t: prefix + name.removeprefix(within) for t, name in problem.meta.get("parameters", {}).items()}
    return dataclasses.replace(problem, meta=dict(problem.meta, parameters=names))


def _step_parts(model: nn.Module, blocks, inputs, **trace) -> tuple[list[Problem], list[int]]:
    """The problems of the model's step in call order: what it runs before its first block (where the
    first block's input wants a gradient), each block, and what it runs after its last one (where it
    returns more than that block's output); and which of them are blocks. The parts around the blocks
    run eagerly: each is traced with the blocks replaced by stand-ins (_StandIn), so it holds none
    of their parameters. What the model computes before the blocks and passes to each of them
    besides the tensor passed on (a mask, rotary tables) counts as each block's own input."""
    calls, after = _calls(model, list(blocks), inputs)
    last = len(calls) - 1
    unpassed = [i for i, c in enumerate(calls) if (c.out is None and (i < last or after)) or (i and c.into is None)]
    if unpassed:
        raise ValueError(f"blocks {unpassed} do not pass on exactly one tensor that wants a gradient: solve_blocks "
                         "needs each block to take the one before's output and return one for the next")
    paths = {id(m): name for name, m in model.named_modules()}
    trace = dict(trace, sink=False)  # each part in autograd's order: the parts around the blocks run as PyTorch does
    parts = [_rooted(trace_problem(b, c.example, **trace), f"{paths[id(b)]}.") for b, c in zip(blocks, calls)]
    own = list(range(len(parts)))
    trace = dict(trace, implementations=False)  # the parts around the blocks run as PyTorch runs them
    if after:
        tail = _Tail(model)
        example = Example.of(inputs, device=model_device(model))
        stand = [_StandIn(c, (lambda x: x) if i < last else (lambda _x: tail.passed))
                 for i, c in enumerate(calls)]
        with _standing_in(blocks, stand):
            problem = trace_problem(tail, Example((calls[-1].result, *example.args), example.kwargs), **trace)
        parts.append(_rooted(problem, within="model."))
    if calls[0].into is not None:
        def stop(x):
            raise _Reached(x)
        with _standing_in(blocks, [_StandIn(c, stop) for c in calls]):
            parts.insert(0, _rooted(trace_problem(_Head(model), inputs, **trace), within="model."))
        own = [k + 1 for k in own]
    return parts, own


@dataclass(frozen=True)
class BlockSchedules:
    """A schedule per block, solved together for the model's step (`solve_blocks`), and that step's
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
                 autocast: str | torch.dtype | None = None, progress=None, **changes) -> BlockSchedules:
    """One schedule per block of `blocks`, solved together so that the model's step (every block's
    forward in order, every backward in reverse) peaks within `budget`: bytes, a size string, or a share of that
    step's unconstrained peak ('50%'). Each block's problem is traced as `monet.solve` traces it
    (`settings` and `changes` as it takes them), the problems are stacked into one
    (monet.solver.stack: each block's output is the next one's input, and is kept), and one ILP
    chooses what every block keeps, reruns and how its ops run. What the model runs before its first
    block and after its last one is stacked before and after them, run eagerly (_step_parts). Pass
    `.schedules` to `wrap_blocks`; `.peak` is the model's step's predicted peak.
    With `shards` > 1 the step is one rank's under FSDP2 over that many ranks (`fully_shard` on each
    wrapper and the root, FSDP2's defaults): parameters sharded, gathered around each block's
    forward and backward, gradients reduce-scattered (monet.solver.fsdp.sharded says which buffers
    it counts); otherwise every parameter and gradient is held whole for the whole step."""
    settings = settings_of(settings, **changes)
    _check_blocks(model, blocks)
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards {shards!r} must be the number of ranks FSDP2 shards over (1: no sharding)")
    parts, own = _step_parts(model, blocks, inputs, cost_model=cost_model, autocast=autocast, progress=progress,
                             implementations=settings.implementations or bool(settings.options))
    stacked = stack(parts, eager=set(range(len(parts))) - set(own))
    unconstrained = step_unconstrained(stacked, shards)
    step = solve_step(stacked, parse_budget(budget, unconstrained.peak), settings, world=shards,
                      unconstrained=unconstrained, progress=progress)
    record = step.solution.record(implementations=settings.implementations,
                                  approximate_allowed=settings.allow_approximate)
    files = tuple(ScheduleFile.of(parts[k], step.schedules[k], type(block).__name__, budget=step.solution.budget,
                                  solver=record) for k, block in zip(own, blocks))
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
    root: `for b in blocks: fully_shard(b)`, `fully_shard(model)` (docs/guides/distributed.md)."""
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
