"""MONeTWrapper trains exactly like the model, within the schedule's memory."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import gradient_errors, rel_err, small_batch, small_model

import monet
import monet.models
from monet import InfeasibleBudgetError, MONeTWrapper, PeakMemory, ScheduleMismatchError, resident_bytes

# Solved once per (model, budget) for the module: the analytic cost model is deterministic.
_SCHEDULES = {}


def schedule_for(name, budget, cost_model="analytic"):
    key = (name, budget, cost_model)
    if key not in _SCHEDULES:
        model, shape = small_model(name)
        _SCHEDULES[key] = monet.solve(model, shape, budget, input_requires_grad=True, cost_model=cost_model,
                                        time_limit=8)  # a schedule, not the optimum: each test checks it runs right
    return _SCHEDULES[key]


def recomputed(schedule):
    forward = {name for name, _, phase in schedule.graph.ops if phase == "forward"}
    return [name for name in schedule.schedule.backward if name in forward]


@pytest.mark.parametrize("budget", ["100%", "50%"])
@pytest.mark.parametrize("name", ["cnn", "mlp", "transformer"])
def test_gradients_equal_pytorch(name, budget):
    model, shape = small_model(name)
    reference = copy.deepcopy(model)
    schedule = schedule_for(name, budget)
    assert bool(recomputed(schedule)) == (budget == "50%")
    wrapped = MONeTWrapper(model, schedule, shape)
    errors = gradient_errors(wrapped, model, reference, small_batch(name))
    assert errors.pop("output") < 1e-6
    assert max(errors.values()) < 1e-5, errors
    for (bname, b), c in zip(model.named_buffers(), reference.buffers()):
        assert torch.equal(b, c), bname  # running stats updated once, as PyTorch does


def test_training_steps_track_pytorch():
    model, shape = small_model("cnn")
    reference = copy.deepcopy(model)
    wrapped = MONeTWrapper(model, schedule_for("cnn", "50%"), shape)
    x, target = torch.randn(shape), torch.randint(0, 10, (shape[0],))
    for module, params in ((wrapped, model), (reference, reference)):
        optimizer = torch.optim.SGD(params.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            optimizer.zero_grad()
            F.cross_entropy(module(x), target).backward()
            optimizer.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert rel_err(p.detach(), q.detach()) < 1e-5


def test_measured_peak_within_budget_and_prediction():
    model, shape = small_model("cnn")
    schedule = schedule_for("cnn", "50%", cost_model="measured")
    wrapped = MONeTWrapper(model, schedule, shape)
    x = torch.randn(shape)
    predicted = schedule.predicted.peak
    for _ in range(2):  # the first step and a steady one
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        with PeakMemory("cpu", resident_bytes(model, xi)) as meter:
            wrapped(xi).sum().backward()
        assert meter.peak <= schedule.budget
        assert abs(meter.peak - predicted) <= 0.03 * meter.peak, (meter.peak, predicted)
        del xi
    assert predicted <= 0.5 * schedule.predicted.unconstrained_peak


def test_eval_mode_and_no_grad_run_the_plain_model():
    model, shape = small_model("cnn")
    reference = copy.deepcopy(model)
    wrapped = MONeTWrapper(model, schedule_for("cnn", "50%"), shape)
    x = torch.randn(shape)
    with torch.no_grad():
        assert torch.equal(wrapped(x), reference(x))  # train mode, no grad: plain forward, stats updated
    wrapped.eval(), reference.eval()
    assert torch.equal(wrapped(x[:3]), reference(x[:3]))  # any batch size in eval mode
    assert all(torch.equal(b, c) for b, c in zip(model.buffers(), reference.buffers()))
    wrapped.train()
    model.eval()  # the wrapped model's own eval mode counts too: batch norm on its running statistics
    assert torch.equal(wrapped(x), reference(x))


def test_the_wrapped_models_eval_mode_turns_dropout_off():
    model, shape = small_model("transformer")
    reference = copy.deepcopy(model).eval()
    wrapped = MONeTWrapper(model, schedule_for("transformer", "50%"), shape)
    model.eval()
    x = torch.randn(shape)
    assert torch.equal(wrapped(x), reference(x))  # no dropout: the eval model's output, every time


def test_wrong_inputs_are_refused():
    model, shape = small_model("cnn")
    wrapped = MONeTWrapper(model, schedule_for("cnn", "50%"), shape)
    with pytest.raises(ValueError, match=r"input x has shape \(8, 3, 32, 32\), but the schedule was made for "
                                         r"shape \(16, 3, 32, 32\)"):
        wrapped(torch.randn(8, 3, 32, 32))
    with pytest.raises(ValueError, match="input x is float64, but the schedule was made for float32"):
        wrapped(torch.randn(shape, dtype=torch.float64))
    no_grad_schedule = monet.solve(model, shape, "100%", cost_model="analytic")
    with pytest.raises(ValueError, match="input_requires_grad"):
        MONeTWrapper(model, no_grad_schedule, shape)(torch.randn(shape, requires_grad=True))


def test_schedule_for_another_model_or_shape_is_refused(tmp_path):
    cnn, shape = small_model("cnn")
    _, mlp_shape = small_model("mlp")
    with pytest.raises(ScheduleMismatchError, match=r"made for MLP .* ResidualCNN does not trace"):
        MONeTWrapper(cnn, schedule_for("mlp", "100%"), mlp_shape)
    shallower = monet.models.MLP(hidden=64, depth=12)
    with pytest.raises(ScheduleMismatchError, match=r"different graph: MLP with \d+ ops.*MLP at input .* traces to"):
        MONeTWrapper(shallower, schedule_for("mlp", "100%"), mlp_shape)
    path = schedule_for("cnn", "50%").save(tmp_path / "cnn.json")
    with pytest.raises(ScheduleMismatchError, match=r"input x has shape \(8, 3, 32, 32\), but the schedule was "
                                                    r"made for shape \(16, 3, 32, 32\)"):
        MONeTWrapper(cnn, path, (8, 3, 32, 32))
    wider, _ = small_model("cnn")
    wider.head = torch.nn.Linear(64, 20)
    with pytest.raises(ScheduleMismatchError, match="first difference"):
        MONeTWrapper(wider, path, shape)


def test_schedule_from_a_file_trains_like_the_solved_one(tmp_path):
    model, shape = small_model("mlp")
    path = schedule_for("mlp", "50%").save(tmp_path / "mlp.json")
    reference = copy.deepcopy(model)
    x = torch.randn(shape)
    for module in (MONeTWrapper(model, str(path), shape), reference):
        torch.manual_seed(3)
        module(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert rel_err(p.grad, q.grad) < 1e-5


def test_an_infeasible_budget_states_the_least_peak():
    model, shape = small_model("cnn")
    with pytest.raises(InfeasibleBudgetError, match=r"least .*peak.* \(\d+ bytes\).* raise the budget") as info:
        monet.solve(model, shape, "5%act", cost_model="analytic", time_limit=10)  # above the floor, below the least
    assert info.value.least_peak > info.value.budget > info.value.floor


class SquaredError(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x, target):
        return F.mse_loss(self.fc(x).relu(), target)


def test_a_loss_that_keeps_its_kernels_buffer_is_predicted_as_measured():
    """PyTorch's CPU mse_loss returns its 0-dim loss in the buffer of the elementwise losses (64 KiB here),
    which lives as long as the loss: the profile counts the storage, not the shape."""
    torch.manual_seed(0)
    model, inputs = SquaredError(), {"x": torch.randn(64, 256), "target": torch.randn(64, 256)}
    schedule = monet.solve(model, inputs, "100%", cost_model="analytic")
    wrapped = MONeTWrapper(model, schedule, inputs)
    with PeakMemory("cpu", resident_bytes(model, *inputs.values())) as meter:
        wrapped(**inputs).backward()
    assert schedule.predicted.peak <= meter.peak <= schedule.predicted.peak + 64  # + the caller's loss scalar


def test_a_loss_outside_the_model_is_scheduled_inside_with_withloss():
    """The budget covers the traced step: a model returning logits, reduced outside by a sum, peaks as
    predicted (the output's gradient is counted); cross-entropy outside keeps its log-softmax outside the
    budget, and monet.WithLoss puts it inside, where the measured peak is the predicted one."""
    torch.manual_seed(0)
    vocab = 2048
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 64), torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, vocab))
    ids, targets = torch.randint(0, vocab, (8, 64)), torch.randint(0, vocab, (8, 64))
    logits = monet.solve(model, ids, "100%", cost_model="analytic")
    with PeakMemory("cpu", resident_bytes(model, ids)) as meter:
        out = MONeTWrapper(model, logits, ids)(ids)  # held through the backward, as a training loop holds it
        out.sum().backward()
    del out
    assert logits.predicted.peak <= meter.peak <= logits.predicted.peak + 64

    step = monet.WithLoss(model, lambda out, target: F.cross_entropy(out.flatten(0, 1), target.flatten()))
    inputs = {"input": ids, "target": targets}
    schedule = monet.solve(step, inputs, "least", cost_model="analytic", time_limit=5)
    model.zero_grad(set_to_none=True)
    with PeakMemory("cpu", resident_bytes(model, ids, targets)) as meter:
        MONeTWrapper(step, schedule, inputs)(input=ids, target=targets).backward()
    assert schedule.predicted.peak <= meter.peak <= schedule.predicted.peak + 64
    assert schedule.predicted.peak < logits.predicted.peak + 2 * ids.numel() * vocab * 4  # below logits + 2 copies
