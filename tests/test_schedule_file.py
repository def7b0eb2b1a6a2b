"""The schedule file: versioned JSON, validated on load, written atomically."""

import json
import os

import pytest

from monet.schedules import (
    Decisions,
    GraphRecord,
    Inputs,
    InputSpec,
    Prediction,
    ScheduleFile,
    ScheduleFileError,
    SolverRecord,
    load_schedule,
)


def sample() -> ScheduleFile:
    return ScheduleFile(
        model="Net", input=Inputs.tensor(InputSpec((2, 3))), device="cpu", budget=1000,
        predicted=Prediction(900, 0.5, 1500, 0.4),
        solver=SolverRecord("compact", "optimal", gap=0.0), cost_model="analytic",
        graph=GraphRecord("abc", (("f", "aten.f", "forward"), ("b", "aten.b", "backward"))),
        schedule=Decisions({"f": 100}, ("b",)),
    )


def test_round_trip(tmp_path):
    path = sample().save(tmp_path / "deep" / "s.json")
    assert load_schedule(path) == sample()
    assert [p.name for p in path.parent.iterdir()] == ["s.json"]  # no temporary left behind


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = sample().save(tmp_path / "s.json")
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        sample().save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(version=7), "format version 7"),
    (lambda d: d.pop("format"), "not a monet schedule"),
    (lambda d: d["input"].update(shape=[0, 3]), "is corrupt: input shape must be positive integers"),
    (lambda d: d.update(device="tpu"), "corrupt at device"),
    (lambda d: d["schedule"].pop("backward"), "corrupt at schedule"),
    (lambda d: d["solver"].update(mip_gap=0.0), "corrupt at solver"),
    (lambda d: d["solver"].update(gap="small"), "corrupt at solver/gap"),
])
def test_bad_files_say_what_is_wrong(tmp_path, mutate, message):
    data = sample().to_dict()
    mutate(data)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ScheduleFileError, match=message):
        load_schedule(path)


def test_truncated_json_and_missing_files(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sample().to_dict())[:-20])
    with pytest.raises(ScheduleFileError, match="not valid JSON"):
        load_schedule(path)
    with pytest.raises(ScheduleFileError, match="not found"):
        load_schedule(tmp_path / "missing.json")


@pytest.mark.parametrize("mutate", [
    lambda d: d["predicted"].update(peak=d["predicted"]["peak"] // 2),
    lambda d: d["schedule"]["backward"].insert(0, "f"),  # a recomputation added
    lambda d: d.update(budget=d["budget"] + 1),
])
def test_an_edited_schedule_file_is_refused(tmp_path, mutate):
    path = sample().save(tmp_path / "s.json")
    assert load_schedule(path) == sample()
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ScheduleFileError, match="changed after monet wrote it"):
        load_schedule(path)
