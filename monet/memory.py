"""The memory meter that tests and benchmarks use: peak bytes live during a block.

Measured by graph.peak.DevicePeak, the meter the profiler measures op workspace with.
CUDA: torch.cuda.max_memory_allocated, everything the caching allocator handed out.
CPU: the bytes already resident when the block starts (parameters, buffers,
gradients, the batch: whatever the caller names) plus the highest running sum
of the CPU allocator's events inside the block, kernel temporaries included.
"""

from __future__ import annotations

import torch
from torch import nn

from monet.graph.peak import DevicePeak


def resident_bytes(*objects: nn.Module | torch.Tensor) -> int:
    """Bytes of the distinct storages held by these modules (params, buffers, grads) and tensors."""
    seen: dict[int, int] = {}

    def add(t: torch.Tensor | None) -> None:
        if t is not None:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()

    for obj in objects:
        if isinstance(obj, nn.Module):
            for p in obj.parameters():
                add(p)
                add(p.grad)
            for b in obj.buffers():
                add(b)
        else:
            add(obj)
    return sum(seen.values())


class PeakMemory:
    """`with PeakMemory(device, resident) as m: ...` then `m.peak` is the peak in bytes
    (graph.peak.DevicePeak's reading: on CUDA the allocator's peak, on CPU `resident` plus its rise).
    On CPU, free nothing inside the block that was allocated before it outside any meter (zero the
    gradients before it): PyTorch's profiler does not report such frees, so the rise would not drop."""

    def __init__(self, device: torch.device | str, resident: int = 0):
        self.device = torch.device(device)
        self.resident = resident
        self.peak: int | None = None
        self._meter = DevicePeak(self.device)

    def __enter__(self) -> PeakMemory:
        self._meter.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._meter.__exit__(*exc)
        self.peak = self._meter.peak if self.device.type == "cuda" else self.resident + self._meter.rise
