"""Shared set-up for the benchmark scripts: devices, timing, tables, plots, child processes, and
the rows each benchmark gives docs/performance.md."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--sizes", default="tiny,small,base,large", help="comma-separated model sizes")
    p.add_argument("--layouts", default="colocated,reshaped,split", help="comma-separated layouts")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per case (median is reported)")
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (ignored on GPU/TPU)")
    p.add_argument("--out", default="benchmarks/results", help="folder for the PNG plots")
    add_row_options(p)
    return p


def setup(args: argparse.Namespace) -> None:
    from rlcluster_lab.core.devices import ensure_simulated_devices

    ensure_simulated_devices(args.devices)
    os.makedirs(args.out, exist_ok=True)


def cases(args: argparse.Namespace) -> Iterator[tuple[str, str, bool]]:
    """(model size, layout, LoRA) for every case the flags ask for."""
    for size in args.sizes.split(","):
        for layout in args.layouts.split(","):
            for lora in (False, True):
                yield size, layout, lora


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` after ``warmup`` untimed calls (compilation)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def save_bar_plot(
    path: str,
    labels: Sequence[str],
    series: dict[str, Sequence[float]],
    ylabel: str,
    title: str,
    hline: float | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6, 0.6 * len(labels) + 2), 4))
    ax = fig.add_subplot()
    _bars(ax, labels, series, ylabel, title, [(hline, None)] if hline is not None else [])
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def save_bar_panels(path: str, panels: Sequence[dict[str, Any]], ncols: int = 2) -> None:
    """Several bar charts in one PNG. Each panel: ``labels``, ``series`` ({name: values}; NaN for
    a missing value), ``ylabel``, ``title``, optional ``hlines`` ([(y, label or None)]) and ``logy``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    nrows = max(1, -(-len(panels) // ncols))
    widest = max((len(p["labels"]) for p in panels), default=1)
    fig = Figure(figsize=(ncols * max(6, 0.55 * widest + 2), nrows * 4.5))
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        _bars(ax, panel["labels"], panel["series"], panel["ylabel"], panel["title"], panel.get("hlines", []))
        if panel.get("logy"):
            ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _bars(
    ax: Any,
    labels: Sequence[str],
    series: dict[str, Sequence[float]],
    ylabel: str,
    title: str,
    hlines: Sequence[tuple[float, str | None]],
) -> None:
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(labels))], values, width, label=name)
    ax.set_xticks([j + width * (n - 1) / 2 for j in range(len(labels))], labels, rotation=45, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    for k, (y, label) in enumerate(hlines):
        ax.axhline(y, color="black", linestyle=("--", ":", "-.")[k % 3], linewidth=1, label=label)
    if n > 1 or any(label for _, label in hlines):
        ax.legend()


# ------------------------------------------------------------------ child processes

RESULT_MARKER = "@@RESULT@@ "


def run_process(
    argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 600, cwd: str | None = None
) -> dict[str, Any]:
    """Run ``argv`` to completion; its wall time (as seen from here), exit code, stdout and stderr.

    ``env`` entries are added to this process's environment. Never raises for a
    failing or hanging command: ``rc`` is None and ``timed_out`` True after ``timeout``.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    start = time.perf_counter()
    try:
        proc = subprocess.run(list(argv), env=full_env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:

        def text(b: Any) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        return {
            "rc": None,
            "timed_out": True,
            "wall_s": time.perf_counter() - start,
            "stdout": text(exc.stdout),
            "stderr": text(exc.stderr),
        }
    return {
        "rc": proc.returncode,
        "timed_out": False,
        "wall_s": time.perf_counter() - start,
        "stdout": proc.stdout,
        "stderr": proc.stderr,
    }


def run_python_child(code: str, **kwargs: Any) -> dict[str, Any]:
    """``run_process([sys.executable, "-c", code])``, plus ``result``: the JSON object of the last
    line the child printed starting with ``RESULT_MARKER`` (None when there is none)."""
    proc = run_process([sys.executable, "-c", code], **kwargs)
    proc["result"] = None
    for line in reversed(proc["stdout"].splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                proc["result"] = json.loads(line[len(RESULT_MARKER) :])
            except ValueError:
                pass
            break
    return proc


def tail(text: str, lines: int = 20) -> str:
    return "\n".join((text or "").rstrip().splitlines()[-lines:])


# ------------------------------------------------------------------ the page's rows
# Each benchmark prints the rows of docs/performance.md it measured, one JSON object a line after
# ROW_MARKER, and with ``--save-row PATH`` merges them into PATH (docs/performance_rows.json), from
# which ``python benchmarks/page.py`` writes the page. A row: which figure (``key``, ``area``,
# ``figure``), on which machine, its runs (each a ``value``, a number or a [low, high] spread,
# and the text ``shown``), the target (None, ``{"at_most": x}`` or ``{"ends": True}``: a run's
# ``ok`` says whether it got there), the date, the commit measured and the command that measured it.

ROW_MARKER = "page row: "


def add_row_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--save-row", metavar="PATH", default="", help="merge this run's page rows into PATH (JSON)")


def machine(platform: str, kind: str | None = None, count: int = 1) -> str:
    """The machine a row was measured on, in the page's words: ``2-core CPU``, ``one TPU v5e chip``."""
    if platform == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return f"{cores}-core CPU"
    name = {"TPU v5 lite": "TPU v5e"}.get(kind or "", kind or platform.upper())
    return f"one {name} chip" if count == 1 else f"{count} {name} chips"


def run_value(value: float | Sequence[float], shown: str, **extra: Any) -> dict[str, Any]:
    """One run of a figure: its number (or [low, high] over the run's repeats) and its text."""
    rounded = [float(f"{v:.4g}") for v in value] if isinstance(value, Sequence) else float(f"{value:.4g}")
    return {"value": rounded, "shown": shown, **extra}


def at_most(limit: float, shown: str) -> dict[str, Any]:
    return {"at_most": limit, "shown": shown}


def page_row(
    key: str, area: str, figure: str, where: str, run: dict[str, Any], target: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A row of the page measured now, by the command this process runs, at the commit checked out."""
    return {
        "key": key,
        "area": area,
        "figure": figure,
        "machine": where,
        "runs": [run],
        "target": target,
        "date": datetime.date.today().isoformat(),
        "commit": commit_measured(),
        "command": command_line(),
    }


def commit_measured() -> str:
    """The commit checked out, with ``+changes`` when src/ or benchmarks/ differ from it."""
    head = run_process(["git", "rev-parse", "--short", "HEAD"], cwd=str(REPO), timeout=30)["stdout"].strip()
    dirty = run_process(["git", "status", "--porcelain", "--", "src", "benchmarks"], cwd=str(REPO), timeout=30)
    return (head or "unknown") + ("+changes" if dirty["stdout"].strip() else "")


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that reproduces this run: this script and its flags, without ``--save-row``."""
    argv = list(sys.argv if argv is None else argv)
    kept, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg == "--save-row":
            skip = True
        elif not arg.startswith("--save-row="):
            kept.append(arg)
    script = Path(argv[0]).resolve()
    where = script.relative_to(REPO) if script.is_relative_to(REPO) else Path(argv[0])
    return shlex.join(["python", where.as_posix(), *kept])


def emit_rows(rows: Sequence[dict[str, Any]], save: str = "") -> None:
    """Print ``rows``; with ``save``, merge them into that JSON file (``merge_rows``)."""
    for row in rows:
        print(ROW_MARKER + json.dumps(row), flush=True)
    if save and rows:
        path = Path(save)
        stored = json.loads(path.read_text(encoding="utf-8"))["rows"] if path.exists() else []
        path.write_text(json.dumps({"rows": merge_rows(stored, rows)}, indent=1) + "\n", encoding="utf-8")
        print(f"saved {len(rows)} row(s) into {path}")


def merge_rows(stored: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``stored`` with ``new`` in: a row of the same figure on the same machine is replaced, or, when
    it was measured by the same command at the same commit, given this run beside its own."""
    out = [dict(r) for r in stored]
    for row in new:
        same = [i for i, r in enumerate(out) if (r["key"], r["machine"]) == (row["key"], row["machine"])]
        if not same:
            out.append(dict(row))
            continue
        old = out[same[0]]
        if (old["commit"], old["command"]) == (row["commit"], row["command"]):
            out[same[0]] = dict(row, runs=[*old["runs"], *row["runs"]], date=old["date"])
        else:
            out[same[0]] = dict(row)
    return out
