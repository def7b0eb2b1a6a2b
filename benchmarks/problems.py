"""Traced and costed problems of the benchmark models, cached as JSON.

Tracing and profiling a full-size model takes minutes on a CPU; the problem it yields is
plain data, so it is kept in a cache folder (default `.cache/`, not in git) under a name
that says the model, input shape, cost model, device and the version of the code that made
it, and reused by every benchmark.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import torch

import monet.graph
import monet.solver
from benchmarks.models import BenchModel
from monet.api import Progress, trace_problem
from monet.graph import InputSpec
from monet.schedules import write_atomic
from monet.solver import Problem


def shape_tag(bench: BenchModel, shape: tuple[int, ...]) -> str:
    """'resnet50-b32-224' for (32, 3, 224, 224); 'distilbert-b8-384' for (8, 384):
    the batch, then the spatial size (one number when square) or the sequence length."""
    size = shape[2:] if bench.input_dtype.startswith("float") else shape[1:]
    size_text = str(size[0]) if len(set(size)) == 1 else "x".join(map(str, size))
    return f"{bench.name}-b{shape[0]}-{size_text}"


@cache
def pipeline_tag() -> str:
    """A hash of the code that turns a model into a problem (monet.graph, and the solver's problem
    types), so that a cached problem is reused only by the code that made it."""
    graph = Path(monet.graph.__file__).parent
    solver = Path(monet.solver.__file__).parent
    digest = hashlib.sha256()
    for path in [*sorted(graph.rglob("*.py")), solver / "problem.py", solver / "edit.py"]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:8]


def cached_problem(bench: BenchModel, shape: tuple[int, ...], *, cost_model: str = "analytic",
                   device: str = "cpu", cache: str | Path | None = ".cache", model: torch.nn.Module | None = None,
                   progress: Progress | None = None) -> Problem:
    """The problem of `bench` at `shape`, from the cache or traced now (and then cached).
    Measured costs are never cached: they belong to one run on one machine. `model` is
    the instance to trace (default: a new one)."""
    name = f"{shape_tag(bench, shape)}-{cost_model}-{device}-{pipeline_tag()}.problem.json"
    path = Path(cache) / name if cache else None
    if path and cost_model == "analytic" and path.exists():
        return Problem.from_json(path.read_text())
    model = model if model is not None else bench.build().to(device)
    problem = trace_problem(model, InputSpec(shape, bench.input_dtype), cost_model=cost_model, progress=progress)
    if path and cost_model == "analytic":
        write_atomic(path, problem.to_json())
    return problem
