"""The one device peak meter: the most bytes live above the start of a block, and what is left.

CUDA: the caching allocator's counters (torch.cuda.max_memory_allocated, memory_allocated),
synchronised before and after. CPU: the running sum of the CPU allocator's events (see
cpu_allocator), kernel temporaries included; `events` keeps them for per-region reads.
The profiler measures op workspace with it (graph/profile.py), and monet.memory.PeakMemory
whole training steps.
"""

from __future__ import annotations

import torch

from .cpu_allocator import AllocatorEvents, allocator_events


class DevicePeak:
    """`with DevicePeak(device) as m: ...`, then `m.rise` is the peak in bytes above the level at the
    start and `m.made` the bytes still allocated at the end above it; on CUDA `m.peak` is the
    allocator's absolute peak, on CPU `m.events` the events recorded."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.rise: int | None = None
        self.made: int | None = None
        self.peak: int | None = None
        self.events: AllocatorEvents | None = None

    def __enter__(self) -> DevicePeak:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._recording = allocator_events()
            self.events = self._recording.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
            self.rise = self.peak - self._before
            self.made = torch.cuda.memory_allocated(self.device) - self._before
        else:
            self._recording.__exit__(*exc)
            self.rise = self.events.peak_delta()
            self.made = sum(self.events.deltas)
