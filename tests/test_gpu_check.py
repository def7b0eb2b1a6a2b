"""benchmarks.gpu_check's solves stage, which runs here too: `monet solve` of each profiled model at each
budget in a process of its own, waited for with each one's outcome recorded (a budget below every
schedule is recorded with the solver's error, not raised)."""

import sys
from pathlib import Path

import monet
import monet.models

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/ is not a package
from benchmarks.gpu_check import Solves  # noqa: E402


def test_solves_run_beside_and_record_each_outcome(tmp_path):
    problem = tmp_path / "mlp.problem.json"
    monet.profile(monet.models.MLP(), (8, 32), cost_model="analytic").save(problem)
    records = {}
    solves = Solves()
    solves.start(tmp_path / "schedules", {"mlp": problem}, [100, 1], seconds=5)
    solves.wait(records.__setitem__)
    outcome = records["solves"]
    assert outcome["mlp-100"]["returncode"] == 0
    assert any(line.startswith("predicted peak") for line in outcome["mlp-100"]["summary"])
    assert (tmp_path / "schedules" / "mlp-100.json").is_file()
    assert outcome["mlp-1"]["returncode"] != 0
    assert any(line.startswith("error: budget") for line in outcome["mlp-1"]["summary"])
    assert not (tmp_path / "schedules" / "mlp-1.json").exists()
    solves.wait(records.__setitem__)  # nothing left to wait for: the record stands
    assert records["solves"] is outcome
