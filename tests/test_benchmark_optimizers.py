"""benchmarks.optimizers at a tiny size: every run measured, monet's whole step at its predicted peak."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.optimizers import main  # noqa: E402


def test_the_seed_experiment_runs_and_monet_measures_its_prediction(tmp_path, capsys):
    pytest.importorskip("transformers")
    code = main(["--batch", "2", "--length", "32", "--precisions", "float32", "--steps", "1", "--budget", "50%",
                 "--time-limit", "10", "-o", str(tmp_path)])
    assert code == 0
    stem = tmp_path / "optimizers-distilbert-qa-b2-32-cpu"
    rows = json.loads(stem.with_suffix(".json").read_text())["rows"]
    assert [(r["optimizer"], r["method"]) for r in rows] == [
        (o, m) for o in ("sgd", "adam") for m in ("eager", "checkpointing", "monet")]
    for row in rows:
        assert row["peak"] > 0 and row["step"] > 0
        if row["method"] == "monet":  # the whole step, the optimizer's state and update included
            assert "50% infeasible: least peak" in row["note"]  # at this size parameters, gradients and state dominate
            assert abs(row["peak"] - row["predicted_peak"]) <= 0.03 * row["peak"], row
    adam_eager = next(r for r in rows if r["optimizer"] == "adam" and r["method"] == "eager")
    sgd_eager = next(r for r in rows if r["optimizer"] == "sgd" and r["method"] == "eager")
    assert adam_eager["peak"] > sgd_eager["peak"]  # Adam's two state tensors per parameter
    assert stem.with_suffix(".png").stat().st_size > 0 and "| adam | float32 | monet |" in stem.with_suffix(
        ".md").read_text()
