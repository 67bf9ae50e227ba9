"""Memory per role (L2), measured on the live run: a walk of the live buffers of every role's
state, keyed by (platform, device, memory kind, pointer), so a buffer several roles hold counts
once; beside it, the allocator's figures where the devices have them. Units: physical bytes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from rlcluster_lab.core.devices import devices_words
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import MEMORY_KINDS, array_leaves
from rlcluster_lab.measure.sync_peak import array_buffers

UNITS = "physical bytes: every device shard counted (a leaf replicated on 4 devices counts 4 times)"
MEMORY_SOURCE = "measured: walk of the live buffers of each role's state"

# The order entries appear in reports and figures: the roles, then what the cluster holds beside them.
MEMORY_ENTRIES: tuple[str, ...] = tuple(role.value for role in Role) + ("anchor", "optimizer", "critic_optimizer")

# Memory kinds in report order: the two the lab places into, then host memory JAX may report too.
KINDS: tuple[str, ...] = MEMORY_KINDS + ("unpinned_host",)

BufferKey = tuple[str, int, str, int]  # (platform, device id, memory kind, buffer pointer)


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Bytes per role, per device and per memory kind, from the live buffers (``memory_table``)."""

    by_role: Mapping[str, Mapping[str, Any]]
    by_device: Mapping[str, Mapping[str, int]]
    shared: Sequence[Mapping[str, Any]]
    unique_bytes: int
    naive_bytes: int
    allocator: Mapping[str, Any]
    units: str = UNITS
    source: str = MEMORY_SOURCE
    where: str = ""  # the devices measured, in words (``core.devices.devices_words``)

    def to_json(self) -> dict[str, Any]:
        keys = "units source where by_role by_device shared unique_bytes naive_bytes allocator".split()
        return {key: _plain(getattr(self, key)) for key in keys}


def cluster_entries(cluster: Any) -> dict[str, Any]:
    """Entry name -> the state it holds, for every entry present in ``cluster`` (the rollout: the
    engine's model; the anchor: the state log-probs are taken with)."""
    out: dict[str, Any] = {"actor": nnx.state(cluster.actor_model), "rollout": nnx.state(cluster.rollout.model())}
    for name in ("reference", "reward", "critic"):
        if (model := getattr(cluster, f"{name}_model")) is not None:
            out[name] = nnx.state(model)
    for name, state in (
        ("anchor", cluster.anchor_policy_state),
        ("optimizer", cluster.optimizer_state),
        ("critic_optimizer", getattr(cluster, "critic_optimizer_state", None)),
    ):
        if state is not None:
            out[name] = state
    return out


def memory_report(cluster: Any) -> MemoryReport:
    """L2 for a constructed cluster (a ``TypeError`` for anything else), allocator figures of its devices."""
    if not all(hasattr(cluster, a) for a in ("actor_model", "rollout", "devices")):
        raise TypeError(f"memory_report takes a constructed cluster (build_cluster(...)), got {type(cluster).__name__}")
    return memory_of(cluster_entries(cluster), devices=cluster.devices())


def memory_of(entries: Mapping[str, Any], devices: Sequence[Any] | None = None) -> MemoryReport:
    """L2 for any named states: the walk, the sharing, the allocator's figures."""
    names = list(entries)
    ids: dict[BufferKey, int] = {}
    rows: list[tuple[int, int, int, int, int]] = []  # entry, device, kind, bytes, buffer id
    for e, name in enumerate(names):
        for key, nbytes in _buffers(entries[name]).items():
            rows.append((e, key[1], KINDS.index(key[2]), nbytes, ids.setdefault(key, len(ids))))
    cols = np.array(rows, dtype=np.int64).reshape(-1, 5).T
    table = memory_table(names, *cols)
    devices = list(devices) if devices is not None else jax.local_devices()
    return MemoryReport(**table, allocator=allocator_stats(devices), where=own_devices_words(devices))


def own_devices_words(devices: Sequence[Any]) -> str:
    """The devices of ``devices`` this process measures (its own: with several processes each
    walks its own buffers), in words (``core.devices.devices_words``); "" when it has none."""
    own = [d for d in devices if d.process_index == jax.process_index()]
    return devices_words(own) if own else ""


def memory_table(
    names: Sequence[str],
    entry: np.ndarray,
    device: np.ndarray,
    kind: np.ndarray,
    nbytes: np.ndarray,
    buffer: np.ndarray,
) -> dict[str, Any]:
    """The memory JSON from one row per (entry, shard), the one count the measured walk and the planner
    share: per row the entry (an index into ``names``), the device id, the memory kind (an index into
    ``KINDS``), the bytes, and an id shared exactly by rows of one buffer. Returns ``by_role``
    (``bytes``, ``by_kind``, ``by_device``), ``by_device`` (every buffer once), ``shared`` (per set of
    two or more entries, what they hold in common), ``unique_bytes`` and ``naive_bytes``."""
    by_role = {}
    for e, name in enumerate(names):
        rows = np.flatnonzero(entry == e)
        _, first = np.unique(buffer[rows], return_index=True)
        rows = rows[first]
        by_kind = {k: int(nbytes[rows][kind[rows] == i].sum()) for i, k in enumerate(KINDS)}
        by_role[name] = {
            "bytes": int(nbytes[rows].sum()),
            "by_kind": {k: v for k, v in by_kind.items() if v},
            "by_device": _by_device(device[rows], kind[rows], nbytes[rows]),
        }
    uniq, first, inv = np.unique(buffer, return_index=True, return_inverse=True)
    mask = np.zeros(len(uniq), dtype=np.int64)
    np.bitwise_or.at(mask, inv, np.left_shift(1, entry))
    held = nbytes[first]
    shared = []
    for m in np.unique(mask):
        roles = [name for i, name in sorted(enumerate(names), key=lambda t: _entry_order(t[1])) if int(m) >> i & 1]
        if len(roles) >= 2:
            sel = mask == m
            shared.append(
                {
                    "roles": roles,
                    "bytes": int(held[sel].sum()),
                    "buffers": int(sel.sum()),
                    "by_device": _by_device(device[first][sel], kind[first][sel], held[sel]),
                }
            )
    shared.sort(key=lambda g: tuple(g["roles"]))
    return {
        "by_role": by_role,
        "by_device": _by_device(device[first], kind[first], held),
        "shared": shared,
        "unique_bytes": int(held.sum()),
        "naive_bytes": int(sum(v["bytes"] for v in by_role.values())),
    }


def _by_device(device: np.ndarray, kind: np.ndarray, nbytes: np.ndarray) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    key = device * len(KINDS) + kind
    uniq, inv = np.unique(key, return_inverse=True)
    sums = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(sums, inv, nbytes)  # integer sums: float weights would round past 2**53
    for k, total in zip(uniq, sums):
        if total:
            out.setdefault(str(int(k // len(KINDS))), {})[KINDS[int(k % len(KINDS))]] = int(total)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def allocator_stats(devices: Sequence[Any] | None = None) -> dict[str, Any]:
    """The allocator's own figures for ``devices`` (default: JAX's), read from those devices (a
    cluster on simulated CPU devices beside a chip reports the CPU's: none)."""
    devices = list(devices) if devices is not None else jax.local_devices()
    platform = devices[0].platform if devices else "?"
    # multi-process: a process reads only the devices it owns (the others' have no stats here).
    devices = [d for d in devices if d.process_index == jax.process_index()]
    stats = {
        str(d.id): {k: int(v) for k, v in s.items() if k in _ALLOCATOR_KEYS} for d in devices if (s := d.memory_stats())
    }
    if not stats:
        return {
            "available": False,
            "note": f"the {platform} devices report no allocator figures "
            "(device.memory_stats() is None); the buffer walk is the only measurement",
            "by_device": {},
        }
    return {
        "available": True,
        "where": f"{devices_words(devices)}, allocator",
        "note": "device.memory_stats() of each device: device memory only, and every buffer of the "
        "process, not only the cluster's; bytes_limit is what the allocator may use (on GPU, JAX "
        "preallocates 75% of the memory by default), not the device's size",
        "difference": ALLOCATOR_DIFFERENCE,
        "by_device": stats,
    }


# Why the allocator's bytes in use and the per-role figure differ, in one sentence (the memory view says it).
ALLOCATOR_DIFFERENCE = (
    "The allocator counts everything live on the device, the cluster's arrays and any other buffer of this "
    "process, in the blocks it rounded and fragmented them into; the per-role figure counts the roles' own "
    "arrays, each buffer once, from their shapes and dtypes."
)


_ALLOCATOR_KEYS = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "largest_alloc_size", "num_allocs")


def _buffers(state: Any) -> dict[BufferKey, int]:
    # Each array's buffers as the sync's peak walk reads them (once while the array lives).
    return {
        (platform, device, kind, pointer): nbytes
        for x in array_leaves(state)
        for (platform, device, pointer), (_, kind, nbytes) in array_buffers(x).items()
    }


def _entry_order(name: str) -> int:
    return MEMORY_ENTRIES.index(name) if name in MEMORY_ENTRIES else len(MEMORY_ENTRIES)


def _plain(x: Any) -> Any:
    """Mappings and sequences as plain dicts and lists, for JSON."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
