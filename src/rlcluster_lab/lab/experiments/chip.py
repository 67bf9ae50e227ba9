"""The chip's own figures: a weight sync to a second mesh on one chip beside one ``jax.device_put``
of the same tree, the anchor's re-pin, and an offload to pinned host memory and back, in ms and GB/s.

On an accelerator they are measured now (``measure``). Anywhere else the figures of the last chip
run are shown (read from ``STORED``), labelled with the chip, the date and the commit they were measured at;
where no chip run is stored with this version, the same operations are measured now on one CPU
device and say so (a CPU's "host link" is a copy within RAM, so they show the mechanism, not a
chip's speed). The stored file is written on a chip by
``python -m rlcluster_lab.lab.experiments.chip --save PATH --commit SHA``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STORED = Path(__file__).with_name("data") / "chip_figures.json"
REPEATS = 10
SYNC, ANCHOR, FLOOR, PROGRAM = (
    "sync_weights to a second mesh on the device",
    "the sync's anchor re-pin to pinned host",
    "one jax.device_put of the same tree",
    "one compiled copy of the same tree",
)


@dataclasses.dataclass(frozen=True)
class ChipFigures:
    """What was measured on one device (one row per operation), and where the figures come from."""

    device: str  # core.devices.devices_words: "TPU v5 lite chip 0", or "1 CPU device" with no chip at hand
    model_size: str
    date: str
    commit: str | None
    live: bool  # measured in this process (False: read from the stored chip run)
    rows: tuple[dict[str, Any], ...]  # operation, bytes, ms (median), GB/s

    @property
    def source(self) -> str:
        """Where the rows come from, in one line."""
        if not self.live:
            at = f", commit {self.commit}" if self.commit else ""
            return f"stored: measured on {self.device} on {self.date}{at} (this process has no accelerator)"
        measured = f"measured now on {self.device} (median of {REPEATS} after 2 untimed)"
        if "CPU" in self.device:
            return f"{measured}: no accelerator here and no chip run stored, so a CPU's copies within RAM"
        return measured

    def row(self, operation: str) -> dict[str, Any]:
        """The row of ``operation`` (one of ``SYNC``, ``ANCHOR``, ``FLOOR``, or an offload row)."""
        return next(r for r in self.rows if r["operation"] == operation)

    def summary(self) -> str:
        """The sync against its floors and the anchor's share, read from the rows themselves."""
        from rlcluster_lab.core.limits import fmt_bytes

        sync, anchor, floor = self.row(SYNC), self.row(ANCHOR), self.row(FLOOR)
        program = next((r for r in self.rows if r["operation"] == PROGRAM), None)  # runs stored before it: none
        beside = f" and {sync['ms'] / program['ms']:.1f}x one compiled copy ({program['ms']} ms)" if program else ""
        return (
            f"The sync took {sync['ms']} ms, {sync['ms'] / floor['ms']:.1f}x one device_put of the same "
            f"{fmt_bytes(floor['bytes'])} ({floor['ms']} ms){beside}; the anchor's re-pin of "
            f"{fmt_bytes(anchor['bytes'])} to pinned host, timed apart, took {anchor['ms']} ms."
        )

    def table(self) -> str:
        """The rows as text, under their source."""
        from rlcluster_lab.lab.experiments.runs import format_table

        return f"{self.model_size} preset, {self.source}\n" + format_table(list(self.rows))

    def to_json(self) -> dict[str, Any]:
        """The figures as saved by ``--save`` (``live`` is not saved: a reader is never live)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "live"}
        return out | {"rows": list(self.rows)}


def chip_figures(accelerators: Sequence[Any], model_size: str | None = None) -> ChipFigures:
    """Measured on the first of ``accelerators`` when there is one, else the stored chip run, else
    measured on one CPU device (labelled so).

    Args:
        accelerators: the real accelerator devices (``rl.setup().accelerator_devices``).
        model_size: the preset to measure now (the stored run is of the preset it names); by
            default ``large`` on a chip and ``small`` on a CPU, where building and timing the
            large preset keeps a reader waiting for half a minute to show copies within RAM.
    """
    if accelerators:
        return measure(accelerators[0], model_size or "large")
    if STORED.exists():  # as saved by ``--save``
        data = json.loads(STORED.read_text(encoding="utf-8"))
        return ChipFigures(**{**data, "rows": tuple(data["rows"]), "live": False})
    import jax

    return measure(jax.devices("cpu")[0], model_size or "small")


def measure(device: Any, model_size: str = "large", commit: str | None = None) -> ChipFigures:
    """Time a sync, its floor, the anchor's re-pin and an offload on ``device``.

    The cluster is the reshaped layout over ``device`` alone: the rollout's mesh is a second
    ``Mesh`` over the same device, so P1 sees another mesh and the rollout holds its own copy
    (P3). Its engine is the vllm stand-in, which keeps weights of its own (P7): a sync is a real
    copy on the device. (The built-in sampler would be handed the actor's own buffers, since a
    ``device_put`` to an identical sharding keeps them, and its sync would copy nothing.)
    """
    import jax
    from flax import nnx

    from rlcluster_lab.app.scenario import Scenario, build_cluster
    from rlcluster_lab.core.devices import devices_words
    from rlcluster_lab.measure.sync import median_seconds, sync_floor
    from rlcluster_lab.placement.place import put_on_memory_kind

    cluster = build_cluster(Scenario(layout="reshaped", engine="vllm", model_size=model_size), devices=[device])
    leaves = jax.tree.leaves(nnx.state(cluster.actor_model, nnx.Param))
    size = sum(x.nbytes for x in leaves)
    rows = []

    def row(what: str, seconds: float, nbytes: int) -> None:
        rate = round(nbytes / seconds / 1e9, 2) if seconds > 0 else float("inf")
        rows.append({"operation": what, "bytes": nbytes, "ms": round(seconds * 1e3, 2), "GB/s": rate})

    for _ in range(2):
        cluster.sync_weights()
    syncs = [cluster.sync_weights() for _ in range(REPEATS)]
    row(SYNC, statistics.median(s.seconds for s in syncs), syncs[-1].synced_bytes)
    # P13 re-pins the anchor in pinned host memory after the handover; the sync's own time leaves it out.
    row(ANCHOR, statistics.median(s.anchor_seconds for s in syncs), syncs[-1].anchor_bytes)
    # The floors (measure.sync.sync_floor): new buffers in the rollout's shardings, as the sync made them.
    floor = sync_floor(cluster, syncs[-1], REPEATS)
    device_put, program = floor["device_put"], floor["compiled copy"]
    assert device_put is not None and program is not None  # one device: one program takes both meshes
    row(FLOOR, device_put, size)
    row(PROGRAM, program, size)
    host = put_on_memory_kind(leaves, "pinned_host")
    for what, move in (
        ("offload: device -> pinned host", lambda: put_on_memory_kind(leaves, "pinned_host")),
        ("back: pinned host -> device", lambda: put_on_memory_kind(host, "device")),
    ):
        row(what, median_seconds(move, REPEATS), size)
    return ChipFigures(
        device=devices_words([device]),
        model_size=model_size,
        date=datetime.date.today().isoformat(),
        commit=commit,
        live=True,
        rows=tuple(rows),
    )


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
