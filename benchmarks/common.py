"""Shared set-up for the benchmark scripts: devices, timing, tables, plots."""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rlcluster_lab.devices import ensure_simulated_devices


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--sizes", default="tiny,small,base,large", help="comma-separated model sizes")
    p.add_argument("--layouts", default="colocated,reshaped,split", help="comma-separated layouts")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per case (median is reported)")
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (ignored on GPU/TPU)")
    p.add_argument("--out", default="benchmarks/results", help="folder for the PNG plots")
    return p


def setup(args: argparse.Namespace) -> None:
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


def save_bar_plot(path: str, labels: Sequence[str], series: dict[str, Sequence[float]], ylabel: str, title: str,
                  hline: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6, 0.6 * len(labels) + 2), 4))
    ax = fig.add_subplot()
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(labels))], values, width, label=name)
    ax.set_xticks([j + width * (n - 1) / 2 for j in range(len(labels))], labels, rotation=45, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if hline is not None:
        ax.axhline(hline, color="black", linestyle="--", linewidth=1)
    if n > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
