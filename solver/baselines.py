"""Published checkpointing baselines, as Schedules the simulator and the runtime take as they are.

Keep-all (PyTorch), Chen et al.'s sqrt(n) and greedy schedules ("Training Deep Nets with Sublinear
Memory Cost", 2016) and Griewank & Walther's binomial checkpointing (revolve) for chains. Baselines
run every op as PyTorch does (each choice's first option): they decide what to keep and rerun only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .heuristics import best_first_need, recompute_at_first_need, segment_cuts
from .problem import PERSISTENT_ROLES, Op, Problem
from .result import InfeasibleBudgetError, LeastPeak
from .schedule import DROPPABLE_ROLES, Schedule
from .stages import Stages


def _as_pytorch(problem: Problem, build: Callable[[Problem], Schedule]) -> Schedule:
    """`build`'s schedule for the problem as PyTorch runs it, mapped back to `problem`'s ids."""
    plain = problem.resolve({c.name: c.options[0] for c in problem.choices})
    return build(plain).remap(plain, problem)


def chen_sqrt(problem: Problem) -> Schedule:
    """Chen et al.'s sqrt(n) schedule: cut the forward pass at segment cuts into about sqrt(n)
    segments of similar op count, keep only the cuts between segments (the last segment ends at
    the model output, which the caller holds) and rebuild every other tensor at its first need."""
    return _as_pytorch(problem, _chen_sqrt)


def _chen_sqrt(plain: Problem) -> Schedule:
    n = len(plain.forward_ops)
    ran = {op.id: i + 1 for i, op in enumerate(plain.forward_ops)}  # forward ops run once its outputs exist
    ends = {ran[plain.tensors[t].producer]: t for t in segment_cuts(plain)}
    segments = max(1, round(math.sqrt(n)))
    targets = [i * n / segments for i in range(1, segments)]
    kept = {ends[min(ends, key=lambda e, x=x: abs(e - x))] for x in targets} if ends else set()
    tensor_win, op_win = Stages(plain).windows
    droppable = {t for t in tensor_win if plain.tensors[t].producer in op_win}
    return recompute_at_first_need(plain, droppable - kept)


def chen_greedy(problem: Problem, budget: int | None = None) -> Schedule:
    """Chen et al.'s greedy: over a grid of byte thresholds, keep a segment cut whenever the bytes
    since the last kept one pass the threshold, rebuild the rest at first need; the fastest schedule
    within `budget` bytes, or (None) the one with the least peak. Raises InfeasibleBudgetError
    (stating the least peak the greedy reaches) when none fits."""

    def build(plain: Problem) -> Schedule:
        found = best_first_need(plain, budget)
        if found is None:
            least = best_first_need(plain, None)[1].peak
            raise InfeasibleBudgetError(budget, LeastPeak(least, 0), "chen-greedy", plain.floor)
        return recompute_at_first_need(plain, found[0])

    return _as_pytorch(problem, build)


# ---- revolve -----------------------------------------------------------------------------------

def revolve(problem: Problem, slots: int) -> Schedule:
    """Griewank & Walther's binomial checkpointing ("Algorithm 799: revolve", ACM TOMS 26(1), 2000)
    for a chain problem: forward op i reads only op i-1's outputs and persistent tensors, and each
    backward op reads the outputs of at most one forward op, latest first.

    A step of the reversed chain runs from one state the backward reads to the next (on chain(n):
    one op; states are forward ops' outputs, state 0 the chain's persistent input). `slots`: how
    many states may be held as checkpoints at once besides those the running op reads. The input
    is persistent here, so it takes none of them; in Griewank's count it takes one: this is revolve
    with s = slots + 1 snapshots. The forward pass stores the first checkpoints; the backward then
    follows Griewank's recursion (advance m steps, checkpoint, reverse the right part with one
    snapshot less, then the left part), each split m from the dynamic programme for the fewest
    forward steps. It reruns revolve_reruns(steps, slots) steps, fewest possible when the steps
    rerun equally many ops (on chain(n): revolve_reruns(n, slots) ops)."""
    if slots < 0:
        raise ValueError(f"revolve needs slots >= 0, got {slots}")
    return _as_pytorch(problem, lambda plain: _revolve(plain, slots))


def revolve_reruns(n: int, slots: int) -> int:
    """The fewest forward reruns that reverse a chain of n steps holding `slots` checkpoints besides
    its persistent input (as revolve counts them), by Griewank's closed form (A. Griewank,
    "Achieving logarithmic growth of temporal and spatial complexity in reverse automatic
    differentiation", Optim. Methods Softw. 1(1), 1992; Griewank & Walther, ACM TOMS 26(1), 2000,
    Proposition 1): with s snapshots, the input's included, the fewest forward steps are

        t(n, s) = r*n - C(s + r, s + 1),   r the integer with C(s + r - 1, s) < n <= C(s + r, s),

    of which the first sweep to state n-1 (our forward pass) takes n - 1; here s = slots + 1."""
    if n < 1 or slots < 0:
        raise ValueError(f"revolve_reruns needs n >= 1 and slots >= 0, got n={n}, slots={slots}")
    s, r = slots + 1, 0
    while math.comb(s + r, s) < n:
        r += 1
    return r * n - math.comb(s + r, s + 1) - (n - 1)


def _revolve(plain: Problem, slots: int) -> Schedule:
    """The recursion run with an explicit stack (chains can be deeper than Python's recursion)."""
    states, groups = _reversal(plain)
    split = _splits(len(states), slots + 1)
    seq: list[int] = []
    todo = [(0, len(states), slots + 1, True)]  # (held state a, reverse steps a+1..b, snapshots, swept)
    while todo:
        a, b, snapshots, swept = todo.pop()
        if b - a == 1:
            seq += groups[a]
            continue
        m = split[b - a][snapshots]
        if not swept:  # else the forward pass made these states
            seq += [_rerunnable(op) for op in plain.forward_ops[states[a]:states[a + m]]]
        todo += [(a, a + m, snapshots, False), (a + m, b, snapshots - 1, swept)]
    return Schedule.from_backward(plain, seq)


def _rerunnable(op: Op) -> int:
    if not op.recomputable:
        raise ValueError(f"revolve must rerun {op.name!r}, which cannot rerun (random or impure)")
    return op.id


def _reversal(plain: Problem) -> tuple[list[int], list[list[int]]]:
    """The states the backward reads, in forward order (state i: the outputs of forward op i-1;
    state 0, the persistent input, always), and for each the backward op ids that run while it is
    the newest one needed: those reading it, and those reading no state that follow them.
    Raises ValueError, naming the op, unless the problem is a chain that the backward reverses."""
    state = {op.id: i + 1 for i, op in enumerate(plain.forward_ops)}
    for i, op in enumerate(plain.forward_ops):
        for t in op.inputs:
            tensor = plain.tensors[t]
            if tensor.role not in PERSISTENT_ROLES and state.get(tensor.producer) != i:
                raise ValueError(f"revolve needs a chain: forward op {op.name!r} reads {tensor.name!r}, "
                                 f"which is neither persistent nor made by the op before it")
    needs: list[int | None] = []
    for op in plain.backward_ops:
        read = {state[plain.tensors[t].producer] for t in op.inputs
                if plain.tensors[t].role in DROPPABLE_ROLES and plain.tensors[t].producer in state}
        earlier = [k for k in needs if k is not None]
        if len(read) > 1 or (read and earlier and max(read) > min(earlier)):
            what = "several forward ops" if len(read) > 1 else "a later forward op than a backward op before it"
            raise ValueError(f"revolve needs a backward that reverses the chain: {op.name!r} reads "
                             f"the outputs of {what}")
        needs.append(max(read, default=None))
    states = sorted({0, *(k for k in needs if k is not None)})
    index = {k: i for i, k in enumerate(states)}
    groups: list[list[int]] = [[] for _ in states]
    current = len(states) - 1
    for op, need in zip(plain.backward_ops, needs):
        current = current if need is None else index[need]
        groups[current].append(op.id)
    return states, groups


def _splits(steps: int, snapshots: int) -> list[list[int]]:
    """split[l][s]: the first advance m of a fewest-steps reversal of l steps with s snapshots,
    by Griewank's recursion t(l, s) = min over 0 < m < l of m + t(l - m, s - 1) + t(m, s),
    t(1, s) = 0, t(l, 0) = infinity for l > 1."""
    t = [[0] * (snapshots + 1) for _ in range(steps + 1)]
    split = [[0] * (snapshots + 1) for _ in range(steps + 1)]
    for length in range(2, steps + 1):
        t[length][0] = math.inf
        for s in range(1, snapshots + 1):
            t[length][s], split[length][s] = min((m + t[length - m][s - 1] + t[m][s], m) for m in range(1, length))
    return split

