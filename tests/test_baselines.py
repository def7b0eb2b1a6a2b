"""Baselines: valid schedules, Chen's sqrt(n) keep set, revolve's optimum against Griewank's closed form
and against the ILP."""

import math
from functools import cache

import pytest
from synthetic import _Builder, chain, random_dag, relu_chain

from monet.solver import InfeasibleBudgetError, keep_all, simulate, solve, validate
from monet.solver.baselines import chen_greedy, chen_sqrt, revolve, revolve_reruns
from monet.solver.milp import SLACK
from monet.solver.strategies import BASELINES as STRATEGIES

SIZE = 100  # bytes of every chain tensor


def reruns(problem, schedule) -> int:
    return len(schedule.recomputations(problem))


CASES = {"chain16": (chain(16), True), "relu_chain4": (relu_chain(4), True),
         **{f"dag{seed}": (random_dag(seed, 8), False) for seed in range(4)}}


@pytest.mark.parametrize("name", CASES)
def test_every_baseline_validates_and_simulates(name):
    problem, is_chain = CASES[name]
    schedules = {label: strategy(problem, None) for label, strategy in STRATEGIES.items()}
    if is_chain:
        schedules.update({f"revolve{slots}": revolve(problem, slots) for slots in range(4)})
    full = simulate(problem, keep_all(problem)).peak
    for label, schedule in schedules.items():
        validate(problem, schedule)
        assert schedule.options == {}, label  # every op runs as PyTorch runs it
        assert simulate(problem, schedule).peak <= full, label
    assert schedules["keep-all"] == keep_all(problem)


def test_revolve_rejects_what_is_not_a_chain():
    with pytest.raises(ValueError, match="forward op 'f2' reads 'a0'"):
        revolve(random_dag(2, 8), 2)
    b = _Builder()  # a chain whose backward reads a0 before a1
    x = b.tensor("x", SIZE, "input")
    a0 = b.ops[b.op("f0", "forward", [x], [("a0", SIZE, "activation")])].outputs[0]
    a1 = b.ops[b.op("f1", "forward", [a0], [("a1", SIZE, "activation")])].outputs[0]
    b.op("f2", "forward", [a1], [("y", SIZE, "output")])
    dy = b.tensor("dy", SIZE, "tangent")
    g = b.ops[b.op("b2", "backward", [dy, a0], [("g2", SIZE, "temp")])].outputs[0]
    b.op("b1", "backward", [g, a1], [("g1", SIZE, "grad")])
    with pytest.raises(ValueError, match="'b1' reads the outputs of a later forward op"):
        revolve(b.problem(), 1)


def test_chen_sqrt_keeps_sqrt_n_segment_ends():
    p = chain(16)
    schedule = chen_sqrt(p)
    # 4 segments of 4 ops: the ends of the first three are kept, the fourth ends at the model output
    assert {p.tensors[t].name for t in schedule.saved} == {"a3", "a7", "a11"}
    assert reruns(p, schedule) == 15 - 3  # every other activation rebuilt once
    assert simulate(p, schedule).peak <= 0.6 * simulate(p, keep_all(p)).peak


def test_chen_greedy_fits_its_budget_or_names_its_least_peak():
    p = chain(12)
    least = simulate(p, chen_greedy(p)).peak
    full = simulate(p, keep_all(p)).peak
    assert least < full
    budget = (least + full) // 2
    fitting = chen_greedy(p, budget)
    assert simulate(p, fitting).peak <= budget
    assert simulate(p, fitting).time < simulate(p, chen_greedy(p)).time  # more memory, fewer reruns
    with pytest.raises(InfeasibleBudgetError, match=f"least peak found is .*{least} bytes"):
        chen_greedy(p, least - 1)


@cache
def griewank_steps(n: int, s: int) -> float:
    """Griewank's recursion for the fewest forward steps reversing n steps with s snapshots."""
    if n == 1:
        return 0
    if s == 0:
        return math.inf
    return min(m + griewank_steps(n - m, s - 1) + griewank_steps(m, s) for m in range(1, n))


def test_closed_form_matches_griewanks_recursion():
    for n in range(1, 40):
        assert revolve_reruns(n, 0) == (n - 1) * (n - 2) // 2  # only the input held: rerun from it every time
        for slots in range(8):
            assert revolve_reruns(n, slots) == griewank_steps(n, slots + 1) - (n - 1), (n, slots)


# The slots <-> bytes correspondence on chain(n) (every tensor SIZE bytes): the input x and the model
# output are held throughout, and at every moment of the backward, besides the checkpoints, exactly
# three tensors are live: a backward op's activation, the gradient it reads and the one it writes, or
# a rerun's input, its output and the gradient waiting for the next backward op (a rerun from a
# checkpoint or from x, or a backward op reading x, has one fewer). So
#     peak(slots) = 2 * SIZE + (slots + 3) * SIZE,   slots <= n - 2 (keep-all holds all n - 1 but the one read).
def chain_peak(n: int, slots: int) -> int:
    return 2 * SIZE + (min(slots, n - 2) + 3) * SIZE


@pytest.mark.parametrize("n", range(4, 13))
def test_revolve_reruns_the_closed_form_and_peaks_at_its_slots(n):
    p = chain(n, SIZE)
    for slots in range(5):
        schedule = revolve(p, slots)
        assert reruns(p, schedule) == revolve_reruns(n, slots), slots
        assert simulate(p, schedule).peak == chain_peak(n, slots), slots
    assert revolve(p, n - 2) == keep_all(p)


def test_revolve_steps_between_the_states_the_backward_reads():
    p = relu_chain(4)  # the backward reads x and every relu output, no linear output: 4 steps of 2 ops
    for slots in range(4):
        assert reruns(p, revolve(p, slots)) == 2 * revolve_reruns(4, slots)


@pytest.mark.parametrize("n", range(6, 12))
def test_ilp_matches_revolves_optimum_at_each_memory_size(n):
    """On a chain of n identical layers the optimal recomputation count at each memory size matches
    revolve's known optimum. The ILP's memory rows keep a relative margin SLACK below the budget (for
    HiGHS's tolerances), so the least budget admitting a peak P is ceil(P / (1 - SLACK)) (as
    least_peak reports it), not P; with every tensor SIZE bytes any budget in [P, P + SIZE) allows
    exactly the schedules peaking at P or below, so this is the same memory size."""
    p = chain(n, SIZE)
    for slots in range(n - 1):
        peak = simulate(p, revolve(p, slots)).peak
        solution = solve(p, math.ceil(peak / (1 - SLACK)), formulation="general", horizon=None, time_limit=30)
        assert solution.status == "optimal"
        assert solution.peak <= peak
        assert reruns(p, solution.schedule) == revolve_reruns(n, slots), slots
        assert solution.replay.recompute_time == revolve_reruns(n, slots)  # each op takes 1 s
