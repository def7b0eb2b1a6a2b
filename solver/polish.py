"""Polishing a schedule by neighbourhood search: HiGHS on small pieces of the general formulation.

On the largest problems HiGHS's search of the whole ILP stalls short of the optimum within
minutes: in UNet, skip connections tie decisions at opposite ends of the step together. A
neighbourhood search (large neighbourhood search, a standard MIP heuristic) starts from the best
schedule so far, frees the decisions of a random share of the forward ops (whether their outputs
are kept, where they rerun) and how every op runs, and holds every other decision at the
schedule's value. How ops run is free in every piece: a faster schedule often changes several
choices at once, with the reruns that serve them (MONeT's UNet at 9 GB, from one start, 150 s:
114,036 units so, 114,500 with each choice held unless its ops were freed). HiGHS solves that
small ILP in seconds; the simulator keeps its schedule when it replays faster within the budget.
Fresh random pieces follow until the time is spent, larger after a piece that HiGHS proved holds
nothing better or admits no schedule at all (what it holds fixed must be freed), smaller after one it
could not finish (adaptive, as such searches usually are). The search ends early where a piece that
frees every op is proven: nothing is left to find. It proves no bound otherwise: the caller states one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from .general import General
from .schedule import Schedule
from .simulate import Replay, simulate

SHARE = 0.3  # of the forward ops, whose decisions the first neighbourhood frees
SHARES = (0.1, 1.0)  # the least and the most share a neighbourhood frees
GROW = 1.1  # the share's factor up after a piece proven to hold nothing better (or nothing), down after one
# that ran out of time
SECONDS = 10.0  # at most, HiGHS's time on one neighbourhood
PATIENCE = 3  # pieces without a faster schedule after which the search takes a faster one handed over


def neighbourhood_search(formulation: General, start: Schedule, budget: int, until: float, *, seed: int = 0,
                         heuristic_effort: float = 0.05,
                         report: Callable[[Replay, int], None] = lambda *_: None,
                         improved: Callable[[Schedule, Replay], None] = lambda *_: None,
                         fresh: Callable[[], Schedule | None] = lambda: None) -> tuple[Schedule, Replay] | None:
    """The fastest schedule of `formulation.problem` within `budget` bytes that the search finds from
    `start` (a schedule of that problem) by time.perf_counter() `until`; None when none is faster
    than `start`. `report(best replay, neighbourhoods tried)` hears of each neighbourhood and
    `improved(schedule, replay)` of each faster schedule it finds. Before each neighbourhood,
    `fresh()` may hand over a schedule found elsewhere: the search goes on from the fastest of those
    (and returns None unless it then finds a faster one) once its own path has found nothing faster
    for PATIENCE pieces. Before that it keeps its path: a faster schedule from elsewhere may lie in a
    worse basin (MONeT's UNet at 5 GB: from 132,727 units alone, 129,210 in 150 s; taking 130,655
    handed over on the way, it stayed near 130,563)."""
    problem = formulation.problem
    values = formulation.warm_from(start)
    if values is None:  # the formulation poses every schedule at an unbounded horizon; a horizon may exclude it
        return None
    owners = formulation.owners()
    forward = [op.id for op in problem.forward_ops]
    rng = random.Random(seed)
    best, found, tried, share = simulate(problem, start), None, 0, SHARE
    handed, stalled = None, 0  # the fastest schedule handed over (posed, replay); pieces without a faster one
    while (left := until - time.perf_counter()) >= 1.0:
        other = fresh()
        if other is not None and (replay := simulate(problem, other)).peak <= budget and replay.time < best.time:
            posed = formulation.warm_from(other)
            if posed is not None and (handed is None or replay.time < handed[1].time):
                handed = posed, replay
        if handed is not None and stalled >= PATIENCE:
            if handed[1].time < best.time:
                (values, best), share, found, stalled = handed, SHARE, None, 0
            handed = None
        free = set(rng.sample(forward, max(1, round(share * len(forward)))))
        held = {var: values[var] for var, ops in owners.items() if not ops & free}
        result = formulation.milp.solve(time_limit=min(SECONDS, left), seed=seed + tried, warm=values, fixed=held,
                                        heuristic_effort=heuristic_effort)
        tried += 1
        better = False
        if result.values is not None:
            schedule = formulation.schedule(result.values)
            replay = simulate(problem, schedule)
            if replay.peak <= budget and replay.time < best.time:
                best, found, better = replay, (schedule, replay), True
                values = formulation.warm_from(schedule) or values
                improved(schedule, replay)
        stalled = 0 if better else stalled + 1
        proven = result.status in ("optimal", "infeasible")
        if not better:
            share = min(SHARES[1], share * GROW) if proven else max(SHARES[0], share / GROW)
        report(best, tried)
        if proven and not held and handed is None:
            break  # the whole formulation, solved: no schedule of it is faster
    return found
