"""Training batch norm runs cuDNN's kernels where eager PyTorch runs them (CUDA).

A trace records training batch norm as `_native_batch_norm_legit_functional` and its backward as
`native_batch_norm_backward`: PyTorch's own kernels. Eager PyTorch on CUDA runs cuDNN's instead
(`cudnn_batch_norm`), and the two differ:
- in time: on an H200 at ResNet-50 b184's shapes cuDNN's forward and backward took 26-41 % less
  (batch norm was 170 of the 373 ms of the traced step's profile), which made monet's keep-all
  step 13.9 % slower than eager;
- in rounding: a gradient that cancels (a batch norm bias whose float64 gradient is small) came
  out 3e-4 off under the native kernels where cuDNN's was 1e-6 off, with TF32 off; with cuDNN off
  in both, monet's gradients were eager's bit for bit.
This pass gives every training batch norm that eager would run with cuDNN (PyTorch's own choice,
`_select_batch_norm_backend`, asked with the traced tensors) cuDNN's kernels, with the functional
op's signature and outputs, so the graph runs what eager runs. cuDNN's reserve space is not a
graph tensor: a batch norm whose reserve is not empty (none seen) keeps the native kernels.
With it, tests/test_cuda.py passed on an H200 (the bundled CNN's gradients with TF32 off had
failed there before), and MONAI ResNet-50 b184's keep-all step went from 13.9 % to 0.7 % over eager
(docs/guides/gpu.md). Inductor (`compile=True`) decomposes cuDNN's batch norm back into its own
kernels, as torch.compile does.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
NATIVE_FORWARD = aten._native_batch_norm_legit_functional.default
NATIVE_BACKWARD = aten.native_batch_norm_backward.default


def cudnn_batch_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, running_mean: torch.Tensor,
                     running_var: torch.Tensor, training: bool, momentum: float, eps: float) -> tuple:
    """`_native_batch_norm_legit_functional` by cuDNN: (output, batch mean, batch invstd, new running mean,
    new running variance). cuDNN updates the running statistics in place, so it gets copies."""
    mean, var = running_mean.clone(), running_var.clone()
    out, save_mean, save_invstd, _ = aten.cudnn_batch_norm.default(
        x.contiguous(memory_format=_layout(x)), weight, bias, mean, var, training, momentum, eps)
    return out, save_mean, save_invstd, mean, var


def cudnn_batch_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                              running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                              save_mean: torch.Tensor, save_invstd: torch.Tensor, training: bool, eps: float,
                              output_mask: list[bool]) -> tuple:
    """`native_batch_norm_backward` (training, same arguments) by cuDNN, as eager's autograd calls it."""
    layout = _layout(x)
    reserve = torch.empty(0, dtype=torch.uint8, device=x.device)
    return aten.cudnn_batch_norm_backward.default(x.contiguous(memory_format=layout),
                                                  grad.contiguous(memory_format=layout), weight, running_mean,
                                                  running_var, save_mean, save_invstd, eps, reserve)


def _layout(x: torch.Tensor) -> torch.memory_format:
    """The memory format PyTorch's `suggest_memory_format` gives `x` (channels-last where it is so strided)."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


TRAINING_FORWARDS = (NATIVE_FORWARD, cudnn_batch_norm)
TRAINING_BACKWARDS = (NATIVE_BACKWARD, cudnn_batch_norm_backward)


def _eager_uses_cudnn(node: torch.fx.Node) -> bool:
    if len(node.args) != 8:
        return False
    *tensors, training, _, eps = node.args
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in tensors]
    if not training or vals[0] is None or vals[0].device.type != "cuda" or vals[1] is None:
        return False
    try:  # PyTorch's own choice, as its decompositions ask it of traced tensors
        backend = torch._C._select_batch_norm_backend(*vals, training, eps)
        return backend == torch._C._BatchNormBackend.Cudnn and \
            torch._C._get_cudnn_batch_norm_reserve_space_size(vals[0], training) == 0
    except RuntimeError:  # a PyTorch that cannot answer for these tensors: the traced kernels stay
        return False


def match_eager_batch_norm(gm: torch.fx.GraphModule) -> None:
    """Give every training batch norm that eager runs with cuDNN cuDNN's kernels."""
    changed = False
    for node in gm.graph.find_nodes(op="call_function", target=NATIVE_FORWARD):
        if not _eager_uses_cudnn(node):
            continue
        node.target = cudnn_batch_norm
        changed = True
        for stat in node.users:  # the backward reads the forward's saved mean through a getitem
            for user in stat.users:
                if user.target is NATIVE_BACKWARD and user.args[5] is stat:
                    user.target = cudnn_batch_norm_backward
    if changed:
        gm.recompile()
