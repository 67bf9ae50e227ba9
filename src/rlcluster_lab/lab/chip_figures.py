"""The chip's own figures: a weight sync to a second mesh on one chip beside one ``jax.device_put``
of the same tree, and an offload to pinned host memory and back, in ms and GB/s.

On an accelerator they are measured now (``measure``); anywhere else the figures of the last chip
run are shown (``stored``), labelled with the chip, the date and the commit they were measured at,
so a reader on a laptop sees what the chip does and where the numbers come from. The stored file
is written on the chip by ``python -m rlcluster_lab.lab.chip_figures --save PATH --commit SHA``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

STORED = Path(__file__).with_name("data") / "chip_figures.json"
REPEATS = 10


@dataclasses.dataclass(frozen=True)
class ChipFigures:
    """What was measured on one chip (one row per operation), and where the figures come from."""

    device: str  # "TPU v5e chip 0"
    model_size: str
    date: str
    commit: str | None
    live: bool  # measured in this process (False: read from the stored chip run)
    rows: tuple[dict[str, Any], ...]  # operation, bytes, ms (median), GB/s

    @property
    def source(self) -> str:
        if self.live:
            return f"measured now on {self.device} (median of {REPEATS} after 2 untimed)"
        at = f", commit {self.commit}" if self.commit else ""
        return f"stored: measured on {self.device} on {self.date}{at} (this process has no accelerator)"

    def table(self) -> str:
        """The rows as text, under their source."""
        from rlcluster_lab.lab.experiments import format_table

        return f"{self.model_size} preset, {self.source}\n" + format_table(list(self.rows))

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("live")
        out["rows"] = list(self.rows)
        return out


def chip_figures(accelerators: Sequence[Any], model_size: str = "large") -> ChipFigures:
    """Measured on the first of ``accelerators`` when there is one, else the stored chip run.

    Args:
        accelerators: the real accelerator devices (``rl.setup().accelerator_devices``).
        model_size: the preset to measure (a live run only; the stored run is of ``large``).
    """
    if accelerators:
        return measure(accelerators[0], model_size)
    return stored()


def stored(path: Path = STORED) -> ChipFigures:
    """The figures of the last chip run, as saved by ``--save``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return ChipFigures(**{**data, "rows": tuple(data["rows"]), "live": False})


def measure(device: Any, model_size: str = "large", commit: str | None = None) -> ChipFigures:
    """Build a cluster whose rollout is a second mesh over ``device`` alone (the reshaped layout on
    one chip: P1 sees another mesh, so the rollout holds its own copy), then time on it: the steady
    sync, one ``jax.device_put`` of the actor's parameters onto the rollout's shardings (the floor
    for that move), and the actor's parameters to pinned host memory and back (P14's offload)."""
    import jax
    from flax import nnx

    from rlcluster_lab.app.scenario import Scenario, build_cluster
    from rlcluster_lab.placement.place import put_on_memory_kind

    cluster = build_cluster(Scenario(layout="reshaped", model_size=model_size), devices=[device])
    params = nnx.state(cluster.actor_model, nnx.Param)
    leaves = jax.tree.leaves(params)
    size = sum(x.nbytes for x in leaves)
    shardings = [x.sharding for x in cluster.rollout.held_values((nnx.Param,))]
    rows = []

    def row(what: str, seconds: float, nbytes: int = size) -> None:
        rows.append({"operation": what, "bytes": nbytes, "ms": round(seconds * 1e3, 2), "GB/s": _rate(nbytes, seconds)})

    for _ in range(2):
        cluster.sync_weights()
    syncs = [cluster.sync_weights() for _ in range(REPEATS)]
    row("sync_weights to a second mesh on the chip", statistics.median(s.seconds for s in syncs))
    # P13's re-pin of the anchor to pinned host, which the sync's own time leaves out.
    row("the sync's anchor re-pin to pinned host", statistics.median(s.anchor_seconds for s in syncs))
    row("one jax.device_put of the same tree", _median(lambda: jax.device_put(leaves, shardings)))
    host = put_on_memory_kind(leaves, "pinned_host")
    row("offload: device -> pinned host", _median(lambda: put_on_memory_kind(leaves, "pinned_host")))
    row("back: pinned host -> device", _median(lambda: put_on_memory_kind(host, "device")))
    return ChipFigures(
        device=f"{getattr(device, 'device_kind', device.platform)} chip {device.id}",
        model_size=model_size,
        date=datetime.date.today().isoformat(),
        commit=commit,
        live=True,
        rows=tuple(rows),
    )


def _median(fn: Callable[[], Any]) -> float:
    import jax

    for _ in range(2):
        jax.block_until_ready(fn())
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rate(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 2) if seconds > 0 else float("inf")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure the chip's figures and save them for CPU readers.")
    parser.add_argument("--save", type=Path, default=STORED, help="where to write the figures (JSON)")
    parser.add_argument("--commit", default=None, help="the commit measured (recorded beside the figures)")
    parser.add_argument("--model-size", default="large")
    args = parser.parse_args(argv)
    import jax

    chips = [d for d in jax.devices() if d.platform != "cpu"]
    if not chips:
        parser.error("no accelerator in this process: the chip's figures are measured on a chip")
    figures = measure(chips[0], args.model_size, args.commit)
    print(figures.table())
    args.save.parent.mkdir(parents=True, exist_ok=True)
    args.save.write_text(json.dumps(figures.to_json(), indent=2) + "\n", encoding="utf-8")
    print(f"saved {args.save}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
