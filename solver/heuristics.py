"""Schedules without a solver: rerun dropped tensors at their first need; Chen's greedy keep sets;
the leanest way to run every op.

`recompute_at_first_need` is the schedule class of the compact formulation,
so a keep set found here (with its options) is a valid starting point (warm start) for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .problem import Problem
from .schedule import DROPPABLE_ROLES, Schedule
from .simulate import Replay, simulate
from .stages import Stages, last_forward_readers


def recompute_at_first_need(problem: Problem, dropped: set[int] | frozenset[int]) -> Schedule:
    """Keep every droppable forward tensor except `dropped`; rebuild each dropped one once,
    right before the first backward op that needs it, from whatever is kept or rebuilt."""
    tensors = problem.tensors
    dropped = set(dropped) - {t for op in problem.ops for t in op.keeps}  # reruns read them: never dropped
    dropped |= overwritten(problem)
    rebuilt: set[int] = set()
    seq: list[int] = []

    def ensure(t: int) -> None:
        tensor = tensors[t]
        if tensor.role not in DROPPABLE_ROLES or t not in dropped or tensor.producer in rebuilt:
            return
        op = problem.ops[tensor.producer]
        if not op.recomputable:
            raise ValueError(f"tensor {tensor.name!r} cannot be dropped: its op {op.name!r} cannot rerun")
        for u in op.inputs:
            ensure(u)
        rebuilt.add(op.id)
        seq.append(op.id)
        if op.overwrites is not None:  # its input is gone: a later need rebuilds it again
            rebuilt.discard(tensors[op.overwrites].producer)

    for op in problem.backward_ops:
        for t in op.inputs:
            ensure(t)
        seq.append(op.id)
    return Schedule.from_backward(problem, seq)


def overwritten(problem: Problem) -> frozenset[int]:
    """The tensors an op overwrites (in place), as the problem's ops run: never saved."""
    return frozenset(op.overwrites for op in problem.ops if op.overwrites is not None)


def segment_cuts(problem: Problem) -> list[int]:
    """Forward tensors that alone carry the forward pass past their op: every later op reads,
    of earlier activations, only this one (a block output, in Chen et al.'s sense)."""
    tensors = problem.tensors
    last_read = last_forward_readers(problem, lambda op: op.inputs)
    cuts, crossing = [], set()
    for op in problem.forward_ops:
        crossing = {t for t in crossing if last_read.get(t, -1) > op.id}
        crossing |= {t for t in op.outputs if last_read.get(t, -1) > op.id and tensors[t].role in DROPPABLE_ROLES}
        if len(crossing) == 1:
            cuts.extend(crossing)
    return cuts


def chen_candidates(problem: Problem) -> list[frozenset[int]]:
    """Drop sets of Chen's greedy: walk the forward pass, keep a segment cut whenever the
    bytes since the last kept cut pass a threshold, drop every other droppable tensor;
    one drop set per threshold on a geometric grid, plus dropping only what is never worth keeping,
    and only what reruns for free."""
    stages = Stages(problem)
    tensor_win, op_win = stages.windows
    droppable = {t for t in tensor_win if problem.tensors[t].producer in op_win}
    cuts = [t for t in segment_cuts(problem) if t in tensor_win]
    sizes = sorted({problem.tensors[t].bytes for t in droppable if problem.tensors[t].bytes})
    if not sizes:
        return [frozenset()]
    total = sum(problem.tensors[t].bytes for t in droppable)
    thresholds = [sizes[0] * 2 ** (i / 2) for i in range(64) if sizes[0] * 2 ** (i / 2) <= 2 * total]
    never = (stages.never_worth_keeping & droppable) | overwritten(problem)
    out = {frozenset(never), never | free_reruns(problem, droppable)}
    for threshold in thresholds:
        kept, since = set(), 0
        for op in problem.forward_ops:
            since += sum(problem.tensors[t].bytes for t in op.outputs if t in droppable)
            for t in op.outputs:
                if t in cuts and since > threshold:
                    kept.add(t)
                    since = 0
        out.add(frozenset(droppable - kept) | overwritten(problem))
    return sorted(out, key=len)


def free_reruns(problem: Problem, droppable: set[int]) -> frozenset[int]:
    """The `droppable` tensors whose op reruns in no time: under Inductor a pointwise op fuses into the
    kernel that reads its output (graph.fused_reruns), so dropping its output costs nothing but the
    buffer the rerun makes."""
    return frozenset(t for t in droppable if problem.ops[problem.tensors[t].producer].pytorch.recompute_time == 0)


def _ops_by_choice(problem: Problem) -> dict[str, list]:
    by_choice: dict[str, list] = {}
    for op in problem.ops:
        if op.choice is not None:
            by_choice.setdefault(op.choice, []).append(op)
    return by_choice


def _per_choice(problem: Problem, allow_approximate: bool, key: Callable[[list, int], object]) -> dict[str, str]:
    """Per choice, the option j (approximate ones only if allowed) with the least key(ops of the
    choice, j); ties: the earlier option, PyTorch's own first."""
    by_choice = _ops_by_choice(problem)
    out = {}
    for choice in problem.choices:
        ops = by_choice.get(choice.name, [])
        allowed = [j for j, name in enumerate(choice.options) if allow_approximate or name not in choice.approximate]
        out[choice.name] = choice.options[min(allowed, key=lambda j, ops=ops: key(ops, j))]
    return out


def lean_options(problem: Problem, *, allow_approximate: bool = False) -> dict[str, str]:
    """Per choice, the option under which its ops hold the least: the bytes its backward ops
    read plus every workspace (ties: the faster). Masks and packed indices win over the
    tensors they stand for; the convolution algorithm with the smallest temporaries wins."""
    def footprint(ops: list, j: int) -> tuple[int, float]:
        impls = [(op, op.impl(j)) for op in ops]
        read = {t for op, impl in impls if impl.runs and op.phase == "backward" for t in impl.inputs}
        return (sum(problem.tensors[t].bytes for t in read) + sum(impl.workspace for _, impl in impls),
                sum(impl.time for _, impl in impls if impl.runs))

    return _per_choice(problem, allow_approximate, footprint)


def fastest_options(problem: Problem, *, allow_approximate: bool = False) -> dict[str, str]:
    """Per choice, the option under which its ops run fastest once each: with nothing rerun, the least
    step time any schedule can have (an op's time depends on its own choice's option alone)."""
    return _per_choice(problem, allow_approximate, lambda ops, j: sum(op.impl(j).time for op in ops if op.impl(j).runs))


def rerun_options(problem: Problem, *, allow_approximate: bool = False) -> dict[str, str]:
    """Per choice, the option under which its forward ops rerun fastest: where reruns are cheap,
    dropping their outputs is what saves memory (a batch norm rerun from its saved statistics,
    free under Inductor)."""
    return _per_choice(problem, allow_approximate, lambda ops, j: sum(
        op.impl(j).recompute_time for op in ops if op.phase == "forward" and op.impl(j).runs))


def rebuildable_options(problem: Problem, *, allow_approximate: bool = False, fastest: bool = False
                        ) -> dict[str, str]:
    """Per choice, the option under which its forward ops that cannot rerun make the fewest bytes (dropout
    replayed from its generator state keeps the state alone), the leanest of them where several (with
    `fastest`, the fastest: dropout rerun from that state, its backward reading the mask): a block can be
    rebuilt whole only where every op in it may rerun."""
    lean = lean_options(problem, allow_approximate=allow_approximate)

    def key(ops: list, j: int) -> tuple[int, bool | float]:  # bytes made by forward ops that cannot rerun: kept
        stuck = sum(problem.out_bytes(op) for op in ops
                    if op.phase == "forward" and op.impl(j).runs and not op.impl(j).recomputable)
        if fastest:
            return stuck, sum(op.impl(j).time for op in ops if op.impl(j).runs)
        choice = problem.choice_named[ops[0].choice] if ops else None
        return stuck, choice is not None and choice.options[j] != lean[choice.name]

    return _per_choice(problem, allow_approximate, key)


def fastest_kernels(problem: Problem, *, allow_approximate: bool = False) -> dict[str, str]:
    """Per choice whose options differ only in time and workspace (convolution algorithms: what each
    run reads, keeps and overwrites is the same), its fastest option; none where no such fastest option
    takes more workspace than another (nothing to trade). A faster kernel costs memory only while its
    ops run and the rest of the schedule has to make room for it, which a search that may also take
    the leaner kernel rarely finds."""
    by_choice = _ops_by_choice(problem)
    out, trades = {}, False
    for choice in problem.choices:
        ops = by_choice.get(choice.name, [])
        if not all(len({(i.inputs, i.keeps, i.runs, i.recomputable, i.overwrites) for i in op.impls}) == 1
                   for op in ops):
            continue
        allowed = [j for j, name in enumerate(choice.options) if allow_approximate or name not in choice.approximate]
        workspace = {j: max((op.impl(j).workspace for op in ops), default=0) for j in allowed}
        fastest = min(allowed, key=lambda j: (sum(op.impl(j).time for op in ops), workspace[j], j))
        trades = trades or any(workspace[j] < workspace[fastest] for j in allowed)
        out[choice.name] = choice.options[fastest]
    return out if trades else {}


def best_first_need(problem: Problem, budget: int | None, admits: Callable[[Schedule], bool] | None = None,
                    until: float | None = None) -> tuple[frozenset[int], Replay] | None:
    """The fastest of Chen's candidate drop sets whose first-need schedule fits `budget`, or
    (budget None) the one with the least peak, shaved as low as it goes (on a problem without
    choices); with `admits`, only schedules it admits count. When none fits, the least-peak one
    is shaved to fit; the fastest of those that do not fit is shaved to fit too, and stands where
    it is faster (where reruns are free, dropping a few more tensors beats Chen's segments). Past `until`
    (a time.perf_counter() deadline) no more candidates are tried: deep models have hundreds."""
    best = least = fastest = None
    for dropped in chen_candidates(problem):
        if until is not None and time.perf_counter() > until and least is not None:
            break
        schedule = recompute_at_first_need(problem, dropped)
        if admits is not None and not admits(schedule):
            continue
        replay = simulate(problem, schedule)
        key = (replay.peak, replay.time) if budget is None else (replay.time,)
        if (budget is None or replay.peak <= budget) and (best is None or key < best[0]):
            best = (key, dropped, replay)
        if least is None or (replay.peak, replay.time) < (least[1].peak, least[1].time):
            least = (dropped, replay)
        if budget is not None and replay.peak > budget and (fastest is None or replay.time < fastest[1].time):
            fastest = (dropped, replay)
    if least is not None and (budget is None or best is None):
        return shave(problem, *least, budget, admits, until)
    if fastest is not None and best is not None and fastest[1].time < best[2].time:
        shaved = shave(problem, *fastest, budget, admits, until)
        if shaved is not None and shaved[1].time < best[2].time:
            return shaved
    return best[1:] if best else None


SHAVE_CANDIDATES = 8  # the largest droppable tensors live at the peak, tried each round


def shave(problem: Problem, dropped: frozenset[int], replay: Replay, budget: int | None,
          admits: Callable[[Schedule], bool] | None = None,
          until: float | None = None) -> tuple[frozenset[int], Replay] | None:
    """Drop one more tensor at a time, among the largest kept ones live at the peak, whichever
    lowers the peak most (ties: the faster), until the first-need schedule fits `budget`; None
    when no single drop lowers the peak any more, or past `until` (budget None: the lowest reached)."""
    tensor_win, op_win = Stages(problem).windows
    droppable = {t for t in tensor_win if problem.tensors[t].producer in op_win}
    while budget is None or replay.peak > budget:
        live = sorted((t for t in replay.peak_live if t in droppable and t not in dropped),
                      key=lambda t: -problem.tensors[t].bytes)[:SHAVE_CANDIDATES]
        best = None
        for t in live:
            schedule = recompute_at_first_need(problem, dropped | {t})
            if admits is not None and not admits(schedule):
                continue
            after = simulate(problem, schedule)
            if after.peak < replay.peak and (best is None or (after.peak, after.time) < (best[1].peak, best[1].time)):
                best = (dropped | {t}, after)
        if best is None or (until is not None and time.perf_counter() > until):
            return (dropped, replay) if budget is None else (best if best and best[1].peak <= budget else None)
        dropped, replay = best
    return dropped, replay


@dataclass(frozen=True)
class Start:
    """A heuristic schedule to start a solver from: its dropped tensors and options (ids and names
    of the problem it was made for), the schedule itself and its replay."""

    dropped: frozenset[int]
    options: dict[str, str]
    schedule: Schedule
    replay: Replay


def warm_starts(problem: Problem, budget: int | None, option_sets: list[dict[str, str]],
                horizon: int | None = None, until: float | None = None) -> Start | None:
    """The fastest first-need schedule that fits `budget` (None: the one with the least peak)
    with any of `option_sets`, rerunning no op earlier than `horizon` allows (see Stages), as far as
    the search gets by `until` (a time.perf_counter() deadline)."""
    stages = Stages(problem, horizon)
    best = None
    for options in option_sets:
        plain = problem.resolve(options)

        def posed(schedule: Schedule, plain=plain, options=options) -> Schedule:
            return schedule.remap(plain, problem, options)

        found = best_first_need(plain, budget, None if horizon is None else lambda s: stages.admits(posed(s)), until)
        if not found:
            continue
        key = (found[1].peak, found[1].time) if budget is None else (found[1].time,)
        if best is None or key < best[0]:
            dropped = frozenset(problem.tensor_named(plain.tensors[t].name).id for t in found[0])
            best = (key, Start(dropped, options, posed(recompute_at_first_need(plain, found[0])), found[1]))
    return best[1] if best else None


__all__ = ["Start", "best_first_need", "chen_candidates", "free_reruns", "lean_options", "overwritten",
           "rebuildable_options", "recompute_at_first_need", "rerun_options", "segment_cuts", "shave", "warm_starts"]
