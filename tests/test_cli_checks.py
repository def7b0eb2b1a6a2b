"""The CLI checks every argument before any work, imports only what a command needs, and fails
with a line that says what to do (issue: trustworthy under real use)."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from monet.cli import _save, main
from monet.schedules import ScheduleFileError, load_schedule

TESTS = Path(__file__).parent
MONET = Path(sys.executable).parent / "monet"  # the console script, as a user runs it


def command(*argv, cwd=None, timeout=120):
    """The real `monet` command; stderr also lists every module imported (-X importtime)."""
    env = {**os.environ, "PYTHONPATH": str(TESTS), "PYTHONWARNINGS": ""}
    return subprocess.run([sys.executable, "-X", "importtime", str(MONET), *argv], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def imported(result) -> set[str]:
    return {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


def message(result) -> str:
    return "\n".join(line for line in result.stderr.splitlines() if not line.startswith("import time:"))


def test_help_imports_neither_torch_nor_highspy():
    result = command("--help")
    assert result.returncode == 0 and "solve" in result.stdout
    assert not {"torch", "highspy", "monet.graph"} & imported(result)


@pytest.mark.parametrize("budget", ["abc", "nan%", "-5%", "0"])
def test_a_bad_budget_fails_before_anything_is_traced(tmp_path, budget):
    result = command("solve", "cnn", "--input-shape", "8,3,32,32", f"--budget={budget}", "-o",
                     str(tmp_path / "s.json"))
    assert result.returncode == 2
    assert message(result).startswith("error: budget") and "Traceback" not in result.stderr
    assert "torch" not in imported(result)  # nothing was traced or profiled
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("output, says", [(".", "is a folder"), ("/sys/monet-test.json", "cannot be written")])
def test_an_unwritable_output_fails_before_anything_is_traced(tmp_path, output, says):
    result = command("solve", "cnn", "--input-shape", "8,3,32,32", "--budget", "50%", "-o", output, cwd=tmp_path)
    assert result.returncode == 2 and says in message(result) and "Traceback" not in result.stderr
    assert "torch" not in imported(result)


def test_other_arguments_are_checked_first(tmp_path):
    for argv, says in [(["--time-limit", "0"], "--time-limit"), (["--gap", "120"], "--gap"),
                       (["--heuristic-effort", "2"], "--heuristic-effort"), (["--polish", "1"], "--polish"),
                       (["--workers", "0"], "--workers"),
                       (["--formulation", "compact,exact"], "--formulation")]:
        result = command("solve", "cnn", "--input-shape", "8,3,32,32", "--budget", "50%", "-o", "s.json", *argv,
                         cwd=tmp_path)
        assert result.returncode == 2 and says in message(result) and "torch" not in imported(result)
    result = command("solve", "nomodel", "--input-shape", "8,3", "--budget", "50%", "-o", "s.json", cwd=tmp_path)
    assert result.returncode == 2 and "unknown model" in message(result) and "torch" not in imported(result)


def test_a_write_that_fails_after_the_solve_keeps_the_result_and_says_where(tmp_path):
    schedule = load_schedule("mobilenet_v2-b32-224-50pct")
    with pytest.raises(ScheduleFileError, match="the result is kept in") as info:
        _save(schedule, "/sys/monet-test.json")
    kept = Path(str(info.value).rsplit("kept in ", 1)[1])
    assert load_schedule(kept) == schedule
    kept.unlink()
    kept.parent.rmdir()


def test_schedule_files_are_readable_as_any_file(tmp_path):
    old = os.umask(0o022)
    try:
        path = load_schedule("mobilenet_v2-b32-224-50pct").save(tmp_path / "s.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_factory_in_the_current_folder_is_found(tmp_path):
    (tmp_path / "mynets.py").write_text("from monet.models import MLP\n\ndef net():\n    return MLP(8, 16, 2)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([str(MONET), "profile", "mynets:net", "--input-shape", "4,8", "--cost-model", "analytic",
                             "-o", "p.json"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "p.json").read_text())["meta"]["model"] == "MLP"
    result = subprocess.run([str(MONET), "profile", "othernets:net", "--input-shape", "4,8", "-o", "p2.json"],
                            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 2 and f"in the current folder ({tmp_path})" in result.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is here")
def test_cuda_on_a_machine_without_it_is_a_clear_error(tmp_path, capsys):
    code = main(["solve", "cnn", "--input-shape", "8,3,32,32", "--budget", "50%", "-o", str(tmp_path / "s.json"),
                 "--device", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and "--device cuda" in err and "use --device cpu" in err


def test_install_hints_are_printed_as_written(tmp_path, capsys):
    code = main(["profile", "factories:needs_extra", "--input-shape", "4,8", "-o", str(tmp_path / "p.json")])
    assert code == 2 and "pip install 'monet[transformers]'" in capsys.readouterr().err


def test_a_model_in_eval_mode_is_solved_for_training_with_a_warning(tmp_path, capsys):
    code = main(["solve", "factories:eval_mlp", "--input-shape", "4,8", "--budget", "100%", "-o",
                 str(tmp_path / "s.json"), "--cost-model", "analytic", "--time-limit", "10"])
    err = capsys.readouterr().err
    assert code == 0 and "warning:" in err and "eval mode" in err and "train mode" in err


def test_a_model_in_another_dtype_is_named_as_such(tmp_path):
    import torch
    from factories import tiny_mlp

    from monet import MONeTWrapper, ScheduleMismatchError, solve

    model = tiny_mlp()
    schedule = solve(model, (4, 8), "100%", cost_model="analytic", time_limit=10)
    with pytest.raises(ScheduleMismatchError, match="float32 parameters, but this model's are float64"):
        MONeTWrapper(model.double(), schedule, (4, 8))
    MONeTWrapper(model.to(torch.float32), schedule, (4, 8))  # as solved: accepted


def test_calling_the_wrapper_under_autocast_is_refused_not_wrong():
    import torch
    from factories import tiny_mlp

    from monet import MONeTWrapper, ScheduleMismatchError, solve

    model = tiny_mlp()
    wrapped = MONeTWrapper(model, solve(model, (4, 8), "100%", cost_model="analytic", time_limit=10), (4, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ScheduleMismatchError, match="autocast"):
        wrapped(torch.randn(4, 8))
    wrapped(torch.randn(4, 8)).sum().backward()  # outside autocast it trains
