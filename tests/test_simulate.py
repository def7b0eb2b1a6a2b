"""The simulator's accounting, checked by hand on tiny problems."""

import dataclasses

import pytest
from synthetic import _Builder, chain

from monet.solver import Schedule, ScheduleError, keep_all, simulate


def two_layers():
    """x(10) -> f0 -> a0(100) -> f1 -> y(5, output); backward b1 reads a0, b0 reads x."""
    b = _Builder()
    x = b.tensor("x", 10, "input")
    f0 = b.op("f0", "forward", [x], [("a0", 100, "activation")], time=2.0, workspace=7)
    a0 = b.ops[f0].outputs[0]
    b.op("f1", "forward", [a0], [("y", 5, "output")], time=3.0)
    dy = b.tensor("dy", 5, "tangent")
    b1 = b.op("b1", "backward", [dy, a0], [("g0", 100, "temp")], time=4.0)
    b.op("b0", "backward", [b.ops[b1].outputs[0], x], [("gx", 10, "grad")], time=5.0, workspace=3)
    return b.problem()


def test_keep_all_by_hand():
    p = two_layers()
    replay = simulate(p, keep_all(p))
    # f0: x + a0 + ws 7 = 117; f1: x + a0 + y = 115; b1: x+a0(saved)+y+dy + g0 = 220;
    # b0: x + y + g0 + gx + ws 3 = 128 (a0 and dy died after b1).
    assert [b for _, b in replay.timeline] == [117, 115, 220, 128]
    assert replay.peak == 220 and replay.peak_at == "b1"
    assert replay.time == 14.0 and replay.recompute_time == 0.0


def test_bytes_libraries_hold_count_at_every_op():
    p = two_layers()
    held = dataclasses.replace(p, held=1000)  # as cuBLAS workspaces on CUDA
    assert [b for _, b in simulate(held, keep_all(held)).timeline] == [1117, 1115, 1220, 1128]
    schedule = Schedule.from_backward(p, [0, 2, 3])
    assert simulate(held, schedule).peak == simulate(p, schedule).peak + 1000


def test_recomputation_moves_memory_and_costs_time():
    p = two_layers()
    schedule = Schedule.from_backward(p, [0, 2, 3])  # rerun f0 just before b1
    assert schedule.saved == frozenset()
    replay = simulate(p, schedule)
    # forward f1: a0 dies after its last forward reader since it is not saved: x + a0 + y = 115
    # rerun f0: x + y + dy + a0 + ws 7 = 127; b1: 220 as before; b0: 128
    assert [b for _, b in replay.timeline] == [117, 115, 127, 220, 128]
    assert replay.recompute_time == 2.0


def test_schedules_that_cannot_run_are_refused():
    p = two_layers()
    with pytest.raises(ScheduleError, match="before its inputs exist"):
        simulate(p, Schedule(saved=frozenset(), backward=(2, 3)))
    with pytest.raises(ScheduleError, match="every backward op once"):
        simulate(p, Schedule(saved=frozenset({1}), backward=(3, 2)))


def test_random_ops_are_never_rerun():
    b = _Builder()
    x = b.tensor("x", 10, "input")
    f = b.op("dropout", "forward", [x], [("a", 10, "activation")], recomputable=False)
    a = b.ops[f].outputs[0]
    b.op("g", "forward", [a], [("y", 1, "output")])
    b.op("bg", "backward", [a], [("gx", 10, "grad")])
    p = b.problem()
    with pytest.raises(ScheduleError, match="must not be recomputed"):
        simulate(p, Schedule(saved=frozenset(), backward=(0, 2)))


def test_dead_recomputations_are_pruned():
    p = chain(4)  # f0..f3 then b3..b0; b1 reads a0
    backward = [op.id for op in p.backward_ops]
    schedule = Schedule.from_backward(p, [0, 0] + backward)  # the first rerun of f0 is never read
    assert schedule.backward == (0, *backward)
    assert p.tensor_named("a0").id not in schedule.saved
