"""What placement costs, measured on the live run: memory per role (L2) and the weight sync (L3).

Units, everywhere in this module: **physical bytes**, every device shard
counted. A leaf replicated on four devices counts four times, because four
devices hold it. ``synced_logical_bytes`` is the one figure counted once per
leaf (the filtered tree's size).

Memory is a walk of the live buffers of every role's state, keyed by
(device, memory kind, buffer pointer), so a buffer several roles hold is
counted once and listed with the roles that share it. The sync accounting
compares the source and destination shards leaf by leaf, and takes what was
copied from the reshard's own log of the copies it made
(``reshard.record_transfers``), not from JAX's transfer guard, which does not
see device-to-device copies on CPU.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict
from jax.sharding import NamedSharding, Sharding

from rlcluster_lab.engines.base import leaf_path
from rlcluster_lab.placement import array_leaves
from rlcluster_lab.reshard import box_size, minimum_cross_device_elements, shard_boxes
from rlcluster_lab.transfers import TransferLog, shard_key, shard_keys

UNITS = (
    "physical bytes: every device shard counted (a leaf replicated on 4 devices counts 4 times)"
)
MEMORY_SOURCE = "measured: walk of the live buffers of each role's state"

# The order entries appear in reports and figures.
MEMORY_ENTRIES = ("actor", "rollout", "reference", "reward", "critic", "anchor", "optimizer")

BufferKey = tuple[str, int, str, int]  # (platform, device id, memory kind, buffer pointer)


# ---------------------------------------------------------------------------- memory (L2)


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Bytes per role, per device and per memory kind, from the live buffers.

    ``by_role[entry]``: ``bytes``, ``by_kind`` {kind: bytes} and ``by_device``
    {device id: {kind: bytes}} of the buffers that entry holds. ``by_device``
    counts every buffer once however many entries hold it; ``shared`` lists,
    for each set of two or more entries, the bytes and buffers they hold in
    common (and per device and memory kind). ``naive_bytes`` is what every entry holding its own copy would
    cost (the sum over entries); ``unique_bytes`` what is really held.
    """

    by_role: Mapping[str, Mapping[str, Any]]
    by_device: Mapping[str, Mapping[str, int]]
    shared: Sequence[Mapping[str, Any]]
    unique_bytes: int
    naive_bytes: int
    allocator: Mapping[str, Any]
    units: str = UNITS
    source: str = MEMORY_SOURCE

    def to_json(self) -> dict[str, Any]:
        return {
            "units": self.units,
            "source": self.source,
            "by_role": _plain(self.by_role),
            "by_device": _plain(self.by_device),
            "shared": _plain(self.shared),
            "unique_bytes": self.unique_bytes,
            "naive_bytes": self.naive_bytes,
            "allocator": _plain(self.allocator),
        }


def cluster_entries(cluster: Any) -> dict[str, Any]:
    """Entry name -> the state it holds, for every entry present in ``cluster``.

    The rollout entry is the engine's own model (the actor itself when they
    share); the anchor is the state log-probs are taken with, so with
    anchor='trainable' its backbone part is the actor's buffers.
    """
    out: dict[str, Any] = {"actor": nnx.state(cluster.actor_model), "rollout": nnx.state(cluster.rollout.model())}
    for name, model in (
        ("reference", cluster.reference_model),
        ("reward", cluster.reward_model),
        ("critic", cluster.critic_model),
    ):
        if model is not None:
            out[name] = nnx.state(model)
    if cluster.anchor_policy_state is not None:
        out["anchor"] = cluster.anchor_policy_state
    if cluster.optimizer_state is not None:
        out["optimizer"] = cluster.optimizer_state
    return out


def memory_report(cluster: Any) -> MemoryReport:
    """L2 for a constructed cluster (allocator figures of the devices its meshes use)."""
    return memory_of(cluster_entries(cluster), devices=cluster.devices())


def memory_of(entries: Mapping[str, Any], devices: Sequence[Any] | None = None) -> MemoryReport:
    """L2 for any named states: the walk, the sharing, the allocator's figures."""
    sizes: dict[BufferKey, int] = {}
    holders: dict[BufferKey, list[str]] = {}
    by_role: dict[str, dict[str, Any]] = {}
    for name, state in entries.items():
        keys = _buffers(state)
        sizes.update(keys)
        for key in keys:
            holders.setdefault(key, []).append(name)
        by_role[name] = _tally(keys)
    unique = _tally(sizes)
    groups: dict[tuple[str, ...], dict[BufferKey, int]] = {}
    for key, names in holders.items():
        if len(names) > 1:
            groups.setdefault(tuple(sorted(names, key=_entry_order)), {})[key] = sizes[key]
    shared = [
        {"roles": list(names), "bytes": sum(keys.values()), "buffers": len(keys),
         "by_device": _tally(keys)["by_device"]}
        for names, keys in sorted(groups.items())
    ]
    return MemoryReport(
        by_role=by_role,
        by_device=unique["by_device"],
        shared=shared,
        unique_bytes=unique["bytes"],
        naive_bytes=sum(r["bytes"] for r in by_role.values()),
        allocator=allocator_stats(devices),
    )


def allocator_stats(devices: Sequence[Any] | None = None) -> dict[str, Any]:
    """The allocator's own figures for ``devices`` (default: JAX's default devices) where their
    backend has them (GPU, TPU); a CPU backend has none.

    Read from the devices given, not from the default backend: a cluster on
    simulated CPU devices beside a chip reports the CPU's (none).
    """
    devices = list(devices) if devices is not None else jax.local_devices()
    platform = devices[0].platform if devices else "?"
    stats = {}
    for d in devices:
        s = d.memory_stats()
        if s:
            stats[str(d.id)] = {k: int(v) for k, v in s.items() if k in _ALLOCATOR_KEYS}
    if not stats:
        return {
            "available": False,
            "note": f"the {platform} devices report no allocator figures "
            "(device.memory_stats() is None); the buffer walk is the only measurement",
            "by_device": {},
        }
    return {
        "available": True,
        "note": "device.memory_stats() of each device: device memory only, and every buffer of the "
        "process, not only the cluster's; bytes_limit is what the allocator may use (on GPU, JAX "
        "preallocates 75% of the memory by default), not the device's size",
        "by_device": stats,
    }


_ALLOCATOR_KEYS = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "largest_alloc_size", "num_allocs")


def _buffers(state: Any) -> dict[BufferKey, int]:
    out = {}
    for x in array_leaves(state):
        kind = str(x.sharding.memory_kind)
        for s in x.addressable_shards:
            out[(s.device.platform, s.device.id, kind, s.data.unsafe_buffer_pointer())] = s.data.nbytes
    return out


def _tally(keys: Mapping[BufferKey, int]) -> dict[str, Any]:
    by_kind: dict[str, int] = {}
    by_device: dict[str, dict[str, int]] = {}
    for (_, dev, kind, _), n in sorted(keys.items()):
        by_kind[kind] = by_kind.get(kind, 0) + n
        d = by_device.setdefault(str(dev), {})
        d[kind] = d.get(kind, 0) + n
    by_device = {k: by_device[k] for k in sorted(by_device, key=int)}
    return {"bytes": sum(keys.values()), "by_kind": by_kind, "by_device": by_device}


def _entry_order(name: str) -> int:
    return MEMORY_ENTRIES.index(name) if name in MEMORY_ENTRIES else len(MEMORY_ENTRIES)


# ---------------------------------------------------------------------------- sync (L3)


@dataclasses.dataclass(frozen=True)
class LeafSync:
    """One synced leaf. Bytes are physical, in the dtype the data moved in (the source's)."""

    path: str
    dtype: str
    dst_dtype: str
    shape: tuple[int, ...]
    src_sharding: str
    dst_sharding: str
    synced_bytes: int
    moved_cross_device_bytes: int
    copied_same_device_bytes: int
    reused_bytes: int
    minimum_cross_device_bytes: int
    logical_bytes: int
    relayed_cross_device_bytes: int = 0
    method: str = "logged copies"

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["shape"] = list(self.shape)
        return out


@dataclasses.dataclass(frozen=True)
class SyncReport:
    """What one ``sync_weights`` moved (P13, L3).

    For every destination shard, its bytes were either *reused* (the
    destination buffer is a source buffer: nothing moved), *copied within
    its device* (made from data that started on that device), or arrived
    from another device. ``moved_cross_device`` is everything that crossed
    devices; ``relayed_cross_device`` is the part of it that did not end up
    as destination data on the device it crossed to (a compiled program that
    moves data twice, or gathers and drops it; 0 for the minimal strategy).
    So ``synced = moved_cross_device - relayed_cross_device +
    copied_same_device + reused``. ``minimum_cross_device_bytes`` is what the
    two shardings force to cross devices, from shard indices and devices
    alone; ``excess_cross_device_bytes`` is how much more than that was moved.
    ``reshard_strategy`` names the strategy (or strategies) that did the
    layout changes.
    ``anchor_bytes`` are the new pinned-host buffers of the anchor re-pin,
    apart from the handover. ``peak_extra_bytes`` per device and memory
    kind: the new buffers the sync allocates while the old ones are still
    alive (new destination buffers in their dtype, plus the new anchor).
    A cast to the rollout dtype happens on the destination device after the
    move and is not counted as movement. ``includes_compilation``: the first
    sync between a set of shardings compiles its copy programs, and its
    ``seconds`` include that; ``includes_program_load``: it read them back
    from the persistent compilation cache instead; later syncs reuse them.
    """

    method: str
    lora: bool
    leaves: tuple[LeafSync, ...]
    anchor_bytes: int
    anchor_mode: str
    seconds: float
    anchor_seconds: float
    arrived_by_device: Mapping[str, int]
    peak_extra_bytes: Mapping[str, Mapping[str, int]]
    global_step: int
    includes_compilation: bool = False
    includes_program_load: bool = False
    reshard_strategy: str = "minimal"
    units: str = UNITS

    def _sum(self, field: str) -> int:
        return int(sum(getattr(leaf, field) for leaf in self.leaves))

    @property
    def synced_bytes(self) -> int:
        return self._sum("synced_bytes")

    @property
    def moved_cross_device_bytes(self) -> int:
        return self._sum("moved_cross_device_bytes")

    @property
    def copied_same_device_bytes(self) -> int:
        return self._sum("copied_same_device_bytes")

    @property
    def reused_bytes(self) -> int:
        return self._sum("reused_bytes")

    @property
    def relayed_cross_device_bytes(self) -> int:
        return self._sum("relayed_cross_device_bytes")

    @property
    def minimum_cross_device_bytes(self) -> int:
        return self._sum("minimum_cross_device_bytes")

    @property
    def synced_logical_bytes(self) -> int:
        return self._sum("logical_bytes")

    @property
    def excess_cross_device_bytes(self) -> int:
        return self.moved_cross_device_bytes - self.minimum_cross_device_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "units": self.units,
            "method": self.method,
            "lora": self.lora,
            "global_step": self.global_step,
            "synced_bytes": self.synced_bytes,
            "moved_cross_device_bytes": self.moved_cross_device_bytes,
            "copied_same_device_bytes": self.copied_same_device_bytes,
            "reused_bytes": self.reused_bytes,
            "relayed_cross_device_bytes": self.relayed_cross_device_bytes,
            "minimum_cross_device_bytes": self.minimum_cross_device_bytes,
            "excess_cross_device_bytes": self.excess_cross_device_bytes,
            "reshard_strategy": self.reshard_strategy,
            "synced_logical_bytes": self.synced_logical_bytes,
            "anchor_bytes": self.anchor_bytes,
            "anchor_mode": self.anchor_mode,
            "seconds": self.seconds,
            "anchor_seconds": self.anchor_seconds,
            "includes_compilation": self.includes_compilation,
            "includes_program_load": self.includes_program_load,
            "arrived_by_device": _plain(self.arrived_by_device),
            "peak_extra_bytes": _plain(self.peak_extra_bytes),
            "leaves": [leaf.to_json() for leaf in self.leaves],
        }


@dataclasses.dataclass(frozen=True)
class ShardFacts:
    """What the accounting needs of one array, read before the sync replaces anything."""

    shape: tuple[int, ...]
    dtype: Any
    sharding: str
    boxes: tuple[tuple[int, Any], ...]  # (device id, box) per shard
    buffers: frozenset[tuple[int, int]]  # (device id, pointer) per shard


def shard_facts(x: jax.Array) -> ShardFacts:
    return ShardFacts(
        shape=tuple(x.shape),
        dtype=x.dtype,
        sharding=describe_sharding(x.sharding),
        boxes=tuple(shard_boxes(x)),
        buffers=frozenset(shard_keys(x)),
    )


def flat_leaves(state: Any) -> dict[str, jax.Array]:
    """Path -> array for every array leaf of a state."""
    values = nnx.to_pure_dict(state) if isinstance(state, nnx.State) else state
    return {leaf_path(k): v for k, v in flatten_dict(values).items() if isinstance(v, jax.Array)}


def sync_report(
    source: Mapping[str, ShardFacts],
    destination: Mapping[str, jax.Array],
    log: TransferLog,
    *,
    lora: bool,
    seconds: float,
    new_anchor_shards: Sequence[tuple[int, str, int]],
    anchor_mode: str,
    anchor_seconds: float,
    global_step: int,
) -> SyncReport:
    """Build the report from the source's facts, the destination arrays and the transfer log.

    ``new_anchor_shards``: (device id, memory kind, bytes) of every buffer
    the anchor re-pin allocated.
    """
    cross: dict[str, int] = {}
    same: dict[str, int] = {}
    arrived: dict[str, int] = {}
    for t in log.transfers:
        if t.leaf is None:
            continue
        if t.kind == "cross_device":
            cross[t.leaf] = cross.get(t.leaf, 0) + t.nbytes
            arrived[str(t.dst_device)] = arrived.get(str(t.dst_device), 0) + t.nbytes
        elif t.kind == "same_device":
            same[t.leaf] = same.get(t.leaf, 0) + t.nbytes
    untraced: dict[str | None, list[str]] = {}
    for leaf, why in log.unreadable:
        untraced.setdefault(leaf, []).append(why)
    program = "xla" in log.strategies
    peak: dict[str, dict[str, int]] = {}
    leaves = []
    for path in sorted(source):
        src = source[path]
        dst = destination[path]
        itemsize = np.dtype(src.dtype).itemsize
        dst_boxes = shard_boxes(dst)
        lacking = minimum_cross_device_elements(src.boxes, dst_boxes)
        synced = reused = 0
        kind = str(dst.sharding.memory_kind)
        for s, (_, box) in zip(dst.addressable_shards, dst_boxes):
            elements = box_size(box)
            synced += elements * itemsize
            if shard_key(s) in src.buffers:
                reused += elements * itemsize
                continue
            d = peak.setdefault(str(s.device.id), {})
            d[kind] = d.get(kind, 0) + s.data.nbytes
        how = "logged copies" if not program else "logged copies and compiled-program collectives"
        if path in untraced or None in untraced:
            how = "not fully derivable: " + "; ".join(untraced.get(path, []) + untraced.get(None, []))[:300]
        leaves.append(
            LeafSync(
                path=path,
                dtype=str(np.dtype(src.dtype)),
                dst_dtype=str(np.dtype(dst.dtype)),
                shape=src.shape,
                src_sharding=src.sharding,
                dst_sharding=describe_sharding(dst.sharding),
                synced_bytes=synced,
                moved_cross_device_bytes=cross.get(path, 0),
                copied_same_device_bytes=same.get(path, 0),
                reused_bytes=reused,
                minimum_cross_device_bytes=sum(lacking) * itemsize,
                logical_bytes=int(np.prod(src.shape, dtype=np.int64)) * itemsize,
                relayed_cross_device_bytes=log.relayed.get(path, 0),
                method=how,
            )
        )
    anchor_bytes = 0
    for dev, kind, n in new_anchor_shards:
        d = peak.setdefault(str(dev), {})
        d[kind] = d.get(kind, 0) + n
        anchor_bytes += n
    strategy = "+".join(sorted(log.strategies)) or "none (no layout changed)"
    method = (
        "measured: copies logged by the reshard, bytes read from the compiled program's collectives "
        "and traced per destination shard, buffer identity for reuse"
        if program
        else "measured: every copy the reshard made, and buffer identity for reuse"
    )
    if untraced:
        method += f"; {sum(len(v) for v in untraced.values())} item(s) could not be derived (see leaves)"
    return SyncReport(
        method=method,
        lora=lora,
        leaves=tuple(leaves),
        anchor_bytes=anchor_bytes,
        anchor_mode=anchor_mode,
        seconds=seconds,
        anchor_seconds=anchor_seconds,
        arrived_by_device={k: arrived[k] for k in sorted(arrived, key=int)},
        peak_extra_bytes={k: peak[k] for k in sorted(peak, key=int)},
        global_step=global_step,
        includes_compilation=log.compiled,
        includes_program_load=log.loaded,
        reshard_strategy=strategy,
    )


def new_shards(after: Any, before: Any) -> list[tuple[int, str, int]]:
    """(device id, memory kind, bytes) of the shards of ``after`` that are not buffers of ``before``."""
    old = {(pf, d, p) for pf, d, _, p in _buffers(before)}
    out = []
    for x in array_leaves(after):
        kind = str(x.sharding.memory_kind)
        for s in x.addressable_shards:
            if shard_key(s) not in old:
                out.append((s.device.id, kind, s.data.nbytes))
    return out


def describe_sharding(s: Sharding) -> str:
    """A short readable sharding: mesh axes, device ids, partition spec, memory kind."""
    if isinstance(s, NamedSharding):
        axes = ",".join(f"{n}={k}" for n, k in s.mesh.shape.items())
        ids = [d.id for d in np.asarray(s.mesh.devices).flatten()]
        spec = ", ".join("None" if p is None else repr(p) for p in s.spec)
        return f"mesh({axes}) devices {_id_ranges(ids)} P({spec}) {s.memory_kind}"
    ids = sorted(d.id for d in s.device_set)
    return f"{type(s).__name__} devices {_id_ranges(ids)} {s.memory_kind}"


def _id_ranges(ids: Sequence[int]) -> str:
    if list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])
    return ",".join(map(str, ids))


def _plain(x: Any) -> Any:
    """Mappings and sequences as plain dicts and lists, for JSON."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


__all__ = [
    "LeafSync", "MEMORY_ENTRIES", "MemoryReport", "ShardFacts", "SyncReport", "UNITS",
    "allocator_stats", "cluster_entries", "describe_sharding", "flat_leaves", "memory_of",
    "memory_report", "new_shards", "shard_facts", "sync_report",
]
