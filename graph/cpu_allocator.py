"""Every CPU allocation and free, in order, from torch.profiler's memory events.

The CPU allocator reports each allocation (kernel temporaries included) to the
profiler when `profile_memory=True`. The running sum of those deltas is the
change in bytes live, which gives both the peak of a whole step and the
workspace of a single op (events inside that op's record_function region).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import sys

from torch.profiler import ProfilerActivity, profile


@contextlib.contextmanager
def _quiet_native_stderr():
    """Kineto prints a status line at profiler start and stop; keep it off the terminal."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (embedded interpreters)
        yield
        return
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class AllocatorEvents:
    """Memory deltas recorded by `allocator_events`, in time order."""

    def __init__(self):
        self.times: list[int] = []
        self.deltas: list[int] = []
        self.regions: list[tuple[str, int, int]] = []

    def _load(self, prof: profile) -> None:
        mem, regions = [], []
        for event in prof.profiler.kineto_results.events():
            if event.name() == "[memory]":
                mem.append((event.start_ns(), event.nbytes()))
            else:
                regions.append((event.name(), event.start_ns(), event.start_ns() + event.duration_ns()))
        mem.sort(key=lambda e: e[0])
        self.times = [t for t, _ in mem]
        self.deltas = [b for _, b in mem]
        self.regions = regions

    def peak_delta(self) -> int:
        """The most bytes live above the level at the start (0 if nothing was allocated)."""
        peak = running = 0
        for delta in self.deltas:
            running += delta
            peak = max(peak, running)
        return peak

    def by_region(self, prefix: str) -> dict[str, list[int]]:
        """Deltas inside each record_function region whose name starts with `prefix`."""
        out: dict[str, list[int]] = {}
        for name, start, end in self.regions:
            if name.startswith(prefix):
                lo = bisect.bisect_left(self.times, start)
                hi = bisect.bisect_right(self.times, end)
                out[name[len(prefix):]] = self.deltas[lo:hi]
        return out


@contextlib.contextmanager
def allocator_events():
    """Record CPU allocator events of the block; the result fills in on exit."""
    events = AllocatorEvents()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_native_stderr():
        prof.__enter__()
    try:
        yield events
    finally:
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)
    events._load(prof)
