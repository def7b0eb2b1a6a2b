"""Shared fixtures: small bundled-model configurations whose 50% schedules solve in seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/synthetic.py

# name -> (factory kwargs, input shape); 50% of the unconstrained peak is feasible for each.
SMALL = {
    "cnn": ({}, (16, 3, 32, 32)),
    "mlp": ({"hidden": 64, "depth": 24}, (1024, 32)),
    "transformer": ({"dim": 64, "depth": 3}, (4, 64, 64)),
}


def small_model(name: str):
    import torch

    from monet.models import MLP, ResidualCNN, Transformer

    torch.manual_seed(0)
    kwargs, shape = SMALL[name]
    factory = {"cnn": ResidualCNN, "mlp": MLP, "transformer": Transformer}[name]
    return factory(**kwargs), shape


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device")


@pytest.fixture
def cuda_device():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device("cuda")
