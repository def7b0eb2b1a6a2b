"""benchmarks.distributed at a tiny size: every method's ranks run, monet's under DDP at its predicted peak."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.distributed import gpt2, main  # noqa: E402


def test_ddp_and_fsdp2_ranks_run_and_monet_measures_its_prediction(tmp_path):
    pytest.importorskip("transformers")
    code = main(["--layers", "2", "--batch", "1", "--length", "128", "--steps", "1", "--time-limit", "10",
                 "--timeout", "240", "-o", str(tmp_path)])
    assert code == 0
    stem = tmp_path / "distributed-gpt2-2layers-2x1-128-cpu"
    rows = json.loads(stem.with_suffix(".json").read_text())["rows"]
    assert [(r["parallel"], r["method"]) for r in rows] == [
        (p, m) for p in ("ddp", "fsdp2") for m in ("eager", "checkpointing", "monet")]
    # FSDP2 over gloo holds a block's gathered parameters longer in some runs than in others: six runs of
    # plain FSDP2 with checkpointing at this size measured per-rank peaks of 25,358,816 and 28,517,856 B, a
    # full benchmark run once 31,676,896 B: steps of exactly one block's parameters (3,159,040 B, 12 % of the
    # peak here)
    late = 2 * sum(p.numel() * p.element_size() for p in gpt2(2).transformer.h[0].parameters())
    for row in rows:
        assert row["peak"] > 0 and row["step"] > 0
        if (row["parallel"], row["method"]) == ("fsdp2", "monet"):  # the whole step predicted; at this size
            # FSDP2's buffers and the parameters dominate: the ranks measured 6.2 % over the prediction when
            # written, and once in CI a block's parameters more (the 3 % target is tested at a real size,
            # where a block's parameters are 0.7 % of the peak, in tests/test_distributed.py)
            assert -0.10 * row["peak"] <= row["peak"] - row["predicted_peak"] <= 0.10 * row["peak"] + late, row
        elif row["method"] == "monet":  # every rank measured within 3 % of the prediction for its shard
            assert abs(row["peak"] - row["predicted_peak"]) <= 0.03 * row["peak"], row
    assert "| ddp | monet |" in stem.with_suffix(".md").read_text()
