"""Models called with keyword, positional and nested inputs, returning structures with the loss inside."""

import copy
import json

import pytest
import torch
from conftest import rel_err
from factories import KeywordNet, keyword_inputs

import monet
from monet import MONeTWrapper, PeakMemory, ScheduleMismatchError, resident_bytes
from monet.cli import main
from monet.graph import Example, TraceError
from monet.schedules import Inputs, InputSpec, load_schedule


def tensors(inputs):
    return [v for v in Example.of(inputs).flat if isinstance(v, torch.Tensor)]


def test_keyword_inputs_train_like_pytorch_within_the_predicted_peak():
    torch.manual_seed(0)
    model, inputs = KeywordNet(), keyword_inputs()
    reference = copy.deepcopy(model)
    schedule = monet.solve(model, inputs, "50%", cost_model="analytic", time_limit=8)
    assert schedule.input.kwargs["scale"] == 2.0 and schedule.input.kwargs["labels"] == InputSpec((64,), "int64")
    wrapped = MONeTWrapper(model, schedule, inputs)
    for _ in range(2):  # the first step and a steady one
        model.zero_grad(set_to_none=True)
        with PeakMemory("cpu", resident_bytes(model, *tensors(inputs))) as meter:
            out = wrapped(**inputs)
            out["loss"].backward()
        assert meter.peak <= schedule.budget
        assert abs(meter.peak - schedule.predicted.peak) <= 0.03 * meter.peak, (meter.peak, schedule.predicted.peak)
    assert schedule.predicted.peak <= 0.5 * schedule.predicted.unconstrained_peak
    expected = reference(**inputs)
    expected["loss"].backward()
    assert set(out) == {"logits", "loss"} and rel_err(out["logits"], expected["logits"]) < 1e-6
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert rel_err(p.grad, q.grad) < 1e-5, name


def tangents(wrapper):
    """How many outputs the wrapper's step takes a gradient for."""
    return sum(n.name.startswith("tangents") for n in wrapper.graphs["backward"].graph.find_nodes(op="placeholder"))


def test_a_model_that_returns_its_loss_is_differentiated_through_the_loss_alone():
    """The trace takes no gradient for the logits of a model that returns its loss (eager makes none when
    the loss is backpropagated); a backward through them stops with the reason rather than leaving their
    share out. Called without labels, the model returns no loss and every output is differentiated."""
    torch.manual_seed(0)
    model, inputs = KeywordNet(depth=2), keyword_inputs(batch=8)
    with_loss = MONeTWrapper(model, monet.solve(model, inputs, "100%", cost_model="analytic"), inputs)
    assert tangents(with_loss) == 1  # the loss's
    out = with_loss(**inputs)
    assert out["logits"].requires_grad
    with pytest.raises(RuntimeError, match=r"returned its loss.*'logits' has no backward.*without the labels"):
        (out["loss"] + out["logits"].sum()).backward()
    unlabelled = {k: v for k, v in inputs.items() if k != "labels"}
    plain = MONeTWrapper(model, monet.solve(model, unlabelled, "100%", cost_model="analytic"), unlabelled)
    assert tangents(plain) == 1  # the logits'
    reference = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    plain(**unlabelled)["logits"].pow(2).sum().backward()
    reference(**unlabelled)["logits"].pow(2).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert rel_err(p.grad, q.grad) < 1e-5, name


class Nested(torch.nn.Module):
    """Positional inputs with a nested structure: a tensor, and a dict holding a list of tensors."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x, extra):
        h = torch.relu(self.fc(x)) + extra["bias"][0]
        return torch.relu(self.fc(h)) * extra["gain"], h.sum()


def test_nested_positional_inputs_and_their_gradients():
    torch.manual_seed(0)
    model = Nested()
    x, bias = torch.randn(8, 16), torch.randn(16, requires_grad=True)
    inputs = (x, {"bias": [bias], "gain": 3})
    schedule = monet.solve(model, inputs, "100%", cost_model="analytic", time_limit=10)
    assert schedule.input == Inputs((InputSpec((8, 16)), {"bias": [InputSpec((16,), requires_grad=True)], "gain": 3}))
    wrapped = MONeTWrapper(model, schedule, inputs)
    out, total = wrapped(*inputs)
    (out.sum() + total).backward()
    got = bias.grad.clone()
    bias.grad = None
    expected, total = model(*inputs)
    (expected.sum() + total).backward()
    assert rel_err(out, expected) < 1e-6 and rel_err(got, bias.grad) < 1e-6


def test_distilbert_question_answering_with_its_labels_and_model_output():
    transformers = pytest.importorskip("transformers")
    config = transformers.DistilBertConfig(vocab_size=1000, dim=64, n_layers=2, n_heads=2, hidden_dim=128,
                                           max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.DistilBertForQuestionAnswering(config)
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(0, 1000, (4, 32), generator=gen),
              "attention_mask": torch.ones(4, 32, dtype=torch.int64),
              "start_positions": torch.randint(0, 32, (4,), generator=gen),
              "end_positions": torch.randint(0, 32, (4,), generator=gen)}
    schedule = monet.solve(model, inputs, "85%", cost_model="analytic", time_limit=8)
    assert schedule.predicted.peak < schedule.predicted.unconstrained_peak
    wrapped = MONeTWrapper(model, schedule, inputs)
    torch.manual_seed(2)  # the same dropout masks
    out = wrapped(**inputs)
    out.loss.backward()
    torch.manual_seed(2)
    expected = reference(**inputs)
    expected.loss.backward()
    assert type(out) is type(expected) and rel_err(out.loss, expected.loss) < 1e-6
    worst = max(rel_err(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    assert worst < 1e-4


def test_calls_other_than_the_schedules_are_refused():
    torch.manual_seed(0)
    model, inputs = KeywordNet(depth=2), keyword_inputs(batch=8)
    wrapped = MONeTWrapper(model, monet.solve(model, inputs, "100%", cost_model="analytic"), inputs)
    with pytest.raises(ScheduleMismatchError, match="input scale is 3.0, but the schedule was made for 2.0"):
        wrapped(**{**inputs, "scale": 3.0})
    with pytest.raises(ScheduleMismatchError, match=r"input attention_mask has shape \(8, 16\), but the schedule "
                                                    r"was made for shape \(8, 32\)"):
        wrapped(**{**inputs, "attention_mask": torch.ones(8, 16)})
    with pytest.raises(ScheduleMismatchError, match="other arguments or structure"):
        wrapped(**{k: v for k, v in inputs.items() if k != "labels"})
    with pytest.raises(ScheduleMismatchError, match="input labels is int32, but the schedule was made for int64"):
        wrapped(**{**inputs, "labels": inputs["labels"].int()})


def test_a_model_called_without_an_input_it_needs_is_told_which():
    with pytest.raises(TraceError, match=r"KeywordNet.forward cannot take the inputs .*attention_mask"):
        monet.solve(KeywordNet(), {"input_ids": torch.zeros(2, 4, dtype=torch.int64)}, "100%")


def test_inputs_are_written_and_read_back(tmp_path):
    inputs = Inputs((InputSpec((2, 3)), [InputSpec((3,), "int64"), None]),
                    {"mask": InputSpec((2, 3), "bool"), "opts": {"scale": 0.5, "name": "x", "pair": (1, True)}})
    assert Inputs.from_json(json.loads(json.dumps(inputs.to_json()))) == inputs
    single = Inputs.tensor(InputSpec((4, 8), "float32", True))  # written as files before keyword inputs
    assert single.to_json() == {"shape": [4, 8], "dtype": "float32", "requires_grad": True}
    assert Inputs.from_json(single.to_json()) == single
    with pytest.raises(ValueError, match=r"input kwargs\['a'\]\[0\]: 'set' of"):
        Inputs.from_json({"kwargs": {"a": {"list": [{"set": [1]}]}}})


def test_example_of_what_users_pass():
    x = torch.randn(2, 3)
    assert Example.of(x).spec() == Inputs.tensor(InputSpec((2, 3)))
    assert Example.of([2, 3], dtype="int64").spec() == Inputs.tensor(InputSpec((2, 3), "int64"))
    assert Example.of((x, 1)).spec() == Inputs((InputSpec((2, 3)), 1))
    with pytest.raises(ValueError, match="describe an input given as a shape"):
        Example.of({"x": x}, dtype="float64")
    with pytest.raises(TypeError, match="input args\\[0\\] is a object: monet takes tensors"):
        Example.of((object(),)).spec()


def test_cli_takes_example_inputs_from_a_factory(tmp_path, capsys, monkeypatch):
    path = tmp_path / "kw.json"
    for argv in (["factories:keyword_net"], ["factories:keyword_net_alone", "--inputs", "factories:keyword_inputs"]):
        code = main(["solve", *argv, "--budget", "60%", "-o", str(path), "--cost-model", "analytic",
                     "--time-limit", "20"])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "input_ids: (64, 32) int64" in out
        schedule = load_schedule(path)
        assert schedule.input.kwargs["scale"] == 2.0 and schedule.predicted.peak <= schedule.budget
    code = main(["solve", "factories:keyword_net", "--input-shape", "4,8", "--budget", "60%", "-o", str(path)])
    assert code != 0 and "got --input-shape, factories:keyword_net's factory" in capsys.readouterr().err


def test_new_sequence_lengths_are_solved_once_and_kept_where_asked(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, inputs = KeywordNet(depth=4), keyword_inputs(batch=16, length=32)
    reference = copy.deepcopy(model)
    schedule = monet.solve(model, inputs, "60%", cost_model="analytic", time_limit=8)
    with pytest.raises(ScheduleMismatchError, match="new_shapes=folder"):
        MONeTWrapper(model, schedule, inputs)(**keyword_inputs(batch=16, length=24))
    wrapped = MONeTWrapper(model, schedule, inputs, new_shapes=tmp_path)
    shorter = keyword_inputs(batch=16, length=24)
    with pytest.warns(UserWarning, match=r"solved a schedule for new input shapes .*\(16, 24\) int64.* "
                                         r"at 60% of their unconstrained peak"):
        out = wrapped(**shorter)
    (kept,) = tmp_path.glob("KeywordNet-*.json")
    made = load_schedule(kept)
    assert made.input.kwargs["input_ids"].shape == (16, 24)
    assert made.budget == pytest.approx(0.6 * made.predicted.unconstrained_peak, abs=1)
    out["loss"].backward()
    expected = reference(**shorter)
    expected["loss"].backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert rel_err(p.grad, q.grad) < 1e-5
    wrapped(**inputs)["loss"].backward()  # the schedule's own shapes still run its own step
    # another wrapper (another process, later) reads the kept file: no tracing for a solve
    monkeypatch.setattr(monet.api, "solve", lambda *a, **k: pytest.fail("solved again"))
    MONeTWrapper(model, schedule, inputs, new_shapes=tmp_path)(**shorter)["loss"].backward()
    with pytest.raises(ScheduleMismatchError, match="labels is int32"):  # not a shape: refused as before
        wrapped(**{**shorter, "labels": shorter["labels"].int()})
