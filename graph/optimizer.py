"""The optimizer's memory in a training step, measured here: its state, and what its step allocates."""

from __future__ import annotations

import torch
from torch import nn

from monet.schedules import OptimizerSpec
from monet.solver import Update

from .peak import DevicePeak


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimizer steps: those that want gradients, each once (tied ones too)."""
    return [p for p in model.parameters() if p.requires_grad]


def measure_update(model: nn.Module, spec: OptimizerSpec, seed: int = 0) -> Update:
    """The optimizer's part of `model`'s step: built on copies of its parameters, with random
    gradients, stepped once so that its state exists (as from the second training step on), then
    stepped again under the device's peak meter. Its state bytes (every tensor in `state`, each
    storage once), plus the gradients of earlier micro-batches when several accumulate, are held for
    the whole step; the second step's rise above what it started with is its workspace."""
    gen = torch.Generator().manual_seed(seed)
    params = [p.detach().clone().requires_grad_(True) for p in trainable(model)]
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen, dtype=torch.float32) * 1e-3).to(p.device, p.dtype)
    optimizer = spec.build(params)
    optimizer.step()
    storages: dict[int, int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                storages[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
    device = params[0].device if params else torch.device("cpu")
    with DevicePeak(device) as meter:
        optimizer.step()
    accumulated = sum(p.grad.nbytes for p in params) if spec.micro_batches > 1 else 0
    return Update(sum(storages.values()) + accumulated, meter.rise)
