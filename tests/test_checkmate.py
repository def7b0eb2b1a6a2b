"""Checkmate's MILP as a baseline: valid schedules, priced as replayed, never faster than MONeT's own."""

import pytest
from synthetic import chain, random_dag, relu_chain

from monet.solver import InfeasibleBudgetError, keep_all, simulate, solve, validate
from monet.solver.checkmate import checkmate
from monet.solver.milp import SLACK


def unconstrained(problem):
    return simulate(problem, keep_all(problem)).peak


def check(problem, solution, budget):
    """Properties of every Checkmate solution; MONeT's own solver must be at least as fast when both fit."""
    validate(problem, solution.schedule)
    assert solution.formulation == "checkmate" and solution.status == "optimal"
    assert solution.objective == pytest.approx(solution.replay.time, rel=1e-6)  # the same op costs
    assert solution.bound <= solution.objective + 1e-9
    if solution.peak <= budget * (1 - SLACK):  # MONeT's rows keep this margin: an exact fit is not in its space
        ours = solve(problem, budget, time_limit=20)
        assert ours.replay.time <= solution.replay.time * (1 + 1e-3) + 1e-9


def test_chain_fits_and_recomputes_more_as_the_budget_falls():
    p = chain(8)
    previous = 0.0
    for fraction in (0.9, 0.75, 0.6):
        budget = int(unconstrained(p) * fraction)
        solution = checkmate(p, budget, time_limit=20)
        check(p, solution, budget)
        assert solution.peak <= budget
        assert solution.replay.recompute_time > previous
        previous = solution.replay.recompute_time


@pytest.mark.parametrize("problem", [chain(8), random_dag(0, 6), random_dag(1, 7), random_dag(5, 8)],
                         ids=["chain8", "dag0_6", "dag1_7", "dag5_8"])
def test_unconstrained_peak_recomputes_nothing(problem):
    full = unconstrained(problem)
    solution = checkmate(problem, full, time_limit=20)
    assert solution.schedule == keep_all(problem)
    assert solution.replay.recompute_time == 0 and solution.peak == full
    check(problem, solution, full)


@pytest.mark.parametrize("seed,size", [(0, 7), (0, 8), (1, 7), (4, 8), (5, 7)])
def test_random_graphs_are_valid_and_never_beat_monet(seed, size):
    p = random_dag(seed, size)
    solved = 0
    for fraction in (0.9, 0.75, 0.6):
        budget = int(unconstrained(p) * fraction)
        try:
            solution = checkmate(p, budget, time_limit=20)
        except InfeasibleBudgetError as error:
            assert error.least_peak > budget
            continue
        check(p, solution, budget)
        solved += 1
    assert solved  # 90 % of the unconstrained peak fits each of these graphs


def test_infeasible_budget_names_checkmates_least_peak():
    p = chain(8)
    with pytest.raises(InfeasibleBudgetError) as info:
        checkmate(p, unconstrained(p) // 3, time_limit=20)
    least = info.value.least_peak
    assert checkmate(p, least, time_limit=20).peak <= least
    with pytest.raises(InfeasibleBudgetError):
        checkmate(p, least - 1, time_limit=20)


def test_outputs_of_an_op_are_held_together():
    """Op f2 makes a2 (172 B) and aux2 (17 B); MONeT saves aux2 alone and reruns f2, while Checkmate
    holds or drops both, so nothing it recomputes lowers this graph's peak."""
    p = random_dag(3, 8)
    budget = int(unconstrained(p) * 0.9)
    with pytest.raises(InfeasibleBudgetError) as info:
        checkmate(p, budget, time_limit=20)
    assert info.value.least_peak == unconstrained(p)
    assert solve(p, budget, time_limit=20).peak <= budget


def test_choices_take_their_first_option():
    p = relu_chain(4)
    budget = int(unconstrained(p) * 0.85)
    solution = checkmate(p, budget, time_limit=20)
    assert solution.schedule.options == {}
    validate(p, solution.schedule, allow_approximate=False)
    assert solution.peak <= budget and solution.replay.recompute_time > 0
    check(p, solution, budget)
