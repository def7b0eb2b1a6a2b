"""The whole training step: the optimizer's state and its step in the budget and the predicted peak."""

import copy
import dataclasses

import pytest
import torch
from conftest import rel_err
from factories import KeywordNet, keyword_inputs
from synthetic import chain

import monet
from monet import MONeTWrapper, PeakMemory, resident_bytes
from monet.cli import main
from monet.schedules import OptimizerSpec, load_schedule
from monet.solver import InfeasibleBudgetError, Problem, Update, keep_all, least_peak, simulate, solve


def test_the_optimizers_state_and_step_count_in_every_solve():
    plain = chain(12)
    grads_and_outputs = sum(t.bytes for t in plain.tensors if t.role in ("output", "grad"))
    p = dataclasses.replace(plain, update=Update(state=100, workspace=400))
    assert Problem.from_dict(p.to_dict()).update == p.update
    assert p.update_peak == plain.persistent_bytes + 100 + grads_and_outputs + 400
    full, before = simulate(p, keep_all(p)), simulate(plain, keep_all(plain))
    assert full.timeline[-1] == ("optimizer step", p.update_peak)  # what the backward leaves, and the step
    assert full.peak == max(before.peak + 100, p.update_peak)
    budget = int(0.7 * full.peak)
    solution = solve(p, budget, time_limit=8)
    assert solution.peak <= budget and solution.replay.peak == simulate(p, solution.schedule).peak
    least = least_peak(p, time_limit=8).found  # the step's, above the activations' least (601 bytes)
    assert p.update_peak <= least <= p.update_peak + 1  # (the ILP's 1e-5 slack, rounded up to a byte)
    with pytest.raises(InfeasibleBudgetError):
        solve(p, p.update_peak - 1, time_limit=8)


@pytest.mark.parametrize("optimizer, micro_batches", [("adam", 1), ("sgd", 1), ("adamw", 2)])
def test_a_whole_step_measures_its_predicted_peak_and_trains_like_pytorch(optimizer, micro_batches):
    torch.manual_seed(0)
    model, inputs = KeywordNet(width=128), keyword_inputs()
    reference = copy.deepcopy(model)
    schedule = monet.solve(model, inputs, "60%", optimizer=optimizer, micro_batches=micro_batches,
                           cost_model="analytic", time_limit=8)
    assert schedule.optimizer == OptimizerSpec.of(optimizer, micro_batches)
    wrapped = MONeTWrapper(model, schedule, inputs)
    batch = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    runs = {}
    for name, module in (("monet", wrapped), ("pytorch", reference)):
        opt = schedule.optimizer.build(module.parameters())
        for _step in range(3):
            opt.zero_grad(set_to_none=True)  # before the meter, which sees no frees of blocks made before it
            state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
            with PeakMemory("cpu", resident_bytes(module, *batch, *state)) as meter:
                for _ in range(micro_batches):
                    out = module(**inputs)
                    out["loss"].backward()
                opt.step()
            del out
            runs.setdefault(name, []).append(meter.peak)
    predicted = schedule.predicted.peak
    for peak in runs["monet"][1:]:  # from the second step on, the optimizer's state exists: the step solved for
        assert peak <= schedule.budget and abs(peak - predicted) <= 0.03 * peak, (peak, predicted)
    assert runs["monet"][0] <= 1.03 * predicted  # the first step: no state yet, or (SGD) the same step
    assert abs(runs["pytorch"][-1] - schedule.predicted.unconstrained_peak) <= 0.03 * runs["pytorch"][-1]
    for p, q in zip(model.parameters(), reference.parameters()):
        assert rel_err(p.detach(), q.detach()) < 1e-5


def test_optimizer_arguments_are_checked_before_tracing():
    model = KeywordNet(depth=1)
    with pytest.raises(ValueError, match="use one of sgd, adam, adamw"):
        monet.solve(model, keyword_inputs(8), "100%", optimizer="lamb")
    with pytest.raises(ValueError, match="name the optimizer too"):
        monet.solve(model, keyword_inputs(8), "100%", micro_batches=4)
    assert OptimizerSpec.of((torch.optim.Adam, {"lr": 0.1})) == OptimizerSpec("torch.optim.Adam", {"lr": 0.1})


def test_cli_solves_a_whole_step(tmp_path, capsys):
    path = tmp_path / "adam.json"
    code = main(["solve", "factories:keyword_net", "--optimizer", "adam", "--budget", "70%", "-o", str(path),
                 "--cost-model", "analytic", "--time-limit", "20"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Adam(): its state and step are in the peak" in out
    assert load_schedule(path).optimizer == OptimizerSpec("torch.optim.Adam")
