"""Budget sweeps: predicted step time against peak memory, one line per strategy.

Every strategy returns a schedule of the same problem, and every point is that
schedule replayed by the one simulator, so the lines compare like with like.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from monet.solver import InfeasibleBudgetError, Problem, SolverFailedError, SolveSettings, simulate
from monet.solver.strategies import STRATEGIES, check_strategies

from .budget import parse_budget
from .report import line_plot, write_report
from .report import markdown_table as report_table

__all__ = ["STRATEGIES", "Point", "check_strategies", "parse_budget_range", "sweep", "title", "write_results"]


@dataclass(frozen=True)
class Point:
    """One strategy at one budget (None: a strategy without one); peak and time None when it found nothing."""

    strategy: str
    budget: int | None
    peak: int | None
    time: float | None
    status: str
    gap: float | None
    solve_time: float


def parse_budget_range(text: str, unconstrained_peak: int) -> list[int]:
    """'30%:100%:10%' -> budgets from 30 % to 100 % in steps of 10 % (the end included);
    a single budget or a comma-separated list works too ('40%,2GiB')."""
    if ":" not in text:
        return [parse_budget(part, unconstrained_peak) for part in text.split(",") if part.strip()]
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"budget range {text!r} is not START:END:STEP, e.g. 30%:100%:10%")
    start, end, step = (parse_budget(part, unconstrained_peak) for part in parts)
    if step <= 0 or end < start:
        raise ValueError(f"budget range {text!r} must have START <= END and a positive STEP")
    count = int((end - start) / step + 1e-9) + 1
    return [start + i * step for i in range(count)]


def title(meta: dict) -> str:
    """A sweep's title from its problem's meta (traced here or read from a problem file):
    model, input shape, device and cost model."""
    return (f"{meta['model']} {'x'.join(map(str, meta['input']['shape']))}, {meta['device']}, "
            f"{meta['cost_model']} costs")


def sweep(problem: Problem, budgets: Sequence[int], strategies: Sequence[str], settings: SolveSettings | None = None,
          *, on_point: Callable[[Point], None] | None = None) -> list[Point]:
    """Every strategy at every budget (once, for strategies without one), replayed by the simulator;
    the solvers run as `settings` say (each monet strategy sets whether it chooses implementations)."""
    check_strategies(strategies)
    points = []
    for name in strategies:
        run, budgeted = STRATEGIES[name]
        for budget in budgets if budgeted else [None]:
            start = time.perf_counter()
            try:
                planned = run(problem, budget, settings)
                schedule, status, gap = planned.schedule, planned.status, planned.gap
            except (InfeasibleBudgetError, SolverFailedError, ValueError) as exc:
                status = "infeasible" if isinstance(exc, InfeasibleBudgetError) else "no schedule"
                point = Point(name, budget, None, None, status, None, time.perf_counter() - start)
            else:
                replay = simulate(problem, schedule)
                if budget is not None and replay.peak > budget:
                    status = "over budget"
                point = Point(name, budget, replay.peak, replay.time, status, gap, time.perf_counter() - start)
            points.append(point)
            if on_point:
                on_point(point)
    return points


def _rows(points: list[Point], unconstrained: tuple[int, float]) -> list[dict]:
    peak0, time0 = unconstrained
    out = []
    for p in points:
        out.append({
            **asdict(p),
            "budget_pct": None if p.budget is None else round(100 * p.budget / peak0, 2),
            "peak_pct": None if p.peak is None else round(100 * p.peak / peak0, 2),
            "overhead_pct": None if p.time is None else round(100 * (p.time / time0 - 1), 3),
        })
    return out


def write_results(points: list[Point], unconstrained: tuple[int, float], out_dir: str | Path, title: str) -> list[Path]:
    """pareto.csv, pareto.md and pareto.png in `out_dir` (each written atomically)."""
    rows = _rows(points, unconstrained)
    return write_report(out_dir, "pareto", rows, markdown_table(rows, title), _plot(rows, title))


def markdown_table(rows: list[dict], title: str) -> str:
    def pct(value, digits=1, scale=1):
        return "-" if value is None else f"{value * scale:.{digits}f} %"

    return report_table(title, ("strategy", "budget", "peak", "predicted overhead", "gap", "status", "solve"),
                        ([r["strategy"], pct(r["budget_pct"], 0), pct(r["peak_pct"]), pct(r["overhead_pct"], 2),
                          pct(r["gap"], 2, 100), r["status"], f"{r['solve_time']:.1f} s"] for r in rows),
                        align=("---", "---:", "---:", "---:", "---:", "---", "---:"))


def _plot(rows: list[dict], title: str) -> bytes:
    """A PNG: predicted overhead against peak (both relative to keeping everything), a line per strategy."""
    lines = {name: [(r["peak_pct"], r["overhead_pct"]) for r in rows
                    if r["strategy"] == name and r["peak_pct"] is not None]
             for name in dict.fromkeys(r["strategy"] for r in rows)}
    return line_plot(lines, title=title, xlabel="peak memory (% of keeping everything)",
                     ylabel="predicted step time overhead (%)", figsize=(7, 4.5), empty="no schedule")
