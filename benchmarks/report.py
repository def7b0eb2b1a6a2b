"""Benchmark results as files: CSV, JSON, a markdown table and a Pareto plot per model (written by
monet.report, as `monet pareto`'s are).

A row is one competitor at one budget, measured: peak memory (the project's meter) and median
step time. For each monet row the table names the competitors that reached no higher a peak in
less time (`beaten by`), so that where monet is not the fastest at its peak the table says so.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch

from monet.report import bar_plot, line_plot, markdown_table, write_report
from monet.solver import format_bytes

COLUMNS = ("competitor", "budget", "status", "predicted peak", "measured peak", "peak vs eager", "step",
           "step vs eager", "beaten by")


def machine(device: str) -> str:
    """The machine, in words: CPU model and cores, or the GPU's name; torch's version."""
    cpu = f"CPU: {_cpu_name()}, {torch.get_num_threads()} threads"
    where = torch.cuda.get_device_name() if device == "cuda" else cpu
    return f"{where}; torch {torch.__version__}"


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.processor())


def beaten_by(row: dict, rows: list[dict]) -> list[str]:
    """Competitors that measured no higher a peak than `row` and a shorter step."""
    if row.get("measured_peak") is None:
        return []
    return [r["name"] for r in rows if r is not row and r.get("measured_peak") is not None
            and r["measured_peak"] <= row["measured_peak"] and r["step_time_s"] < row["step_time_s"]]


def write_model(out_dir: Path, tag: str, header: dict, rows: list[dict]) -> list[Path]:
    """TAG.json (header and rows), TAG.csv (rows), TAG.md (table), TAG.png (Pareto plot)."""
    return write_report(out_dir, tag, rows, markdown(header, rows), plot(header, rows), header=header)


def markdown(header: dict, rows: list[dict]) -> str:
    eager = next((r for r in rows if r["competitor"] == "eager" and r.get("measured_peak")), None)
    return markdown_table(header["title"], COLUMNS, (_cells(r, eager) for r in rows),
                          intro=f"{header['machine']}. {header['settings']}")


def _cells(r: dict, eager: dict | None) -> list[str]:
    measured = r.get("measured_peak") is not None

    def vs(key: str) -> str:
        return f"{r[key] / eager[key]:.0%}" if measured and eager else "-"

    status = r["status"] if len(r["status"]) < 60 else r["status"][:57] + "..."
    return [r["competitor"], "-" if r["budget_pct"] is None else f"{r['budget_pct']:.0f} %", status,
            format_bytes(r["predicted_peak"]) if r.get("predicted_peak") else "-",
            format_bytes(r["measured_peak"]) if measured else "-", vs("measured_peak"),
            f"{r['step_time_s'] * 1e3:.1f} ms" if measured else "-", vs("step_time_s"),
            ", ".join(r.get("beaten_by") or []) or ("-" if r["competitor"].startswith("monet") else "")]


def plot(header: dict, rows: list[dict]) -> bytes:
    """Measured peak against measured step time, one line (or point) per competitor."""
    lines = {family: [(r["measured_peak"] / 2**20, r["step_time_s"] * 1e3) for r in rows
                      if r["competitor"] == family and r.get("measured_peak") is not None]
             for family in dict.fromkeys(r["competitor"] for r in rows)}
    return line_plot(lines, title=header["title"], xlabel="measured peak memory (MiB)",
                     ylabel="median step time (ms)", figsize=(7.5, 4.8), empty="none", title_size=10,
                     legend_size=8, style=lambda family: ({"marker": "*", "markersize": 12} if family == "eager"
                                                          else {"marker": "o", "markersize": 6}))


def peak_step_plot(rows: dict[str, dict], *, title: str, figsize: tuple[float, float],
                   peak: str = "peak (MiB)") -> bytes:
    """A PNG of two bar charts, measured peak (MiB) and step time (s), one bar per labelled row."""
    return bar_plot({peak: {label: r["peak"] / 2**20 for label, r in rows.items()},
                     "step (s)": {label: r["step"] for label, r in rows.items()}}, title=title, figsize=figsize)
