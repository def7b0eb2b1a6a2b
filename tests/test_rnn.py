"""Multi-layer LSTM, GRU and RNN with dropout between their layers train under monet as in eager: the
same masks drawn in the same order (PyTorch's RNN decomposition leaves that dropout out), gradients
equal to eager's, and the measured peak the predicted one; an LSTM whose input needs no gradient
(the first layer of a model) traces for training."""

import copy

import pytest
import torch
from conftest import gradient_errors
from torch import nn

import monet
from monet import MONeTWrapper
from monet.api import solve_traced, trace_problem
from monet.graph import TracedStep
from monet.solver import SolveSettings
from monet.training import compare_training


class Recurrent(nn.Module):
    def __init__(self, cell: type[nn.RNNBase], bidirectional: bool):
        super().__init__()
        self.rnn = cell(16, 32, num_layers=3, dropout=0.3, batch_first=True, bidirectional=bidirectional)
        self.out = nn.Linear(64 if bidirectional else 32, 8)

    def forward(self, x):
        return self.out(self.rnn(x)[0])


@pytest.mark.parametrize(("cell", "bidirectional"), [(nn.LSTM, False), (nn.GRU, True), (nn.RNN, False)])
def test_dropout_between_layers_is_traced_as_eager_draws_it(cell, bidirectional):
    torch.manual_seed(0)
    model = Recurrent(cell, bidirectional)
    x = torch.randn(4, 5, 16)
    with TracedStep(model, x) as step:
        dropouts = step.graph_module.graph.find_nodes(op="call_function",
                                                      target=torch.ops.aten.native_dropout.default)
    assert len(dropouts) == 2  # after each layer but the last
    reference = copy.deepcopy(model)
    problem = trace_problem(model, x, cost_model="analytic")
    for budget in ("100%", "least"):
        schedule = solve_traced(problem, budget, type(model).__name__, SolveSettings(time_limit=5))
        errors = gradient_errors(MONeTWrapper(model, schedule, x.shape), model, reference, x)
        assert max(errors.values()) <= 1e-5, (budget, errors)
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)


def test_lstm_trains_as_predicted_at_its_least_peak():
    torch.manual_seed(0)
    model = Recurrent(nn.LSTM, False)
    x = torch.randn(8, 10, 16)
    schedule = monet.solve(model, x, "least", cost_model="analytic", time_limit=5)
    assert schedule.predicted.peak < schedule.predicted.unconstrained_peak
    stats = compare_training({"monet": MONeTWrapper(model, schedule, x.shape)}, x, lambda out: out.square().mean(),
                             steps=1)
    measured, predicted = stats["monet"].peak, schedule.predicted.peak
    assert predicted - 0.03 * predicted <= measured <= predicted + 64, (measured, predicted)
