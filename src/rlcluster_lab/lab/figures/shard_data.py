"""Shards you can see: one array's shards as boxes, and one sync's bytes per pair of devices.

Plain data for ``figures.shard`` and notebook 05, read from what exists, never assumed from
a partition spec: ``shard_layout`` reads a live array's ``addressable_shards`` (a replicated
box shows up once per device that holds it, as JAX stores it); ``sync_flows`` reads a sync
report's per-leaf ``pieces`` (L3), which the reshard logged as it ran. Bytes are physical
(every device's copy counted) unless a name says logical (each element once).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from rlcluster_lab.measure.sync import describe_sharding, flat_leaves
from rlcluster_lab.placement.boxes import Box, to_box
from rlcluster_lab.placement.transfers import shard_key

HOWS: tuple[str, ...] = ("moved", "copied", "reused")


@dataclasses.dataclass(frozen=True, order=True)
class Shard:
    """One addressable shard: its device, the box of the global array it holds, its buffer's bytes
    (ordered by device, then box: a device holds one shard of an array)."""

    device: int
    box: Box
    nbytes: int


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """How one array is cut over its devices, as read from the live array.

    ``mesh`` and ``spec`` describe a ``NamedSharding`` (empty for another
    kind of sharding); they label the figure, the boxes come from the shards.
    """

    label: str
    shape: tuple[int, ...]
    dtype: str
    mesh: str
    spec: str
    shards: tuple[Shard, ...]

    @property
    def physical_bytes(self) -> int:
        """Every shard's buffer counted: a box held by four devices counts four times."""
        return sum(s.nbytes for s in self.shards)

    @property
    def logical_bytes(self) -> int:
        """The array counted once."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(sorted({s.device for s in self.shards}))

    def boxes(self) -> dict[Box, tuple[int, ...]]:
        """Each distinct box, with the devices holding a copy of it (sorted)."""
        out: dict[Box, list[int]] = {}
        for s in self.shards:
            out.setdefault(s.box, []).append(s.device)
        return {box: tuple(sorted(devs)) for box, devs in sorted(out.items())}

    @property
    def replicas(self) -> int:
        """How many devices hold each element (physical / logical bytes)."""
        return self.physical_bytes // max(self.logical_bytes, 1)


def shard_layout(x: jax.Array, label: str = "") -> ShardLayout:
    """The shards of a live array: device, box and buffer bytes of each addressable shard."""
    if not isinstance(x, jax.Array):
        raise TypeError(f"shard_layout needs a jax.Array, got {type(x).__name__}")
    shape = tuple(int(n) for n in x.shape)
    shards = tuple(
        sorted(Shard(int(s.device.id), to_box(s.index, shape), int(s.data.nbytes)) for s in x.addressable_shards)
    )
    mesh = spec = ""
    if isinstance(x.sharding, NamedSharding):
        mesh = ", ".join(f"{k}={v}" for k, v in x.sharding.mesh.shape.items())
        spec = "P(" + ", ".join("None" if p is None else repr(p) for p in x.sharding.spec) + ")"
    return ShardLayout(label, shape, str(np.dtype(x.dtype)), mesh, spec, shards)


def model_leaf(model: nnx.Module, path: str) -> jax.Array:
    """The array at ``path`` (as the reports write it: ``blocks/attn/q/kernel``) of a model."""
    leaves = flat_leaves(nnx.state(model))
    if path not in leaves:
        near = [p for p in leaves if p.rsplit("/", 1)[-1] == path.rsplit("/", 1)[-1]][:4]
        raise KeyError(f"no leaf {path!r} in this model; leaves with the same name: {near or 'none'}")
    return leaves[path]


def cluster_layouts(cluster: Any, path: str) -> tuple[ShardLayout, ShardLayout]:
    """One leaf's shards in the actor (the sync's source) and in the rollout's model (its destination)."""
    actor, rollout = _sync_ends(cluster, path)
    return (
        shard_layout(actor, f"actor: {_mesh_label(actor)}"),
        shard_layout(rollout, f"rollout: {_mesh_label(rollout)}"),
    )


def leaf_specs(cluster: Any, path: str) -> str:
    """One leaf's shape and its partition spec in the actor and in the rollout's model, read from
    their shardings (as the report writes a spec: ``P(None, None)``)."""
    ends = _sync_ends(cluster, path)
    roles = ("actor", "rollout")
    lines = [f"{role:8} {spec_of(describe_sharding(x.sharding))} on {_mesh_label(x)}" for role, x in zip(roles, ends)]
    return f"{path}, shape {tuple(ends[0].shape)}:\n" + "\n".join(lines)


def _sync_ends(cluster: Any, path: str) -> tuple[jax.Array, jax.Array]:
    """One leaf in the actor (a sync's source) and in the rollout's model (its destination)."""
    return model_leaf(cluster.actor_model, path), model_leaf(cluster.rollout.model(), path)


def _mesh_label(x: jax.Array) -> str:
    ids = sorted(d.id for d in x.sharding.device_set)
    where = f"dev {ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1 else f"dev {ids}"
    if isinstance(x.sharding, NamedSharding):
        return f"mesh {tuple(x.sharding.mesh.devices.shape)} on {where}"
    return where


def same_buffer_rows(cluster: Any, path: str) -> list[dict[str, Any]]:
    """Per device: the actor's and the rollout's shard of one leaf, and whether they are one buffer.

    Buffer identity (device and buffer address) is what the sync report counts
    as reused (L3): nothing was copied for that shard.
    """
    actor, rollout = _sync_ends(cluster, path)
    mine = {s.device.id: s for s in actor.addressable_shards}
    return [
        {
            "device": s.device.id,
            "actor box": _box_text(to_box(a.index, actor.shape)) if (a := mine.get(s.device.id)) is not None else "-",
            "rollout box": _box_text(to_box(s.index, rollout.shape)),
            "bytes": int(s.data.nbytes),
            "same buffer": a is not None and shard_key(a) == shard_key(s),
        }
        for s in sorted(rollout.addressable_shards, key=lambda s: s.device.id)
    ]


def _box_text(box: Box) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


@dataclasses.dataclass(frozen=True)
class SyncFlows:
    """One sync's bytes (of one leaf, some leaves or all) per pair of devices, by how they came.

    ``moved[(src, dst)]``: bytes that crossed from device ``src`` to ``dst``;
    ``copied[d]``/``reused[d]``: bytes made on (or kept in place on) device d.
    The totals are the report's own figures for the same leaves, so the
    identity ``synced = arrived + copied + reused`` (``arrived = moved - relayed``)
    can be checked against what is drawn.
    """

    label: str
    moved: Mapping[tuple[int, int], int]
    copied: Mapping[int, int]
    reused: Mapping[int, int]
    synced_bytes: int
    synced_logical_bytes: int
    moved_bytes: int
    copied_bytes: int
    reused_bytes: int
    relayed_bytes: int
    arrived_bytes: int
    minimum_bytes: int
    strategy: str
    method: str
    where: str = ""  # the devices the sync ran on, in words (the report's ``where``)

    def arrived(self, device: int) -> int:
        """Bytes that crossed into ``device`` from other devices."""
        return sum(n for (_, d), n in self.moved.items() if d == device)

    @property
    def arrived_share(self) -> float:
        """The part of the synced physical bytes that came from other devices (at most 1: the
        relayed bytes, which crossed without staying, are not part of the synced bytes)."""
        return self.arrived_bytes / self.synced_bytes if self.synced_bytes else 0.0


def sync_flows(report: Mapping[str, Any], paths: Iterable[str] | None = None, label: str = "") -> SyncFlows:
    """The per-device bytes of a sync report's leaves (``SyncReport.to_json()``): all of them, or ``paths``.

    Raises:
        KeyError: a path that the report did not sync.
        ValueError: a report without per-device pieces (made before they were recorded).
    """
    leaves = {lf["path"]: lf for lf in report.get("leaves", [])}
    wanted = list(leaves) if paths is None else list(paths)
    if missing := [p for p in wanted if p not in leaves]:
        raise KeyError(f"the sync did not carry {missing}; it synced {len(leaves)} leaves, e.g. {list(leaves)[:3]}")
    chosen = [leaves[p] for p in wanted]
    if any("pieces" not in lf for lf in chosen):
        raise ValueError("this sync report has no per-device pieces; sync again with this version of the lab")
    moved: Counter[tuple[int, int]] = Counter()
    kept: dict[str, Counter[int]] = {"copied": Counter(), "reused": Counter()}
    for lf in chosen:
        for p in lf["pieces"]:
            if p["how"] == "moved":
                moved[int(p["src_device"]), int(p["dst_device"])] += int(p["nbytes"])
            elif p["how"] in kept:
                kept[p["how"]][int(p["dst_device"])] += int(p["nbytes"])
            else:
                raise ValueError(f"unknown piece kind {p['how']!r} in leaf {lf['path']}; expected one of {HOWS}")

    def total(key: str) -> int:
        return sum(int(lf.get(key, 0)) for lf in chosen)

    return SyncFlows(
        label=label or (chosen[0]["path"] if len(chosen) == 1 else f"{len(chosen)} leaves"),
        moved=dict(sorted(moved.items())),
        copied=dict(sorted(kept["copied"].items())),
        reused=dict(sorted(kept["reused"].items())),
        synced_bytes=total("synced_bytes"),
        synced_logical_bytes=total("logical_bytes"),
        moved_bytes=total("moved_cross_device_bytes"),
        copied_bytes=total("copied_same_device_bytes"),
        reused_bytes=total("reused_bytes"),
        relayed_bytes=total("relayed_cross_device_bytes"),
        arrived_bytes=total("arrived_cross_device_bytes"),
        minimum_bytes=total("minimum_cross_device_bytes"),
        strategy=str(report.get("reshard_strategy", "?")),
        method=str(report.get("method", "?")),
        where=str(report.get("where") or ""),
    )


def spec_of(sharding: str) -> str:
    """The partition spec in a report's sharding text (``describe_sharding``), e.g. ``P('fsdp', 'tp')``."""
    found = re.search(r"P\((.*)\)", sharding)
    return f"P({found.group(1)})" if found else sharding


def mesh_of(sharding: str) -> str:
    found = re.search(r"mesh\(([^)]*)\)", sharding)
    return found.group(1) if found else "?"


def _short_name(path: str) -> str:
    """``blocks/attn/o/lora_a`` -> ``o/lora_a``; ``blocks/attn_norm/scale`` -> ``attn_norm/scale``."""
    return "/".join([p for p in path.split("/") if not p.isdigit() and p not in ("blocks", "attn", "mlp")][-2:])


def spec_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A sync's leaves grouped by their partition spec: how each group's synced bytes came
    (arrived from other devices, copied, reused: they add up to ``synced``), and apart, what
    crossed devices without staying (relayed, not part of ``synced``).

    The spec is read from the report's source and destination sharding text;
    the same spec on another mesh cuts the array differently, which is what
    decides how much of each destination shard its device already holds.
    """
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for lf in report.get("leaves", []):
        groups.setdefault((spec_of(lf["src_sharding"]), spec_of(lf["dst_sharding"])), []).append(lf)
    rows = [
        {
            "partition spec": src if src == dst else f"{src} -> {dst}",
            "leaves": ", ".join(dict.fromkeys(_short_name(lf["path"]) for lf in leaves)),
            "count": len(leaves),
            "synced": (synced := sum(int(lf["synced_bytes"]) for lf in leaves)),
            "arrived": (arrived := sum(int(lf["arrived_cross_device_bytes"]) for lf in leaves)),
            "copied": sum(int(lf["copied_same_device_bytes"]) for lf in leaves),
            "reused": sum(int(lf["reused_bytes"]) for lf in leaves),
            "arrived %": f"{100 * arrived / synced:.1f}" if synced else "-",
            "relayed (not synced)": sum(int(lf["relayed_cross_device_bytes"]) for lf in leaves),
        }
        for (src, dst), leaves in groups.items()
    ]
    return sorted(rows, key=lambda r: (-r["synced"], r["leaves"]))


def share_lines(report: Mapping[str, Any]) -> str:
    """The share of one sync's bytes that arrived from other devices, worked out from its spec
    groups (``spec_rows``); the bytes relayed (crossed without staying, not part of the synced
    bytes) are said apart.

    Where every group that receives anything from other devices receives the same share of
    its bytes, the total share is that share times the part of the bytes those groups hold;
    the line says so with the numbers.
    """
    rows = spec_rows(report)
    synced = int(report["synced_bytes"])
    arrived = int(report["arrived_cross_device_bytes"])
    relayed = int(report.get("relayed_cross_device_bytes", 0))
    if not synced:
        return "this sync carried no bytes"
    lines = [
        f"arrived from other devices / synced (physical bytes) = {arrived:,} / {synced:,} = {arrived / synced:.1%}"
    ]
    if relayed:
        lines.append(
            f"  and {relayed:,} B more crossed devices without staying (relayed: moved again or dropped), "
            f"so {int(report['moved_cross_device_bytes']):,} B crossed in all"
        )
    for r in rows:
        lines.append(
            f"  {r['partition spec']:<18} {r['count']:>2} leaves  {r['synced']:>9,} B  "
            f"arrived {r['arrived']:>9,} B = {r['arrived'] / max(r['synced'], 1):.1%} of them"
        )
    moving = [r for r in rows if r["arrived"]]
    if moving and len({r["arrived"] * 10**6 // r["synced"] for r in moving}) == 1:
        held = sum(r["synced"] for r in moving)
        share = moving[0]["arrived"] / moving[0]["synced"]
        lines.append(
            f"= {share:.1%} (what each group that receives from other devices gets so) x {held:,} / {synced:,} "
            f"({held / synced:.1%} of the bytes are in those groups) = {share * held / synced:.1%}"
        )
    return "\n".join(lines)


def share_rows(syncs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per sync: physical and logical bytes synced, the part of the physical bytes that arrived
    from other devices (and its share), and apart the bytes relayed (crossed without staying)."""
    return [
        {
            "run": label,
            "synced physical": (synced := int(s["synced_bytes"])),
            "synced logical": int(s["synced_logical_bytes"]),
            "physical / logical": f"{synced / max(int(s['synced_logical_bytes']), 1):.2f}",
            "arrived": (arrived := int(s["arrived_cross_device_bytes"])),
            "arrived % of physical": f"{100 * arrived / synced:.1f}" if synced else "-",
            "relayed (not synced)": int(s.get("relayed_cross_device_bytes", 0)),
        }
        for label, s in syncs.items()
    ]


def replication_rows(syncs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per partition spec: logical bytes, and in each sync how many devices hold each element.

    A sync counts its destination shards (physical bytes), so the same
    adapters weigh logical x replicas, and the replicas of a spec are the
    sizes of the mesh axes it does not split over. The first row names each
    sync's rollout mesh, the last gives its total.
    """
    groups: dict[str, dict[str, Any]] = {}
    for label in syncs:
        for lf in syncs[label].get("leaves", []):
            g = groups.setdefault(spec_of(lf["dst_sharding"]), {"leaves": {}, "logical": {}, "physical": {}})
            g["leaves"][_short_name(lf["path"])] = None
            g["logical"][label] = g["logical"].get(label, 0) + int(lf["logical_bytes"])
            g["physical"][label] = g["physical"].get(label, 0) + int(lf["synced_bytes"])
    rows = []
    for spec, g in groups.items():
        logical = max(g["logical"].values())
        row: dict[str, Any] = {"spec": spec, "leaves": ", ".join(g["leaves"]), "logical": logical}
        for label in syncs:
            phys = g["physical"].get(label)
            row[label] = "-" if phys is None else f"x{phys // max(g['logical'][label], 1)} = {phys:,}"
        rows.append(row)
    rows.sort(key=lambda r: (-r["logical"], r["spec"]))
    total: dict[str, Any] = {"spec": "total", "leaves": "", "logical": sum(r["logical"] for r in rows)}
    meshes: dict[str, Any] = {"spec": "rollout mesh", "leaves": "", "logical": ""}
    for label in syncs:
        total[label] = f"{int(syncs[label]['synced_bytes']):,}"
        leaves = syncs[label].get("leaves", [])  # the rollout mesh, as the report wrote it
        meshes[label] = mesh_of(leaves[0]["dst_sharding"]) if leaves else "?"
    return [meshes, *rows, total]
