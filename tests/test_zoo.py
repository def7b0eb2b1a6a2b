"""The precomputed schedules in schedules/: each one is valid, named for its model, input and
budget, listed in zoo.md, and within its budget; regeneration writes schedules that train."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from monet.graph import InputSpec
from monet.memory import PeakMemory, resident_bytes
from monet.schedules import BUNDLED_DIR, bundled_names, load_schedule
from monet.wrapper import MONeTWrapper

REPO = Path(__file__).parents[1]
sys.path.insert(0, str(REPO))  # benchmarks/ is not a package
from benchmarks.models import MODELS  # noqa: E402
from benchmarks.problems import shape_tag  # noqa: E402
from benchmarks.zoo import schedule_name  # noqa: E402


def test_bundled_schedules_are_named_listed_and_within_budget():
    names = bundled_names()
    assert len(names) >= 10
    listed = (BUNDLED_DIR / "zoo.md").read_text()
    tags = {shape_tag(m, m.input_shape): m for m in MODELS.values()}
    for name in names:
        made = load_schedule(name)
        tag, _, pct = name.rpartition("-")
        bench = tags[tag]
        assert made.input.single == InputSpec(bench.input_shape, bench.input_dtype)
        assert pct == f"{round(100 * made.budget / made.predicted.unconstrained_peak)}pct"
        assert made.cost_model == "analytic" and made.predicted.peak <= made.budget
        assert f"| {name} |" in listed


def train_step_peak(model: torch.nn.Module, x: torch.Tensor) -> int:
    """One forward and backward; the peak. Seeded: dropout draws the same masks under monet."""
    model.train()
    torch.manual_seed(1)
    with PeakMemory(x.device, resident_bytes(model, x)) as meter:
        model(x).float().square().mean().backward()
    return meter.peak


def test_bundled_schedule_by_name_trains_within_budget():
    """MobileNetV2 at batch 32, 224x224, by name: the measured peak is the predicted one, and the
    gradients are plain PyTorch's (float32, relative error under 1e-5)."""
    bench = MODELS["mobilenet_v2"]
    name = schedule_name(shape_tag(bench, bench.input_shape), "50%")
    torch.manual_seed(0)
    model = bench.build()
    reference = bench.build()
    reference.load_state_dict(model.state_dict())
    x = InputSpec(bench.input_shape).example()
    wrapped = MONeTWrapper(model, name, bench.input_shape)
    peak = train_step_peak(wrapped, x)
    made = load_schedule(name)
    assert peak <= made.budget
    assert peak == pytest.approx(made.predicted.peak, rel=0.03)
    train_step_peak(reference, x)
    for (key, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad - q.grad).norm() <= 1e-5 * q.grad.norm(), key


def test_regenerated_schedule_loads_by_path_and_trains(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.zoo", "--models", "cnn", "--budgets", "50%",
                           "--time-limit", "10", "--cache", str(tmp_path / "cache"), "-o", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    path = tmp_path / "cnn-b32-64-50pct.json"
    assert "| cnn-b32-64-50pct |" in (tmp_path / "zoo.md").read_text()
    made = load_schedule(path)
    bench = MODELS["cnn"]
    x = InputSpec(bench.input_shape).example()
    peak = train_step_peak(MONeTWrapper(bench.build(), path, bench.input_shape), x)
    assert peak <= made.budget
    assert peak == pytest.approx(made.predicted.peak, rel=0.03)
