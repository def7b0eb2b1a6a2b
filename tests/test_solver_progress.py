"""What the solver tells a progress display while it works: each stage, and while HiGHS runs the
best schedule so far, its gap and the time left."""

import re

from synthetic import chain, relu_chain

from monet.solver import keep_all, least_peak, simulate, solve
from monet.solver.general import General


def recorded(problem, budget, **settings):
    events = []
    solution = solve(problem, budget, progress=lambda *event: events.append(event), **settings)
    return solution, events


def test_each_stage_is_reported_in_order_and_solving_says_best_gap_and_time_left():
    p = chain(40)  # the general formulation: here HiGHS finds schedules within a second, and goes on
    full = simulate(p, keep_all(p))
    least = least_peak(p, time_limit=10).found
    solution, events = recorded(p, least + 2 * (full.peak - least) // 5, gap=0, time_limit=3)
    stages = list(dict.fromkeys(stage for stage, *_ in events))
    assert stages == ["finding a starting schedule", "building the ILP", "solving"]
    ticks = [(done, total, detail) for stage, done, total, detail in events if stage == "solving"]
    assert len(ticks) >= 5  # about every 0.1 s
    assert all(total == 3 for _, total, _ in ticks)
    assert [done for done, _, _ in ticks] == sorted(done for done, _, _ in ticks)
    parsed = [re.fullmatch(r"(no schedule yet|best so far \+([\d.]+)% step time, (gap ([\d.]+)%|no bound yet)); "
                           r"(\d+) s left", detail) for _, _, detail in ticks]
    assert all(parsed), [detail for _, _, detail in ticks]
    left = [int(m[5]) for m in parsed]
    assert left == sorted(left, reverse=True) and left[0] <= 3
    best = [m for m in parsed if m[2]]
    assert best and parsed.index(best[0]) + len(best) == len(parsed)  # once a schedule is found, it is shown
    overheads = [float(m[2]) for m in best]
    assert overheads == sorted(overheads, reverse=True)  # the best so far only gets better
    final = solution.replay.time / full.time - 1
    assert final * 100 <= overheads[-1] + 0.05  # what comes back is no worse than what was last shown
    gaps = [float(m[4]) for m in best if m[4]]
    assert gaps and gaps[-1] >= solution.gap * 100 - 0.05


def test_choosing_implementations_reports_its_checkpointing_alone_solve_first():
    p = relu_chain(10)
    full = simulate(p, keep_all(p))
    _, events = recorded(p, int(0.6 * full.peak), time_limit=2)
    stages = list(dict.fromkeys(stage for stage, *_ in events))
    alone = [s for s in stages if s.startswith("checkpointing alone: ")]
    assert alone and stages.index(alone[-1]) < stages.index("building the ILP")
    assert {s.removeprefix("checkpointing alone: ") for s in alone} <= {
        "finding a starting schedule", "building the ILP", "solving"}


def test_milp_progress_reports_an_improving_incumbent_and_a_rising_bound():
    p = chain(40)
    full = simulate(p, keep_all(p))
    least = least_peak(p, time_limit=10).found
    model = General(p, least + 2 * (full.peak - least) // 5)  # as above: schedules within a second
    seen = []
    result = model.milp.solve(time_limit=2, mip_rel_gap=0, progress=lambda *state: seen.append(state))
    assert len(seen) >= 5 and result.status in ("time_limit", "optimal")
    objectives, bounds = [o for o, _ in seen], [b for _, b in seen]
    assert objectives == sorted(objectives, reverse=True) and bounds == sorted(bounds)
    assert objectives[-1] < float("inf") and bounds[-1] > float("-inf")
    assert result.objective <= objectives[-1] and result.bound <= result.objective
