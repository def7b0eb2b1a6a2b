"""Steps traced and run under torch.autocast (mixed precision), and torch.amp.GradScaler with the wrapper."""

import copy

import pytest
import torch
from conftest import rel_err
from factories import KeywordNet, keyword_inputs

import monet
from monet import MONeTWrapper, PeakMemory, ScheduleMismatchError, resident_bytes
from monet.schedules import ScheduleFile


def resident(model, inputs):
    return resident_bytes(model, *[v for v in inputs.values() if isinstance(v, torch.Tensor)])


@pytest.fixture(scope="module")
def bfloat16_schedule():
    torch.manual_seed(0)
    model = KeywordNet()
    return model, monet.solve(model, keyword_inputs(), "70%", autocast="bfloat16", cost_model="analytic",
                              time_limit=20)


def test_an_autocast_step_trains_like_pytorch_under_autocast_within_the_predicted_peak(bfloat16_schedule):
    solved, schedule = bfloat16_schedule
    model, inputs = copy.deepcopy(solved), keyword_inputs()
    reference = copy.deepcopy(model)
    assert schedule.autocast == "bfloat16"
    assert ScheduleFile.from_dict(schedule.to_dict()).autocast == "bfloat16"
    wrapped = MONeTWrapper(model, schedule, inputs)
    for _ in range(2):  # the first step and a steady one
        model.zero_grad(set_to_none=True)
        with PeakMemory("cpu", resident(model, inputs)) as meter:
            out = wrapped(**inputs)  # called outside autocast: the wrapper applies the schedule's
            out["loss"].backward()
        assert meter.peak <= schedule.budget
        assert abs(meter.peak - schedule.predicted.peak) <= 0.03 * meter.peak, (meter.peak, schedule.predicted.peak)
    with torch.autocast("cpu", torch.bfloat16):
        expected = reference(**inputs)
    expected["loss"].backward()
    assert out["logits"].dtype == expected["logits"].dtype == torch.bfloat16
    assert rel_err(out["loss"], expected["loss"]) < 1e-6
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.grad.dtype == torch.float32 and rel_err(p.grad, q.grad) < 1e-5, name
    with torch.autocast("cpu", torch.bfloat16):  # under the same autocast: the same step
        assert torch.equal(wrapped(**inputs)["logits"], out["logits"])


def test_a_call_under_another_autocast_is_refused(bfloat16_schedule):
    solved, schedule = bfloat16_schedule
    inputs = keyword_inputs()
    wrapped = MONeTWrapper(copy.deepcopy(solved), schedule, inputs)
    with pytest.raises(ScheduleMismatchError, match=r"solved under torch.autocast at bfloat16.*autocast='float16'"):
        with torch.autocast("cpu", torch.float16):
            wrapped(**inputs)
    plain = monet.solve(solved, inputs, "100%", cost_model="analytic")
    with pytest.raises(ScheduleMismatchError, match="solved without autocast"):
        with torch.autocast("cpu", torch.bfloat16):
            MONeTWrapper(copy.deepcopy(solved), plain, inputs)(**inputs)


def test_grad_scaler_steps_like_pytorchs(bfloat16_schedule):
    solved, schedule = bfloat16_schedule
    inputs = keyword_inputs()
    model, reference = copy.deepcopy(solved), copy.deepcopy(solved)
    wrapped = MONeTWrapper(model, schedule, inputs)
    for module, run in ((wrapped, lambda: wrapped(**inputs)), (reference, lambda: reference(**inputs))):
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        for _ in range(2):
            optimizer.zero_grad()
            with torch.autocast("cpu", torch.bfloat16):
                loss = run()["loss"]
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert rel_err(p.detach(), q.detach()) < 1e-6


class DropoutAttention(torch.nn.Module):
    """Attention with dropout on its weights (SDPA's math path: float32 inside on CPU) and dropout on
    its bfloat16 output, as transformers' attention blocks run under autocast."""

    def __init__(self, width: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x):
        b, n, width = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
        return self.out(self.drop(a.transpose(1, 2).reshape(b, n, width))).float().pow(2).mean()


def test_dropout_and_attention_under_autocast_give_eager_autocasts_gradients():
    """Eager's recipe runs the forward under autocast and the backward outside it, so the traced
    backward runs without autocast (traced under it, the backward's float32 matmuls of SDPA's math
    path were cast to bfloat16); and a bfloat16 dropout's backward scales by 1/(1-p) rounded to
    bfloat16, as eager's CPU dropout does (graph.dropout_scale). Each alone left gradients 2e-3 to
    2e-2 from eager's on GPT-2; here both give the same numbers."""
    torch.manual_seed(0)
    model, x = DropoutAttention(), torch.randn(4, 16, 32)
    reference = copy.deepcopy(model)
    schedule = monet.solve(copy.deepcopy(model), x, "100%", autocast="bfloat16", cost_model="analytic")
    wrapped = MONeTWrapper(model, schedule, x)
    torch.manual_seed(1)
    wrapped(x).backward()
    torch.manual_seed(1)
    with torch.autocast("cpu", torch.bfloat16):
        loss = reference(x)
    loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad), (name, rel_err(p.grad, q.grad))


def test_an_autocast_dtype_autocast_cannot_run_is_refused_before_tracing():
    with pytest.raises(ValueError, match=r"autocast='int8': use one of torch.bfloat16, torch.float16 \(or its name"):
        monet.solve(KeywordNet(), keyword_inputs(), "100%", autocast="int8")
