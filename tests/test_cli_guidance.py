"""Hard budgets through the real command: when the search finds nothing, monet says what would
work (the least peak found, a budget from which a schedule is sure, more time), and a heuristic
result says what it is, how far from the bound, and what would help."""

import dataclasses
import json
import re

from synthetic import chain, random_dag

from monet.cli import main
from monet.schedules import ProblemFile
from monet.solver import keep_all, least_peak, simulate


def problem_file(problem, path, name: str) -> tuple[int, int]:
    """Write `problem` as a problem file; (its least peak, its unconstrained peak)."""
    meta = {"model": name, "input": {"shape": [1], "dtype": "float32", "requires_grad": False},
            "device": "cpu", "cost_model": "analytic", "torch": "2.13.0", "fingerprint": f"synthetic-{name}"}
    ProblemFile(dataclasses.replace(problem, meta=meta), implementations=False).save(path)
    return least_peak(problem, time_limit=10).found, simulate(problem, keep_all(problem)).peak


def solve(capsys, path, budget, out, *options):
    code = main(["solve", "--problem", str(path), "--budget", str(budget), "-o", str(out), *options])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_no_schedule_in_time_says_what_would_work_and_that_budget_works(tmp_path, capsys):
    problem_file(chain(60), tmp_path / "chain.json", "Chain60")
    # schedules down to 1501 exist (found in 60 s), every heuristic one needs 1700; at 1600 neither the
    # least-peak search nor the ILP finds one in a second (about 12 s together here; on chain(40) the
    # least-peak search finds one within the second)
    budget = 1600
    code, out, err = solve(capsys, tmp_path / "chain.json", budget, tmp_path / "out.json", "--time-limit", "1")
    assert code == 2 and out == "", err
    message = " ".join(err.split())  # as one line, whatever the terminal's width
    assert "found no schedule within 1 s" in message and "--time-limit" in message
    sure = int(re.search(r"a budget of at least (\d+) bytes", message)[1])
    found = int(re.search(r"the least peak found(?: is|,) (\d+) bytes", message)[1])
    assert found <= sure and sure > budget
    assert ("schedules within this budget exist" in message) == (found <= budget)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.json"]
    # the budget it names gives a schedule, in the same second
    code, out, _ = solve(capsys, tmp_path / "chain.json", sure, tmp_path / "out.json", "--time-limit", "1")
    assert code == 0 and "wrote" in out
    predicted = json.loads((tmp_path / "out.json").read_text())["predicted"]
    assert predicted["peak"] <= sure


def test_a_heuristic_result_says_so_how_far_from_its_bound_and_what_would_help(tmp_path, capsys):
    problem = random_dag(1, 80)
    least, full = problem_file(problem, tmp_path / "dag.json", "Dag80")
    # just above the least peak the compact formulation's memory rows, which count conservatively,
    # admit nothing, while the heuristic's schedule fits when replayed
    code, out, err = solve(capsys, tmp_path / "dag.json", least + (full - least) // 20, tmp_path / "out.json",
                           "--time-limit", "10")
    assert code == 0, err
    solver = json.loads((tmp_path / "out.json").read_text())["solver"]
    assert solver["status"] == "heuristic" and solver["gap"] > 0
    note = " ".join(out[out.index("note:"):].split())
    assert note.startswith("note: this is the heuristic's starting schedule")
    assert f"its step time is {solver['gap']:.0%} above the bound" in note
    assert "What would help: a higher budget, --formulation general or a longer --horizon" in note
    assert solver["note"].endswith("a higher budget, `formulation='general'` or a longer `horizon`")  # library terms


def test_budget_least_solves_at_the_least_peak_and_nothing_below_it_fits(tmp_path, capsys):
    """`--budget least`: the schedule file is solved at the least peak the search proves (recorded as
    `least`), far below the unconstrained peak. The ILP's rows count with a safety margin (1e-5, a byte
    here), so the schedule there peaks a byte lower: at that peak the simulator's verdict stands and the
    search's schedule comes back; a byte below it, the same command says that is below that peak."""
    least, full = problem_file(chain(30), tmp_path / "chain.json", "Chain30")
    code, out, err = solve(capsys, tmp_path / "chain.json", "least", tmp_path / "least.json", "--time-limit", "10")
    assert code == 0, err
    written = json.loads((tmp_path / "least.json").read_text())
    assert written["solver"]["least"] is True
    peak = written["predicted"]["peak"]
    assert written["budget"] == least and least - 1 <= peak <= least < full / 4
    code, out, err = solve(capsys, tmp_path / "chain.json", peak, tmp_path / "at.json", "--time-limit", "10")
    assert code == 0 and json.loads((tmp_path / "at.json").read_text())["predicted"]["peak"] == peak, err
    code, out, err = solve(capsys, tmp_path / "chain.json", peak - 1, tmp_path / "below.json", "--time-limit", "10")
    assert code == 2 and f"below the least feasible peak {peak} B" in " ".join(err.split()), err
    assert not (tmp_path / "below.json").exists()
