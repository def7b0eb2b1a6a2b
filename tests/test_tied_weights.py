"""A model whose embedding and LM head share one weight (GPT-2): the weight is counted once,
both of its gradients reach it, and the measured peak is the predicted one."""

import copy
import sys
from pathlib import Path

import pytest
import torch
from conftest import gradient_errors

import monet
from monet import MONeTWrapper, resident_bytes
from monet.api import trace_problem
from monet.graph import InputSpec
from monet.training import compare_training

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/ is not a package
from benchmarks.models import GPT2LM  # noqa: E402

# The tied weight (4096 x 64) outweighs the rest of the parameters, so counting it twice shows.
CONFIG = {"vocab_size": 4096, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64}
SHAPE = (4, 64)


def tiny_gpt2():
    torch.manual_seed(0)
    model = GPT2LM(**CONFIG)
    assert model.model.lm_head.weight is model.model.transformer.wte.weight
    return model


def test_tied_weight_is_counted_once():
    model = tiny_gpt2()
    x = torch.zeros(SHAPE, dtype=torch.int64)
    problem = trace_problem(model, InputSpec(SHAPE, "int64"), cost_model="analytic", implementations=False)
    assert problem.persistent_bytes == resident_bytes(model, x)


@pytest.mark.parametrize("budget", ["100%", "80%"])
def test_tied_weight_trains_as_predicted(budget):
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    schedule = monet.solve(model, SHAPE, budget, input_dtype="int64", cost_model="analytic", time_limit=30)
    wrapped = MONeTWrapper(model, schedule, SHAPE)
    x = torch.randint(0, CONFIG["vocab_size"], SHAPE, generator=torch.Generator().manual_seed(1))
    errors = gradient_errors(wrapped, model, reference, x)
    assert max(errors.values()) < 1e-5, errors

    stats = compare_training({"monet": wrapped}, x, lambda out: out.sum(), steps=1)
    measured, predicted = stats["monet"].peak, schedule.predicted.peak
    assert measured <= schedule.budget + 64  # + the loss scalar, which is the caller's, not the step's
    assert abs(measured - predicted) <= 0.01 * predicted, (measured, predicted)
