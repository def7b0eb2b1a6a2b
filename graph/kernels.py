"""The alternative implementations' kernels, in plain PyTorch (any device).

Each takes and returns tensors only, so it can stand as the target of an fx node
in the runtime's graphs and run on fake tensors for shapes.
"""

from __future__ import annotations

import contextlib

import torch

_BIT_WEIGHTS = (1, 2, 4, 8, 16, 32, 64, 128)


def pack_bits(flags: torch.Tensor) -> torch.Tensor:
    """A bool tensor as bits, 8 per byte (uint8, length ceil(numel / 8))."""
    flat = flags.reshape(-1)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=flags.device)
    return (flat.view(-1, 8).to(torch.uint8) * weights).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The bool tensor of `like`'s shape that `pack_bits` packed."""
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(1) & weights) != 0
    return bits.reshape(-1)[: like.numel()].reshape(like.shape)


def relu_mask(out: torch.Tensor) -> torch.Tensor:
    """What ReLU's backward needs of its output: where it is positive, as bits."""
    return pack_bits(out > 0)


def relu_backward_from_mask(grad: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """threshold_backward(grad, out, 0) from the packed mask: the same numbers."""
    return torch.where(unpack_bits(mask, grad), grad, torch.zeros((), dtype=grad.dtype, device=grad.device))


def dropout_mask(keep: torch.Tensor) -> torch.Tensor:
    """Dropout's bool mask (one byte per element) as bits."""
    return pack_bits(keep)


def dropout_backward_from_mask(grad: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """native_dropout_backward(grad, keep, scale) from the packed mask: the same numbers."""
    return grad * unpack_bits(mask, grad).to(grad.dtype) * scale


def rng_state(x: torch.Tensor) -> torch.Tensor:
    """The random generator's state of x's device, taken right before a dropout draws its mask
    (CPU: 5056 bytes; CUDA: a small host tensor, seed and offset)."""
    if x.device.type == "cuda":
        return torch.cuda.get_rng_state(x.device)
    return torch.get_rng_state()


@contextlib.contextmanager
def _generator_at(state: torch.Tensor, device: torch.device):
    """Run the block with the generator of `device` set to `state`, then put it back as it was."""
    before = rng_state(torch.empty(0, device=device))
    _set_rng_state(state, device)
    try:
        yield
    finally:
        _set_rng_state(before, device)


def _set_rng_state(state: torch.Tensor, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def dropout_rerun(x: torch.Tensor, p: float, train: bool | None, state: torch.Tensor) -> tuple:
    """native_dropout rerun in the backward from the generator state its forward run started from:
    the same output and mask, and the generator is left as it was."""
    with _generator_at(state, x.device):
        return torch.ops.aten.native_dropout.default(x, p, train)


def dropout_backward_replay(grad: torch.Tensor, state: torch.Tensor, p: float, scale: float) -> torch.Tensor:
    """native_dropout_backward(grad, keep, scale) with the mask drawn again from the generator state
    the forward dropout started from: native_dropout's mask depends only on that state, the shape and
    the dtype, so it is the same mask, and the generator is left as it was. On CPU native_dropout draws
    its mask as `empty(shape, dtype).bernoulli_(1 - p)`, so the mask is drawn that way and becomes the
    result in place (bit for bit native_dropout_backward's, with no memory besides the result); CUDA's
    fused kernel draws it its own way, so there native_dropout runs again on a dummy input."""
    with _generator_at(state, grad.device):
        if grad.device.type == "cpu":
            noise = torch.empty(grad.shape, dtype=grad.dtype).bernoulli_(1 - p)
            return noise.mul_(grad).mul_(scale)
        _, keep = torch.ops.aten.native_dropout.default(torch.empty(grad.shape, dtype=grad.dtype,
                                                                    device=grad.device), p, True)
    return torch.ops.aten.native_dropout_backward.default(grad, keep, scale)


def pool_offsets(indices: torch.Tensor, input_hw: tuple[int, int], kernel: tuple[int, int],
                 stride: tuple[int, int], padding: tuple[int, int]) -> torch.Tensor:
    """Max-pool argmax indices (int64, into each input plane) as offsets inside each window (uint8)."""
    _, _, oh, ow = indices.shape
    width = input_hw[1]
    rows = torch.arange(oh, device=indices.device).view(-1, 1) * stride[0] - padding[0]
    cols = torch.arange(ow, device=indices.device).view(1, -1) * stride[1] - padding[1]
    return ((indices // width - rows) * kernel[1] + (indices % width - cols)).to(torch.uint8)


def pool_backward_from_offsets(grad: torch.Tensor, offsets: torch.Tensor, input_hw: tuple[int, int],
                               kernel: tuple[int, int], stride: tuple[int, int],
                               padding: tuple[int, int]) -> torch.Tensor:
    """max_pool2d_with_indices_backward from window offsets: the same numbers in every dtype.

    The argmax indices are rebuilt from the offsets. Windows that do not overlap (stride at least
    the kernel) send each input element at most one gradient, so a scatter is exact. Overlapping
    windows (3x3, stride 2) add several gradients into one element, and the sum's order and
    precision matter in bfloat16 and float16: PyTorch's CPU kernel adds them one by one in the
    input's dtype, while scatter_add sums them in float32 and rounds once (up to a bfloat16 ulp
    apart). So there PyTorch's own backward kernel runs on the rebuilt indices (its input argument
    is only a shape: an expanded scalar, nothing allocated on CPU; CUDA's kernel copies it)."""
    n, c, oh, ow = grad.shape
    height, width = input_hw
    offsets = offsets.to(torch.int64)
    rows = torch.arange(oh, device=grad.device).view(-1, 1) * stride[0] - padding[0] + offsets // kernel[1]
    cols = torch.arange(ow, device=grad.device).view(1, -1) * stride[1] - padding[1] + offsets % kernel[1]
    index = rows * width + cols
    if stride[0] < kernel[0] or stride[1] < kernel[1]:
        like = grad.new_empty(()).expand(n, c, height, width)
        return torch.ops.aten.max_pool2d_with_indices_backward.default(
            grad, like, list(kernel), list(stride), list(padding), [1, 1], False, index)
    out = torch.zeros(n, c, height * width, dtype=grad.dtype, device=grad.device)
    return out.scatter_add_(2, index.view(n, c, -1), grad.reshape(n, c, -1)).view(n, c, height, width)


BN_WEIGHT_FLOOR = 1e-6  # |weight| below this is taken as this when reconstructing from the output


def batch_norm_backward_from_output(grad: torch.Tensor, out: torch.Tensor, weight: torch.Tensor,
                                    bias: torch.Tensor, save_mean: torch.Tensor, save_invstd: torch.Tensor,
                                    eps: float, output_mask: list[bool]) -> tuple:
    """native_batch_norm_backward (training) from the output instead of the input, which it rebuilds
    as out / (weight * invstd) + mean - bias / (weight * invstd), so the input need not be kept
    (In-place ABN). Exact up to rounding while every |weight| is at least BN_WEIGHT_FLOOR; a
    smaller weight is floored there."""
    shape = (1, -1) + (1,) * (out.dim() - 2)
    floor = torch.full_like(weight, BN_WEIGHT_FLOOR)
    safe = torch.where(weight.abs() < BN_WEIGHT_FLOOR, torch.copysign(floor, weight), weight)
    scale = 1 / (safe * save_invstd)
    rebuilt = torch.addcmul((save_mean - bias * scale).view(shape), out, scale.view(shape))
    return torch.ops.aten.native_batch_norm_backward.default(grad, rebuilt, weight, None, None, save_mean,
                                                             save_invstd, True, eps, output_mask)


def batch_norm_from_stats(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, running_mean: torch.Tensor,
                          running_var: torch.Tensor, training: bool, momentum: float, eps: float,
                          save_mean: torch.Tensor, save_invstd: torch.Tensor) -> tuple:
    """_native_batch_norm_legit_functional rerun from the batch statistics its forward run saved:
    the normalisation alone (no reduction over the batch, running statistics passed through, not
    updated again), with the same output as the first run, bit for bit, in every dtype.

    PyTorch's training kernel computes x * alpha + beta, with alpha = invstd * weight and beta =
    bias - mean * alpha, from the saved invstd itself. Its eval-mode kernel, which takes a variance,
    computes 1 / sqrt(variance + eps) instead; invstd^-2 - eps as that variance (what this rerun
    did before) gives an invstd one float32 ulp off in 10-30 % of the channels, and in
    bfloat16 or float16 the variance itself is rounded to 8 or 11 bits: outputs then differ by up
    to an ulp of the dtype, and gradients that cancel (a batch norm weight's) moved by 4 % in
    float32 and by more than 100 % in bfloat16 on a small DenseNet. Not every invstd is even
    reachable that way (sqrt and the division round separately). So:

    - CUDA: the training kernel's own elementwise step (batch_norm_elemt on the saved statistics).
    - Elsewhere the eval kernel with eps 0 and variance 1, so that its invstd is 1 exactly, and
      alpha (computed here as the kernel does: one float32 product) as the weight: its alpha is
      then the training run's, and so is beta = bias - mean * alpha, computed by the same code
      when the parameters are in the kernel's compute dtype (float32, float64; a float32 model
      under autocast). Parameters in bfloat16 or float16 must go in as float32 (alpha has 16 or 22
      bits), which takes the kernel's mixed-dtype code, and that code may round beta differently:
      once (a fused multiply-add) where the all-float16 code rounds twice, as seen here
      (`_beta_rounds_once` asks the kernel). Where the two codes agree the parameters go in as
      they are; where the all-dtype code rounds twice and the mixed one once, beta goes in as
      the bias, with a zero mean, computed here with two roundings.
    - Otherwise (an input that is not contiguous takes another code path; roundings the other way
      round, or that no probe told apart) the normalisation reruns with the statistics computed
      again, as PyTorch's own option does: exact, and as slow as that."""
    if x.device.type == "cuda":
        out = torch.ops.aten.batch_norm_elemt.default(x, weight, bias, save_mean, save_invstd, eps)
        return out, save_mean, save_invstd, running_mean, running_var
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    params = {weight.dtype, bias.dtype, save_mean.dtype, save_invstd.dtype}
    fast = x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)) \
        or (x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d))
    alpha = save_invstd.to(compute) * weight.to(compute)
    one = torch.ones_like(alpha)
    if fast and params == {compute}:
        out = _normalise(x, alpha, bias, save_mean, one)
        return out, save_mean, save_invstd, running_mean, running_var
    if fast and params == {x.dtype}:
        own, mixed = _beta_rounds_once(x.dtype, x.dtype, x.device), _beta_rounds_once(x.dtype, compute, x.device)
        if own is not None and own == mixed:
            out = _normalise(x, alpha, bias.to(compute), save_mean.to(compute), one)
            return out, save_mean, save_invstd, running_mean, running_var
        if own is False:
            beta = bias.to(compute) - save_mean.to(compute) * alpha
            out = _normalise(x, alpha, beta, torch.zeros_like(beta), one)
            return out, save_mean, save_invstd, running_mean, running_var
    out = torch.ops.aten._native_batch_norm_legit_functional.default(x, weight, bias, running_mean, running_var,
                                                                      True, momentum, eps)[0]
    return out, save_mean, save_invstd, running_mean, running_var


def _normalise(x, weight, bias, mean, variance):
    """The eval-mode kernel with eps 0: x * alpha + beta, alpha = 1 / sqrt(variance) * weight."""
    return torch.ops.aten._native_batch_norm_legit_no_training.default(x, weight, bias, mean, variance, 0.0, 0.0)[0]


_ROUNDS_ONCE: dict[tuple[torch.dtype, torch.dtype, str], bool | None] = {}


def _beta_rounds_once(dtype: torch.dtype, params: torch.dtype, device: torch.device) -> bool | None:
    """Whether the batch-norm kernel, with an input in `dtype` (bfloat16, float16) and parameters in
    `params` (that dtype, or float32), computes beta = bias - mean * alpha in float32 with one
    rounding (a fused multiply-add) or two; None if neither, or if no probe told them apart. Asked
    once: a zero input normalises to beta rounded to `dtype`, on channels made so that the two
    roundings land on different values of `dtype` (a bias that nearly cancels mean * alpha, so
    that the product's float32 rounding shows)."""
    key = (dtype, params, device.type)
    if key not in _ROUNDS_ONCE:
        gen = torch.Generator().manual_seed(0)
        n = 1 << 14
        mean = torch.randn(n, generator=gen).to(dtype).to(device)
        weight = (torch.rand(n, generator=gen) + 0.5).to(dtype).to(device)
        variance = (torch.rand(n, generator=gen) + 0.5).to(dtype).to(device)
        zero = torch.zeros(n, device=device)
        alpha = _normalise(torch.ones(1, n, 1, device=device), weight.float(), zero, zero,
                           variance.float()).view(n)  # the kernel's alpha: 1 * alpha + (0 - 0 * alpha)
        bias = (mean.double() * alpha.double()).to(dtype)
        once = (bias.double() - mean.double() * alpha.double()).float()  # exact in float64, then one rounding
        twice = bias.float() - mean.float() * alpha
        apart = (once.to(dtype) != twice.to(dtype)).nonzero().view(-1)
        found = None
        if apart.numel():
            k = apart.numel()
            got = _normalise(torch.zeros(1, k, 1, dtype=dtype, device=device), weight[apart].to(params),
                             bias[apart].to(params), mean[apart].to(params), variance[apart].to(params)).view(k)
            found = True if torch.equal(got, once[apart].to(dtype)) else (
                False if torch.equal(got, twice[apart].to(dtype)) else None)
        _ROUNDS_ONCE[key] = found
    return _ROUNDS_ONCE[key]


# A smooth activation's derivative, approximated by four levels chosen by where x falls (a 2-bit
# code per element). The levels are the mean derivative over each interval for x ~ N(0, 1).
_CODE_EDGES = (-1.0, 0.0, 1.0)
GELU_LEVELS = (-0.1052, 0.182, 0.818, 1.1052)
SILU_LEVELS = (-0.0235, 0.2861, 0.7139, 1.0235)


def activation_codes(x: torch.Tensor) -> torch.Tensor:
    """2-bit codes of x's interval (below -1, to 0, to 1, above) for an approximate backward, 4 per byte."""
    edges = torch.tensor(_CODE_EDGES, dtype=x.dtype, device=x.device)
    code = torch.bucketize(x.reshape(-1), edges).to(torch.uint8)
    pad = (-code.numel()) % 4
    if pad:
        code = torch.cat([code, code.new_zeros(pad)])
    code = code.view(-1, 4)
    return code[:, 0] | (code[:, 1] << 2) | (code[:, 2] << 4) | (code[:, 3] << 6)


def backward_from_codes(grad: torch.Tensor, codes: torch.Tensor, levels: tuple[float, ...]) -> torch.Tensor:
    """An activation's backward with its derivative replaced by the level of each element's interval."""
    shifts = torch.tensor((0, 2, 4, 6), dtype=torch.uint8, device=codes.device)
    code = ((codes.unsqueeze(1) >> shifts) & 3).reshape(-1)[: grad.numel()].to(torch.int64)
    table = torch.tensor(levels, dtype=grad.dtype, device=grad.device)
    return grad * table[code].view(grad.shape)


@contextlib.contextmanager
def _onednn(enabled: bool):
    before = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(enabled)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(before)


def convolution_native(*args):
    """aten.convolution without oneDNN (PyTorch's own CPU kernels)."""
    with _onednn(False):
        return torch.ops.aten.convolution.default(*args)


def convolution_backward_native(*args):
    """aten.convolution_backward without oneDNN."""
    with _onednn(False):
        return torch.ops.aten.convolution_backward.default(*args)


@contextlib.contextmanager
def cudnn_benchmark():
    """cuDNN's algorithms as `torch.backends.cudnn.benchmark` times them, inside the block."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def convolution_benchmarked(*args):
    """aten.convolution with cuDNN's algorithm chosen by timing (cudnn.benchmark)."""
    with cudnn_benchmark():
        return torch.ops.aten.convolution.default(*args)


def convolution_backward_benchmarked(*args):
    """aten.convolution_backward with cuDNN's algorithms chosen by timing."""
    with cudnn_benchmark():
        return torch.ops.aten.convolution_backward.default(*args)
