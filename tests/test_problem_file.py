"""Profile once, solve anywhere: `monet profile` writes the traced and measured problem, `monet solve
--problem` and `monet pareto --problem` solve it without the model, and the schedule runs in
MONeTWrapper on the model it was profiled from (and only there)."""

import copy
import csv
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import gradient_errors

import monet
from monet.api import solve_traced
from monet.cli import main
from monet.memory import PeakMemory, resident_bytes
from monet.models import MLP
from monet.schedules import (
    PROBLEM_FILE_VERSION,
    Inputs,
    InputSpec,
    ProblemFile,
    ProblemFileError,
    ScheduleFileError,
    load_problem,
    load_schedule,
)
from monet.solver import Problem

SHAPE = (512, 32)
MODEL = "test_problem_file:small_net"  # tests/ is on sys.path (conftest)


def small_net(depth: int = 12) -> MLP:
    """A 12-layer MLP (ReLU, dropout): its 60 % schedule solves in seconds."""
    torch.manual_seed(0)
    return MLP(hidden=64, depth=depth)


_PROFILED = {}


def profiled() -> ProblemFile:
    """The small MLP profiled once for the module (analytic costs: the same on every run)."""
    if "mlp" not in _PROFILED:
        _PROFILED["mlp"] = monet.profile(small_net(), SHAPE, cost_model="analytic", input_requires_grad=True)
    return _PROFILED["mlp"]


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_problem_round_trips_through_its_file(tmp_path):
    made = profiled()
    assert made.model == "MLP" and made.input == Inputs.tensor(InputSpec(SHAPE, "float32", True))
    assert made.device == "cpu" and made.cost_model == "analytic" and made.implementations
    assert made.problem.choices, "the MLP's ReLUs and dropout have other ways to run"
    path = made.save(tmp_path / "deep" / "mlp.problem.json")
    assert [p.name for p in path.parent.iterdir()] == ["mlp.problem.json"]  # no temporary left behind
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # a file like any other, not mkstemp's 0600
    back = load_problem(path)
    assert back == made and back.problem == made.problem  # tensors, ops (costs included), choices
    assert back.problem.meta == made.problem.meta and back.digest == made.digest
    assert back.problem.to_dict() == made.problem.to_dict()
    assert made.save(tmp_path / "again.json").read_bytes() == path.read_bytes()  # deterministic
    data = json.loads(path.read_text())
    assert data["format"] == "monet.problem" and data["version"] == PROBLEM_FILE_VERSION
    assert data["meta"]["fingerprint"] == made.fingerprint and data["digest"].startswith("sha256:")
    assert Problem.from_dict({**data["problem"], "meta": data["meta"]}) == made.problem
    assert "held" not in data["problem"]  # nothing on CPU; on CUDA the cuBLAS workspaces
    held = ProblemFile(dataclasses.replace(made.problem, held=33554432), made.implementations)
    assert load_problem(held.save(tmp_path / "held.json")).problem.held == 33554432


def test_profile_solve_problem_then_train_like_pytorch(tmp_path, capsys):
    """The real CLI: profile the model, solve from the file alone, run the schedule on the model."""
    problem_path, out = tmp_path / "mlp.problem.json", tmp_path / "mlp-60.json"
    code, printed, err = cli(capsys, "profile", MODEL, "--input-shape", "512,32", "--input-requires-grad",
                             "--cost-model", "analytic", "-o", problem_path)
    assert code == 0, err
    assert f"wrote {problem_path}" in printed and "graph fingerprint" in printed
    made = load_problem(problem_path)
    assert made.model == "MLP" and made.cost_model == "analytic" and made.input.single.requires_grad
    code, printed, err = cli(capsys, "solve", "--problem", problem_path, "--budget", "60%", "-o", out,
                             "--time-limit", "30")
    assert code == 0, err
    assert "wrote" in printed and out.exists()
    schedule = load_schedule(out)
    assert schedule.graph.fingerprint == made.fingerprint and schedule.solver.problem == made.digest
    assert schedule.model == "MLP" and schedule.input == made.input and schedule.cost_model == "analytic"
    assert schedule.predicted.peak <= schedule.budget == int(0.6 * schedule.predicted.unconstrained_peak)
    forward = {name for name, _, phase in schedule.graph.ops if phase == "forward"}
    assert any(name in forward for name in schedule.schedule.backward), "60 % needs recomputation"

    model = small_net()  # the same model, built again where it trains
    reference = copy.deepcopy(model)
    wrapped = monet.MONeTWrapper(model, out, SHAPE)
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))
    errors = gradient_errors(wrapped, model, reference, x)
    assert errors.pop("output") < 1e-6
    assert max(errors.values()) <= 1e-5, errors
    target = torch.randint(0, 10, (SHAPE[0],), generator=torch.Generator().manual_seed(2))
    for _ in range(2):  # the first step and a steady one
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        with PeakMemory("cpu", resident_bytes(model, xi)) as meter:
            out = wrapped(xi)  # the caller holds the output to the end of the step, as predicted
            F.cross_entropy(out, target).backward()
            del out
        # measured = predicted, but for the loss scalar the caller makes (the prediction leaves it out)
        assert 0 <= meter.peak - schedule.predicted.peak <= 16, (meter.peak, schedule.predicted.peak)
        del xi


def test_solved_from_the_file_is_solved_directly(tmp_path):
    """The same problem gives the same schedule, read from its file or solved where it was traced."""
    made = profiled()
    path = made.save(tmp_path / "mlp.problem.json")
    for budget, implementations in (("60%", True), ("70%", False)):
        direct = solve_traced(made.problem, budget, "MLP", implementations=implementations, time_limit=30)
        from_file = monet.solve_problem_file(path, budget, implementations=implementations, time_limit=30)
        assert from_file.schedule == direct.schedule  # options, saved tensors, backward sequence
        assert from_file.predicted == direct.predicted and from_file.budget == direct.budget
        assert from_file.graph == direct.graph
        assert from_file.model == direct.model and from_file.device == direct.device
        assert from_file.input == direct.input
        assert dataclasses.replace(from_file.solver, solve_time_s=None, problem=None) == \
            dataclasses.replace(direct.solver, solve_time_s=None)
        assert from_file.solver.problem == made.digest
        saved = from_file.save(tmp_path / f"{budget[:-1]}.json")
        assert load_schedule(saved) == from_file  # the same schedule format, valid


def test_solving_a_problem_file_needs_no_torch(tmp_path):
    """A fresh interpreter in which torch cannot be imported reads the file, solves and writes the
    schedule: through the API, and through `monet solve --problem`."""
    path = profiled().save(tmp_path / "mlp.problem.json")
    out, by_cli = tmp_path / "mlp-70.json", tmp_path / "mlp-70-cli.json"
    script = f"""
import sys


class NoTorch:  # `import torch` raises ModuleNotFoundError, as where torch is not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)


sys.meta_path.insert(0, NoTorch())
from monet.api import solve_problem_file
from monet.schedules import load_problem
made = load_problem({str(path)!r})
schedule = solve_problem_file(made, "70%", time_limit=30)
schedule.save({str(out)!r})
from monet.cli import main
code = main(["solve", "--problem", {str(path)!r}, "--budget", "70%", "--time-limit", "30", "-o", {str(by_cli)!r}])
assert code == 0, code
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "monet"))
print("modules:", loaded)
assert not any(m.startswith(("torch", "monet.graph", "monet.wrapper", "monet.runtime")) for m in loaded), loaded
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    schedule = load_schedule(out)
    assert schedule.graph.fingerprint == profiled().fingerprint
    assert schedule.predicted.peak <= schedule.budget
    assert load_schedule(by_cli).schedule == schedule.schedule
    monet.MONeTWrapper(small_net(), out, SHAPE)  # and it loads where the model is


def test_a_problem_of_another_model_gives_a_schedule_the_wrapper_refuses(tmp_path):
    schedule = monet.solve_problem_file(profiled().save(tmp_path / "mlp.problem.json"), "100%", time_limit=20)
    with pytest.raises(monet.ScheduleMismatchError, match=r"different graph: MLP with \d+ ops.*first difference"):
        monet.MONeTWrapper(small_net(depth=8), schedule, SHAPE)
    with pytest.raises(monet.ScheduleMismatchError, match=r"input x has shape \(256, 32\), but the "
                                                              r"schedule was made for shape \(512, 32\)"):
        monet.MONeTWrapper(small_net(), schedule, (256, 32))


def _rewrite(data: dict) -> None:
    """Keep the file consistent (a fresh digest) after an edit, as a careful forger would."""
    from monet.schedules import problem_digest

    data["digest"] = problem_digest(Problem.from_dict({**data["problem"], "meta": data["meta"]}))


def _slower(data: dict) -> None:
    data["problem"]["ops"][3]["time"] *= 2


def _reads_unknown(data: dict) -> None:
    data["problem"]["ops"][3]["inputs"] = [10**6]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(version=PROBLEM_FILE_VERSION + 1), "version 2, newer than this monet reads"),
    (lambda d: d.update(version=0), "version 0, but this monet reads version 1; profile the model again"),
    (lambda d: d.pop("format"), "not a monet problem file"),
    (lambda d: d.update(format="monet.schedule"), "is a monet schedule, not a problem file"),
    (lambda d: d["meta"].update(device="tpu"), "corrupt at meta/device"),
    (lambda d: d["problem"]["ops"][3].update(time=-1.0), "corrupt at problem/ops/3/time"),
    (lambda d: d["problem"]["tensors"][0].pop("bytes"), "corrupt at problem/tensors/0"),
    (_slower, "was changed after monet wrote it"),
    (lambda d: (_slower(d), _rewrite(d)), None),  # edited and resealed: it loads, with the new cost
    (_reads_unknown, "inconsistent problem: op .* reads unknown tensor 1000000"),
])
def test_bad_problem_files_say_what_is_wrong(tmp_path, mutate, message):
    data = profiled().to_dict()
    mutate(data)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    if message is None:
        assert load_problem(path).problem.ops[3].time == 2 * profiled().problem.ops[3].time
        return
    with pytest.raises(ProblemFileError, match=message) as info:
        load_problem(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ScheduleFileError)  # what the CLI reports as a clean error


def test_truncated_missing_and_non_json_problem_files(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profiled().to_dict())[:-40])
    with pytest.raises(ProblemFileError, match=r"p.json is not valid JSON .*corrupt"):
        load_problem(path)
    path.write_bytes(b"\x89PNG\r\n\x1a\n\0\0")
    with pytest.raises(ProblemFileError, match="not valid JSON"):
        load_problem(path)
    with pytest.raises(ProblemFileError, match="not found"):
        load_problem(tmp_path / "missing.json")
    code, _, err = cli(capsys, "solve", "--problem", path, "--budget", "50%", "-o", tmp_path / "s.json")
    assert code == 2 and "not valid JSON" in err and not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["solve", "--budget", "50%", "-o", "s.json"], "takes a MODEL to trace here or --problem FILE"),
    (["solve", "mlp", "--problem", "p.json", "--budget", "50%", "-o", "s.json"], "not both"),
    (["solve", "mlp", "--budget", "50%", "-o", "s.json"], "takes its inputs from one of --input-shape"),
    (["solve", "--problem", "p.json", "--input-shape", "8,32", "--budget", "50%", "-o", "s.json"],
     "--input-shape cannot go with --problem"),
    (["solve", "--problem", "p.json", "--cost-model", "analytic", "--budget", "50%", "-o", "s.json"],
     "--cost-model cannot go with --problem"),
    (["pareto", "--problem", "p.json", "--device", "cuda"], "--device cannot go with --problem"),
    (["pareto"], "takes a MODEL to trace here or --problem FILE"),
])
def test_model_or_problem_argument_errors(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    profiled().save(tmp_path / "p.json")
    code, _, err = cli(capsys, *argv)
    assert code == 2
    assert message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]  # nothing written


def test_pareto_from_a_problem_file(tmp_path, capsys):
    path = profiled().save(tmp_path / "mlp.problem.json")
    code, printed, err = cli(capsys, "pareto", "--problem", path, "--budgets", "60%,80%",
                             "--strategies", "monet,chen-greedy,keep-all", "--time-limit", "20",
                             "-o", tmp_path / "sweep")
    assert code == 0, err
    with open(tmp_path / "sweep" / "pareto.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["strategy"], r["budget_pct"]) for r in rows] == [
        ("monet", "60.0"), ("monet", "80.0"), ("chen-greedy", "60.0"), ("chen-greedy", "80.0"), ("keep-all", "")]
    monet_rows = [r for r in rows if r["strategy"] == "monet"]
    assert all(r["status"] == "optimal" and int(r["peak"]) <= int(r["budget"]) for r in monet_rows)
    direct = solve_traced(profiled().problem, "60%", "MLP", time_limit=20)
    assert float(monet_rows[0]["time"]) == pytest.approx(direct.predicted.time, rel=1e-9)
    assert "MLP 512x32, cpu, analytic costs" in (tmp_path / "sweep" / "pareto.md").read_text()
