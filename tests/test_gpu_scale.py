"""GPU-size problems without a GPU: a small problem scaled up to tens of GB must be posed and solved
exactly as the small one is. Stated in bytes, such problems had ILP coefficients from 1e-7 to 1e10,
and HiGHS then called feasible budgets infeasible and stopped at slow schedules as "optimal"."""

import numpy as np
import pytest
from synthetic import norm_chain, scaled

from monet.solver import keep_all, simulate, solve
from monet.solver.compact import Compact
from monet.solver.general import General

GPU = 2 ** 21  # norm_chain(16, 1024) becomes 2 GiB activations and a peak of tens of GB


def matrix(model):
    milp = model.milp
    return np.array(milp._rows), np.array(milp._cols), np.array(milp._vals), np.array(milp._rhs)


@pytest.mark.parametrize("fraction", [0.7, 0.5])
@pytest.mark.parametrize("formulation", ["compact", "general"])
def test_a_scaled_problem_poses_the_same_ilp(formulation, fraction):
    small = norm_chain(16, 1024)
    big = scaled(small, GPU)
    assert simulate(big, keep_all(big)).peak > 20 * 2 ** 30
    budget = int(simulate(small, keep_all(small)).peak * fraction)
    if formulation == "compact":
        models = [Compact(p, b) for p, b in ((small, budget), (big, budget * GPU))]
    else:
        first = {c.name: c.options[0] for c in small.choices}
        models = [General(p.resolve(first), b) for p, b in ((small, budget), (big, budget * GPU))]
    (rows, cols, vals, rhs), (big_rows, big_cols, big_vals, big_rhs) = map(matrix, models)
    assert np.array_equal(rows, big_rows) and np.array_equal(cols, big_cols)
    assert np.array_equal(vals, big_vals) and np.array_equal(rhs, big_rhs)
    assert np.abs(big_vals).max() / np.abs(big_vals[big_vals != 0]).min() < 1e5


@pytest.mark.parametrize("fraction", [0.7, 0.5])
def test_a_scaled_problem_solves_as_the_small_one(fraction):
    small = norm_chain(16, 1024)
    big = scaled(small, GPU)
    budget = int(simulate(small, keep_all(small)).peak * fraction)
    want = solve(small, budget, time_limit=30, gap=1e-4)
    got = solve(big, budget * GPU, time_limit=30, gap=1e-4)
    assert want.status == got.status == "optimal"
    assert got.objective == pytest.approx(want.objective, rel=1e-9)
    assert got.peak <= budget * GPU
    assert got.replay.time == pytest.approx(want.replay.time, rel=1e-9)
