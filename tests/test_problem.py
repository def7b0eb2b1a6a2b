"""The framework-free problem: validation, JSON, and no torch anywhere in the solver."""

import dataclasses
import json
import subprocess
import sys

import pytest
from synthetic import chain, random_dag, relu_chain

from monet.solver import Impl, Op, Problem, ProblemError, Tensor, keep_all, simulate, solve


def test_json_round_trip_keeps_everything():
    plain = random_dag(3)
    problem = dataclasses.replace(plain, held=4096,
                                  tensors=[*plain.tensors[:-1], dataclasses.replace(plain.tensors[-1], keep_time=0.5)])
    again = Problem.from_json(problem.to_json())
    assert again.tensors == problem.tensors
    assert again.ops == problem.ops
    assert again.meta == problem.meta
    assert again.held == 4096 and again == problem
    assert again.tensors[-1].keep_time == 0.5
    assert "held" not in plain.to_dict()  # files of problems with nothing held or priced are as before
    assert not any("keep_time" in t for t in plain.to_dict()["tensors"])


def test_unknown_version_is_refused():
    data = chain(3).to_dict()
    data["version"] = 99
    with pytest.raises(ProblemError, match="version 99"):
        Problem.from_dict(data)


def test_malformed_problems_are_refused():
    x = Tensor(0, "x", 10, "input")
    a = Tensor(1, "a", 10, "activation", producer=0)
    with pytest.raises(ProblemError, match="before it exists"):
        Problem([x, a, Tensor(2, "b", 10, "activation", producer=1)],
                [Op(0, "f", "t", "forward", (1,), Impl((2,), 1.0)), Op(1, "g", "t", "forward", (2,), Impl((0,), 1.0))])
    with pytest.raises(ProblemError, match="unknown role"):
        Problem([Tensor(0, "x", 10, "weird")], [])
    with pytest.raises(ProblemError, match="comes after a backward op"):
        Problem([x, a, Tensor(2, "g", 10, "temp", producer=0)],
                [Op(0, "b", "t", "backward", (2,), Impl((0,), 1.0)), Op(1, "f", "t", "forward", (1,), Impl((0,), 1.0))])
    with pytest.raises(ProblemError, match="malformed"):
        Problem.from_dict({"version": 1, "tensors": [{"id": 0}], "ops": []})
    with pytest.raises(ProblemError, match="held bytes must be non-negative"):
        Problem([x], [], held=-1)


def test_solver_and_schedule_format_import_without_torch():
    code = ("import sys, monet.solver, monet.schedules; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_problem_written_elsewhere_solves(tmp_path):
    path = tmp_path / "problem.json"
    path.write_text(chain(6).to_json())
    code = ("import sys, json; from monet.solver import Problem, solve, simulate, keep_all; "
            f"p = Problem.from_json(open({str(path)!r}).read()); "
            "budget = int(0.7 * simulate(p, keep_all(p)).peak); s = solve(p, budget); "
            "print(json.dumps({'peak': s.peak, 'budget': budget, 'torch': 'torch' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    assert result["torch"] is False
    assert 0 < result["peak"] <= result["budget"]


def test_excluded_options_are_gone_and_the_rest_unchanged():
    """`without` takes options out of their choices (and their ops' impls); PyTorch's own option
    stays (a choice left with it alone is gone), and the solver then never picks what was taken out."""
    problem = relu_chain(4)
    lean = problem.without({"mask1": ["mask"], "mask2": ["sketch"], "nowhere": ["x"]})
    assert lean.choice_named["mask1"].options == ("output", "sketch")
    assert lean.choice_named["mask1"].approximate == ("sketch",)
    assert lean.choice_named["mask2"].options == ("output", "mask") and lean.choice_named["mask2"].approximate == ()
    assert lean.choice_named["algo0"] == problem.choice_named["algo0"]
    relu_b = lean.op_named("relu_b2")
    assert relu_b.impls == problem.op_named("relu_b2").impls[:2]
    assert [t.name for t in lean.tensors] == [t.name for t in problem.tensors]
    fast = problem.without({"algo0": ["lean"]})  # PyTorch's option alone: the choice is gone
    assert "algo0" not in fast.choice_named and fast.op_named("lin0").choice is None
    assert fast.op_named("lin0").impls == problem.op_named("lin0").impls[:1]
    with pytest.raises(ProblemError, match="leaves choice 'mask1' one option, under which 'pack1' does not run"):
        problem.without({"mask1": ["mask", "sketch"]})
    budget = simulate(problem, keep_all(problem)).peak * 8 // 10
    wanted = solve(problem, budget, time_limit=10, allow_approximate=True).schedule.options
    assert "sketch" in wanted.values(), wanted  # the solver takes sketches here when it may
    chosen = solve(problem.without({f"mask{i}": ["sketch"] for i in range(4)}), budget, time_limit=10,
                   allow_approximate=True).schedule.options
    assert "sketch" not in chosen.values(), chosen
