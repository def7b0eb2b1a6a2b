"""Analytic op times: FLOPs and bytes moved, priced at nominal machine rates.

Deterministic, for schedules that must be reproducible (tests, precomputed
schedules): an op's time is the roofline estimate
max(flops / FLOP_RATE, bytes / BANDWIDTH) plus a fixed launch overhead.
"""

from __future__ import annotations

import torch
from torch._guards import detect_fake_mode
from torch.utils.flop_counter import FlopCounterMode

from .analyze import GraphAnalysis

FLOP_RATE = 1e12  # FLOP/s
BANDWIDTH = 1e11  # bytes/s
LAUNCH = 5e-6  # s per op


def analytic_times(analysis: GraphAnalysis, gm: torch.fx.GraphModule) -> dict[str, float]:
    """Roofline seconds of every op in `analysis.problem`, keyed by op name."""
    problem = analysis.problem
    nodes = {n.name: n for n in gm.graph.nodes}
    vals = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
    fake_mode = detect_fake_mode(vals)
    costs = {}
    for op in problem.ops:
        node = nodes[op.name]
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        with fake_mode, FlopCounterMode(display=False) as counter:
            node.target(*args, **kwargs)
        moved = sum(problem.tensors[t].bytes for t in (*op.inputs, *op.outputs))
        costs[op.name] = max(counter.get_total_flops() / FLOP_RATE, moved / BANDWIDTH) + LAUNCH
    return costs
