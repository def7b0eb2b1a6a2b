"""Neighbourhood searches beside the search, each in a process of its own (SolveSettings.workers).

HiGHS runs one solve at a time in a process (highspy), and its branch and bound uses one core,
so a second core would otherwise idle. Each worker runs the neighbourhood search of
solver/polish.py on the best schedule found so far: the search hands over every better schedule
it finds (HiGHS's incumbents, each rung's result), and a worker goes on from the fastest of those
once its own path stalls (polish.PATIENCE); it sends back each faster schedule it finds, which the
solve returns where it is the fastest. Where no schedule within the budget is at hand and the
search seeks one (its least-peak search), each worker seeks one too, with a seed of its own, until
either side finds one: whether one is found in time varies with the seed (MONeT's UNet at 5 GB,
45 s: two seeds of four found one, in 39-41 s). A worker is a fresh interpreter (running `serve`),
which needs no `if __name__ == "__main__"` guard in the caller's script, talks over one socket,
runs in a session of its own (Ctrl-C reaches the solve, which stops it) and exits at its deadline
or when the solve goes away.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, Pipe

from .polish import neighbourhood_search
from .problem import Problem
from .schedule import Schedule
from .simulate import Replay, simulate

TICK = 0.1  # seconds a worker waits between looks for its first schedule
SERVE = "import sys; from monet.solver.beside import serve; serve(int(sys.argv[1]))"  # a worker's program


class Beside:
    """`workers` neighbourhood searches of `problem` within `budget` bytes, for `seconds` from now."""

    def __init__(self, problem: Problem, budget: int, settings, workers: int, seconds: float):
        self.problem, self.budget = problem, budget
        self.best: tuple[Schedule, Replay] | None = None  # the fastest schedule seen, from either side
        self.found = False  # whether a worker found `best`
        self.bound = float("inf")  # a lower bound on any schedule's time: the workers' LP relaxation
        self._links: list[tuple[subprocess.Popen, Connection]] = []
        self._inbox = _Inbox()
        for i in range(workers):
            ours, theirs = Pipe()
            process = subprocess.Popen([sys.executable, "-c", SERVE, str(theirs.fileno())],
                                       pass_fds=[theirs.fileno()], start_new_session=True)
            theirs.close()
            ours.send((problem, budget, settings.but(seed=settings.seed + 1 + i, workers=1), seconds))
            self._inbox.listen(ours)
            self._links.append((process, ours))

    def offer(self, schedule: Schedule, replay: Replay | None = None) -> None:
        """A schedule the search found: the workers go on from it where it is the fastest yet."""
        replay = replay or simulate(self.problem, schedule)
        if replay.peak <= self.budget and (self.best is None or replay.time < self.best[1].time):
            self.best, self.found = (schedule, replay), False
            for _, link in self._links:
                _send(link, schedule)

    def seek(self, settings, start: Schedule | None) -> None:
        """The search has no schedule within the budget and seeks one: a least-peak search as `settings`
        (a SolveSettings of one formulation) say, from `start` (a schedule over the budget, or None).
        Each worker runs one too, with its own seed, until a schedule within the budget is at hand."""
        for _, link in self._links:
            _send(link, ("seek", settings, start))

    def fastest(self) -> tuple[Schedule, Replay] | None:
        """The fastest schedule seen so far, after what the workers sent."""
        for kind, value in self._inbox.take():
            if kind == "bound":
                self.bound = min(self.bound, value)
                continue
            schedule, replay = value, simulate(self.problem, value)
            if replay.peak <= self.budget and (self.best is None or replay.time < self.best[1].time):
                self.best, self.found = (schedule, replay), True
        return self.best

    def close(self) -> None:
        for process, link in self._links:
            link.close()
            process.kill()
            process.wait()
        self._links = []

    def __enter__(self) -> Beside:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Inbox:
    """What the other side sent, read as it arrives by a thread per connection, so that no sender ever
    waits for a full socket while its reader is busy."""

    def __init__(self):
        self._lock = threading.Lock()
        self._messages: list = []
        self.open = True  # until a connection closes

    def listen(self, link: Connection) -> None:
        threading.Thread(target=self._read, args=(link,), daemon=True).start()

    def _read(self, link: Connection) -> None:
        try:
            while True:
                message = link.recv()
                with self._lock:
                    self._messages.append(message)
        except (EOFError, OSError):  # the other side, or this one, closed it
            self.open = False

    def take(self) -> list:
        with self._lock:
            messages, self._messages = self._messages, []
        return messages


def _send(link: Connection, message) -> None:
    try:
        link.send(message)
    except OSError:  # the worker ended (its deadline): nothing to tell it
        pass


def _work(link: Connection) -> None:
    """One worker: the neighbourhood search, from the first schedule handed over, until the deadline."""
    from .solve import neighbourhoods

    problem, budget, settings, seconds = link.recv()
    until = time.perf_counter() + seconds
    inbox = _Inbox()
    inbox.listen(link)
    formulation, posed, unpose, bound = neighbourhoods(problem, budget, settings)
    link.send(("bound", bound))
    schedules: list[Schedule] = []  # handed over, not yet taken
    seeks: list[tuple] = []  # ("seek", settings, start): the search seeks a first schedule

    def look() -> None:
        """What arrived since the last look; EOFError once the solve has gone."""
        newest = inbox.take()
        if not newest and not inbox.open:
            raise EOFError
        schedules.extend(m for m in newest if isinstance(m, Schedule))
        seeks.extend(m for m in newest if not isinstance(m, Schedule))

    def fresh() -> Schedule | None:
        """The newest schedule handed over since the last look (each is faster than those before)."""
        look()
        newest = schedules[-1].remap(problem, posed) if schedules else None
        schedules.clear()
        return newest

    def improved(schedule: Schedule, _replay: Replay) -> None:
        link.send(("schedule", unpose(schedule)))

    # Wait for a schedule (seeking one where the search does), search from it until the deadline (or
    # at once back here, for a start the formulation cannot pose), and so on, while the solve is there.
    while time.perf_counter() < until - 1.0:
        start = fresh()
        if start is not None:
            seeks.clear()  # a schedule is at hand: no one seeks any more
        elif seeks:
            _, seeking, given = seeks.pop()
            seeks.clear()
            found = _seek(problem, budget, seeking.but(seed=settings.seed), given, look, lambda: bool(schedules))
            if found is not None:
                link.send(("schedule", found))
                start = found.remap(problem, posed)
        if start is None:
            time.sleep(TICK)
            continue
        neighbourhood_search(formulation, start, budget, until, seed=settings.seed,
                             heuristic_effort=settings.heuristic_effort, improved=improved, fresh=fresh)


class _Arrived(Exception):
    """A schedule within the budget arrived from the other side while this one sought one."""


def _seek(problem: Problem, budget: int, settings, start: Schedule | None, look, arrived) -> Schedule | None:
    """A least-peak search as `settings` say, from `start`, stopped at its first schedule within `budget`
    (which it returns) or where `arrived()` says one came from elsewhere after `look()` (None)."""
    from .result import SolverFailedError
    from .solve import least_peak

    def watch(*_) -> None:
        look()
        if arrived():
            raise _Arrived

    try:
        least = least_peak(problem, settings, target=budget, start=start, progress=watch)
    except (_Arrived, SolverFailedError):
        return None
    return least.schedule if least.schedule is not None and simulate(problem, least.schedule).peak <= budget else None


def serve(fd: int) -> None:
    """A worker's life, on the socket `fd` that Beside handed it."""
    link = Connection(fd)
    try:
        _work(link)
    except (EOFError, OSError):  # the solve ended before the deadline
        pass
