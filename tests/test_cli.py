"""The `monet` command: solve, pareto, inspect and demo, and its errors."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from monet.cli import main
from monet.pareto import STRATEGIES


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_solve_then_inspect(tmp_path, capsys):
    path = tmp_path / "mlp.json"
    code, out, _ = run(capsys, "solve", "factories:small_mlp", "--input-shape", "1024,32", "--budget", "60%",
                       "-o", str(path), "--cost-model", "analytic", "--time-limit", "10")
    assert code == 0, out
    data = json.loads(path.read_text())
    assert data["format"] == "monet.schedule" and data["input"]["shape"] == [1024, 32]
    assert data["predicted"]["peak"] <= data["budget"] == int(0.6 * data["predicted"]["unconstrained_peak"])
    assert "predicted peak" in out and f"wrote {path}" in out
    code, out, _ = run(capsys, "inspect", str(path))
    assert code == 0
    assert "kept for the backward" in out and "recomputed in the backward" in out


def test_ablation_compares_with_checkpointing_alone(tmp_path, capsys):
    path = tmp_path / "mlp.json"
    code, out, _ = run(capsys, "solve", "factories:small_mlp", "--input-shape", "1024,32", "--budget", "60%",
                       "-o", str(path), "--cost-model", "analytic", "--time-limit", "8", "--ablation")
    assert code == 0, out
    assert "joint" in out and "checkpointing alone" in out
    options = json.loads(path.read_text())["schedule"]["options"]
    # packed dropout or ReLU masks, ReLUs in place, or dropout replayed (a chain schedule over the MLP's layers)
    assert options and set(options.values()) <= {"bits", "mask", "in", "replay"}
    code, out, _ = run(capsys, "inspect", str(path))
    assert f"run otherwise than PyTorch: {len(options)} ops: " in out
    code, _, err = run(capsys, "solve", "factories:small_mlp", "--input-shape", "1024,32", "--budget", "60%",
                       "-o", str(path), "--ablation", "--checkpointing-only")
    assert code == 2 and "give one of them" in err


def test_pareto_sweeps_every_strategy_and_writes_table_and_plot(tmp_path, capsys):
    code, out, _ = run(capsys, "pareto", "factories:small_mlp", "--input-shape", "1024,32", "--budgets", "50%:70%:20%",
                       "--cost-model", "analytic", "--time-limit", "10", "-o", str(tmp_path))
    assert code == 0, out
    with open(tmp_path / "pareto.csv") as f:
        rows = list(csv.DictReader(f))
    by_strategy = {}
    for row in rows:
        by_strategy.setdefault(row["strategy"], []).append(row)
    assert set(by_strategy) == set(STRATEGIES)
    assert [int(r["budget"]) for r in by_strategy["monet"]] == [int(r["budget"]) for r in by_strategy["checkmate"]]
    assert len(by_strategy["monet"]) == 2 and len(by_strategy["keep-all"]) == 1
    for row in by_strategy["monet"] + by_strategy["monet-checkpointing"]:
        assert row["status"] in ("optimal", "time_limit") and int(row["peak"]) <= int(row["budget"])
    monet = {r["budget"]: float(r["time"]) for r in by_strategy["monet"]}
    for row in by_strategy["chen-greedy"] + by_strategy["checkmate"]:
        if row["peak"] and int(row["peak"]) <= int(row["budget"]):
            assert monet[row["budget"]] <= float(row["time"]) * (1 + 1e-3)  # the gap monet stops at
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| monet |" in (tmp_path / "pareto.md").read_text()
    assert "wrote" in out and not list(tmp_path.glob(".*tmp"))


def test_infeasible_budget_fails_cleanly_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "out.json"
    code, _, err = run(capsys, "solve", "factories:small_mlp", "--input-shape", "1024,32", "--budget", "1MiB",
                       "-o", str(path), "--cost-model", "analytic", "--time-limit", "10")
    assert code == 2
    assert "raise the budget to at least" in err
    assert not path.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["solve", "cnn", "--input-shape", "8,3,32,32", "--budget", "lots", "-o", "x.json"], "budget 'lots'"),
    (["solve", "nosuchmodel", "--input-shape", "8,3", "--budget", "50%", "-o", "x.json"], "unknown model"),
    (["solve", "cnn", "--input-shape", "8,3,32", "--budget", "50%", "-o", "x.json", "--cost-model", "analytic"],
     "could not trace"),
    (["inspect", "no-such-schedule"], "not found"),
])
def test_errors_say_what_to_do(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err


def test_bad_arguments_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as info:
        main(["solve", "cnn", "--input-shape", "8,a", "--budget", "50%", "-o", "x.json"])
    assert info.value.code == 2
    assert "comma-separated integers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["solve", "cnn", "--input-shape", "8,3,32,32", "--budget", "50%", "-o", "x.json", "--horizon", "soon"])
    assert info.value.code == 2
    assert "'none' or 'auto'" in capsys.readouterr().err
    code, _, err = run(capsys, "pareto", "cnn", "--input-shape", "8,3,32,32", "--budgets", "50%:30%:10%")
    assert code == 2 and "START <= END" in err


def test_demo_prints_the_comparison(capsys):
    code, out, _ = run(capsys, "demo", "--input-shape", "16,3,32,32", "--steps", "1", "--cost-model", "analytic")
    assert code == 0
    for row in ("PyTorch", "monet 100%", "monet 50%", "measured", "overhead", "solve"):
        assert row in out
    assert "…" not in out  # nothing cut short on an 80-column terminal


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "monet"  # installed next to this interpreter
    assert exe.exists(), f"no monet command in {exe.parent}"
    result = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "demo" in result.stdout and "solve" in result.stdout
