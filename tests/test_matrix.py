"""The quick form of the model matrix (benchmarks/matrix.py): models from transformers, MONAI, diffusers
and plain PyTorch that nobody here wrote, each traced, solved at its least peak and midway to keeping
everything, and trained one step beside eager: gradients and loss equal to eager's, the measured peak
the predicted one (at or under it, within 3 %), in float32 and under bfloat16 autocast; compiled by
Inductor, gradients within twice torch.compile's own error. The same solve twice gives the same
answer. `python -m benchmarks.matrix` runs every entry and writes the results page."""

import sys
from pathlib import Path

import pytest

from monet.api import solve_traced, trace_problem
from monet.solver import SolveSettings

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/ is not a package
from benchmarks.matrix import MATRIX, check  # noqa: E402

pytest.importorskip("transformers")
pytest.importorskip("monai")
pytest.importorskip("diffusers")

QUICK = [name for name, entry in MATRIX.items() if entry.quick]
CALLER = 64  # bytes: the loss the caller holds, outside the step


def assert_trains_as_predicted(outcome, gradients: float = 1e-5):
    assert outcome.error is None, outcome.error
    for run in outcome.trained:
        assert run.gradient_error <= gradients and run.loss_error <= gradients, (run.budget, run.gradient_error)
        assert 0.97 * run.predicted <= run.measured <= run.predicted + CALLER, (run.budget, run.measured,
                                                                                 run.predicted)


def test_the_matrix_covers_the_libraries_and_a_quick_form_of_each():
    assert len(MATRIX) >= 20
    libraries = {entry.library for entry in MATRIX.values()}
    assert libraries == {"transformers", "monai", "diffusers", "torch"}
    assert {MATRIX[name].library for name in QUICK} == libraries


@pytest.mark.parametrize("name", QUICK)
def test_trains_as_eager_at_the_predicted_peak(name):
    outcome = check(MATRIX[name], time_limit=5)
    assert_trains_as_predicted(outcome)
    least, middle = outcome.trained
    assert least.predicted <= middle.predicted <= middle.schedule.budget < least.schedule.predicted.unconstrained_peak


@pytest.mark.parametrize("name", ["bert", "tied-weights"])
def test_trains_as_eager_under_bfloat16_autocast(name):
    assert_trains_as_predicted(check(MATRIX[name], autocast="bfloat16", time_limit=5))


def test_compiled_gradients_are_within_twice_torch_compiles_own_error():
    outcome = check(MATRIX["tied-weights"], compiled=True, time_limit=5)
    assert outcome.error is None, outcome.error
    bound = max(2 * outcome.compile_error, 1e-6)
    assert all(run.gradient_error <= bound for run in outcome.trained), (outcome.compile_error, outcome.trained)


@pytest.mark.parametrize("name", ["qwen2-gqa", "tied-weights"])
def test_the_same_solve_gives_the_same_answer(name):
    model, inputs = MATRIX[name].build()
    problem = trace_problem(model, inputs, cost_model="analytic")
    settings = SolveSettings(time_limit=5)
    first, second = (solve_traced(problem, "least", name, settings) for _ in range(2))
    assert first.predicted.peak == second.predicted.peak
    assert first.schedule == second.schedule
