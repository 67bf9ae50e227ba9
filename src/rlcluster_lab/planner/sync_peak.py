"""A weight sync's transient peak on paper (L4): the cluster's sync phases, from shapes.

Per chunk (``placement.chunks.chunk_leaves``) the handover is the route ``placement.route``
works out for the chunk's leaves, the very description the live reshard executes: this module
adds up, at each of the route's phases, the buffers its steps made and have not dropped, as
``measure.sync_peak`` walks the live arrays at the same phases; then ``commit`` (with chunks, the
replaced arrays go), the ``anchor re-pin`` and the ``end``. A buffer the actor holds is never
new and never freed. Program temporaries are counted when ``programs`` compiles the route's
reshard and cast programs here (no array allocated); the minimal strategy's per-device
slicing programs are left out on both sides, and the method says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from rlcluster_lab.engines.base import leaf_path
from rlcluster_lab.measure.sync_peak import PeakPhase, nonzero, peak_of
from rlcluster_lab.placement import phases as ph
from rlcluster_lab.placement import xla as reshard_xla
from rlcluster_lab.placement.chunks import chunk_leaves
from rlcluster_lab.placement.layout import Layout
from rlcluster_lab.placement.reshard import cast_temporaries_of
from rlcluster_lab.placement.route import WORK, Leg, Made, Route, Step, route
from rlcluster_lab.planner.buffers import PlannedArray

PathKey = tuple[Any, ...]

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
        chunk_paths = [paths[i] for i in part]
        legs = tuple(
            Leg(
                actor[p].shape,
                actor[p].dtype,
                Layout(actor[p].mesh, actor[p].spec, actor[p].kind),
                Layout(rollout[p].mesh, rollout[p].spec, rollout[p].kind),
                rollout[p].dtype,
            )
            for p in chunk_paths
        )
        r = route(legs, copy, strategy)
        if r.pieces is not None:
            notes.append("the minimal strategy's per-device slicing programs' temporaries are not read")
        alive: dict[Any, Made] = {}
        for step in r.steps:
            for key in step.drops:
                alive.pop(key, None)
            alive.update((m.key, m) for m in step.made)
            if step.phase is not None:
                emit(step.phase, c, _level(span, alive.values()), temps=_step_temps(r, step, devices))
        results = [alive[k] for k in (r.result_key(i) for i in range(len(legs))) if k is not None and k in alive]
        committed = committed.plus(_level(span, results))
        if chunked:
            for p in chunk_paths:
                _release(released, gone, rollout[p], kept_through)
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


def _sharding(a: PlannedArray | Layout, devices: Mapping[int, Any], kind: str | None = None) -> NamedSharding:
    return reshard_xla.layout_sharding(Layout(a.mesh, a.spec, kind or a.kind), devices)


def _level(span: int, made: Any) -> _Level:
    """The bytes of these values' new buffers, per memory kind and per term, on each device."""
    out = _Level(span)
    for m in made:
        for device, n in m.bytes:
            out.add(np.array([device]), m.kind, m.term, n)
    return out


def _step_temps(r: Route, step: Step, devices: Mapping[int, Any] | None) -> dict[int, int]:
    """Per device, the temporaries of the program a step runs (compiled here, as the live
    reshard compiles it: ``placement.xla.program`` and ``placement.reshard.cast_temporaries_of``)."""
    if devices is None or step.group is None or step.op not in ("program", "between", "cast"):
        return {}
    if step.op == "cast":
        legs = [r.legs[i] for i in step.legs]
        arrays = [jax.ShapeDtypeStruct(leg.shape, leg.dtype, sharding=_sharding(leg.dst, devices)) for leg in legs]
        ids, n = cast_temporaries_of(arrays, [leg.to_dtype for leg in legs])
        return {int(d): n for d in ids}
    g = r.programs[step.group]
    ins, outs = [], []
    for i in g.legs:
        leg = r.legs[i]
        ins.append(jax.ShapeDtypeStruct(leg.shape, leg.dtype, sharding=_sharding(leg.src, devices, WORK)))
        outs.append(_sharding(g.inter(leg) if g.between else leg.dst, devices, WORK))
    prog, _ = reshard_xla.program(ins, outs)
    ids, n = prog.temporaries
    return {int(d): n for d in ids}
