"""Ctrl-C stops a solve at once, HiGHS included: through the real `monet` command, and through
monet.solver in a process of its own (SIGINT sent to a real subprocess, never to pytest's)."""

import dataclasses
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from synthetic import chain

from monet.schedules import ProblemFile
from monet.solver import keep_all, least_peak, simulate

MONET = Path(sys.executable).parent / "monet"  # the console script, as a user runs it
TESTS = Path(__file__).parent


def hard_problem_file(path: Path) -> int:
    """A problem file whose ILP HiGHS works on for minutes (40 layers, the general formulation, no
    gap allowed), and a budget a little above its least peak, where the search is hardest."""
    problem = chain(40)
    meta = {"model": "Chain40", "input": {"shape": [1], "dtype": "float32", "requires_grad": False},
            "device": "cpu", "cost_model": "analytic", "torch": "2.13.0", "fingerprint": "synthetic-chain-40"}
    ProblemFile(dataclasses.replace(problem, meta=meta), implementations=False).save(path)
    least = least_peak(problem, time_limit=10).found
    return least + (simulate(problem, keep_all(problem)).peak - least) // 5


def read_until(process: subprocess.Popen, marker: str, timeout: float) -> list[str]:
    """Lines of the process's stderr up to the first that starts with `marker`."""
    lines, selector = [], selectors.DefaultSelector()
    selector.register(process.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if selector.select(timeout=0.2):
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith(marker):
                return lines
    raise AssertionError(f"no {marker!r} line in {timeout} s; stderr so far: {lines}")


def test_ctrl_c_stops_monet_solve_mid_highs_in_one_line_and_writes_nothing(tmp_path):
    budget = hard_problem_file(tmp_path / "chain.json")
    out = tmp_path / "out.json"
    process = subprocess.Popen(
        [sys.executable, str(MONET), "solve", "--problem", str(tmp_path / "chain.json"), "--budget", str(budget),
         "-o", str(out), "--gap", "0", "--time-limit", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": ""})
    try:
        before = read_until(process, "solving", timeout=60)  # stderr is no terminal: one line per stage
        time.sleep(1.0)  # HiGHS is in its branch and bound by now
        assert process.poll() is None, "the solve ended before Ctrl-C; the test needs a harder problem"
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=10)
        seconds = time.monotonic() - sent
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert seconds < 2.0, f"{seconds:.2f} s from SIGINT to exit"
    assert stderr.splitlines() == ["interrupted; nothing written"], stderr  # one line after the stages
    assert stdout == "" and "Traceback" not in "".join(before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.json"]  # no schedule, no temporary file


CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
from synthetic import chain
from monet.solver import solve
from monet.solver.milp import stopping
budget = int(sys.argv[1])
def progress(stage, done, total, detail):
    if stage == "solving" and done > 1.0 and not progress.said:
        progress.said = True
        print("solving", flush=True)
progress.said = False
try:
    solve(chain(40), budget, gap=0, time_limit=300, progress=progress)
    print("finished")
except KeyboardInterrupt:
    print("interrupted", time.monotonic(), stopping(), flush=True)
"""


def test_ctrl_c_raises_keyboardinterrupt_from_the_solver_at_once(tmp_path):
    """The library: KeyboardInterrupt reaches the caller while HiGHS runs, HiGHS is cancelled, and
    the process then exits cleanly (a HiGHS still stopping is waited for, not aborted)."""
    budget = hard_problem_file(tmp_path / "chain.json")
    process = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=str(TESTS)), str(budget)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "solving\n"
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    word, raised, _ = stdout.split()
    assert word == "interrupted" and float(raised) - sent < 1.5, stdout  # TICK + GRACE: 0.6 s, and a busy machine
    assert "Traceback" not in stderr and "terminate" not in stderr
