"""Budgets as people write them: '4GiB', '512 MB', '1.5G', '60%', '50% activations', plain bytes, or 'least' where
a solve takes it."""

from __future__ import annotations

import re
import warnings

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z%]*(?:\s+activations)?)\s*$", re.IGNORECASE)
ACTIVATIONS = ("%act", "% activations")  # a share of the activation memory: of the unconstrained peak above the floor


def parse_budget(text: str | int | float, unconstrained_peak: int, *, floor: int | None = None,
                 warn: bool = True) -> int:
    """Bytes for a budget; a percentage is of the unconstrained peak, and one of activations ('50%act', '50%
    activations') is of the activation memory, the unconstrained peak above the `floor` that no schedule frees
    (parameters, their gradients, buffers and inputs: torch.compile's activation_memory_budget and Rockmate's
    figures count so): floor + 50 % of the rest. K/M/G are binary (KiB/MiB/GiB); a number without a unit is
    bytes, so one below 1 (a share meant as activation_memory_budget=0.5 means it) is refused with the ways to
    say it. A share above 100 % warns (`warn`): the step then keeps everything."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = _PATTERN.match(str(text))
        if not match:
            raise ValueError(f"budget {text!r} is not a size like 4GiB, 512MB or 60%")
        value, unit = float(match.group(1)), " ".join(match.group(2).lower().split())
    if unit == "" and 0 < value < 1:
        raise ValueError(f"budget {text!r} is a number of bytes below one: for a share of the unconstrained peak "
                         f"write '{value * 100:g}%', of its activation memory '{value * 100:g}%act', for a size "
                         "give its unit ('512MiB', '2GB')")
    if unit in ACTIVATIONS:
        if floor is None:
            raise ValueError(f"budget {text!r} is a share of the activation memory, which is known once the model is "
                             "traced: give it to monet.solve or `monet solve`")
        return floor + parse_budget(f"{value}%", unconstrained_peak - floor, warn=warn)
    if unit == "%":
        if not 0 < value:
            raise ValueError(f"budget {text!r} must be a positive percentage")
        if value > 100 and warn:
            warnings.warn(f"budget {text!r} is above the unconstrained peak: every schedule fits, and the fastest "
                          "keeps everything", stacklevel=3)
        return int(unconstrained_peak * value / 100)
    if unit not in _UNITS:
        raise ValueError(f"budget {text!r} has unknown unit {unit!r}; use B, KiB, MiB, GiB, KB, MB, GB, % or %act")
    if value <= 0:
        raise ValueError(f"budget {text!r} must be positive")
    return int(value * _UNITS[unit])


def is_least(budget: str | int | float) -> bool:
    """Whether `budget` is 'least': the least peak the solver's search finds, at the least time there."""
    return isinstance(budget, str) and budget.strip().lower() == "least"


def check_budget(budget: str | int | float) -> None:
    """A solve's budget checked for its form before any tracing or profiling: 'least', or a size or
    percentage that parse_budget reads (a percentage is of the peak, known once traced)."""
    if not is_least(budget):
        parse_budget(budget, 1, floor=0, warn=False)
