"""Deep models as chains of repeated blocks: find the blocks, and the schedules that checkpoint them.

A transformer's forward is a head (embeddings), the same block again and again, and a tail (norm,
head, loss). `find_chain` finds the blocks in the problem itself, as the longest run of forward ops
that repeats one period of ops (op by op: the same operator, the same input and output sizes), cut
where the fewest bytes cross from one block to the next. Nothing about the model's modules is
needed, so a problem file is enough; a block found wrongly costs only a worse candidate, never a
wrong schedule, since every schedule made here is replayed by the simulator.

On that chain, `chain_schedules` makes the schedules the peers run, as monet schedules: per-block
checkpointing (every block keeps only what it passes on and rebuilds the rest at its backward);
selective checkpointing (each block also keeps the tensors whose rerun saves the most time per byte),
with the last k blocks keeping everything (a frontier from per-block checkpointing to keeping
everything); Chen's sqrt(n) segments (only every s-th block's output kept; a segment is rebuilt whole
at its first need); and Rotor's dynamic programme over the chain (`Rotor`: which block outputs to keep
and which blocks to rerun how often, down to the least memory the chain runs in), over whole blocks and
over their halves (`halves`: a block's first half may be rebuilt twice). They are the
solver's floor on deep models, where the ILP's rerun horizon cannot pose a rebuilt block's tensors
living through the block's whole backward.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from .heuristics import overwritten, recompute_at_first_need
from .problem import Problem
from .schedule import DROPPABLE_ROLES, Schedule, ScheduleError, keep_all
from .simulate import Replay, simulate
from .stages import last_forward_readers

MIN_BLOCKS = 3  # a chain of fewer repeated blocks is left to the ILP alone


@dataclass(frozen=True)
class Chain:
    """Repeated blocks of a problem's forward: `blocks[i]` is (first, stop), positions in
    `problem.forward_ops` of block i's ops; the ops before the first block are the head, those after
    the last the tail."""

    blocks: tuple[tuple[int, int], ...]

    def __len__(self) -> int:
        return len(self.blocks)


def _signatures(problem: Problem) -> np.ndarray:
    """One integer per forward op: equal where the ops are the same operator on tensors of the same sizes."""
    codes: dict[tuple, int] = {}
    out = []
    for op in problem.forward_ops:
        key = (op.target, op.choice is not None, tuple(problem.tensors[t].bytes for t in op.inputs),
               tuple(problem.tensors[t].bytes for t in op.outputs))
        out.append(codes.setdefault(key, len(codes)))
    return np.array(out, dtype=np.int64)


def _crossing(problem: Problem) -> np.ndarray:
    """crossing[i]: bytes of droppable forward tensors made before forward position i and read at or after it."""
    ops = problem.forward_ops
    position = {op.id: i for i, op in enumerate(ops)}
    last = last_forward_readers(problem, lambda op: op.inputs)
    diff = np.zeros(len(ops) + 2, dtype=np.int64)
    for t, reader in last.items():
        tensor = problem.tensors[t]
        if tensor.role in DROPPABLE_ROLES and tensor.producer in position:
            made, read = position[tensor.producer], position[reader]
            if read > made:
                diff[made + 1] += tensor.bytes
                diff[read + 1] -= tensor.bytes
    return np.cumsum(diff)[: len(ops) + 1]


def find_chains(problem: Problem, min_blocks: int = MIN_BLOCKS) -> list[Chain]:
    """Every run of at least `min_blocks` repeated blocks in `problem`'s forward, longest first, none
    overlapping another (an encoder's and a decoder's), by `find_chain` on what the runs before leave."""
    codes = _signatures(problem)
    crossing = _crossing(problem)
    chains = []
    while (chain := _longest(codes, crossing, min_blocks)) is not None:
        chains.append(chain)
        first, stop = chain.blocks[0][0], chain.blocks[-1][1]
        codes[first:stop] = -1 - np.arange(first, stop)  # matches nothing any more
    return chains


def find_chain(problem: Problem, min_blocks: int = MIN_BLOCKS) -> Chain | None:
    """The longest run of at least `min_blocks` repeated blocks in `problem`'s forward (see the module's
    docstring), or None. Of runs that cover as many ops, the one of the shortest period; of its cuts,
    those where the fewest bytes cross."""
    return _longest(_signatures(problem), _crossing(problem), min_blocks)


def _longest(codes: np.ndarray, crossing: np.ndarray, min_blocks: int) -> Chain | None:
    n = len(codes)
    best = None  # (covered ops, -period, start of the periodic run, its end)
    for period in range(2, n // min_blocks + 1):
        same = np.concatenate(([False], codes[period:] == codes[:-period], [False]))
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        begins, ends = edges[::2], edges[1::2]  # codes[i] == codes[i + period] for begin <= i < end
        long = ends - begins + period >= min_blocks * period
        for begin, end in zip(begins[long], ends[long]):
            covered = (end - begin + period) // period * period
            if covered // period >= min_blocks and (best is None or (covered, -period) > best[:2]):
                best = (covered, -period, int(begin), int(end + period))
    if best is None:
        return None
    _, period, begin, end = best
    period = -period
    choices = []
    for first in range(begin, begin + period):
        count = (end - first) // period
        if count >= min_blocks:
            cuts = [first + k * period for k in range(count + 1)]
            choices.append((-count, int(crossing[cuts].sum()), first, count))
    _, _, first, count = min(choices)
    return Chain(tuple((first + k * period, first + (k + 1) * period) for k in range(count)))


def halves(problem: Problem, chain: Chain) -> Chain:
    """`chain` with each block cut in two (an attention and an MLP, say) where the fewest bytes cross, in the
    middle half of the block: Rotor over the halves may rebuild a block's first half twice rather than hold
    its tensors through the second half's backward, which lowers the least peak below per-block's."""
    crossing = _crossing(problem)
    first, stop = chain.blocks[0]
    period = stop - first
    offsets = range(max(1, period // 4), max(2, 3 * period // 4))
    cut = min(offsets, key=lambda offset: (sum(int(crossing[start + offset]) for start, _ in chain.blocks), offset))
    return Chain(tuple(half for start, end in chain.blocks for half in ((start, start + cut), (start + cut, end))))


@dataclass(frozen=True)
class _Parts:
    """Each block's droppable tensors: what it passes on to later forward ops (`passed`) and the rest (`inner`)."""

    inner: tuple[frozenset[int], ...]
    passed: tuple[frozenset[int], ...]


def _parts(problem: Problem, chain: Chain) -> _Parts:
    ops = problem.forward_ops
    position = {op.id: i for i, op in enumerate(ops)}
    last = last_forward_readers(problem, lambda op: op.inputs)
    inner, passed = [], []
    for first, stop in chain.blocks:
        made = [t for op in ops[first:stop] for t in op.outputs
                if problem.tensors[t].role in DROPPABLE_ROLES and op.recomputable]
        out = frozenset(t for t in made if t in last and position[last[t]] >= stop)
        passed.append(out)
        inner.append(frozenset(made) - out)
    return _Parts(tuple(inner), tuple(passed))


def per_block(problem: Problem, chain: Chain, keep_last: int = 0, keep: Collection[int] = ()) -> Schedule:
    """Per-block checkpointing: every block but the last `keep_last` keeps only what it passes on and
    `keep` (tensors: see `selected`), and rebuilds the rest at its first need in its backward; the head,
    the tail and the last blocks keep all."""
    parts = _parts(problem, chain)
    dropped = set().union(*parts.inner[: len(chain) - keep_last]) - set(keep)
    return recompute_at_first_need(problem, dropped | overwritten(problem))


def ranked(problem: Problem, chain: Chain) -> list[tuple[int, int]]:
    """The first block's tensors that its backward reads and that it does not pass on, as (op's offset in
    the block, output index), those whose rerun saves the most time per byte kept first: what selective
    checkpointing keeps of each block."""
    parts = _parts(problem, chain)
    saved = keep_all(problem).saved
    first, stop = chain.blocks[0]
    found = [(offset, index) for offset, op in enumerate(problem.forward_ops[first:stop])
             for index, t in enumerate(op.outputs) if t in parts.inner[0] and t in saved]

    def value(pair: tuple[int, int]) -> float:
        op = problem.forward_ops[first + pair[0]]
        return op.pytorch.recompute_time / max(1, problem.tensors[op.outputs[pair[1]]].bytes)

    return sorted(found, key=value, reverse=True)


def selected(problem: Problem, chain: Chain, share: float) -> frozenset[int]:
    """What selective checkpointing keeps of every block of `chain`: the first of `ranked`'s tensors that
    hold `share` of those bytes in the first block, and the same tensors of the others."""
    order = ranked(problem, chain)
    ops = problem.forward_ops
    start = chain.blocks[0][0]
    sizes = np.cumsum([problem.tensors[ops[start + offset].outputs[index]].bytes for offset, index in order])
    count = int(np.searchsorted(sizes, share * sizes[-1])) + 1 if order and share > 0 else 0
    return frozenset(ops[first + offset].outputs[index] for first, _ in chain.blocks for offset, index in order[:count])


SELECTIVE = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # shares of a block's saved bytes that selective
# checkpointing keeps


def segments(problem: Problem, chain: Chain, length: int) -> Schedule:
    """Chen's sqrt(n) on the blocks: only every `length`-th block's output (and the last block's) is kept;
    a segment is rebuilt whole from the output before it at its first need."""
    parts = _parts(problem, chain)
    dropped = set().union(*parts.inner)
    for i, out in enumerate(parts.passed):
        if (i + 1) % length and i < len(chain) - 1:
            dropped |= out
    return recompute_at_first_need(problem, dropped | overwritten(problem))


@dataclass(frozen=True)
class _Costs:
    """One block as the chain's dynamic programme sees it (the blocks' mean): `forward` and `backward`
    seconds, `passed` bytes it hands on, `saved` bytes of the rest that keeping everything saves."""

    forward: float
    backward: float
    passed: int
    saved: int


def _costs(problem: Problem, chain: Chain, parts: _Parts) -> _Costs:
    ops = problem.forward_ops
    saved = keep_all(problem).saved
    n = len(chain)
    forward = sum(op.pytorch.recompute_time for first, stop in chain.blocks for op in ops[first:stop]
                  if op.recomputable) / n
    passed = sum(problem.tensors[t].bytes for out in parts.passed for t in out) // n
    kept = sum(problem.tensors[t].bytes for inner in parts.inner for t in inner if t in saved) // n
    made = {t for inner, out in zip(parts.inner, parts.passed) for t in inner | out}
    backward = sum(op.time for op in problem.backward_ops if any(t in made for t in op.inputs)) / n
    return _Costs(forward, backward, passed, kept)


LEVELS = 1500  # memory levels of the chain's dynamic programme


class Rotor:
    """Rotor's dynamic programme (Beaumont et al., "Optimal checkpointing for heterogeneous chains",
    2019) over a chain of identical blocks followed by a tail (norm, head, loss). A block's backward needs
    `saved` + `working` memory units besides what is held; the tail's backward `tail` units besides the
    checkpoints. `inner[l][m]`: the least time to rerun and run the backward of l blocks whose input is
    held, with m units free: keep everything of the first (then the rest), or run the first j keeping
    only the j-th output, solve the rest, then the first j again. `spine[l][m]`: the same for the last l
    blocks and the tail, whose forward the forward pass runs (so its time is not counted): the tail's
    backward runs first, with every checkpoint of the spine held."""

    def __init__(self, costs: _Costs, blocks: int, unit: int, working: int, tail: int):
        self.blocks = blocks
        passed, saved = -(-costs.passed // unit), -(-costs.saved // unit)
        working, tail = -(-max(0, working) // unit), -(-max(0, tail) // unit)
        levels = blocks * (passed + saved) + saved + working + tail + 1
        self.passed, self.saved, self.levels = passed, saved, levels
        inner = np.full((blocks + 1, levels), np.inf)
        spine = np.full((blocks + 1, levels), np.inf)
        inner_how = np.zeros((blocks + 1, levels), dtype=np.int64)  # 0: keep everything of the first; j: checkpoint
        spine_how = np.zeros((blocks + 1, levels), dtype=np.int64)
        inner[1, saved + working:] = costs.forward + costs.backward
        spine[0, tail:] = 0.0
        held = saved + passed

        def shifted(row: np.ndarray, by: int) -> np.ndarray:  # shifted[m] = row[m - by]
            out = np.full(levels, np.inf)
            if by < levels:
                out[by:] = row[: levels - by]
            return out

        for length in range(1, blocks + 1):
            fits = np.arange(levels) >= saved + working
            if length > 1:
                best = np.where(fits, costs.forward + costs.backward + shifted(inner[length - 1], held), np.inf)
                how = np.zeros(levels, dtype=np.int64)
                for j in range(1, length):
                    candidate = j * costs.forward + shifted(inner[length - j], passed) + inner[j]
                    better = candidate < best
                    best[better], how[better] = candidate[better], j
                inner[length], inner_how[length] = best, how
            best = np.where(fits, costs.backward + shifted(spine[length - 1], held), np.inf)
            how = np.zeros(levels, dtype=np.int64)
            for j in range(1, length + 1):
                candidate = shifted(spine[length - j], passed) + inner[j]
                better = candidate < best
                best[better], how[better] = candidate[better], j
            spine[length], spine_how[length] = best, how
        self.inner, self.spine, self.inner_how, self.spine_how = inner, spine, inner_how, spine_how

    def units(self) -> np.ndarray:
        """The memory levels at which the chain's least time changes (the first: the least memory it runs in)."""
        row = self.spine[self.blocks]
        finite = np.isfinite(row)
        return np.flatnonzero(finite & np.concatenate(([True], row[1:] < row[:-1])))

    def plan(self, units: int) -> list[tuple[str, int]]:
        """The actions for the whole chain with `units` free: ("forward", block) reruns a block that the
        forward pass (or an earlier rerun) has passed, ("backward", block) runs its backward; the forward
        pass itself is implied, and the tail's backward comes first."""
        out: list[tuple[str, int]] = []
        todo = [("spine", 0, self.blocks, min(units, self.levels - 1))]
        while todo:
            kind, first, length, m = todo.pop()
            if kind == "backward":
                out.append(("backward", first))
                continue
            if length == 0:
                continue
            if kind == "inner" and length == 1:
                out += [("forward", first), ("backward", first)]
                continue
            j = int((self.spine_how if kind == "spine" else self.inner_how)[length, m])
            if j == 0:
                if kind == "inner":
                    out.append(("forward", first))
                todo += [("backward", first, 0, 0), (kind, first + 1, length - 1, m - self.saved - self.passed)]
            else:
                if kind == "inner":
                    out += [("forward", b) for b in range(first, first + j)]
                todo += [("inner", first, j, m), (kind, first + j, length - j, m - self.passed)]
        return out


def _backward_starts(problem: Problem, chain: Chain) -> list[int] | None:
    """For each block, the position in the backward of the first op that reads what the block makes;
    None unless the blocks' backwards run one after another, last block first."""
    ops = problem.forward_ops
    block_of = {ops[i].id: k for k, (first, stop) in enumerate(chain.blocks) for i in range(first, stop)}
    starts: dict[int, int] = {}
    for position, op in enumerate(problem.backward_ops):
        for t in op.inputs:
            k = block_of.get(problem.tensors[t].producer)
            if k is not None:
                starts.setdefault(k, position)
    order = [starts.get(k) for k in range(len(chain))]
    if None in order or any(order[k] <= order[k + 1] for k in range(len(chain) - 1)):
        return None
    return order


def rotor_schedule(problem: Problem, chain: Chain, starts: list[int], plan: list[tuple[str, int]]) -> Schedule:
    """A plan of Rotor's (Rotor.plan) as a schedule of `problem`: the tail's backward first, then each
    block's reruns before the backward ops from its start (`starts`, _backward_starts) to the next block's."""
    ops, backward = problem.forward_ops, problem.backward_ops
    seq = [op.id for op in backward[: starts[-1]]]
    pending: list[int] = []
    for action, k in plan:
        first, stop = chain.blocks[k]
        if action == "forward":
            pending += [op.id for op in ops[first:stop] if op.recomputable]
            continue
        end = starts[k - 1] if k > 0 else len(backward)
        seq += pending + [op.id for op in backward[starts[k]:end]]
        pending = []
    return Schedule.from_backward(problem, seq)


ROTOR_POINTS = 16  # memory levels of Rotor's frontier turned into schedules and replayed
ROTOR_RERUNS = 4  # block reruns per block, on average, beyond which a plan of Rotor's is left out: it would
# cost several steps' time, and at 80 layers minutes to replay (its backward grows as the square of depth)


def rotor_schedules(problem: Problem, chain: Chain, checkpointed: Schedule, replay: Replay) -> list[Schedule]:
    """Rotor's schedules on the chain, from the least memory it runs in (within ROTOR_RERUNS) to keeping
    everything. The blocks' working memory and the tail's are read off `replay`, the replay of per-block checkpointing
    (`checkpointed`): at the tail's backward it holds every block's output, at block k's the outputs
    of the k blocks before it and the block's own tensors."""
    starts = _backward_starts(problem, chain)
    if starts is None:
        return []
    parts = _parts(problem, chain)
    costs = _costs(problem, chain, parts)
    n = len(chain)
    region = []  # per entry of the backward's timeline: -1 the tail, k block k, n the head
    ahead = 0
    position = {op.id: i for i, op in enumerate(problem.backward_ops)}
    for i in checkpointed.backward:
        if i in position:
            where = next((k for k in range(n) if position[i] >= starts[k]), n if position[i] >= starts[0] else -1)
            where = -1 if position[i] < starts[-1] else where
            region += [where] * (ahead + 1)
            ahead = 0
        else:
            ahead += 1
    peaks = [bytes for _, bytes in replay.timeline[len(replay.timeline) - len(region) - (problem.update is not None):]]
    heads = {op.id for op in problem.forward_ops[: chain.blocks[0][0]]}
    base = problem.persistent_bytes + sum(problem.tensors[t].bytes for t in checkpointed.saved
                                          if problem.tensors[t].producer in heads)
    tail = max((b for b, r in zip(peaks, region) if r == -1), default=base) - base - n * costs.passed
    working = max((b - base - r * costs.passed - costs.saved for b, r in zip(peaks, region) if 0 <= r < n),
                  default=0)
    unit = max(1, (n * (costs.passed + costs.saved) + tail + working) // LEVELS)
    rotor = Rotor(costs, n, unit, working, tail)
    plans = []
    for m in reversed(rotor.units()):  # from the most memory down: fewer reruns first
        plan = rotor.plan(int(m))
        if sum(action == "forward" for action, _ in plan) > ROTOR_RERUNS * n:
            break
        plans.insert(0, plan)
    if len(plans) > ROTOR_POINTS:
        plans = [plans[i] for i in np.unique(np.linspace(0, len(plans) - 1, ROTOR_POINTS).round().astype(int))]
    return [rotor_schedule(problem, chain, starts, plan) for plan in plans]


@dataclass(frozen=True)
class Chained:
    """The chain's schedules of a problem (`schedules`: the frontier of peak and step time, by rising
    peak, each with its replay), the number of blocks of its longest chain (0: none), per-block
    checkpointing with its replay (None without a chain), and per-block checkpointing of the chains'
    blocks alone (`blockwise`, the ops around them keeping all: what a rerun horizon must admit for the
    ILP to reach per-block checkpointing's memory; a CNN's stem rebuilt too would not be admitted, though
    the ILP reaches lower peaks there)."""

    schedules: tuple[tuple[Schedule, Replay], ...] = ()
    blocks: int = 0
    checkpointed: tuple[Schedule, Replay] | None = None
    blockwise: Schedule | None = None

    def within(self, budget: int) -> list[tuple[Schedule, Replay]]:
        return [pair for pair in self.schedules if pair[1].peak <= budget]


def chain_schedules(problem: Problem, budget: int | None = None, option_sets: list[dict[str, str]] = ({},),
                    until: float | None = None, deadline: float | None = None) -> Chained:
    """The chains' schedules of `problem` (none where it has no chain of repeated blocks), with ops run
    as each of `option_sets` says, on all its chains at once (find_chains: an encoder's and a decoder's
    blocks alike, and the ops before and between them as blocks of their own: `covering`): per-block
    checkpointing; selective checkpointing, and (with a `budget`) with the most blocks keeping everything
    that fits it; Chen's segments of 2 to 2 sqrt(n) blocks; and Rotor's schedules on the longest chain,
    and on its blocks' halves (the other chains keeping everything). Past time.perf_counter() `until`,
    the option sets after the first are left out once a schedule within the `budget` is found (or, for
    no budget, at once): a budget that only another set meets is never refused for want of time. Past
    `deadline`, no more schedules are made but the first set's per-block checkpointing (a chain of many
    small blocks, an RNN's time steps, makes hundreds, each replayed)."""
    found, blocks, checkpointed, blockwise = [], 0, None, None

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    for index, options in enumerate(option_sets):
        if index and late():
            break
        if index and until is not None and time.perf_counter() > until and (
                budget is None or any(replay.peak <= budget for _, replay in found)):
            break
        plain = problem.resolve(options)
        chains = find_chains(plain)
        if not chains:
            continue
        whole = covering(chains)
        if blockwise is None:
            blockwise = per_block(plain, Chain(tuple(sorted(b for chain in chains for b in chain.blocks))))
            blockwise = blockwise.remap(plain, problem, options)

        def replayed(schedule: Schedule, plain=plain, options=options) -> tuple[Schedule, Replay]:
            schedule = schedule.remap(plain, problem, options)
            return schedule, simulate(problem, schedule)

        blocks = max(blocks, sum(len(chain) for chain in chains))
        for share in (0.0, *SELECTIVE):
            if share and late():
                break
            keep = frozenset().union(*(selected(plain, chain, share) for chain in chains))
            selective = replayed(per_block(plain, whole, 0, keep))
            found.append(selective)
            if share == 0 and (checkpointed is None or selective[1].peak < checkpointed[1].peak):
                checkpointed = selective
            if budget is None or selective[1].peak > budget:
                continue
            low, high = 0, len(whole)  # the most blocks keeping everything within the budget: peaks grow with them
            while low < high and not late():
                middle = (low + high + 1) // 2
                candidate = replayed(per_block(plain, whole, middle, keep))
                if candidate[1].peak <= budget:
                    found.append(candidate)
                    low = middle
                else:
                    high = middle - 1
        for chain in (chains[0], halves(plain, chains[0])):
            if late():
                break
            schedule = per_block(plain, chain)
            for rotor in rotor_schedules(plain, chain, schedule, simulate(plain, schedule)):
                with contextlib.suppress(ScheduleError):  # a rerun reads a copy an op outside the blocks overwrote
                    found.append(replayed(rotor))
        for length in range(2, int(2 * len(whole) ** 0.5) + 1):
            if late():
                break
            found.append(replayed(segments(plain, whole, length)))
    return Chained(tuple(frontier(found)), blocks, checkpointed, blockwise)


def covering(chains: list[Chain]) -> Chain:
    """The blocks of every chain, and as blocks of their own the runs of ops before and between them (the
    embeddings; an encoder's or a decoder's first block, which differs from the rest: T5's makes the
    position bias), so that per-block checkpointing rebuilds those too; the tail (head and loss, whose
    backward comes first) keeps all."""
    blocks = sorted(block for chain in chains for block in chain.blocks)
    gaps = [(stop, first) for (_, stop), (first, _) in zip([(0, 0), *blocks], blocks) if first > stop]
    return Chain(tuple(sorted(blocks + gaps)))


def frontier(schedules: list[tuple[Schedule, Replay]]) -> list[tuple[Schedule, Replay]]:
    """The schedules no other is both as low in peak and as fast as, by rising peak."""
    out = []
    for schedule, replay in sorted(schedules, key=lambda pair: (pair[1].peak, pair[1].time)):
        if not out or replay.time < out[-1][1].time:
            out.append((schedule, replay))
    return out
