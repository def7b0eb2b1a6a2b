"""The PyTorch competitors of the benchmark train the same model: per-block checkpointing and
checkpoint_sequential give plain PyTorch's gradients, and they do hold less memory."""

import copy
import sys
from pathlib import Path

import torch

from monet.graph import InputSpec
from monet.memory import PeakMemory, resident_bytes

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/ is not a package
from benchmarks.competitors import CheckpointSequential, checkpoint_blocks  # noqa: E402
from benchmarks.models import MODELS  # noqa: E402


def step(model, x):
    torch.manual_seed(1)
    with PeakMemory("cpu", resident_bytes(model, x)) as meter:
        model(x).square().mean().backward()
    return meter.peak


def test_checkpointed_competitors_match_eager_gradients():
    bench = MODELS["cnn"]
    torch.manual_seed(0)
    model = bench.build().train()
    x = InputSpec(bench.input_shape).example()
    blocks = copy.deepcopy(model)
    checkpoint_blocks(blocks, bench.blocks(blocks))
    chained = copy.deepcopy(model)
    sequential = CheckpointSequential(chained, bench.chain(chained))
    assert sequential.segments == round(len(bench.chain(chained)) ** 0.5)
    peaks = {name: step(m, x) for name, m in (("eager", model), ("blocks", blocks), ("sequential", sequential))}
    assert peaks["blocks"] < 0.8 * peaks["eager"] and peaks["sequential"] < 0.8 * peaks["eager"]
    for other in (blocks, chained):
        for p, q in zip(other.parameters(), model.parameters(), strict=True):
            assert (p.grad - q.grad).norm() <= 1e-5 * q.grad.norm()
