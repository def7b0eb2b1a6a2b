"""GPU-size problems without a GPU: a small problem scaled up to tens of GB must be posed and solved
exactly as the small one is. Stated in bytes, such problems had ILP coefficients from 1e-7 to 1e10,
and HiGHS then called feasible budgets infeasible and stopped at slow schedules as "optimal"."""

from pathlib import Path

import numpy as np
import pytest
from synthetic import norm_chain, scaled

from monet.schedules import load_problem
from monet.solver import keep_all, simulate, solve
from monet.solver.compact import Compact
from monet.solver.general import General

GPU = 2 ** 21  # norm_chain(16, 1024) becomes 2 GiB activations and a peak of tens of GB
# MONAI ResNet-50 at batch 184, 224x224, profiled on an H200 (README, "On a GPU")
H200_RESNET50 = Path(__file__).parents[1] / "benchmarks" / "results" / "gpu" / "resnet50-b184-h200.problem.json"


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


def test_resnet50_measured_on_an_h200_solves_within_two_percent_of_its_bound():
    """The GPU target: ResNet-50 at batch 184, with the op times and workspaces an H200 measured and its
    59.3 GiB unconstrained peak, at 33 % gives an ILP schedule (not the heuristic start) within 2 % of its
    bound (about 19 s here, 2 cores; proven optimal in 28 s at the default 0.5 % gap), and it measured its
    predicted peak there."""
    problem = load_problem(H200_RESNET50).problem
    unconstrained = simulate(problem, keep_all(problem)).peak
    assert unconstrained > 59 * 2 ** 30 and problem.held > 0  # the GPU's size, cuBLAS's workspaces counted
    got = solve(problem, int(unconstrained * 0.33), time_limit=150, gap=0.02)
    assert got.status in ("optimal", "time_limit") and got.gap <= 0.02
    assert got.peak <= int(unconstrained * 0.33)
