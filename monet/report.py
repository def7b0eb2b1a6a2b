"""Result tables as files: CSV, a markdown table and a line plot (PNG), each written atomically.

`monet pareto` (monet/pareto.py) and the benchmark (benchmarks/report.py) both write through here;
each says what its rows, cells and lines are.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from monet.schedules import write_atomic


def write_report(out_dir: str | Path, stem: str, rows: list[dict], markdown: str, png: bytes, *,
                 header: dict | None = None) -> list[Path]:
    """STEM.json (`header` and the rows; only with a header), STEM.csv (the rows), STEM.md and STEM.png
    in `out_dir`; the paths written."""
    out_dir = Path(out_dir)
    paths = []
    if header is not None:
        paths.append(write_atomic(out_dir / f"{stem}.json", json.dumps({**header, "rows": rows}, indent=1) + "\n"))
    return paths + [write_atomic(out_dir / f"{stem}.csv", csv_text(rows)),
                    write_atomic(out_dir / f"{stem}.md", markdown),
                    write_atomic(out_dir / f"{stem}.png", png)]


def csv_text(rows: list[dict]) -> str:
    """The rows as CSV, with the first row's keys as columns (keys it lacks are left out); lists are
    joined by ';'."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]), extrasaction="ignore")
    writer.writeheader()
    writer.writerows({k: (";".join(v) if isinstance(v, list) else v) for k, v in r.items()} for r in rows)
    return text.getvalue()


def markdown_table(title: str, columns: Sequence[str], cells: Iterable[Sequence[str]], *,
                   intro: str | None = None, align: Sequence[str] | None = None) -> str:
    """'### title', `intro` as a paragraph, then the table; `align` per column ('---', '---:')."""
    lines = [f"### {title}", ""] + ([intro, ""] if intro else [])
    lines += ["| " + " | ".join(columns) + " |", "|" + "".join(f"{a}|" for a in align or ["---"] * len(columns))]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def line_plot(lines: dict[str, list[tuple[float, float]]], *, title: str, xlabel: str, ylabel: str,
              figsize: tuple[float, float], empty: str, style: Callable[[str], dict] | None = None,
              title_size: float | None = None, legend_size: float | None = None) -> bytes:
    """A PNG: one line per label through its points in ascending order (a label without points
    shows in the legend as 'label: `empty`'); `style(label)` gives matplotlib's line keywords
    (default: marker 'o')."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=figsize, dpi=120)
    for label, points in lines.items():
        if points:
            ax.plot(*zip(*sorted(points), strict=True), label=label, **(style(label) if style else {"marker": "o"}))
        else:
            ax.plot([], [], label=f"{label}: {empty}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, **({} if title_size is None else {"fontsize": title_size}))
    ax.grid(alpha=0.3)
    ax.legend(**({} if legend_size is None else {"fontsize": legend_size}))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def bar_plot(panels: dict[str, dict[str, float]], *, title: str, figsize: tuple[float, float]) -> bytes:
    """A PNG of side-by-side bar charts: one per panel (its title names the quantity), one bar per label."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=figsize, dpi=120, squeeze=False)
    for ax, (name, bars) in zip(axes[0], panels.items(), strict=True):
        ax.barh(list(bars), list(bars.values()), color="tab:blue")
        ax.invert_yaxis()
        ax.set_title(name)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()
