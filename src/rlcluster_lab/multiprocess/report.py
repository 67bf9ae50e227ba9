"""One placement report from several processes: what each host holds, and what crossed between hosts.

Every process reports what it sees; process 0 merges them: facts the rules took must be equal on
every process (a difference is an error), devices are united and bytes added, and the sync's
cross-device bytes split into those that crossed a process boundary and those that stayed
inside one, each beside its minimum. Only ``crossing_facts`` and ``merge_peaks`` import JAX.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Report fields every process must agree on: they come from the rules and the meshes.
AGREED = (
    "sharing_map",
    "rollout_branch",
    "rollout_shares_actor_weights",
    "reference_shares_backbone",
    "role_to_mesh",
    "config_role_to_mesh",
    "mesh_overridden_by_engine",
    "engine",
    "offload_to_cpu",
    "lora",
    "decisions",
    "warnings",
    "platform",
    "device_count",
)

CROSSING_SOURCE = (
    "moved: the sync's logged cross-device copies (collectives read from the compiled programs, "
    "copies the reshard made), split by the process owning the source and the destination device; "
    "minimum: computed from the two shardings (shard indices and the process owning each device)"
)


class ProcessesDisagree(RuntimeError):
    """Two processes took different decisions: they did not run the same program."""


def merge_reports(per_process: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Process 0's view: the processes' placement reports (each with ``process``: ``index``,
    ``device_ids``, ``host``, and after a sync ``crossing``), in process order, as one report: the
    agreed fields as they are, memory and sync added up, plus ``process_count``, ``by_host`` and,
    with a sync, ``sync["processes"]``.

    Raises:
        ProcessesDisagree: an agreed field differs between processes.
    """
    first = per_process[0]
    for other in per_process[1:]:
        for key in AGREED:
            if other[key] != first[key]:
                raise ProcessesDisagree(
                    f"process {other['process']['index']} reports a different {key!r} than process "
                    f"{first['process']['index']}: the processes did not take the same decisions"
                )
    out: dict[str, Any] = {key: first[key] for key in AGREED}
    out["anchor"] = {**first["anchor"], "bytes": sum(int(r["anchor"]["bytes"]) for r in per_process)}
    out["memory"] = merge_memory([r["memory"] for r in per_process])
    syncs = [r.get("sync") for r in per_process]
    out["sync"] = None
    if all(s is not None for s in syncs):
        out["sync"] = merge_sync(syncs)  # type: ignore[arg-type]
        out["sync"]["processes"] = merge_crossing([r["crossing"] for r in per_process])
    out["process_count"] = len(per_process)
    out["by_host"] = {str(r["process"]["index"]): host_summary(r) for r in per_process}
    return out


def host_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """One process's share: its devices, what its devices hold per role and kind, its sync figures."""
    memory = report["memory"]
    by_kind: dict[str, int] = {}
    for kinds in memory["by_device"].values():
        _add(by_kind, kinds)
    out: dict[str, Any] = {
        "host": report["process"].get("host"),
        "device_ids": list(report["process"]["device_ids"]),
        "memory": {
            "unique_bytes": memory["unique_bytes"],
            "naive_bytes": memory["naive_bytes"],
            "by_role": {role: r["bytes"] for role, r in memory["by_role"].items() if r["bytes"]},
            "by_kind": by_kind,
            "by_device": memory["by_device"],
        },
    }
    sync = report.get("sync")
    if sync is not None:
        out["sync"] = {
            "arrived_bytes": sum(sync["arrived_by_device"].values()),
            "crossed_into_bytes": report["crossing"]["cross_process_bytes"],
            "seconds": sync["seconds"],
            "anchor_seconds": sync["anchor_seconds"],
        }
    return out


def _add(into: dict[str, int], items: Mapping[str, Any]) -> None:
    """Add each of ``items``' counts to ``into``."""
    for key, n in items.items():
        into[key] = into.get(key, 0) + int(n)


def merge_memory(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Memory reports of disjoint device sets as one: bytes added, devices united."""
    by_role: dict[str, dict[str, Any]] = {}
    shared: dict[tuple[str, ...], dict[str, Any]] = {}
    for part in parts:
        for role, r in part["by_role"].items():
            into = by_role.setdefault(role, {"bytes": 0, "by_kind": {}, "by_device": {}})
            into["bytes"] += int(r["bytes"])
            _add(into["by_kind"], r["by_kind"])
            into["by_device"].update(r["by_device"])
        for g in part["shared"]:
            into = shared.setdefault(tuple(g["roles"]), {"roles": list(g["roles"]), "bytes": 0, "buffers": 0})
            _add(into, {"bytes": g["bytes"], "buffers": g["buffers"]})
            into.setdefault("by_device", {}).update(g["by_device"])
    return {
        "units": parts[0]["units"],
        "source": parts[0]["source"] + ", on each process for its own devices, added up by process 0",
        "where": merge_where(parts),
        "by_role": {role: {**r, "by_device": _by_id(r["by_device"])} for role, r in by_role.items()},
        "by_device": _united(p["by_device"] for p in parts),
        "shared": [shared[k] for k in sorted(shared)],
        "unique_bytes": sum(int(p["unique_bytes"]) for p in parts),
        "naive_bytes": sum(int(p["naive_bytes"]) for p in parts),
        "allocator": _merge_allocator([p["allocator"] for p in parts]),
    }


_LEAF_SUMS = (
    "synced_bytes",
    "moved_cross_device_bytes",
    "copied_same_device_bytes",
    "reused_bytes",
    "minimum_cross_device_bytes",
    "relayed_cross_device_bytes",
    "arrived_cross_device_bytes",
)


def merge_sync(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Sync reports of the processes as one, bytes added; ``seconds`` is the longest process's."""
    leaves: dict[str, dict[str, Any]] = {}
    for part in parts:
        for leaf in part["leaves"]:
            into = leaves.get(leaf["path"])
            if into is None:
                leaves[leaf["path"]] = dict(leaf)
                continue
            _add(into, {key: leaf[key] for key in _LEAF_SUMS})
            if leaf["method"] != into["method"]:
                into["method"] = f"{into['method']}; {leaf['method']}"
    merged = [leaves[k] for k in sorted(leaves)]
    total = {key: sum(int(leaf[key]) for leaf in merged) for key in _LEAF_SUMS}
    first = parts[0]
    return {
        "units": first["units"],
        "where": merge_where(parts),
        "method": first["method"] + "; on each process for its own devices, added up by process 0",
        "lora": first["lora"],
        "global_step": first["global_step"],
        **total,
        "excess_cross_device_bytes": total["moved_cross_device_bytes"] - total["minimum_cross_device_bytes"],
        "reshard_strategy": "+".join(sorted({s for p in parts for s in p["reshard_strategy"].split("+")})),
        "synced_logical_bytes": sum(int(leaf["logical_bytes"]) for leaf in merged),
        "anchor_bytes": sum(int(p["anchor_bytes"]) for p in parts),
        "anchor_mode": first["anchor_mode"],
        "seconds": max(float(p["seconds"]) for p in parts),
        "anchor_seconds": max(float(p["anchor_seconds"]) for p in parts),
        "includes_compilation": any(p["includes_compilation"] for p in parts),
        "includes_program_load": any(p["includes_program_load"] for p in parts),
        "arrived_by_device": _united(p["arrived_by_device"] for p in parts),
        "peak_extra_bytes": _united(p["peak_extra_bytes"] for p in parts),
        "transient_peak": merge_peaks([p.get("transient_peak") for p in parts]),
        "leaves": merged,
    }


def merge_peaks(parts: Sequence[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The processes' transient peaks (each walked the arrays on its own devices) as one: phase by
    phase (every process goes through the same phases), each device's figures from its process."""
    if not parts or any(p is None for p in parts):
        return None
    from rlcluster_lab.measure.sync_peak import PeakPhase, peak_of  # the one reduction of a peak

    first = parts[0]
    phases = [  # phase by phase, as far as every process went
        PeakPhase(
            rows[0]["name"],
            rows[0]["chunk"],
            *(_united(r[key] for r in rows) for key in ("arrays", "terms", "temporaries")),
        )
        for rows in zip(*(p["phases"] for p in parts))  # type: ignore[index]
    ]
    return peak_of(
        phases,
        chunk_bytes=first["chunk_bytes"],  # type: ignore[index]
        largest_chunk_bytes=first["largest_chunk_bytes"],  # type: ignore[index]
        order=first["order"],  # type: ignore[index]
        method={k: v + "; each process walked its own devices" for k, v in first["method"].items()},  # type: ignore[index]
        allocator=_merge_allocator([p.get("allocator") or {} for p in parts]),  # type: ignore[union-attr]
    ).to_json()


def process_split(
    transfers: Iterable[tuple[int, int, int]], process_of: Mapping[int, int]
) -> tuple[int, int, dict[str, int]]:
    """(cross-process bytes, within-process bytes, bytes per "src->dst" process pair) of
    cross-device transfers given as (source device id, destination device id, bytes)."""
    crossed = {True: 0, False: 0}  # by whether the bytes crossed a process boundary
    pairs: dict[str, int] = {}
    for src, dst, nbytes in transfers:
        a, b = process_of[src], process_of[dst]
        crossed[a != b] += nbytes
        _add(pairs, {f"{a}->{b}": nbytes})
    return crossed[True], crossed[False], pairs


def merge_crossing(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The processes' crossing facts as one: moved bytes added (each process counted what landed on
    its own devices); the minimums are global already (computed from shardings), taken from process 0."""
    first = parts[0]
    across = sum(int(p["cross_process_bytes"]) for p in parts)
    pairs: dict[str, int] = {}
    for p in parts:
        _add(pairs, p["by_process_pair"])
    return {
        "cross_process_bytes": across,
        "minimum_cross_process_bytes": int(first["minimum_cross_process_bytes"]),
        "excess_cross_process_bytes": across - int(first["minimum_cross_process_bytes"]),
        "within_process_bytes": sum(int(p["within_process_bytes"]) for p in parts),
        "minimum_within_process_bytes": int(first["minimum_within_process_bytes"]),
        "by_process_pair": dict(sorted(pairs.items())),
        "minimum_by_process": first["minimum_by_process"],
        "source": CROSSING_SOURCE,
    }


def minimum_crossing_elements(
    src_boxes: Iterable[tuple[int, Any]], dst_boxes: Iterable[tuple[int, Any]]
) -> dict[int, int]:
    """Per receiving process: elements its destination shards need that none of its own source shards
    holds (``boxes.minimum_cross_device_elements`` with processes for devices; boxes are (process
    index, box) per shard, each distinct box once)."""
    from rlcluster_lab.placement.boxes import minimum_cross_device_elements

    needed = sorted(set(dst_boxes))
    out = {proc: 0 for proc, _ in needed}
    for (proc, _), lacking in zip(needed, minimum_cross_device_elements(list(src_boxes), needed)):
        out[proc] += lacking
    return out


def crossing_facts(source: Mapping[str, Any], destination: Mapping[str, Any], sync: Any) -> dict[str, Any]:
    """This process's crossing facts for one sync, from the actor's arrays the sync read (``source``),
    the rollout's after it (``destination``) and its ``SyncReport`` (every process: the same minimums)."""
    import jax
    import numpy as np

    from rlcluster_lab.placement.boxes import minimum_cross_device_elements, to_box

    process_of = {int(d.id): int(d.process_index) for d in jax.devices()}
    across, within, pairs = process_split(((t.src_device, t.dst_device, t.nbytes) for t in sync.transfers), process_of)
    by_process: dict[str, int] = {}
    cross_device = 0  # the sync report's minimum_cross_device_bytes over every device of every process
    for path, x in source.items():
        shape = tuple(x.shape)
        itemsize = np.dtype(x.dtype).itemsize
        src, dst = (
            [(d, to_box(i, shape)) for d, i in a.sharding.devices_indices_map(shape).items()]
            for a in (x, destination[path])
        )
        cross_device += sum(minimum_cross_device_elements(_keyed(src, "id"), _keyed(dst, "id"))) * itemsize
        needed = minimum_crossing_elements(_keyed(src, "process_index"), _keyed(dst, "process_index"))
        _add(by_process, {str(proc): n * itemsize for proc, n in needed.items()})
    minimum_across = sum(by_process.values())
    return {
        "cross_process_bytes": across,
        "within_process_bytes": within,
        "by_process_pair": pairs,
        "minimum_cross_process_bytes": minimum_across,
        # What crossed devices at least, less what must cross processes, may stay inside one.
        "minimum_within_process_bytes": cross_device - minimum_across,
        "minimum_by_process": dict(sorted(by_process.items(), key=lambda kv: int(kv[0]))),
    }


def _keyed(boxes: Sequence[tuple[Any, Any]], attribute: str) -> list[tuple[int, Any]]:
    """(device, box) pairs as (the device's id or process index, box)."""
    return [(int(getattr(d, attribute)), box) for d, box in boxes]


def _merge_allocator(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The processes' allocator figures (``measure.memory``) as one, by device id."""
    out = {
        "available": any(a.get("available") for a in parts),
        "note": parts[0].get("note", ""),
        "by_device": _united(a.get("by_device", {}) for a in parts),
    }
    if out["available"]:
        out["where"] = merge_where(parts)
        out["difference"] = next(a["difference"] for a in parts if a.get("difference"))
    return out


def merge_where(parts: Sequence[Mapping[str, Any]]) -> str:
    """Where the processes' figures come from, in words: "2 processes of 4 simulated CPU devices
    each" when every process names the same (``core.devices.devices_words``), else each in turn."""
    said = [str(p.get("where") or "") for p in parts]
    if not any(said):
        return ""
    if len(set(said)) == 1:
        return f"{len(said)} processes of {said[0]} each" if len(said) > 1 else said[0]
    return "; ".join(f"process {i}: {w}" for i, w in enumerate(said))


def _by_id(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in sorted(d, key=int)}


def _united(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-device maps of disjoint device sets as one, by device id."""
    return _by_id({k: v for part in parts for k, v in part.items()})


def format_processes(data: Mapping[str, Any]) -> list[str]:
    """The per-process part of a merged report as lines of text."""
    lines = [f"processes: {data['process_count']} (each holds the shards on its own devices)"]
    for index, h in data["by_host"].items():
        roles = ", ".join(f"{r} {n:,}" for r, n in h["memory"]["by_role"].items())
        lines.append(f"  process {index} devices {h['device_ids']}: {h['memory']['unique_bytes']:,} bytes ({roles})")
        if "sync" in h:
            lines.append(
                f"    sync: {h['sync']['arrived_bytes']:,} bytes arrived on its devices, "
                f"{h['sync']['crossed_into_bytes']:,} of them from another process; "
                f"handover {h['sync']['seconds'] * 1e3:.2f} ms"
            )
    sync = data.get("sync")
    if sync:
        p = sync["processes"]
        lines.append(
            f"  across processes {p['cross_process_bytes']:,} bytes (minimum {p['minimum_cross_process_bytes']:,}); "
            f"within processes {p['within_process_bytes']:,} (minimum {p['minimum_within_process_bytes']:,})"
        )
    return lines
