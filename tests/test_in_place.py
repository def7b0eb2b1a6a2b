"""Ops that overwrite their input in place (MONeT's in-place ReLU): the simulator counts one storage
for input and output, schedules never read an overwritten copy, and both formulations choose it."""

from dataclasses import replace

import pytest
from synthetic import _Builder, relu_chain

from monet.solver import (
    Choice,
    Impl,
    InfeasibleBudgetError,
    ProblemError,
    Schedule,
    ScheduleError,
    SolveSettings,
    simulate,
    solve,
)

FORMULATIONS = ("compact", "general")


def conv_relu_pool(*, input_path: bool = False):
    """conv (x -> z, 400 B) -> relu (z -> a, 400 B; "place": "out" or "in") -> pool (a -> y, idx).
    The backward is light, so the forward's relu is the peak: 810 B out of place, 410 B in place.
    With `input_path`, relu's backward may read z instead of idx (choice "path": "idx" or "z")."""
    b = _Builder()
    x = b.tensor("x", 10, "input")
    conv = b.op("conv", "forward", [x], [("z", 400, "activation")], 1.0)
    z = b.ops[conv].outputs[0]
    b.choices.append(Choice("place", ("out", "in")))
    relu = b.op("relu", "forward", [z], [("a", 400, "activation")], 0.2, choice="place",
                others=[Impl((z,), 0.2, overwrites=z)])
    a = b.ops[relu].outputs[0]
    pool = b.op("pool", "forward", [a], [("y", 50, "output"), ("idx", 20, "activation")], 0.5)
    y, idx = b.ops[pool].outputs
    dy = b.tensor("dy", 50, "tangent")
    pool_b = b.op("pool_b", "backward", [dy, idx], [("ga", 100, "temp")], 0.5)
    ga = b.ops[pool_b].outputs[0]
    if input_path:
        b.choices.append(Choice("path", ("idx", "z")))
    relu_b = b.op("relu_b", "backward", [ga, idx], [("gz", 100, "temp")], 0.2, choice="path" if input_path else None,
                  others=[Impl((ga, z), 0.1)] if input_path else ())
    gz = b.ops[relu_b].outputs[0]
    b.op("conv_b", "backward", [gz, x], [("gx", 10, "grad")], 1.0)
    return b.problem()


def test_in_place_counts_one_storage_for_input_and_output():
    problem = conv_relu_pool()
    backward, idx = tuple(op.id for op in problem.backward_ops), problem.tensor_named("idx").id
    out = simulate(problem, Schedule(frozenset({idx}), backward, {}))
    inside = simulate(problem, Schedule(frozenset({idx}), backward, {"place": "in"}))
    assert (out.peak, out.peak_at) == (810, "relu")
    assert inside.peak == 480 and dict(inside.timeline)["relu"] == 410


def test_a_backward_op_may_overwrite_a_backward_intermediate_it_reads_last():
    """relu_b writes its gradient into pool_b's (ga, 100 B, read by nothing after it): relu_b's moment
    counts one storage for both; conv_b's gradient (10 B) fits no 100 B intermediate."""
    problem = conv_relu_pool()
    ga = problem.tensor_named("ga").id
    backward, idx = tuple(op.id for op in problem.backward_ops), problem.tensor_named("idx").id
    relu_b = problem.op_named("relu_b")
    ops = list(problem.ops)
    ops[relu_b.id] = replace(relu_b, pytorch=replace(relu_b.pytorch, overwrites=ga))
    in_place = replace(problem, ops=tuple(ops))
    before = dict(simulate(problem, Schedule(frozenset({idx}), backward, {})).timeline)["relu_b"]
    after = dict(simulate(in_place, Schedule(frozenset({idx}), backward, {})).timeline)["relu_b"]
    assert before - after == 100
    conv_b = problem.op_named("conv_b")
    ops[conv_b.id] = replace(conv_b, pytorch=replace(conv_b.pytorch, overwrites=problem.tensor_named("gz").id))
    with pytest.raises(ProblemError, match="not a backward intermediate of its output's size"):
        replace(problem, ops=tuple(ops))


def test_a_schedule_never_reads_an_overwritten_copy():
    problem = conv_relu_pool(input_path=True)
    ids = {op.name: op.id for op in problem.ops}
    z, idx = problem.tensor_named("z").id, problem.tensor_named("idx").id
    backward = tuple(op.id for op in problem.backward_ops)
    with pytest.raises(ScheduleError, match="overwrites 'z' in place, which the schedule saves"):
        simulate(problem, Schedule(frozenset({z, idx}), backward, {"place": "in", "path": "z"}))
    rerun = (ids["pool_b"], ids["conv"], ids["relu"], ids["relu_b"], ids["conv_b"])
    with pytest.raises(ScheduleError, match=r"z \(overwritten by rerun 'relu'\)"):
        simulate(problem, Schedule(frozenset({idx}), rerun, {"place": "in", "path": "z"}))
    assert simulate(problem, Schedule(frozenset({idx}), rerun, {"path": "z"})).recompute_time == 1.2  # out of place


def test_in_place_needs_an_activation_the_op_reads():
    problem = conv_relu_pool()
    x = problem.tensor_named("x").id
    for name, message in (("relu", "not a one-output op reading it"), ("conv", "not an activation")):
        op = problem.op_named(name)
        ops = list(problem.ops)
        ops[op.id] = replace(op, choice="place", others=(Impl(op.inputs, 1.0, overwrites=x),))
        if name == "relu":
            ops[op.id] = replace(op, others=(Impl(op.inputs, 0.2, overwrites=x),))
        else:
            ops[problem.op_named("relu").id] = replace(problem.op_named("relu"), choice=None, others=())
        with pytest.raises(ProblemError, match=message):
            replace(problem, ops=tuple(ops))


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_both_formulations_reach_budgets_only_in_place_fits(formulation):
    settings = SolveSettings(formulation=formulation, implementations=True, time_limit=20)
    problem = conv_relu_pool(input_path=True)
    solution = solve(problem, 500, settings)
    assert solution.schedule.options.get("place") == "in"
    assert simulate(problem, solution.schedule).peak <= 500
    with pytest.raises(InfeasibleBudgetError):
        solve(problem, 500, settings.but(options={"place": "out"}))


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_in_place_options_never_slow_a_solve(formulation):
    """relu_chain's relus may run in place (a little faster): at every budget the solve is no slower
    than without the option, and its schedule replays (no overwritten copy read)."""
    settings = SolveSettings(formulation=formulation, implementations=True, time_limit=20)
    for budget in (900, 700, 620):
        plain = solve(relu_chain(6), budget, settings)
        problem = relu_chain(6, in_place=True)
        inside = solve(problem, budget, settings)
        replay = simulate(problem, inside.schedule)
        assert replay.peak <= budget
        assert replay.time <= simulate(relu_chain(6), plain.schedule).time + 1e-9
