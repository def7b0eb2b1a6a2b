"""A model with its loss, so that the loss is part of the step monet traces, schedules and budgets."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class WithLoss(nn.Module):
    """`loss(model(*args, **kwargs), target)` as one module, to solve and wrap in place of `model`.

    A budget covers the traced step: from the model's inputs to its outputs, and the backward from the
    gradients of those outputs. A loss computed outside (`F.cross_entropy(wrapped(ids), targets)`) keeps
    what it keeps (cross-entropy: its log-softmax, the size of the logits) outside the budget, and its
    measured peak can exceed the prediction by that much. Inside, it is scheduled with the rest:

        step = monet.WithLoss(model, F.cross_entropy)
        inputs = {"x": images, "target": labels}  # the model's own argument names, and the target
        schedule = monet.solve(step, inputs, "50%")
        wrapped = monet.MONeTWrapper(step, schedule, inputs)
        wrapped(x=images, target=labels).backward()  # called as it was solved, by keyword

    The model's parameters are this module's, under `model.`; `model`'s train/eval mode is this module's.
    """

    def __init__(self, model: nn.Module, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *args, target, **kwargs) -> torch.Tensor:
        return self.loss(self.model(*args, **kwargs), target)
