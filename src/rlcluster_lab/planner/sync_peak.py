"""A weight sync's transient peak on paper (L4): the cluster's sync phases, from shapes.

Per chunk (``placement.chunks.chunk_leaves``) the handover is the route ``placement.route``
works out for the chunk's leaves, the very description the live reshard executes: at each of
the route's phases, then at ``commit`` (with chunks, the replaced arrays go), the ``anchor
re-pin`` and the ``end``, this module hands the buffers the steps made and have not dropped,
and those the sync freed, to the count the live walk runs on real arrays
(``measure.sync_peak.PeakCount``). A buffer the actor holds is never new and never freed.
Program temporaries are counted when ``programs`` compiles the route's reshard and cast
programs here (no array allocated); the minimal strategy's per-device slicing programs are
left out on both sides, and the method says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from rlcluster_lab.engines.base import leaf_path
from rlcluster_lab.measure.sync_peak import Buffer, PeakCount, PeakPhase, largest_chunk, peak_of, tally
from rlcluster_lab.placement import phases as ph
from rlcluster_lab.placement import xla as reshard_xla
from rlcluster_lab.placement.chunks import chunk_leaves
from rlcluster_lab.placement.layout import Layout
from rlcluster_lab.placement.reshard import cast_temporaries_of
from rlcluster_lab.placement.route import WORK, Leg, Made, Route, Step, plan_lines, route
from rlcluster_lab.placement.xla import layout_sharding
from rlcluster_lab.planner.buffers import PlannedArray, anchor_arrays
from rlcluster_lab.rules.anchor import p8_repin_in_place
from rlcluster_lab.rules.steps import p13_sync_order

PathKey = tuple[Any, ...]

METHOD_ARRAYS = (
    "computed from shapes: the sync's phases (planner.sync_peak) on arrays on paper, buffers counted once, "
    "those alive before the sync left out"
)


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
    programs: Sequence[Any] | None = None,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The transient peak JSON (``SyncPeak.to_json()``'s keys) of the cluster's next sync, from shapes,
    and its plan in words: the routes the live reshard runs (``placement.route.plan_lines``).

    ``programs``: the devices (this process's, by id) to compile the reshard programs on
    for their temporaries; None leaves the temporaries out.
    """
    keep = {k for a in actor.values() for k in _buffers(a)}
    kept_through = keep | {k for a in anchor.values() for k in _buffers(a)}  # the old anchor goes at the end
    paths = sorted(trainable, key=leaf_path)
    sizes = [int(np.prod(actor[p].shape, dtype=np.int64)) * actor[p].dtype.itemsize for p in paths]
    devices = None if programs is None else {int(d.id): d for d in programs}
    notes: list[str] = []
    # Every buffer handed to the count below is new or freed once: the chunks' results (the
    # rollout's from now on) and the replaced buffers freed so far are summed as they grow.
    committed: list[tuple[str, dict[Any, Buffer]]] = []
    released: list[tuple[str, dict[Any, Buffer]]] = []
    freed: set[tuple[int, int]] = set()

    def release(arrays: Sequence[PlannedArray], held: set[tuple[int, int]]) -> None:
        """The buffers of replaced arrays that nothing else holds are freed (each once)."""
        nonlocal released
        bufs = {k: b for a in arrays for k, b in _buffers(a).items() if k not in held and k not in freed}
        freed.update(bufs)
        released = _summed([*released, (ph.RELEASED, bufs)])

    count = PeakCount()
    routes: list[Route] = []

    def phase(name: str, made: Sequence[tuple[str, Mapping[Any, Buffer]]], programs: Sequence[Any] = ()) -> None:
        count.count(name, [*committed, *made], frozenset(), [bufs for _, bufs in released], programs)

    for c, part in enumerate(chunk_leaves(sizes, chunk_bytes), 1):
        chunk_paths = [paths[i] for i in part]
        legs = tuple(
            Leg(actor[p].shape, actor[p].dtype, actor[p].layout, rollout[p].layout, rollout[p].dtype)
            for p in chunk_paths
        )
        r = route(legs, copy, strategy)
        routes.append(r)
        if r.pieces is not None:
            notes.append("the minimal strategy's per-device slicing programs' temporaries are not read")
        alive: dict[Any, tuple[str, dict[Any, Buffer]]] = {}
        for step in r.steps:
            for key in step.drops:
                alive.pop(key, None)
            alive.update((m.key, _made(c, m)) for m in step.made)
            if step.phase is not None:
                phase(step.phase, list(alive.values()), _programs(r, step, devices))
        results = [alive[k] for k in r.result_keys if k is not None and k in alive]
        committed = _summed(committed + results)
        if chunk_bytes is not None:
            release([rollout[p] for p in chunk_paths], kept_through)
        phase("commit", [])
    repinned = anchor_arrays(actor, trainable, partial=partial_anchor, new=True)
    new_anchor = {
        p: (ph.ANCHOR, {("anchor", p, d): (str(d), "pinned_host", a.shard_bytes) for d in a.mesh.device_ids})
        for p, a in repinned.items()
    }
    # P8: the leaves written over the old anchor's buffers take them over at the re-pin (the plan's
    # anchor is the cluster's alone: nothing else holds it).
    over = [p for p, a in repinned.items() if p in anchor and _written_over(anchor[p], a)]
    release([anchor[p] for p in over], keep)
    phase("anchor re-pin", list(new_anchor.values()))
    release([*(rollout[p] for p in paths), *anchor.values()], keep)
    phase("end", list(new_anchor.values()))
    method = {
        "arrays": METHOD_ARRAYS + ("" if not notes else "; " + "; ".join(sorted(set(notes)))),
        "program_temporaries": "computed: the memory analysis of the reshard and cast programs the sync runs, "
        "compiled for these shapes and shardings (no array allocated)"
        if devices is not None
        else "not included: the reshard programs were not compiled for this topology",
        "allocator": "not applicable to a plan",
    }
    largest = largest_chunk(sizes, chunk_bytes)
    order = p13_sync_order(chunk_bytes, offload).text  # the cluster's order of the sync's steps (P13)
    peak = peak_of(count.phases, chunk_bytes=chunk_bytes, largest_chunk_bytes=largest, order=order, method=method)
    rollout_on_device = _per_device([("", _buffers(rollout[p])) for p in paths]) if offload else None
    orders = other_orders(count.phases, _per_device(list(new_anchor.values())), rollout_on_device)
    return {**peak.to_json(), "orders": orders}, plan_lines(routes)


def other_orders(
    phases: Sequence[PeakPhase], anchor: Mapping[str, int], rollout: Mapping[str, int] | None
) -> dict[str, Any]:
    """The peaks of the sync's steps in other orders, from the cluster's own phases (P13, P14).

    ``the cluster's``: the handover, then the anchor re-pin (``rules.steps.p13_sync_order``).
    ``anchor re-pinned first``: the new anchor (``anchor``: pinned bytes per device) is alive
    through the whole handover, in buffers of its own: the old one must stay for a rollback (last,
    it is written over the old one, ``rules.anchor.p8_repin_in_place``). ``rollout brought to
    device whole`` (offload): the rollout's synced leaves (``rollout``: bytes per device) come to
    device for the handover, as an operation brings its role (P14); counted on top of the
    cluster's phases, which is the least that order needs. Per order: the largest bytes of each
    memory kind on one device, and the largest sum over kinds on one device at one phase (on CPU
    devices every kind is the host's RAM).
    """
    variants: dict[str, tuple[str, Mapping[str, int]]] = {
        "the cluster's": ("", {}),
        "anchor re-pinned first": ("pinned_host", anchor),
    }
    if rollout is not None:
        variants["rollout brought to device whole"] = (WORK, rollout)
    out = {}
    for name, (kind, extra) in variants.items():
        top: dict[str, int] = {}
        total = 0
        for p in phases:
            during = p.chunk is not None  # a phase of the handover, where the order adds its extra
            for d in set(p.arrays) | set(p.temporaries) | (set(extra) if during else set()):
                kinds = p.on(d)
                if during and d in extra:
                    kinds[kind] = kinds.get(kind, 0) + extra[d]
                for k, v in kinds.items():
                    top[k] = max(top.get(k, 0), v)
                total = max(total, sum(kinds.values()))
        out[name] = {"max_bytes": {k: v for k, v in sorted(top.items()) if v > 0}, "max_total_bytes": total}
    return out


def _written_over(old: PlannedArray, new: PlannedArray) -> bool:
    """``rules.anchor.p8_repin_in_place`` on paper: ``new``'s copy goes over ``old``'s buffers."""
    same = old.shape == new.shape and old.dtype == new.dtype and old.layout == new.layout.in_kind("pinned_host")
    return p8_repin_in_place(new.kind == "pinned_host", same, held_elsewhere=False)


def _buffers(a: PlannedArray) -> dict[tuple[int, int], Buffer]:
    """Each shard's buffer, by (device, buffer on it): (device, memory kind, bytes)."""
    return {(d, o): (str(d), a.kind, a.shard_bytes) for d, o in zip(a.mesh.device_ids, a.origins.tolist())}


def _made(chunk: int, m: Made) -> tuple[str, dict[Any, Buffer]]:
    """A route's value as the count takes it: its term, and its new buffers under keys of their own."""
    return m.term, {(chunk, m.key, j): (str(d), m.kind, n) for j, (d, n) in enumerate(m.bytes)}


def _summed(entries: Sequence[tuple[str, Mapping[Any, Buffer]]]) -> list[tuple[str, dict[Any, Buffer]]]:
    """Values whose every buffer counts (new, or freed once), in few entries: bytes per term, device and kind."""
    out: dict[str, dict[Any, int]] = {}
    for term, bufs in entries:
        for dev, kind, n in bufs.values():
            tally(out, term, (dev, kind), n)
    return [(term, {(term, d, k): (d, k, n) for (d, k), n in row.items()}) for term, row in out.items()]


def _per_device(made: Sequence[tuple[str, Mapping[Any, Buffer]]]) -> dict[str, int]:
    """The bytes of these values' buffers on each device, any memory kind."""
    out: dict[str, int] = {}
    for _, bufs in made:
        for dev, _, n in bufs.values():
            if n:
                out[dev] = out.get(dev, 0) + n
    return out


def _programs(r: Route, step: Step, devices: Mapping[int, Any] | None) -> list[tuple[tuple[int, ...], int]]:
    """(device ids, temporaries per device) of the program a step runs (compiled here, as the live
    reshard compiles it: ``placement.xla.program`` and ``placement.reshard.cast_temporaries_of``)."""
    if devices is None or step.group is None or step.op not in ("program", "between", "cast"):
        return []

    def abstract(leg: Leg, layout: Layout) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(leg.shape, leg.dtype, sharding=layout_sharding(layout, devices))

    legs = [r.legs[i] for i in step.legs]  # a program's step takes its group's legs
    if step.op == "cast":
        return [cast_temporaries_of([abstract(leg, leg.dst) for leg in legs], [leg.to_dtype for leg in legs])]
    g = r.programs[step.group]
    ins = [abstract(leg, leg.src.in_kind(WORK)) for leg in legs]
    outs = [layout_sharding(g.inter(leg) if g.between else leg.dst.in_kind(WORK), devices) for leg in legs]
    prog, _ = reshard_xla.program(ins, outs)
    return [prog.temporaries]
