"""The command line's progress display, and how a command ends on Ctrl-C.

The display is a plain callback, progress(stage, done, total, detail="") (see monet.api), so that
the solver and the tracer know nothing of rich. In a terminal it is one transient line: the stage,
a bar where its length is known, its detail (while solving: the best schedule so far, its gap and
the seconds left) and the time spent in the stage. Elsewhere (a pipe, a log) each stage is
printed once, as it starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

INTERRUPTED = "interrupted; nothing written"
INTERRUPTED_STATUS = 130  # 128 + SIGINT: what shells report for a command Ctrl-C stopped

Callback = Callable[..., None]  # progress(stage, done, total, detail="")

_written: list[Path] = []  # what the command has written since its work began (see wrote)


@contextlib.contextmanager
def progress_display(console: Console) -> Iterator[Callback]:
    """A progress callback that shows on `console` while the block runs (and is gone after it).
    A command's files are written after its work, so the work's start also starts the record of
    what it wrote (see wrote)."""
    _written.clear()
    if not console.is_terminal:
        yield _stage_lines(console)
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("", total=None, detail="")
        shown = None

        def update(stage: str, done: float, total: float | None, detail: str = "") -> None:
            nonlocal shown
            if stage != shown:  # a new stage: its own bar and clock
                bar.reset(task, total=total, description=stage)
                shown = stage
            if not detail and total is not None:
                detail = f"{done:g}/{total:g}"
            bar.update(task, completed=done, total=total, detail=detail)

        yield update


def _stage_lines(console: Console) -> Callback:
    shown = None

    def update(stage: str, done: float, total: float | None, detail: str = "") -> None:
        nonlocal shown
        if stage != shown:
            console.print(f"{stage} ...", markup=False, highlight=False)
            shown = stage

    return update


def wrote(path: str | os.PathLike) -> Path:
    """Record that the command wrote `path`, for what a Ctrl-C after it says; returns the path."""
    _written.append(Path(path))
    return Path(path)


def interrupted(console: Console) -> int:
    """After Ctrl-C: say so in one line on `console`, and return the exit status (130).

    Files are written after the work, atomically, so a Ctrl-C during the work leaves none (one
    after a file was written says which). If HiGHS, which runs in a thread of its own, was
    cancelled but has not stopped yet (some steps of its search look for a cancellation only every
    few seconds), the process ends here at once: finalising the interpreter under it would abort
    the process when HiGHS next calls into Python."""
    milp = sys.modules.get("monet.solver.milp")  # loaded if anything was solved
    with _ignoring_sigint():  # a second Ctrl-C while this ends changes nothing
        written = ", ".join(map(str, _written))
        console.print(f"interrupted after writing {written}" if written else INTERRUPTED, markup=False,
                      highlight=False, soft_wrap=True)
        if milp is not None and milp.stopping():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(INTERRUPTED_STATUS)
    return INTERRUPTED_STATUS


@contextlib.contextmanager
def _ignoring_sigint() -> Iterator[None]:
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
