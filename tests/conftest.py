"""Shared fixtures: small bundled-model configurations whose 50% schedules solve in seconds."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/synthetic.py
if "PYTEST_XDIST_WORKER" in os.environ:
    # Under pytest-xdist (README's `-n 2`) each worker computes on one thread, set before torch loads,
    # so that two workers on two cores do not oversubscribe them; processes the tests start inherit it.
    os.environ["OMP_NUM_THREADS"] = "1"

# name -> (factory kwargs, input shape); 50% of the unconstrained peak is feasible for each.
SMALL = {
    "cnn": ({}, (16, 3, 32, 32)),
    "mlp": ({"hidden": 64, "depth": 24}, (1024, 32)),
    "transformer": ({"dim": 64, "depth": 3}, (4, 64, 64)),
    "transformer-silu": ({"dim": 64, "depth": 3, "activation": "silu"}, (4, 64, 64)),
    "distilbert": ({"n_layers": 2, "dim": 64, "hidden_dim": 128, "n_heads": 4, "vocab_size": 1000,
                    "max_position_embeddings": 128}, (4, 64)),
}
INPUT_DTYPE = {"distilbert": "int64"}


def small_model(name: str):
    import torch

    from monet.models import MLP, DistilBertQA, ResidualCNN, Transformer

    torch.manual_seed(0)
    kwargs, shape = SMALL[name]
    factory = {"cnn": ResidualCNN, "mlp": MLP, "transformer": Transformer, "transformer-silu": Transformer,
               "distilbert": DistilBertQA}[name]
    return factory(**kwargs), shape


def small_batch(name: str, seed: int = 1):
    """A batch for the small model `name`: normal floats, or token ids."""
    import torch

    _, shape = SMALL[name]
    gen = torch.Generator().manual_seed(seed)
    if INPUT_DTYPE.get(name) == "int64":
        return torch.randint(0, SMALL[name][0]["vocab_size"], shape, generator=gen)
    return torch.randn(shape, generator=gen)


def gradient_errors(wrapped, model, reference, x) -> dict[str, float]:
    """Relative errors of `wrapped` (training `model`) against `reference` on one weighted-sum
    backward from `x`: the output, the input's gradient (if the schedule wants one) and every
    parameter's."""
    import torch

    outputs, input_grads, weights = [], [], None
    for module in (wrapped, reference):
        torch.manual_seed(2)  # the same dropout masks
        xi = x.clone().requires_grad_(wrapped.spec.single.requires_grad)
        out = module(xi)
        if weights is None:
            weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        (out * weights).sum().backward()
        outputs.append(out.detach())
        input_grads.append(xi.grad)
    errors = {"output": rel_err(*outputs)}
    if wrapped.spec.single.requires_grad:
        errors["input"] = rel_err(*input_grads)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        errors[name] = rel_err(p.grad, q.grad)
    return errors


def compiled_module(model, spec, **compile_options):
    """torch.compile(model, **compile_options) as a module with the `spec` (one tensor's InputSpec, as
    Inputs) that gradient_errors reads, as MONeTWrapper has it."""
    import torch

    from monet.schedules import Inputs

    class _Compiled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.compiled, self.spec = torch.compile(model, **compile_options), Inputs.tensor(spec)

        def forward(self, x):
            return self.compiled(x)

    return _Compiled()


def inductor_rounding(name, spec):
    """compile_rounding of the small model `name` on its small batch."""
    model, _ = small_model(name)
    return compile_rounding(model, spec, small_batch(name))


def compile_rounding(model, spec, x):
    """gradient_errors of torch.compile(model) against eager on the batch `x`: how far Inductor's fused
    kernels move its gradients by themselves. `model` is left untrained."""
    import copy

    plain = copy.deepcopy(model)
    return gradient_errors(compiled_module(plain, spec), plain, copy.deepcopy(model), x)


def errors_within_rounding(errors, rounding):
    """Each gradient error (of gradient_errors) within twice Inductor's own, or 1e-4."""
    for key, error in errors.items():
        assert error <= max(1e-4, 2 * rounding[key]), (key, error, rounding[key])


def rel_err(a, b) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device")


@pytest.fixture
def cuda_device():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device("cuda")
