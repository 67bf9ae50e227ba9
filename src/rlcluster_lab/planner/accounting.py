"""Counting for the what-if planner (L4): memory per role and device, the sync, fits, in the
JSON of the measured reports (``measure.MemoryReport``, ``measure.SyncReport``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlcluster_lab.measure.memory import KINDS, MEMORY_ENTRIES, UNITS, memory_table
from rlcluster_lab.measure.sync import describe_layout
from rlcluster_lab.placement.layout import shard_elements
from rlcluster_lab.planner.buffers import Buffers, PlannedArray, anchor_arrays, host_overlap, overlap, shard_rows
from rlcluster_lab.planner.tables import Topology
from rlcluster_lab.rules.anchor import anchor_is_partial

SOURCE = "computed from shapes (no allocation)"
PathKey = tuple[Any, ...]


def memory_summary(entries: Mapping[str, Sequence[PlannedArray]]) -> dict[str, Any]:
    """The memory JSON (same keys as the measured one, without the allocator) from arrays on paper."""
    names = [n for n in MEMORY_ENTRIES if n in entries]
    r = shard_rows([entries[n] for n in names])
    span = int(r["device"].max(initial=0)) + 1
    # One id per buffer: a shard's origin names its buffer on its device.
    table = memory_table(names, r["entry"], r["device"], r["kind"], r["bytes"], r["origin"] * span + r["device"])
    return {"units": UNITS, "source": SOURCE, **table}


class _PerDevice:
    """Bytes per device id and memory kind, summed with numpy."""

    def __init__(self, span: int) -> None:
        self.bytes = np.zeros((span, len(KINDS)), dtype=np.int64)

    def add(self, devices: np.ndarray, kind: str, nbytes: np.ndarray | int) -> None:
        np.add.at(self.bytes[:, KINDS.index(kind)], devices, nbytes)

    def by_kind(self) -> dict[str, dict[str, int]]:
        return {str(d): {k: int(v) for k, v in zip(KINDS, row) if v} for d, row in enumerate(self.bytes) if row.any()}

    def total(self) -> dict[str, int]:
        return {str(d): int(v) for d, v in enumerate(self.bytes.sum(axis=1)) if v}


def sync_summary(
    buf: Buffers,
    actor: Mapping[PathKey, PlannedArray],
    rollout: Mapping[PathKey, PlannedArray],
    trainable: frozenset[PathKey],
    *,
    lora: bool,
    copy: bool,
    anchor_mode: str,
    strategy: str,
    topo: Topology,
) -> dict[str, Any]:
    """P13 on paper, with the ``SyncReport``'s definitions.

    ``trainable`` are the leaves handed over (LoRAParam for a LoRA actor, else Param), from
    the actor's leaves to the rollout's. A destination shard with box B on device d is
    *reused* if the reshard keeps the source buffer (``Buffers.kept``; never with ``copy``
    nor a dtype cast); else B's elements inside d's source shard are *copied_same_device*
    and the rest *moved_cross_device*: the least the placement forces (a compiled program
    may move more, and relay some: only a measured sync can say). Bytes are in the source
    dtype, and a plan relays nothing, so synced = moved + copied + reused per leaf (the measured
    report's synced = moved - relayed + copied + reused with relayed 0). A local source shard
    that lands in a new buffer, in pinned_host or another dtype, counts as copied, as the
    measured report counts it (``placement.reshard`` logs such a shard as a same-device copy).

    ``anchor_bytes``: what the sync copies to pinned host for the anchor, over the old
    anchor's buffers (P8; the adapters only with ``anchor="trainable"``;
    0 under offload, where the snapshot keeps the actor's pinned buffers).
    ``peak_extra_bytes[device][kind]``: the new destination buffers plus the anchor's copy.
    ``topo``: the devices' hosts and links; ``cross_host_bytes``: elements no
    source shard on the destination's host holds. ``estimated_seconds``: the busiest
    device's within-host bytes over the device link and cross-host bytes over the host link
    at once, each the rate one device receives: a lower bound (no latency nor contention).
    """
    span = 1 + max(max(a.mesh.device_ids) for m in (actor, rollout) for a in m.values())
    arrived, peak, across = _PerDevice(span), _PerDevice(span), _PerDevice(span)
    host_of = topo.host_of()
    hosts_key = tuple(sorted(host_of.items()))
    several_hosts = len(set(host_of.values())) > 1
    leaves = []
    for path in sorted(trainable, key=lambda k: "/".join(map(str, k))):
        src, dst = actor[path], rollout[path]
        _, lacking = overlap(src.shape, src.layout, dst.layout)
        reused = np.zeros(dst.mesh.size, dtype=bool)
        if not copy and dst.dtype == src.dtype:
            reused = buf.kept(src, dst.layout)
        elems = shard_elements(dst.shape, dst.spec, dst.mesh)
        item = src.dtype.itemsize
        moved = np.where(reused, 0, lacking) * item
        copied = np.where(reused, 0, elems - lacking) * item
        crossing = np.zeros(dst.mesh.size, dtype=np.int64)
        if several_hosts:
            crossing = np.where(reused, 0, host_overlap(src.shape, src.layout, dst.layout, hosts_key)) * item
        arrived.add(dst.mesh.ids, "device", moved)
        across.add(dst.mesh.ids, "device", crossing)
        peak.add(dst.mesh.ids[~reused], dst.kind, elems * dst.dtype.itemsize)
        leaves.append(
            {
                "path": "/".join(map(str, path)),
                "dtype": str(src.dtype),
                "dst_dtype": str(dst.dtype),
                "shape": list(src.shape),
                "src_sharding": describe_layout(src.layout),
                "dst_sharding": describe_layout(dst.layout),
                "synced_bytes": int(elems * item * dst.mesh.size),
                "moved_cross_device_bytes": int(moved.sum()),
                "copied_same_device_bytes": int(copied.sum()),
                "reused_bytes": int(reused.sum() * elems * item),
                "minimum_cross_device_bytes": int(lacking.sum() * item),
                "logical_bytes": int(np.prod(src.shape, dtype=np.int64) * item),
                "relayed_cross_device_bytes": 0,
                "arrived_cross_device_bytes": int(moved.sum()),  # a plan relays nothing: all that moves stays
                "cross_host_bytes": int(crossing.sum()),
                "method": "planned: the least the placement forces",
            }
        )
    totals = {key: sum(leaf[key] for leaf in leaves) for key in _TOTALS}
    # P13: then the anchor is pinned again (P8).
    partial = anchor_is_partial(anchor_mode, lora)
    repinned = anchor_arrays(actor, trainable, partial=partial, new=True)
    for a in repinned.values():
        peak.add(a.mesh.ids, "pinned_host", a.shard_bytes)
    arrived_by_device = arrived.total()
    across_by_device = across.total()
    cross_host = sum(leaf["cross_host_bytes"] for leaf in leaves)
    seconds, estimate = _sync_seconds(arrived_by_device, across_by_device, topo)
    by_host: dict[str, dict[str, int]] = {}
    for d, n in arrived_by_device.items():
        h = str(host_of.get(int(d), 0))
        entry = by_host.setdefault(h, {"cross_host_bytes": 0, "within_host_bytes": 0})
        entry["cross_host_bytes"] += across_by_device.get(d, 0)
        entry["within_host_bytes"] += n - across_by_device.get(d, 0)
    return {
        "units": UNITS,
        "lora": lora,
        **totals,
        "relayed_cross_device_bytes": 0,
        "excess_cross_device_bytes": 0,  # a plan moves only what the placement forces
        "reshard_strategy": strategy,
        "moved_is_lower_bound": strategy == "xla",
        "synced_logical_bytes": sum(leaf["logical_bytes"] for leaf in leaves),
        "anchor_bytes": sum(a.shard_bytes * a.mesh.size for a in repinned.values()),
        "anchor_mode": "trainable" if partial else "full",
        "global_step": 1,
        "arrived_by_device": arrived_by_device,
        "cross_host_bytes": cross_host,
        "within_host_cross_device_bytes": totals["moved_cross_device_bytes"] - cross_host,
        "arrived_cross_host_by_device": across_by_device,
        "by_host": dict(sorted(by_host.items(), key=lambda kv: int(kv[0]))),
        "peak_extra_bytes": peak.by_kind(),
        "estimated_seconds": seconds,
        "estimate": estimate,
        "leaves": leaves,
    }


# The sync's totals (each the sum of its leaves' figure), in the order the JSON lists them.
_TOTALS = (
    "synced_bytes moved_cross_device_bytes arrived_cross_device_bytes copied_same_device_bytes reused_bytes "
    "minimum_cross_device_bytes"
).split()


def _sync_seconds(arrived: Mapping[str, int], across: Mapping[str, int], topo: Topology) -> tuple[float | None, str]:
    """The sync's time on its busiest device, and the rule (``sync_summary``)."""
    rule = (
        "max over devices of max(within-host cross-device bytes / device link bandwidth, "
        "cross-host bytes / host link bandwidth), each the rate one device receives"
    )
    link, host_link = topo.link_bandwidth, topo.host_link_bandwidth
    needs_host = any(across.values())
    if link is None or (needs_host and host_link is None):
        missing = "device link" if link is None else "host link"
        return None, f"{rule} (no {missing} bandwidth known for this topology: pass one)"
    worst = 0.0
    for d, n in arrived.items():
        cross = across.get(d, 0)
        worst = max(worst, (n - cross) / link, cross / host_link if cross else 0.0)
    return worst, rule


def fits_summary(
    memory: dict[str, Any], sync: dict[str, Any], memory_per_device: int | None, source: str
) -> dict[str, Any]:
    def verdict(n: int) -> bool | None:
        return None if memory_per_device is None else n <= memory_per_device

    roles = {}
    for name, role in memory["by_role"].items():
        busiest = max((sum(k.values()) for k in role["by_device"].values()), default=0)
        roles[name] = {"max_device_bytes": busiest, "fits": verdict(busiest)}
    resident = {d: kinds.get("device", 0) for d, kinds in memory["by_device"].items()}
    during = (sync.get("transient_peak") or {}).get("by_device") or sync["peak_extra_bytes"]
    peak = resident | {d: resident.get(d, 0) + kinds.get("device", 0) for d, kinds in during.items()}
    top_resident = max(resident.values(), default=0)
    top_peak = max(peak.values(), default=0)
    return {
        "memory_per_device": memory_per_device,
        "memory_source": source,
        "by_role": roles,
        "resident": {"max_device_bytes": top_resident, "fits": verdict(top_resident)},
        "with_sync_peak": {"max_device_bytes": top_peak, "fits": verdict(top_peak)},
        "all_fit": None
        if memory_per_device is None
        else all(r["fits"] for r in roles.values()) and top_peak <= memory_per_device,
        "rule": "a role fits when its bytes on its busiest device (any memory kind: an offloaded role "
        "comes to device for its operation) are at most the memory per device; resident = device-kind "
        "bytes with shared buffers counted once; with_sync_peak adds the sync's transient device peak",
    }
