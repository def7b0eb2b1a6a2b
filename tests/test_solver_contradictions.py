"""Incumbents across horizons, and HiGHS's answers judged by the simulator (issue 14, items 1b and 2).

HiGHS is never mocked: the contradictions are posed to it (an ILP whose budget or prices are not the
problem's, a start that is no integral solution), and the simulator, which judges peaks and step
times, must catch them."""

import importlib
import time

import pytest
from synthetic import chain, random_dag, relu_chain

from monet.solver import SolveSettings, keep_all, least_peak, simulate, solve, validate
from monet.solver.beside import Beside
from monet.solver.general import General
from monet.solver.heuristics import recompute_at_first_need, warm_starts
from monet.solver.polish import neighbourhood_search
from monet.solver.stages import Stages

solve_module = importlib.import_module("monet.solver.solve")


def unconstrained(problem):
    return simulate(problem, keep_all(problem)).peak


# ---- item 2: a longer horizon starts from the best schedule so far -------------------------------

def feasible_at_horizon_0(p):
    """A budget halfway between the least peak within horizon 0 and keeping everything."""
    return (least_peak(p, formulation="compact", horizon=0).found + unconstrained(p)) // 2


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_longer_horizon_started_from_a_shorter_ones_schedule_is_never_slower(seed):
    p = random_dag(seed, 10)
    budget = feasible_at_horizon_0(p)
    short = solve(p, budget, formulation="compact", horizon=0, gap=0)
    assert Stages(p, None).admits(short.schedule)  # a schedule valid at a horizon is valid at any longer one
    longer = solve(p, budget, formulation="compact", horizon=None, gap=0, start=short.schedule)
    assert longer.peak <= budget and longer.replay.time <= short.replay.time + 1e-9
    # gap 1: HiGHS stops at its first incumbent, the start: still never slower
    hasty = solve(p, budget, formulation="compact", horizon=None, gap=1.0, start=short.schedule)
    assert hasty.peak <= budget and hasty.replay.time <= short.replay.time + 1e-9


@pytest.mark.parametrize("seed", [1, 2])
def test_a_ladder_of_horizons_ends_no_slower_than_any_rung(seed):
    p = random_dag(seed, 10)
    budget = feasible_at_horizon_0(p)
    short = solve(p, budget, formulation="compact", horizon=0, gap=0)
    free = solve(p, budget, formulation="compact", horizon=None, gap=0)
    ladder = solve(p, budget, formulation="compact", horizon=[0, None], gap=0)
    validate(p, ladder.schedule)
    assert ladder.peak <= budget and ladder.horizon is None
    assert ladder.replay.time <= short.replay.time + 1e-9
    assert ladder.replay.time == pytest.approx(free.replay.time, rel=1e-9)  # gap 0: the unbounded optimum
    assert ladder.status == "optimal" and not ladder.warnings


def test_the_ladder_finds_what_a_short_horizon_misses():
    # random_dag(37, 10) at 80 %: rerunning ops further ahead than horizon 0 allows is faster
    p = random_dag(37, 10)
    budget = int(unconstrained(p) * 0.8)
    short = solve(p, budget, formulation="compact", horizon=0, gap=0)
    ladder = solve(p, budget, formulation="compact", horizon=[0, None], gap=0)
    assert ladder.replay.time < short.replay.time


def test_a_ladder_whose_short_rung_is_infeasible_goes_on():
    p = chain(12)
    budget = least_peak(p, formulation="compact", horizon=None).found
    assert least_peak(p, formulation="compact", horizon=0).bound > budget  # no schedule within horizon 0
    ladder = solve(p, budget, formulation="compact", horizon=[0, None])
    assert ladder.peak <= budget and ladder.horizon is None


def test_a_rung_starts_from_a_faster_schedule_found_beside_the_search():
    """relu_chain(12) at 50 %: a neighbourhood search in the general formulation beats the compact
    formulation's optimum (58.7 s against 57.3 or 58.1 s in 3 s, measured, from two of its optima). Where
    such a schedule is at hand beside the search (a worker's, as solve(workers=2) has them), the ladder's
    next rung starts from it, so the ladder ends no slower than it; rungs that ignored it ended at the
    compact optimum."""
    p = relu_chain(12)
    budget = int(unconstrained(p) * 0.5)
    compact = solve(p, budget, formulation="compact", time_limit=10, gap=1e-9)
    found = neighbourhood_search(General(p, budget, None), compact.schedule, budget, time.perf_counter() + 3)
    assert found is not None and found[1].time < compact.replay.time - 0.5
    settings = SolveSettings(formulation=["compact", "compact"], horizon=["auto", None], time_limit=10, gap=1e-9)
    baseline = (keep_all(p), simulate(p, keep_all(p)))
    with Beside(p, budget, settings, 0, 10) as beside:  # no worker: the schedule is handed to it here
        beside.offer(*found)
        ladder = solve_module._ladder(p, budget, settings, None, lambda *_: None, baseline, beside)
    validate(p, ladder.schedule)
    assert ladder.peak <= budget and ladder.replay.time <= found[1].time + 1e-9


def test_an_auto_horizon_is_lengthened_to_admit_the_best_schedule_so_far():
    p = chain(80)  # enough stages that "auto" bounds the horizon
    everything = recompute_at_first_need(p, set(Stages(p).windows[0]))  # reruns far ahead of their use
    auto = solve_module.auto_horizon(p)
    assert auto is not None and not Stages(p, auto).admits(everything)
    horizon, _ = solve_module._start(p, None, [{}], "auto", incumbent=everything)
    assert Stages(p, horizon).admits(everything)
    assert horizon is not None and (horizon > auto)
    plain, _ = solve_module._start(p, None, [{}], "auto")
    assert plain == auto  # without an incumbent nothing changes


def test_lengthening_the_horizon_for_a_start_stops_at_its_deadline():
    """Where no heuristic schedule fits, each longer horizon tried simulates hundreds of schedules
    (seconds on a 700-op bfloat16 transformer, most of a 30 s solve before this deadline)."""
    p = chain(80)
    budget = warm_starts(p, None, [{}], None).replay.peak - 1  # no heuristic schedule fits at any horizon
    auto = solve_module.auto_horizon(p)
    tried = []
    horizon, found = solve_module._start(p, budget, [{}], "auto", lambda *state: tried.append(state[-1]))
    assert found is None and len(tried) == solve_module.HORIZONS.index(auto) + 1  # every longer one tried
    tried.clear()
    horizon, found = solve_module._start(p, budget, [{}], "auto", lambda *state: tried.append(state[-1]),
                                         until=time.perf_counter())
    assert found is None and horizon == auto and len(tried) == 2 and "no time left" in tried[-1]


# ---- item 1b: contradictions reported, not trusted -----------------------------------------------

def test_a_start_beyond_the_horizon_is_a_limit_of_the_horizon_not_a_contradiction():
    p = chain(12)
    budget = least_peak(p, formulation="compact", horizon=None).found
    free = solve(p, budget, formulation="compact", horizon=None)
    assert not Stages(p, 0).admits(free.schedule)
    solution = solve(p, budget, formulation="compact", horizon=0, start=free.schedule)
    assert solution.schedule == free.schedule and solution.peak <= budget
    assert solution.status == "heuristic" and not solution.warnings  # HiGHS was right about the ILP it was given
    assert "horizon of 0 stages" in solution.note and "`horizon`" in solution.note
    assert "warnings" not in solution.record().to_dict()


def _tampered(monkeypatch, tamper):
    """Every model solve() builds goes through `tamper(model, budget)` before HiGHS sees it."""
    build = solve_module._formulate

    def model(kind, posed, budget, *args):
        built = build(kind, posed, budget, *args)
        tamper(built, budget)
        return built

    monkeypatch.setattr(solve_module, "_formulate", model)


def test_a_schedule_priced_otherwise_than_the_simulator_replays_it_is_not_optimal(monkeypatch):
    p = chain(12)
    budget = int(unconstrained(p) * 0.6)
    honest = solve(p, budget, formulation="compact")
    assert honest.status == "optimal" and not honest.warnings

    def misprice(model, budget):  # every schedule priced a second more than it takes
        model.milp.add_cost(model.one, 1e3)

    _tampered(monkeypatch, misprice)
    solution = solve(p, budget, formulation="compact")
    assert solution.status != "optimal" and solution.peak <= budget
    assert any("simulator replays it at" in w for w in solution.warnings)
    assert solution.objective == pytest.approx(solution.replay.time)  # the simulator's step time
    assert solution.gap == pytest.approx(1.0)  # no bound is claimed
    record = solution.record().to_dict()
    assert record["warnings"] == list(solution.warnings) and "does not confirm" in record["note"]


def test_a_schedule_over_the_budget_is_never_returned(monkeypatch):
    p = chain(12)
    budget = int(unconstrained(p) * 0.6)

    build = solve_module._formulate  # HiGHS is told a budget half as large again
    monkeypatch.setattr(solve_module, "_formulate",
                        lambda kind, posed, budget, *args: build(kind, posed, budget * 3 // 2, *args))
    solution = solve(p, budget, formulation="compact")
    assert solution.peak <= budget and solution.status == "heuristic"
    assert any("over the budget" in w for w in solution.warnings)
    assert solution.replay.time > simulate(p, keep_all(p)).time  # it recomputes: HiGHS's schedule did not


def test_an_ilp_that_rejects_a_start_the_simulator_accepts_is_reported_as_the_ilps_limit(monkeypatch):
    # HiGHS calling an ILP infeasible after accepting the start as a solution of it (the contradiction
    # solve() warns of) needs a HiGHS fault: its warm-start run is the same ILP with the binaries fixed.
    # What can be posed is an ILP that rejects the start: no contradiction, and none is claimed.
    p = chain(12)
    budget = int(unconstrained(p) * 0.6)

    def exclude_everything(model, budget):  # the constant one must be zero: no solution at all
        model.milp.add_row([(model.one, 1.0)], 0.0)

    _tampered(monkeypatch, exclude_everything)
    solution = solve(p, budget, formulation="compact")
    assert solution.peak <= budget and solution.status == "heuristic" and not solution.warnings
    assert "admits no schedule at this budget" in solution.note
