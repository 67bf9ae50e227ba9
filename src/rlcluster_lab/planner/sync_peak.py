"""A weight sync's transient peak on paper (L4): the cluster's sync phases, from shapes.

The same phases ``measure.sync_peak`` walks on live arrays, on arrays on paper and counted
the same way, so a plan and a measured first sync agree (tests/test_sync_peak.py). Per chunk
(``placement.chunks.chunk_leaves``), in the order ``placement.reshard.reshard_many`` runs:
``stage`` (offloaded sources to device), the layout change (a leaf in its destination
sharding is kept, or copied for an owning engine; an equivalent layout is re-labelled; any
other goes through a compiled program per device order, ``reshard``, or a program onto the
source devices and a ``move`` of whole shards), ``reshard`` (the batch holds every result),
``memory kind`` (to pinned host), ``cast`` (per set of destination devices) and ``commit``
(with chunks, the replaced arrays go). Then the ``anchor re-pin`` and the ``end``. A buffer
the actor holds is never new and never freed.

Program temporaries are counted when ``programs`` compiles the reshard programs here (no
array allocated); the minimal strategy's packs in flight are not modelled, and the method
says what was left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from rlcluster_lab.engines.base import leaf_path
from rlcluster_lab.measure.sync_peak import PeakPhase, nonzero, peak_of
from rlcluster_lab.placement import phases as ph
from rlcluster_lab.placement import xla as reshard_xla
from rlcluster_lab.placement.chunks import chunk_leaves
from rlcluster_lab.placement.layout import PlannedMesh, shard_elements
from rlcluster_lab.placement.reshard import cast_temporaries_of
from rlcluster_lab.planner.buffers import PlannedArray, laid_out_as, overlap

PathKey = tuple[Any, ...]
WORK = "device"  # the memory kind layouts change in (a device's default)

METHOD_ARRAYS = (
    "computed from shapes: the sync's phases (planner.sync_peak) on arrays on paper, buffers counted once, "
    "those alive before the sync left out"
)


class _Level:
    """Bytes per (memory kind, device) and per (term, device): numpy rows."""

    def __init__(self, span: int) -> None:
        self.span = span
        self.kinds: dict[str, np.ndarray] = {}
        self.terms: dict[str, np.ndarray] = {}

    def add(self, ids: np.ndarray, kind: str, term: str, nbytes: np.ndarray | int) -> None:
        """Add ``nbytes`` on each of ``ids`` (a mesh's devices: each once)."""
        for table, key in ((self.kinds, kind), (self.terms, ph.term_in(term, kind))):
            row = table.get(key)
            if row is None:
                row = table[key] = np.zeros(self.span, dtype=np.int64)
            row[ids] += nbytes

    def plus(self, *others: _Level) -> _Level:
        out = _Level(self.span)
        for lv in (self, *others):
            for table, dst in ((lv.kinds, out.kinds), (lv.terms, out.terms)):
                for k, row in table.items():
                    dst[k] = dst.get(k, np.zeros(self.span, dtype=np.int64)) + row
        return out


@dataclasses.dataclass
class _Leaf:
    """One leaf's arrays through a chunk, on paper."""

    path: PathKey
    src: PlannedArray
    dst: PlannedArray
    staged: bool = False  # brought to device memory first (offload)
    how: str = "kept"  # kept | copied | relabel | run | run_then_move | minimal
    group: Any = None  # the program group (source order, destination order)
    inter: bool = False  # run_then_move: a program onto the source devices ran
    final: bool = False  # moved to the destination's memory kind after the layout change
    cast: bool = False
    out: tuple[str, int] | None = None  # the result's new buffers: (memory kind, bytes per device)

    def dst_bytes(self, itemsize: int) -> int:
        return shard_elements(self.dst.shape, self.dst.spec, self.dst.mesh) * itemsize


def plan_sync_peak(
    actor: Mapping[PathKey, PlannedArray],
    rollout: Mapping[PathKey, PlannedArray],
    anchor: Mapping[PathKey, PlannedArray],
    trainable: frozenset[PathKey],
    *,
    copy: bool,
    offload: bool,
    partial_anchor: bool,
    chunk_bytes: int | None,
    strategy: str,
    order: str,
    programs: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """The transient peak JSON (``SyncPeak.to_json()``'s keys) of the cluster's next sync, from shapes.

    ``programs``: the devices (this process's, by id) to compile the reshard programs on
    for their temporaries; None leaves the temporaries out.
    """
    ids = [d for m in (actor, rollout, anchor) for a in m.values() for d in a.mesh.device_ids]
    span = 1 + max(ids, default=0)
    keep = _buffers(actor.values())
    kept_through = keep | _buffers(anchor.values())  # the old anchor is released at the end only
    paths = sorted(trainable, key=leaf_path)
    sizes = [int(np.prod(actor[p].shape, dtype=np.int64)) * actor[p].dtype.itemsize for p in paths]
    parts = chunk_leaves(sizes, chunk_bytes)
    chunked = chunk_bytes is not None
    devices = None if programs is None else {int(d.id): d for d in programs}
    notes: list[str] = []

    committed = _Level(span)  # the chunks' results, the rollout's from now on
    released = _Level(span)
    gone: set[tuple[int, int]] = set()
    phases: list[PeakPhase] = []

    def emit(name: str, chunk: int | None, *levels: _Level, temps: Mapping[int, int] | None = None) -> None:
        total = committed.plus(released, *levels)
        phases.append(_phase(name, chunk, total, temps or {}))

    for c, part in enumerate(parts, 1):
        leaves = [_classify(p, actor[p], rollout[p], copy, strategy) for p in (paths[i] for i in part)]
        if any(lf.how == "minimal" for lf in leaves):
            notes.append("the minimal strategy's packs in flight are not modelled")
        staged = _Level(span)
        for lf in leaves:
            if lf.staged:
                staged.add(lf.src.mesh.ids, WORK, ph.STAGED, lf.src.shard_bytes)
        if any(lf.staged for lf in leaves):
            emit("stage", c, staged)
        outputs = _Level(span)
        for lf in leaves:  # the equivalent layouts: re-labelled, or copied for an owning engine
            if lf.how == "copied":
                kind = lf.dst.kind if lf.src.same_sharding(lf.dst.mesh, lf.dst.spec, lf.dst.kind) else WORK
                lf.out = (kind, lf.dst_bytes(lf.src.dtype.itemsize))
                outputs.add(lf.dst.mesh.ids, kind, _term(kind), lf.out[1])
            elif lf.how == "relabel" and lf.staged:
                # The staged source, re-labelled, is the result from here on.
                staged.add(lf.src.mesh.ids, WORK, ph.STAGED, -lf.src.shard_bytes)
                lf.out = (WORK, lf.src.shard_bytes)
                outputs.add(lf.src.mesh.ids, WORK, ph.RESHARDED, lf.out[1])
        groups: dict[Any, list[_Leaf]] = {}
        for lf in leaves:
            if lf.how in ("run", "run_then_move", "minimal"):
                groups.setdefault(lf.group, []).append(lf)
        for group in groups.values():
            kind = group[0].how
            made = _Level(span)
            for lf in group:
                lf.out = (WORK, lf.dst_bytes(lf.src.dtype.itemsize))
                made.add(lf.dst.mesh.ids, WORK, ph.RESHARDED, lf.out[1])
            if kind == "run":
                emit("reshard", c, staged, outputs, made, temps=_temps(group, devices, between=False))
            elif kind == "run_then_move":
                inflight = _Level(span)
                ran = [lf for lf in group if lf.inter]
                for lf in ran:
                    inflight.add(lf.src.mesh.ids, WORK, ph.IN_FLIGHT, lf.dst_bytes(lf.src.dtype.itemsize))
                if ran:
                    emit("reshard", c, staged, outputs, inflight, temps=_temps(ran, devices, between=True))
                emit("move", c, staged, outputs, inflight, made)
            else:
                emit("reshard", c, staged, outputs, made)
            outputs = outputs.plus(made)
        # Each staged source was dropped once its layout changed.
        emit("reshard", c, outputs)
        finals = [lf for lf in leaves if lf.final]
        if finals:
            moved = _Level(span)
            for lf in finals:
                moved.add(lf.dst.mesh.ids, lf.dst.kind, _term(lf.dst.kind), lf.dst_bytes(lf.src.dtype.itemsize))
            emit("memory kind", c, outputs, moved)
            for lf in finals:
                _drop(outputs, lf)
                lf.out = (lf.dst.kind, lf.dst_bytes(lf.src.dtype.itemsize))
            outputs = outputs.plus(moved)
        by_devices: dict[tuple[int, ...], list[_Leaf]] = {}
        for lf in leaves:
            if lf.cast:
                by_devices.setdefault(tuple(sorted(lf.dst.mesh.device_ids)), []).append(lf)
        casts = _Level(span)
        for group in by_devices.values():
            for lf in group:
                casts.add(lf.dst.mesh.ids, lf.dst.kind, ph.CAST, lf.dst.shard_bytes)
            emit("cast", c, outputs, casts, temps=_cast_temps(group, devices))
        for group in by_devices.values():
            for lf in group:
                _drop(outputs, lf)
        committed = committed.plus(outputs, casts)
        if chunked:
            for lf in leaves:
                _release(released, gone, lf.dst, kept_through)
        emit("commit", c)
    new_anchor = _Level(span)
    if not offload:
        for p, a in actor.items():
            if partial_anchor and p not in trainable:
                continue
            new_anchor.add(a.mesh.ids, "pinned_host", ph.ANCHOR, a.shard_bytes)
    emit("anchor re-pin", None, new_anchor)
    for p in paths:
        _release(released, gone, rollout[p], keep)
    for a in anchor.values():
        _release(released, gone, a, keep)
    emit("end", None, new_anchor)
    method = {
        "arrays": METHOD_ARRAYS + ("" if not notes else "; " + "; ".join(sorted(set(notes)))),
        "program_temporaries": "computed: the memory analysis of the reshard and cast programs the sync runs, "
        "compiled for these shapes and shardings (no array allocated)"
        if devices is not None
        else "not included: the reshard programs were not compiled for this topology",
        "allocator": "not applicable to a plan",
    }
    peak = peak_of(
        phases,
        chunk_bytes=chunk_bytes,
        largest_chunk_bytes=max((sum(sizes[i] for i in r) for r in parts), default=0),
        order=order,
        method=method,
    ).to_json()
    rollout_on_device = _Level(span)
    for p in paths:
        a = rollout[p]
        rollout_on_device.add(a.mesh.ids, WORK, "rollout", a.shard_bytes)
    peak["orders"] = other_orders(peak["phases"], new_anchor, rollout_on_device if offload else None)
    return peak


def other_orders(phases: Sequence[Mapping[str, Any]], anchor: _Level, rollout: _Level | None) -> dict[str, Any]:
    """The peaks of the sync's steps in other orders, from the cluster's own phases (P13, P14).

    ``the cluster's``: the handover, then the anchor re-pin (``rules.steps.p13_sync_order``).
    ``anchor re-pinned first``: the new anchor is alive through the whole handover.
    ``rollout brought to device whole`` (offload): the rollout's synced leaves come to device
    for the handover, as an operation brings its role (P14); counted on top of the cluster's
    phases, which is the least that order needs. Per order: the largest bytes of each memory
    kind on one device, and the largest sum over kinds on one device at one phase (on CPU
    devices every kind is the host's RAM).
    """

    def per_device(level: _Level | None, kind: str) -> dict[str, int]:
        row = None if level is None else level.kinds.get(kind)
        return {} if row is None else {str(int(d)): int(row[d]) for d in np.flatnonzero(row)}

    extra_anchor, extra_rollout = per_device(anchor, "pinned_host"), per_device(rollout, WORK)
    variants: dict[str, tuple[str, Mapping[str, int]]] = {
        "the cluster's": ("", {}),
        "anchor re-pinned first": ("pinned_host", extra_anchor),
    }
    if rollout is not None:
        variants["rollout brought to device whole"] = (WORK, extra_rollout)
    out = {}
    for name, (kind, extra) in variants.items():
        top: dict[str, int] = {}
        total = 0
        for p in phases:
            during = p["chunk"] is not None  # a phase of the handover, where the order adds its extra
            devices = set(p["arrays"]) | set(p["temporaries"]) | (set(extra) if during else set())
            for d in devices:
                kinds = dict(p["arrays"].get(d, {}))
                if p["temporaries"].get(d):
                    kinds["device"] = kinds.get("device", 0) + int(p["temporaries"][d])
                if during and d in extra:
                    kinds[kind] = kinds.get(kind, 0) + extra[d]
                for k, v in kinds.items():
                    top[k] = max(top.get(k, 0), int(v))
                total = max(total, sum(int(v) for v in kinds.values()))
        out[name] = {"max_bytes": {k: v for k, v in sorted(top.items()) if v > 0}, "max_total_bytes": total}
    return out


def _phase(name: str, chunk: int | None, level: _Level, temps: Mapping[int, int]) -> PeakPhase:
    def by_device(rows: Mapping[str, np.ndarray]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for key, row in rows.items():
            for d in np.flatnonzero(row):
                out.setdefault(str(int(d)), {})[key] = int(row[d])
        return nonzero(out)

    temporaries = {str(d): int(n) for d, n in sorted(temps.items()) if n}
    return PeakPhase(name, chunk, by_device(level.kinds), by_device(level.terms), temporaries)


def _term(kind: str) -> str:
    return ph.RESHARDED if kind == WORK else ph.MEMORY_KIND


def _drop(outputs: _Level, lf: _Leaf) -> None:
    """The leaf's result so far is dropped (replaced by its move to pinned host, or its cast)."""
    if lf.out is not None:
        kind, n = lf.out
        outputs.add(lf.dst.mesh.ids, kind, _term(kind), -n)
        lf.out = None


def _buffers(arrays: Any) -> set[tuple[int, int]]:
    """(device, buffer) of every shard."""
    return {k for a in arrays for k in zip(a.mesh.device_ids, a.origins.tolist())}


def _release(released: _Level, gone: set[tuple[int, int]], a: PlannedArray, held: set[tuple[int, int]]) -> None:
    """The shards of a replaced array that nothing else holds are freed (each buffer once)."""
    keys = list(zip(a.mesh.device_ids, a.origins.tolist()))
    free = np.array([k not in held and k not in gone for k in keys], dtype=bool)
    if free.any():
        gone.update(k for k, f in zip(keys, free) if f)
        released.add(a.mesh.ids[free], a.kind, ph.RELEASED, -a.shard_bytes)


def _classify(path: PathKey, src: PlannedArray, dst: PlannedArray, copy: bool, strategy: str) -> _Leaf:
    """What ``reshard_many`` does with one leaf (see the module docstring)."""
    lf = _Leaf(path, src, dst, cast=dst.dtype != src.dtype)
    if src.same_sharding(dst.mesh, dst.spec, dst.kind):
        lf.how = "copied" if copy else "kept"
        return lf
    lf.staged = src.kind != WORK
    lf.final = dst.kind != WORK
    same, _ = overlap(src.shape, src.mesh, src.spec, dst.mesh, dst.spec)
    src_ids, dst_ids = src.mesh.device_ids, dst.mesh.device_ids
    # Every shard already on its device: re-labelled (the same device order, or any order with
    # the minimal strategy; in another order the xla strategy makes every shard anew, as device_put).
    if (src_ids == dst_ids or (strategy == "minimal" and set(src_ids) == set(dst_ids))) and bool(same.all()):
        lf.how = "copied" if copy and not lf.staged else "relabel"
        return lf
    if strategy == "minimal" or len(src_ids) != len(dst_ids):
        lf.how, lf.group = "minimal", "minimal"
        return lf
    lf.group = (src_ids, dst_ids)
    if src_ids == dst_ids:
        lf.how = "run"
        return lf
    if set(src_ids) & set(dst_ids):
        raise NotImplementedError(
            f"{leaf_path(path)}: the sync's peak is not planned for a layout change between overlapping but "
            "different device sets; place the rollout on the actor's devices or on devices of its own"
        )
    lf.how = "run_then_move"
    lf.inter = not laid_out_as(src, src.mesh.device_ids, dst.mesh, dst.spec)
    return lf


def _mesh(m: PlannedMesh, devices: Mapping[int, Any]) -> Mesh:
    grid = np.empty(len(m.device_ids), dtype=object)
    grid[:] = [devices[i] for i in m.device_ids]
    types = tuple(getattr(AxisType, t) for t in m.axis_types)
    return Mesh(grid.reshape(m.axis_sizes), m.axis_names, axis_types=types)


def _sharding(a: PlannedArray, devices: Mapping[int, Any], kind: str | None = None) -> NamedSharding:
    return NamedSharding(_mesh(a.mesh, devices), a.spec, memory_kind=kind or a.kind)


def _temps(group: Sequence[_Leaf], devices: Mapping[int, Any] | None, *, between: bool) -> dict[int, int]:
    """Per device, the temporaries of the program the reshard runs for this group (compiled here)."""
    if devices is None:
        return {}
    ins, outs = [], []
    for lf in group:
        src = _sharding(lf.src, devices, WORK)
        dst = _sharding(lf.dst, devices, WORK)
        if between:
            dst = reshard_xla.congruent(dst, [devices[i] for i in lf.src.mesh.device_ids])
        ins.append(jax.ShapeDtypeStruct(lf.src.shape, lf.src.dtype, sharding=src))
        outs.append(dst)
    prog, _ = reshard_xla.program(ins, outs)
    ids, n = prog.temporaries
    return {int(d): n for d in ids}


def _cast_temps(group: Sequence[_Leaf], devices: Mapping[int, Any] | None) -> dict[int, int]:
    """Per device, the temporaries of the cast program (compiled here, as ``reshard.cast_many`` builds it)."""
    if devices is None:
        return {}
    arrays = [jax.ShapeDtypeStruct(lf.dst.shape, lf.src.dtype, sharding=_sharding(lf.dst, devices)) for lf in group]
    ids, n = cast_temporaries_of(arrays, [lf.dst.dtype for lf in group])
    return {int(d): n for d in ids}
