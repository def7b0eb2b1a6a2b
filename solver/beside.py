"""Neighbourhood searches beside the search, each in a process of its own (SolveSettings.workers).

HiGHS runs one solve at a time in a process (highspy), and its branch and bound uses one core,
so a second core would otherwise idle. Each worker runs the neighbourhood search of
solver/polish.py on the best schedule found so far: the search hands over every better schedule
it finds (HiGHS's incumbents, each rung's result), and a worker goes on from any that is faster
than its own; it sends back each faster schedule it finds, which the solve returns where it is the
fastest. A worker is a fresh interpreter (running `serve`), which needs no `if __name__ ==
"__main__"` guard in the caller's script, talks over one socket, runs in a session of its own
(Ctrl-C reaches the solve, which stops it) and exits at its deadline or when the solve goes away.
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


def _send(link: Connection, schedule: Schedule) -> None:
    try:
        link.send(schedule)
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

    def fresh() -> Schedule | None:
        """The newest schedule handed over since the last look (each is faster than those before);
        EOFError once the solve has gone."""
        newest = inbox.take()
        if not newest and not inbox.open:
            raise EOFError
        return newest[-1].remap(problem, posed) if newest else None

    def improved(schedule: Schedule, _replay: Replay) -> None:
        link.send(("schedule", unpose(schedule)))

    # Wait for a schedule, search from it until the deadline (or at once back here, for a start
    # the formulation cannot pose), and so on, while the solve is there.
    while time.perf_counter() < until - 1.0:
        start = fresh()
        if start is None:
            time.sleep(TICK)
            continue
        neighbourhood_search(formulation, start, budget, until, seed=settings.seed,
                             heuristic_effort=settings.heuristic_effort, improved=improved, fresh=fresh)


def serve(fd: int) -> None:
    """A worker's life, on the socket `fd` that Beside handed it."""
    link = Connection(fd)
    try:
        _work(link)
    except (EOFError, OSError):  # the solve ended before the deadline
        pass
