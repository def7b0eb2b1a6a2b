"""Both formulations: valid schedules within budget, optimality relations, errors."""

import dataclasses
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import _Builder, chain, norm_chain, random_dag, relu_chain

from monet.schedules import Decisions
from monet.solver import (
    Choice,
    Impl,
    InfeasibleBudgetError,
    Schedule,
    ScheduleError,
    SolveSettings,
    keep_all,
    least_peak,
    simulate,
    solve,
    validate,
)
from monet.solver.compact import Compact
from monet.solver.general import General
from monet.solver.heuristics import best_first_need, chen_candidates, fastest_kernels, recompute_at_first_need
from monet.solver.polish import PATIENCE, neighbourhood_search
from monet.solver.result import format_bytes
from monet.solver.stages import Stages


def unconstrained(problem):
    return simulate(problem, keep_all(problem)).peak


@pytest.mark.parametrize("formulation", ["compact", "general"])
def test_chain_schedules_fit_and_recompute_only_what_they_must(formulation):
    p = chain(16)
    full = unconstrained(p)
    assert solve(p, full, formulation=formulation).schedule == keep_all(p)
    previous = 0.0
    for fraction in (0.8, 0.6, 0.5):
        budget = int(full * fraction)
        solution = solve(p, budget, formulation=formulation)
        validate(p, solution.schedule)
        assert solution.peak <= budget
        assert solution.status == "optimal" and solution.gap <= 1e-3
        assert solution.objective >= previous - 1e-9  # less memory never costs less time
        assert solution.objective == pytest.approx(solution.replay.time, rel=1e-6)
        previous = solution.objective


@pytest.mark.parametrize("formulation", ["compact", "general"])
def test_reruns_are_priced_at_their_rerun_time(formulation):
    """An op's rerun costs its `rerun_time` where one is set (fused_reruns sets 0 for ops Inductor fuses):
    the ILP's price and the simulator's step time agree, and cheaper reruns make a faster schedule."""
    plain = chain(12)
    cheap = {op.id for op in plain.forward_ops if op.id % 2}
    p = type(plain)(plain.tensors, [dataclasses.replace(op, pytorch=dataclasses.replace(op.pytorch, rerun_time=0.1))
                                    if op.id in cheap else op for op in plain.ops], plain.meta)
    budget = int(unconstrained(p) * 0.6)
    solution = solve(p, budget, formulation=formulation)
    assert not solution.warnings and solution.objective == pytest.approx(solution.replay.time, rel=1e-6)
    reruns = [i for i in solution.schedule.backward if p.ops[i].phase == "forward"]
    assert solution.replay.recompute_time == pytest.approx(sum(0.1 if i in cheap else 1.0 for i in reruns))
    assert solution.objective < solve(plain, budget, formulation=formulation).objective - 0.5


@pytest.mark.parametrize("formulation", ["compact", "general"])
def test_saving_a_tensor_costs_its_keep_time(formulation):
    """A saved tensor costs its `keep_time` (fused_reruns sets one where a compiled forward writes a tensor
    only to save it): the simulator adds it to the forward, the ILP prices it alike, and where the tensor's
    op reruns for free the fastest schedule drops it even with memory to spare."""
    plain = chain(12)
    free = {op.id for op in plain.forward_ops if op.id % 2}
    priced = {t for i in free for t in plain.ops[i].outputs if plain.tensors[t].role == "activation"}
    p = dataclasses.replace(
        plain, tensors=[dataclasses.replace(t, keep_time=0.3) if t.id in priced else t for t in plain.tensors],
        ops=[dataclasses.replace(op, pytorch=dataclasses.replace(op.pytorch, rerun_time=0.0)) if op.id in free
             else op for op in plain.ops])
    everything = keep_all(p)
    assert simulate(p, everything).forward_time == pytest.approx(simulate(plain, everything).forward_time
                                                                 + 0.3 * len(priced & everything.saved))
    solution = solve(p, unconstrained(p), formulation=formulation)
    assert not solution.warnings and solution.objective == pytest.approx(solution.replay.time, rel=1e-6)
    assert priced and not priced & solution.schedule.saved  # each rerun costs 0, each saved copy 0.3
    assert solution.objective == pytest.approx(simulate(plain, everything).time)


def test_general_reaches_budgets_that_compact_cannot():
    p = chain(12)
    compact, general = least_peak(p, formulation="compact"), least_peak(p, formulation="general")
    assert general.found < compact.found
    budget = compact.found - 101  # a layer's worth below what one rerun per tensor allows
    with pytest.raises(InfeasibleBudgetError):
        solve(p, budget, formulation="compact")
    solution = solve(p, budget, formulation="general")
    assert solution.peak <= budget
    assert max(solution.schedule.backward.count(op.id) for op in p.forward_ops) > 1  # some op reruns twice


def test_infeasible_budget_names_the_least_peak():
    p = chain(6)
    found = least_peak(p)
    least = simulate(p, found.schedule).peak  # the rows' least budget adds their safety margin: a byte here
    assert least <= found.found <= least + 1
    with pytest.raises(InfeasibleBudgetError, match=f"least feasible peak .*\\({least} bytes") as info:
        solve(p, least - 1)
    assert info.value.least_peak == least
    assert solve(p, least).peak <= least and solve(p, found.found).status == "optimal"
    # what no schedule frees is named, as part of that peak: parameters, their gradients, buffers and inputs
    grads = sum(t.bytes for t in p.tensors if t.role == "grad")
    assert info.value.floor == p.persistent_bytes + grads and 0 < info.value.floor < least
    assert f"{format_bytes(info.value.floor)} is parameters, their gradients, buffers and inputs" in str(info.value)
    assert f"raise the budget to at least {format_bytes(least)}" in str(info.value)


def test_a_budget_below_what_every_schedule_holds_is_refused_before_any_search():
    p = chain(6)
    stages = []
    with pytest.raises(InfeasibleBudgetError, match="below what every schedule holds") as info:
        solve(p, p.floor - 1, progress=lambda stage, *_: stages.append(stage))
    assert not stages and info.value.least_peak is None and info.value.floor == p.floor
    assert f"raise the budget above {format_bytes(p.floor)} ({p.floor} bytes)" in str(info.value)
    assert solve(p, least_peak(p).found).peak >= p.floor  # the floor is below every schedule's peak


@pytest.mark.parametrize("seed", range(4))
def test_least_peak_gives_a_schedule_that_reaches_it(seed):
    p = relu_chain(10) if seed == 0 else random_dag(seed, 12)
    least = least_peak(p, time_limit=10)
    validate(p, least.schedule)
    assert simulate(p, least.schedule).peak <= least.found
    assert solve(p, least.found, start=least.schedule, time_limit=10).peak <= least.found


def test_same_input_same_schedule():
    p = random_dag(5, 12)
    budget = (unconstrained(p) + least_peak(p).found) // 2
    first, second = solve(p, budget), solve(p, budget)
    assert first.schedule == second.schedule and first.objective == second.objective


def test_first_need_heuristic_matches_its_own_replay():
    p = chain(16)
    found = best_first_need(p, int(unconstrained(p) * 0.7))
    assert found is not None
    dropped, replay = found
    assert dropped
    assert simulate(p, recompute_at_first_need(p, dropped)).peak == replay.peak <= int(unconstrained(p) * 0.7)


def test_the_first_need_heuristic_drops_free_reruns_first():
    """Where every other op reruns in no time (a pointwise op fused under Inductor), the heuristic start
    drops those outputs first: at 1200 of the chain's 1900 bytes it reruns nothing that costs time; below
    that it drops a few more tensors (shaving) rather than take Chen's segments (1100: 33 s, where the
    fastest candidate drop set that fits takes 37 s)."""
    p = chain(16)
    p = dataclasses.replace(p, ops=tuple(
        dataclasses.replace(op, pytorch=dataclasses.replace(op.pytorch, rerun_time=0.0))
        if op.phase == "forward" and op.id % 2 else op for op in p.ops))
    full = simulate(p, keep_all(p))
    dropped, replay = best_first_need(p, 1200)
    assert replay.peak <= 1200 and replay.time == full.time
    assert all(p.ops[p.tensors[t].producer].pytorch.recompute_time == 0 for t in dropped)
    candidates = [simulate(p, recompute_at_first_need(p, d)) for d in chen_candidates(p)]
    fastest_fitting = min(r.time for r in candidates if r.peak <= 1100)
    dropped, replay = best_first_need(p, 1100)
    assert replay.peak <= 1100 and full.time < replay.time < fastest_fitting
    assert simulate(p, recompute_at_first_need(p, dropped)) == replay


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), size=st.integers(3, 9), fraction=st.sampled_from([0.9, 0.7, 0.5, 0.35]))
def test_random_graphs_schedules_are_valid_and_general_is_never_worse(seed, size, fraction):
    p = random_dag(seed, size)
    budget = int(unconstrained(p) * fraction)
    results = {}
    for formulation in ("compact", "general"):
        try:
            solution = solve(p, budget, formulation=formulation, time_limit=20)
        except InfeasibleBudgetError:
            results[formulation] = None
            continue
        validate(p, solution.schedule)  # every op's inputs exist when it runs
        assert solution.peak <= budget
        results[formulation] = solution.objective
    if results["compact"] is not None:
        assert results["general"] is not None
        assert results["general"] <= results["compact"] + 1e-6


# ---- implementation choices ------------------------------------------------------------------

def test_choosing_implementations_never_costs_time_and_reaches_lower_budgets():
    p = relu_chain(8)
    full = unconstrained(p)
    for fraction in (1.0, 0.8, 0.7):
        budget = int(full * fraction)
        joint, alone = solve(p, budget), solve(p, budget, implementations=False)
        assert alone.schedule.options == {}
        assert joint.replay.time <= alone.replay.time + 1e-9
    budget = int(full * 0.6)  # only lean algorithms (no workspace) fit here
    with pytest.raises(InfeasibleBudgetError):
        solve(p, budget, implementations=False, formulation="compact")
    joint = solve(p, budget)
    assert joint.peak <= budget and set(joint.schedule.options.values()) == {"lean"}


def test_fastest_kernels_are_the_choices_that_trade_time_for_workspace():
    """relu_chain's algorithms differ only in time and workspace: their fastest options; its masks read
    other tensors and norm_chain's reruns keep their statistics, so they are no kernels to fix."""
    assert fastest_kernels(relu_chain(3)) == {"algo0": "fast", "algo1": "fast", "algo2": "fast"}
    assert fastest_kernels(norm_chain(3)) == {}
    lean_and_fast = relu_chain(2)  # "lean" made as fast as "fast": no option trades time for workspace
    ops = [dataclasses.replace(op, others=(dataclasses.replace(op.others[0], time=op.pytorch.time),))
           if op.choice and op.choice.startswith("algo") else op for op in lean_and_fast.ops]
    assert fastest_kernels(dataclasses.replace(lean_and_fast, ops=tuple(ops))) == {}


def test_the_general_formulation_tries_the_fastest_kernels_first():
    """Choosing implementations, the general formulation first solves with the fastest kernels fixed and
    starts from that schedule: it never returns a slower one, and progress names that stage."""
    p = relu_chain(8)
    budget = int(unconstrained(p) * 0.8)
    stages = []
    joint = solve(p, budget, formulation="general", horizon=None, time_limit=30,
                  progress=lambda stage, *_: stages.append(stage))
    fixed = solve(p, budget, formulation="general", horizon=None, time_limit=10, options=fastest_kernels(p))
    assert any(stage.startswith("fastest kernels: ") for stage in stages)
    assert joint.peak <= budget and joint.replay.time <= fixed.replay.time + 1e-9


def test_approximate_options_only_when_allowed():
    p = relu_chain(6)
    budget = int(unconstrained(p) * 0.7)
    exact = solve(p, budget)
    assert "sketch" not in exact.schedule.options.values()
    validate(p, exact.schedule, allow_approximate=False)
    sketchy = solve(p, budget, allow_approximate=True)
    assert "sketch" in sketchy.schedule.options.values()  # cheaper, so it is taken when allowed
    assert sketchy.replay.time < exact.replay.time
    with pytest.raises(ScheduleError, match="changes gradients"):
        validate(p, sketchy.schedule, allow_approximate=False)


def test_reruns_from_saved_outputs_are_cheaper_and_keep_those_outputs():
    p = norm_chain(8)
    budget = int(unconstrained(p) * 0.75)
    joint, alone = solve(p, budget), solve(p, budget, implementations=False)
    reruns = [p.ops[i] for i in joint.schedule.recomputations(p)]
    assert reruns and all(joint.schedule.options.get(f"rerun{op.name[4:]}") == "stats" for op in reruns)
    assert all(p.tensor_named(f"s{op.name[4:]}").id in joint.schedule.saved for op in reruns)
    assert joint.replay.recompute_time == pytest.approx(0.2 * len(reruns))
    assert joint.replay.time < alone.replay.time and joint.peak <= budget

    # The same reruns without the statistics saved cannot run.
    unsaved = Schedule(joint.schedule.saved - {p.tensor_named(f"s{op.name[4:]}").id for op in reruns},
                       joint.schedule.backward, joint.schedule.options)
    with pytest.raises(ScheduleError, match="before its inputs exist"):
        validate(p, unsaved)


def test_options_change_what_runs_and_what_is_read():
    p = relu_chain(2)
    masked = keep_all(p, {"mask0": "mask", "mask1": "mask"})
    plain = keep_all(p)
    assert {p.tensors[t].name for t in masked.saved} == {"m0", "m1", "x", "a0"} - {"x"}
    assert {p.tensors[t].name for t in plain.saved} == {"a0"}
    with_masks, without = simulate(p, masked), simulate(p, plain)
    assert with_masks.forward_time == pytest.approx(without.forward_time + 2 * 0.05)
    assert Decisions.of(p, masked).on(p) == masked  # through the schedule file's names


def indices_rerun():
    """x -> conv1 -> z -> conv2 -> w -> pool -> y, and idx (100 B) from z under path "idx" only, where
    relu_b reads it (0.1 s) instead of z (5 s). Saving idx through y_b's peak costs 100 B; rerunning
    it from z (which conv2_b reads anyway) costs 0.1 s: at a budget 50 B under that peak, the least
    time reruns idx, which runs, and reruns, under path "idx" only."""
    b = _Builder()
    x = b.tensor("x", 10, "input")
    (z,) = b.ops[b.op("conv1", "forward", [x], [("z", 400, "activation")], 1.0)].outputs
    b.choices.append(Choice("path", ("z", "idx")))
    (idx,) = b.ops[b.op("idx", "forward", [z], [("idx", 100, "activation")], 0.0, runs=False, recomputable=False,
                        choice="path", others=[Impl((z,), 0.1, recomputable=True)])].outputs
    (w,) = b.ops[b.op("conv2", "forward", [z], [("w", 400, "activation")], 3.0)].outputs
    b.op("pool", "forward", [w], [("y", 10, "output")], 0.5)
    dy = b.tensor("dy", 10, "tangent")
    (gw,) = b.ops[b.op("y_b", "backward", [dy, w], [("gw", 400, "temp")], 1.0)].outputs
    (gz,) = b.ops[b.op("conv2_b", "backward", [gw, z], [("gz", 400, "temp")], 1.0)].outputs
    (gx2,) = b.ops[b.op("relu_b", "backward", [gz, z], [("gx2", 400, "temp")], 5.0, choice="path",
                        others=[Impl((gz, idx), 0.1)])].outputs
    b.op("conv1_b", "backward", [gx2, x], [("gx", 10, "grad")], 1.0)
    return b.problem()


@pytest.mark.parametrize("formulation", ["compact", "general"])
def test_an_op_made_under_one_option_reruns_under_it(formulation):
    p = indices_rerun()
    ids = {op.name: op.id for op in p.ops}
    saving = keep_all(p, {"path": "idx"})
    rerun = Schedule(saving.saved - {p.tensor_named("idx").id}, (ids["y_b"], ids["conv2_b"], ids["idx"],
                     ids["relu_b"], ids["conv1_b"]), {"path": "idx"})
    saved_peak, rerun_replay = simulate(p, saving).peak, simulate(p, rerun)
    assert rerun_replay.peak == saved_peak - 100
    with pytest.raises(ScheduleError, match="'idx' does not run under the chosen options"):
        validate(p, dataclasses.replace(rerun, options={}))
    sol = solve(p, saved_peak - 50, SolveSettings(formulation=formulation, time_limit=20))
    assert sol.status == "optimal" and sol.schedule.options == {"path": "idx"}
    assert ids["idx"] in sol.schedule.backward and sol.replay.time == pytest.approx(rerun_replay.time)
    assert sol.replay.peak <= saved_peak - 50


@pytest.mark.parametrize("problem, share, options_pay", [("relu", 0.6, True), ("relu", 0.8, False),
                                                         ("norm", 0.75, True), ("norm", 0.6, True)])
def test_general_formulation_chooses_how_ops_run(problem, share, options_pay):
    """The general formulation chooses options with the rest (masks that exist only under an option,
    workspace and time per option, reruns that keep saved statistics): its optimum is priced as the
    simulator replays it, is never slower than the compact formulation's, and (`options_pay`) is faster
    than running ops as PyTorch does, or fits where that cannot."""
    p = relu_chain(6) if problem == "relu" else norm_chain(8)
    budget = int(unconstrained(p) * share)
    exact = {"gap": 1e-6, "time_limit": 30}
    def time(**settings):  # the optimum's step time; infinite where the budget cannot be met
        try:
            return solve(p, budget, **exact, **settings).replay.time
        except InfeasibleBudgetError:
            return float("inf")

    general = solve(p, budget, formulation="general", **exact)
    validate(p, general.schedule, allow_approximate=False)
    assert general.status == "optimal" and not general.warnings and general.peak <= budget
    assert general.replay.time == pytest.approx(general.objective, rel=1e-9)
    assert general.replay.time <= time(formulation="compact") * (1 + 1e-6)
    plain = time(formulation="general", implementations=False)
    assert general.replay.time <= plain * (1 + 1e-6)
    if options_pay:
        assert general.replay.time < plain and general.schedule.options


# ---- scale: horizon, gap, reductions ------------------------------------------------------------

@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), size=st.integers(4, 9), fraction=st.sampled_from([0.9, 0.7, 0.5]),
       horizon=st.sampled_from([0, 1, 2]))
def test_a_horizon_only_restricts_when_ops_rerun(seed, size, fraction, horizon):
    p = random_dag(seed, size)
    budget = int(unconstrained(p) * fraction)
    try:
        bounded = solve(p, budget, formulation="compact", horizon=horizon, gap=0, time_limit=20)
    except InfeasibleBudgetError:
        return
    validate(p, bounded.schedule)
    assert bounded.peak <= budget and bounded.horizon == horizon
    assert Stages(p, horizon).admits(bounded.schedule)
    free = solve(p, budget, formulation="compact", horizon=None, gap=0, time_limit=20)
    assert free.replay.time <= bounded.replay.time * (1 + 1e-4)  # a horizon never finds a faster schedule


def test_every_solution_states_its_bound_and_gap():
    p = random_dag(0, 12)  # its least compact peak is 85 % of keeping everything
    for fraction in (0.95, 0.9):
        solution = solve(p, int(unconstrained(p) * fraction), formulation="compact")
        assert solution.bound <= solution.objective
        assert solution.gap == pytest.approx((solution.objective - solution.bound) / solution.objective)
        assert solution.gap <= 5e-3 or solution.status == "time_limit"
        assert solution.objective == pytest.approx(solution.replay.time, rel=1e-6)


def test_dominated_options_are_left_out():
    p = relu_chain(3)
    assert Compact(p, None).better == {}  # exact options trade memory for time: none dominates
    # with approximate options allowed, "sketch" reads the same mask in less time than "mask"
    assert Compact(p, None, allow_approximate=True).better == {(f"mask{i}", 1): 2 for i in range(3)}
    solution = solve(p, int(unconstrained(p) * 0.7), allow_approximate=True)
    assert "mask" not in solution.schedule.options.values()


def test_shaving_fits_budgets_below_chens_least_peak():
    shaved = 0
    for seed in range(20):
        p = random_dag(seed, 10)
        chen_least = min(simulate(p, recompute_at_first_need(p, d)).peak for d in chen_candidates(p))
        found = best_first_need(p, chen_least - 1)
        if found is None:
            continue
        shaved += 1
        dropped, replay = found
        schedule = recompute_at_first_need(p, dropped)
        validate(p, schedule)
        assert simulate(p, schedule).peak == replay.peak < chen_least
        # with no budget, shaving goes on along the same path as far as it lowers the peak
        assert best_first_need(p, None)[1].peak <= replay.peak
    assert shaved >= 3


def test_a_start_schedule_is_kept_unless_the_search_beats_it():
    p = relu_chain(8)
    budget = int(unconstrained(p) * 0.7)
    alone = solve(p, budget, implementations=False, formulation="compact")
    # gap 1: HiGHS stops at its first incumbent, which is the start when the start is accepted
    joint = solve(p, budget, start=alone.schedule, time_limit=1, gap=1.0)
    assert joint.peak <= budget and joint.replay.time <= alone.replay.time + 1e-9


def test_choosing_implementations_never_raises_the_least_peak():
    """The joint least-peak search starts from checkpointing alone's (the same formulation) and keeps
    it if it finds none lower; here the 1/32-size ReLU masks make it strictly lower."""
    p = relu_chain(10)
    joint = least_peak(p, formulation="compact", time_limit=10)
    alone = least_peak(p, formulation="compact", implementations=False, time_limit=10)
    assert joint.found < alone.found
    validate(p, joint.schedule)
    assert simulate(p, joint.schedule).peak <= joint.found


def test_general_formulation_keeps_fixed_options():
    """The general formulation solves with fixed options resolved into the ops; its schedule (and the
    starting one) carries them back, so it runs as it was priced (it used to come back without them,
    replay over the budget and be refused)."""
    p = relu_chain(4)
    options = {f"mask{i}": "mask" for i in range(4)} | {f"algo{i}": "lean" for i in range(4)}
    full = simulate(p, keep_all(p, options))
    for share in (0.99, 0.8):
        solution = solve(p, int(full.peak * share), formulation="general", options=options, time_limit=20)
        validate(p, solution.schedule)
        assert solution.schedule.options == options and solution.status == "optimal"
        assert solution.peak <= int(full.peak * share) and solution.replay.time == pytest.approx(solution.objective)
    assert least_peak(p, formulation="general", options=options, time_limit=20).schedule.options == options


@pytest.mark.parametrize("problem, share", [("chain", 0.63), ("chain", 0.73), ("chain", 0.83), ("relu", 0.7),
                                            ("norm", 0.7)])
def test_the_general_formulation_poses_the_compact_schedule_as_its_start(problem, share):
    # warm_from gives the general ILP the compact solution's binaries, its options included: HiGHS
    # accepts them, at its cost. The chain's budgets lie between two of its peaks (tensors of 100 bytes
    # of 1500): a schedule that fills the budget exactly, as the heuristic start can, is beyond the
    # memory rows' 1e-5 margin.
    p = {"chain": chain(12), "relu": relu_chain(6), "norm": norm_chain(8)}[problem]
    compact = solve(p, int(unconstrained(p) * share), formulation="compact", time_limit=20)
    assert compact.schedule.options or problem == "chain"
    formulation = General(p, compact.budget, None)
    result = formulation.milp.solve(time_limit=5, warm=formulation.warm_from(compact.schedule))
    assert result.warm == "accepted"
    assert formulation.fixed_time + result.warm_objective / 1e3 == pytest.approx(compact.replay.time, rel=1e-9)


def test_a_ladder_of_formulations_polishes_the_compact_schedule():
    """formulation=["compact", "general"]: the general formulation starts from the compact one's
    schedule and returns one no slower; formulations and horizons given as lists go in step."""
    p = norm_chain(12)
    budget = int(unconstrained(p) * 0.6)
    compact = solve(p, budget, formulation="compact", time_limit=10)
    ladder = solve(p, budget, formulation=["compact", "general"], horizon=["auto", None], time_limit=20)
    assert ladder.formulation == "general" and ladder.peak <= budget
    assert ladder.replay.time <= compact.replay.time * (1 + 1e-9)
    with pytest.raises(ValueError, match="go in step"):
        solve(p, budget, formulation=["compact", "general"], horizon=[None])


def test_only_a_ladders_first_rung_solves_checkpointing_alone():
    """Checkpointing alone gives the joint search a start; a later rung starts from the best schedule so
    far, which already beats it, so solving it again there would only take that rung's time."""
    p = relu_chain(8)
    stages = []
    solve(p, int(unconstrained(p) * 0.6), formulation=["compact", "compact"], horizon=[10, None], time_limit=20,
          progress=lambda stage, *_: stages.append(stage))
    alone = {stage.split(":")[0] for stage in stages if "checkpointing alone" in stage}
    assert alone == {"compact, reruns at most 10 stages ahead"}
    assert any(stage.startswith("compact, reruns at any distance: solving") for stage in stages)


def test_the_least_peak_choosing_how_ops_run_starts_from_checkpointing_alones():
    """least_peak with implementations first seeks checkpointing alone's least peak (a third of the
    time) and keeps it if the joint search finds none lower, so choosing how ops run never raises the
    least peak found (a joint search alone, cut short, has: DistilBERT 2,321,428 against 2,253,867 bytes)."""
    p = relu_chain(8)
    stages = []
    joint = least_peak(p, time_limit=30, progress=lambda stage, *_: stages.append(stage))
    assert any(stage.startswith("checkpointing alone: least peak") for stage in stages), sorted(set(stages))
    alone = least_peak(p, implementations=False, time_limit=10)
    assert alone.found == alone.bound and joint.found <= alone.found


def test_a_general_solve_is_never_slower_than_its_start():
    p = norm_chain(30)
    budget = int(unconstrained(p) * 0.6)
    compact = solve(p, budget, formulation="compact", time_limit=20)
    general = solve(p, budget, formulation="general", start=compact.schedule, time_limit=2, horizon=None)
    assert general.peak <= budget and general.replay.time <= compact.replay.time


def test_heuristic_effort_changes_no_optimum_and_is_a_share():
    """HiGHS's heuristic effort changes how it searches, not what is optimal; outside 0..1 it is refused."""
    p = relu_chain(6)
    budget = int(unconstrained(p) * 0.7)
    default, eager = (solve(p, budget, gap=1e-6, heuristic_effort=effort) for effort in (0.05, 1.0))
    assert eager.status == default.status == "optimal"
    assert eager.replay.time == pytest.approx(default.replay.time, rel=1e-9)
    with pytest.raises(ValueError, match="heuristic_effort"):
        solve(p, budget, heuristic_effort=1.5)


@pytest.mark.parametrize("formulation", ["compact", "general"])
def test_the_least_peak_search_goes_on_from_a_start(formulation):
    """A ladder hands the next rung the lowest peak so far: the search from it never ends higher, and
    its schedule replays within the peak it reports (the general formulation took no start before)."""
    p = chain(12)
    lowest = least_peak(p, formulation="compact", time_limit=10)
    assert lowest.found == 801
    again = least_peak(p, formulation=formulation, start=lowest.schedule, horizon=None, time_limit=1)
    assert again.found <= lowest.found and simulate(p, again.schedule).peak <= again.found


def test_a_budget_no_heuristic_schedule_meets_starts_from_the_least_peak_search():
    """At 801 on a 12-op chain no heuristic schedule fits (they need 900): the least-peak search,
    stopped at its first schedule within the budget, gives the ILP one to start from."""
    p = chain(12)
    least = least_peak(p, formulation="compact", time_limit=10)
    assert least.found == 801 and least.sure == 900
    first = least_peak(p, formulation="general", target=850, time_limit=10)
    assert first.found <= 850 and simulate(p, first.schedule).peak <= 850
    stages = []
    solution = solve(p, 801, formulation="compact", time_limit=20,
                     progress=lambda stage, *state: stages.append(stage))
    assert any("a first schedule within the budget" in stage for stage in stages)
    assert solution.status == "optimal" and solution.peak <= 801
    validate(p, solution.schedule)


def _compact_optimum():
    """relu_chain(12), 50 % of its unconstrained peak, and one of the compact formulation's optima there (58.7 s;
    it has several, and which one HiGHS returns moves with the formulation's rows): saving a4, a7, a9 and a10,
    the convolutions after them lean. The searches below start from it, so that what they find does not
    depend on which optimum that is (from another, saving a3, a6, a9 and a10, 3 s reach 58.1 s)."""
    p = relu_chain(12)
    budget = int(unconstrained(p) * 0.5)
    compact = solve(p, budget, formulation="compact", time_limit=10, gap=1e-9)
    named = {t.name: t.id for t in p.tensors}
    dropped = {t.id for t in p.tensors if t.role == "activation"} - {named[n] for n in ("a4", "a7", "a9", "a10")}
    start = dataclasses.replace(recompute_at_first_need(p, dropped),
                                options={f"algo{i}": "lean" for i in (3, 4, 7, 9, 10, 11)})
    replay = simulate(p, start)
    assert replay.peak <= budget and replay.time == pytest.approx(compact.replay.time, rel=1e-9)
    return p, budget, dataclasses.replace(compact, schedule=start, replay=replay)


def test_a_neighbourhood_search_improves_a_schedule_the_whole_ilp_search_stops_at():
    """relu_chain(12) at 50 %: the compact formulation's optimum (58.7 s) is not the general one's; HiGHS on the
    whole general formulation had reached 58.4 s after 30 s (measured), the neighbourhood search 57.3 s in 3 s
    from the optimum `_compact_optimum` names. Each piece holds the decisions of the ops it does not free at
    the start's values."""
    p, budget, compact = _compact_optimum()
    formulation = General(p, budget, None)
    start = formulation.warm_from(compact.schedule)
    owners = formulation.owners()
    held = {var: start[var] for var, ops in owners.items() if not ops & {p.forward_ops[0].id}}
    piece = formulation.milp.solve(time_limit=5, warm=start, fixed=held)
    assert piece.warm == "accepted" and all(piece.values[var] == value for var, value in held.items())
    found = neighbourhood_search(formulation, compact.schedule, budget, time.perf_counter() + 3)
    assert found is not None
    schedule, replay = found
    validate(p, schedule)
    assert replay == simulate(p, schedule) and replay.peak <= budget
    assert replay.time < compact.replay.time - 1.0


def test_a_neighbourhood_search_keeps_its_own_path_before_taking_a_faster_schedule_handed_over():
    """relu_chain(12) at 50 %: handed the fastest schedule a first search found, a second search from the
    compact formulation's schedule first goes its own way (its first faster schedule is slower than the
    one handed over) and holds the handed one, or a faster, once its path stalls."""
    p, budget, compact = _compact_optimum()
    formulation = General(p, budget, None)
    fastest, replay = neighbourhood_search(formulation, compact.schedule, budget, time.perf_counter() + 3)
    handed, found, held = [fastest], [], []
    neighbourhood_search(formulation, compact.schedule, budget, time.perf_counter() + 3, seed=1,
                         fresh=lambda: handed.pop() if handed else None,
                         improved=lambda _, r: found.append(r.time), report=lambda r, _: held.append(r.time))
    assert not handed and found and found[0] > replay.time, (found, replay.time)
    assert held[-1] <= replay.time and len(held) > PATIENCE


def _children() -> set[int]:
    """The pids of this process's children that have not ended (Linux /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(parent) == os.getpid() and state != "Z":
            found.add(int(stat.parent.name))
    return found


def test_a_worker_beside_the_search_finds_what_the_search_stops_short_of():
    """relu_chain(12) at 50 %: HiGHS on the whole general formulation reached 61.7 s in 6 s (measured; 58.4 s
    in 30 s); a second process runs the neighbourhood search from the schedules the search finds meanwhile
    (its start, then HiGHS's incumbents) and reached 57.3 s in the same 6 s. The solve returns the worker's
    schedule as the general formulation's, and no worker outlives it."""
    p = relu_chain(12)
    budget = int(unconstrained(p) * 0.5)
    alone = solve(p, budget, formulation="general", horizon=None, time_limit=6, gap=1e-9)
    before = _children()
    both = solve(p, budget, formulation="general", horizon=None, time_limit=6, gap=1e-9, workers=2)
    assert _children() == before
    validate(p, both.schedule)
    assert both.peak <= budget and both.replay.time < alone.replay.time - 0.5, (both.replay.time, alone.replay.time)
    assert both.formulation == "general" and both.status == "time_limit" and both.bound <= both.objective
    assert "found by a neighbourhood search beside the search, faster than the general" in both.note
    assert both.solve_time < 6 + 2
    for workers in (0, 1.5):
        with pytest.raises(ValueError, match="workers"):
            solve(p, budget, workers=workers)


def test_a_worker_seeks_a_first_schedule_until_one_arrives():
    """Where no heuristic schedule fits (801 on a 12-op chain), a worker beside the search runs a
    least-peak search of its own to the budget, and gives it up when a schedule arrives from the search."""
    from monet.solver.beside import _seek

    p = chain(12)
    settings = SolveSettings(formulation="compact", time_limit=10)
    found = _seek(p, 801, settings, None, lambda: None, lambda: False)
    assert found is not None and simulate(p, found).peak <= 801
    looks = []
    assert _seek(p, 801, settings, None, lambda: looks.append(1), lambda: True) is None and looks
    with_workers = solve(p, 801, formulation="compact", time_limit=20, workers=2)
    assert with_workers.peak <= 801


def test_polish_keeps_a_share_of_the_time_for_the_neighbourhood_search():
    p = relu_chain(12)
    budget = int(unconstrained(p) * 0.5)
    compact = solve(p, budget, formulation="compact", time_limit=4, gap=1e-9)
    polished = solve(p, budget, formulation="compact", time_limit=8, gap=1e-9, polish=0.5)
    assert polished.peak <= budget and polished.replay.time < compact.replay.time
    assert polished.formulation == "general" and polished.horizon is None and polished.status == "time_limit"
    assert "polished by a neighbourhood search from the compact formulation's schedule" in polished.note
    assert polished.bound <= polished.objective and polished.solve_time < 8 + 2
    for share in (-0.1, 1.0):
        with pytest.raises(ValueError, match="polish"):
            solve(p, budget, polish=share)


def test_a_stalled_search_stops_as_at_its_time_limit():
    """`stall`: HiGHS stops once it has gone that long without a better solution (a ladder's rungs
    before the last stop so and leave their time to the next). A 200-item knapsack with 10 weight rows:
    HiGHS finds good packings at once and then branches to the time limit of 60 s (measured)."""
    import numpy as np

    from monet.solver.milp import Milp

    rng = np.random.default_rng(0)
    weights = rng.integers(20, 100, size=(10, 200))
    values = rng.integers(10, 100, size=200) + weights.sum(axis=0) // 10
    milp = Milp()
    first = milp.add_vars(200, binary=True)
    for j in range(200):
        milp.add_cost(first + j, -float(values[j]))
    for row in weights:
        milp.add_row([(first + j, float(w)) for j, w in enumerate(row)], float(row.sum() // 2))
    began = time.perf_counter()
    result = milp.solve(time_limit=60, stall=1.0, mip_rel_gap=0)
    assert time.perf_counter() - began < 20
    assert result.status == "time_limit" and result.values is not None
    assert result.bound <= result.objective < 0 and result.gap > 0
    # `stall_above`: a search whose gap is within it goes on (to its time limit here) however long it stalls
    began = time.perf_counter()
    result = milp.solve(time_limit=6, stall=1.0, stall_above=-result.objective, mip_rel_gap=0)
    assert time.perf_counter() - began > 5.5 and result.status == "time_limit"


def test_a_ladders_last_rung_stalled_with_a_wide_gap_hands_on_to_a_neighbourhood_search(monkeypatch):
    """The last rung stops where it stalls with its gap over STALL_GAP, and a neighbourhood search takes
    the time left (as `polish` would), whether or not the simulator confirmed HiGHS's answer; with its gap
    within STALL_GAP, HiGHS goes on (to its time limit here)."""
    import importlib

    solving = importlib.import_module("monet.solver.solve")  # the module: monet.solver.solve is also the function
    p = relu_chain(12)
    budget = int(unconstrained(p) * 0.5)
    settings = dict(formulation=["compact", "general"], horizon=["auto", None], time_limit=20, gap=1e-9)
    monkeypatch.setattr(solving, "STALL_SHARE", 1e-3)  # stalled at once
    monkeypatch.setattr(solving, "STALL_GAP", 0.0)
    stages = []
    handed = solve(p, budget, **settings, progress=lambda stage, *_: stages.append(stage))
    assert "polishing" in stages
    assert "polished by a neighbourhood search from the general formulation's schedule" in handed.note
    assert handed.peak <= budget and handed.status == "time_limit" and handed.solve_time > 20 - 2
    monkeypatch.setattr(solving, "STALL_GAP", 1.0)  # any gap is within it: the last rung runs to its time limit
    stages.clear()
    kept = solve(p, budget, **{**settings, "time_limit": 5}, progress=lambda stage, *_: stages.append(stage))
    assert "polishing" not in stages and "polished" not in kept.note
    assert kept.peak <= budget and kept.solve_time > 5 - 2
    # where the simulator contradicts HiGHS's answer, the rung's solution is "unverified", not "time_limit", but
    # unproven all the same: the time left still goes to the neighbourhood search (it went unused)
    monkeypatch.setattr(solving, "STALL_GAP", 0.0)
    contradicted = []
    monkeypatch.setattr(solving, "_audit", lambda *_: contradicted.append(1) or ["a contradiction, injected"])
    stages.clear()
    unverified = solve(p, budget, **settings, progress=lambda stage, *_: stages.append(stage))
    assert contradicted and "polishing" in stages and "a contradiction, injected" in unverified.warnings
    assert unverified.peak <= budget and unverified.solve_time > 20 - 2


def test_a_copy_only_reruns_read_is_not_counted_at_the_backward_op():
    """a0 is read by f1 alone: the schedule saves a0 and reruns f1 from it just before b2, a0's last
    reader. The simulator frees a0 there, before b2 runs; neither formulation counts it at b2 any more
    (each did: a copy held into a stage counted to the stage's end, 530 bytes against the replayed peak of
    430 here, and Gurobi's own UNet 5 GB schedule at 1.11 times its budget in the general one)."""
    b = _Builder()
    x = b.tensor("x", 10, "input")
    a0 = b.ops[b.op("f0", "forward", [x], [("a0", 100, "activation")])].outputs[0]
    a1 = b.ops[b.op("f1", "forward", [a0], [("a1", 100, "activation")])].outputs[0]
    b.op("f2", "forward", [a1], [("y", 10, "output")])
    dy = b.tensor("dy", 10, "tangent")
    g2 = b.ops[b.op("b2", "backward", [dy, a1], [("g2", 300, "temp")])].outputs[0]
    g1 = b.ops[b.op("b1", "backward", [g2, a1], [("g1", 10, "temp")])].outputs[0]
    b.op("b0", "backward", [g1, x], [("g0", 10, "grad")])
    p = b.problem()
    schedule = Schedule.from_names(p, ["a0"], ["f1", "b2", "b1", "b0"])
    replay = simulate(p, schedule)
    least = General(p, None, None)
    values = least.warm_from(schedule)
    priced = least.milp.solve(time_limit=10, warm=values, fixed=values)
    assert priced.status == "optimal"
    assert priced.values[least.memory.peak] * least.memory.unit == pytest.approx(replay.peak, rel=1e-9)
    within = General(p, replay.peak + 1, None)  # keeping everything fits too: the schedule is priced, not sought
    values = within.warm_from(schedule)
    assert within.milp.solve(time_limit=10, warm=values, fixed=values).warm == "accepted"
    compact = Compact(p, None, horizon=None)  # a1 dropped and rerun once, where b2 first needs it
    values = compact.warm_start(frozenset({a1}), {})
    priced = compact.milp.solve(time_limit=10, warm=values, fixed=values)
    assert priced.status == "optimal" and simulate(p, compact.schedule(priced.values)) == replay
    assert priced.values[compact.memory.peak] * compact.memory.unit == pytest.approx(replay.peak, rel=1e-9)


def test_a_rerun_for_one_output_holds_the_others_until_they_are_needed():
    """random_dag(6, 12): f0 makes a0 and aux0. The schedule reruns f0 where b_f5 needs a0 and holds aux0
    from that rerun until b_f0 reads it, three stages later. The general formulation poses it at its replayed
    peak and time; before, it held aux0 only over aux0's own window, so that schedule was not one of its
    solutions (with every decision held at it, HiGHS found the ILP infeasible)."""
    p = random_dag(6, 12)
    schedule = Schedule.from_names(p, ["a4", "a5", "a6", "a9"],
                                   ["b_f11", "b_f9", "b_f6", "f0", "f1", "b_f5", "b_f4", "b_f1", "b_f0"])
    assert [p.ops[i].name for i in schedule.recomputations(p)] == ["f0", "f1"]
    replay = simulate(p, schedule)
    least = General(p, None, None)  # the peak as the objective, every decision held at the schedule's
    values = least.warm_from(schedule)
    priced = least.milp.solve(time_limit=10, warm=values, fixed=values)
    assert priced.status == "optimal"
    assert priced.values[least.memory.peak] * least.memory.unit == pytest.approx(replay.peak, rel=1e-9)
    within = General(p, replay.peak + 1, None)
    values = within.warm_from(schedule)
    priced = within.milp.solve(time_limit=10, warm=values, fixed=values)
    assert priced.status == "optimal" and priced.warm == "accepted"
    assert within.fixed_time + priced.objective / 1e3 == pytest.approx(replay.time, rel=1e-9)


def test_a_rerun_no_op_reads_is_dropped_without_a_contradiction():
    """HiGHS can stop at a solution that reruns f1 where no op reads its copy (before b1, which does not
    read a1, and again before b0, which does).
    The schedule returned drops that rerun, so it replays faster than HiGHS priced it; priced with the
    rerun kept it replays at HiGHS's price, so the audit states no contradiction (it did: a UNet solve
    ended "unverified", its bound dropped). A price that the schedule does not replay at, even with the
    rerun kept, is still one."""
    import importlib

    solving = importlib.import_module("monet.solver.solve")  # the module: monet.solver.solve is also the function
    b = _Builder()
    x = b.tensor("x", 10, "input")
    a0 = b.ops[b.op("f0", "forward", [x], [("a0", 100, "activation")])].outputs[0]
    a1 = b.ops[b.op("f1", "forward", [a0], [("a1", 100, "activation")], time=2.0)].outputs[0]
    b.op("f2", "forward", [a1], [("y", 10, "output")])
    dy = b.tensor("dy", 10, "tangent")
    g2 = b.ops[b.op("b2", "backward", [dy, a1], [("g2", 30, "temp")])].outputs[0]
    g1 = b.ops[b.op("b1", "backward", [g2], [("g1", 10, "temp")])].outputs[0]
    b.op("b0", "backward", [g1, x, a1], [("g0", 10, "grad")])
    p = b.problem()
    named = [p.op_named(n).id for n in ["f1", "b2", "f1", "b1", "f1", "b0"]]
    unpruned = Schedule.from_backward(p, named, prune=False)
    pruned = Schedule.from_backward(p, named)
    assert pruned.backward == tuple(p.op_named(n).id for n in ["f1", "b2", "b1", "f1", "b0"])
    replay = simulate(p, pruned)
    assert simulate(p, unpruned).time == pytest.approx(replay.time + 2.0)
    budget = 2 * simulate(p, unpruned).peak  # room for the copy no op reads
    formulation = General(p, budget, None)
    values = formulation.warm_from(unpruned)
    result = formulation.milp.solve(time_limit=10, warm=values, fixed=values)
    assert values is not None and result.status == "optimal" and formulation.schedule(result.values) == pruned
    priced = formulation.fixed_time + result.objective / 1e3
    assert priced == pytest.approx(replay.time + 2.0)
    assert replay.peak <= budget and solving._audit(result, formulation, replay, priced, 0.0, budget) == []
    warned = solving._audit(result, formulation, replay, priced + 1.0, 0.0, budget)
    assert len(warned) == 1 and "the simulator replays it at" in warned[0]
