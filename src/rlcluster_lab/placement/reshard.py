"""Moving arrays between shardings device to device, never through the host.

``reshard_many`` works out the batch's route (``placement.route``, which the planner reads too)
and runs its steps in order, holding its values in one table and dropping what the route drops,
so at each phase exactly the route's buffers are alive. On CPU ``jax.device_put`` between
layouts goes through the host, which the sync's transfer guard forbids (P13); no step does.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from rlcluster_lab.core.meshes import MESH_AXES
from rlcluster_lab.core.options import RESHARD_STRATEGIES
from rlcluster_lab.placement import minimal as reshard_minimal
from rlcluster_lab.placement import phases
from rlcluster_lab.placement import xla as reshard_xla
from rlcluster_lab.placement.boxes import Relabel
from rlcluster_lab.placement.events import LEDGER, Built, Made, Phase, Routed, Transfer, emit, listening, wants
from rlcluster_lab.placement.layout import Layout, PlannedMesh
from rlcluster_lab.placement.programs import ProgramCache, compile_outside_mesh
from rlcluster_lab.placement.route import Leg, Route, route
from rlcluster_lab.placement.transfers import log_new_shards, log_within_devices, shard_buffers, shard_keys


def reshard_many(
    xs: Sequence[jax.Array],
    dsts: Sequence[Sharding],
    *,
    copy: bool = False,
    labels: Sequence[str | None] | None = None,
    dtypes: Sequence[Any] | None = None,
    strategy: str = "xla",
) -> list[jax.Array]:
    """``xs`` laid out as ``dsts``, device to device (a memory-kind change after), each cast to
    ``dtypes[i]`` on its destination last when given; ``labels`` tag their transfers.

    Per array: kept when already in the destination sharding (unless ``copy``), re-labelled when
    the layout is equivalent, else changed by ``strategy`` (``xla`` or ``minimal``); a source buffer
    is kept exactly where ``jax.device_put`` keeps it (``minimal``: wherever its device holds it).
    """
    shapes = [(tuple(x.shape), x.dtype) for x in xs]
    key = (*(x.sharding for x in xs), *shapes, *dsts, copy, strategy)
    key += (None if labels is None else tuple(labels), None if dtypes is None else tuple(dtypes))
    plan = _BATCHES.get(key)
    if plan is None:
        plan = batch([x.sharding for x in xs], shapes, dsts, copy, labels, dtypes, strategy)
        _BATCHES.put(key, plan)
    return plan.run(xs)


_BATCHES = ProgramCache(64)  # each batch signature's reshard and ledger (cleared with the programs)


@dataclasses.dataclass
class Batch:
    """One reshard worked out from shapes and layouts alone (its ``route``), to run on any arrays
    of those shapes in those shardings; ``ledger``: the copies its first recorded run emitted."""

    route: Route
    dsts: tuple[Sharding, ...]
    labels: list[str | None]
    ledger: list[Any] | None = None
    relabels: dict[int, Relabel] = dataclasses.field(default_factory=dict)  # per relabelled leg, made on its first run

    @functools.cached_property
    def work_dsts(self) -> tuple[Sharding, ...]:
        """Each leg's destination in its devices' default memory (where layouts change), worked out
        once: a sharding made anew each run would be hashed and compared anew by every ``device_put``."""
        legs = self.route.legs
        return tuple(d if leg.src == leg.dst else d.with_memory_kind(_work_kind(d)) for d, leg in zip(self.dsts, legs))

    def run(self, xs: Sequence[jax.Array]) -> list[jax.Array]:
        """The batch run on ``xs``: its ledger is described on the first run somebody listens to and
        replayed after (the same shapes and shardings make the same copies); ``Built`` is news of the
        first run only."""
        if not wants(Transfer):
            return _Run(self, xs).results()
        ledger = self.ledger
        heard = _Ledger() if ledger is None else ledger
        with listening(*([heard] if ledger is None else []), instead=LEDGER):
            out = _Run(self, xs).results()
        if ledger is None:
            self.ledger = [e for e in heard if not isinstance(e, Built)]
        for event in heard:
            emit(event)
        emit(Routed(self.route))
        return out


class _Ledger(list):
    kinds = LEDGER
    on = list.append


def batch(
    srcs: Sequence[Sharding],
    shapes: Sequence[tuple[tuple[int, ...], Any]],
    dsts: Sequence[Sharding],
    copy: bool,
    labels: Sequence[str | None] | None,
    dtypes: Sequence[Any] | None,
    strategy: str,
) -> Batch:
    """The reshard of arrays of ``shapes`` (shape, dtype) in shardings ``srcs`` onto ``dsts`` (see
    ``reshard_many``), worked out once."""
    if strategy not in RESHARD_STRATEGIES:
        raise ValueError(f"unknown reshard strategy {strategy!r}; use one of {', '.join(RESHARD_STRATEGIES)}")
    labels = list(labels) if labels is not None else [None] * len(srcs)
    legs = tuple(
        Leg(shape, np.dtype(dtype), layout_of(s), layout_of(d), None if t is None else np.dtype(t))
        for (shape, dtype), s, d, t in zip(shapes, srcs, dsts, dtypes if dtypes is not None else [None] * len(srcs))
    )
    return Batch(route(legs, copy, strategy), tuple(dsts), labels)


def layout_of(sharding: Sharding) -> Layout:
    """A sharding as plain data; a single-device sharding is a mesh of one device."""
    if isinstance(sharding, NamedSharding):
        return Layout.of(sharding)
    (device,) = sharding.device_set
    return Layout(PlannedMesh((device.id,), (1,) * len(MESH_AXES)), PartitionSpec(), str(sharding.memory_kind))


@dataclasses.dataclass
class _Run:
    """One execution of a route on arrays: the values each step made, by key, and for each leg
    the devices whose result shard a logged copy made (``produced``)."""

    batch: Batch
    xs: Sequence[jax.Array]
    vals: dict[tuple[Any, ...], Any] = dataclasses.field(default_factory=dict)
    produced: dict[int, set[int]] = dataclasses.field(default_factory=dict)
    # The xla strategy's moves: a between program's (provenance, bytes crossed) per leg, the
    # shards gathered for each leg, and legs already one array (moved whole, or across processes).
    between: dict[int, tuple[Any, int]] = dataclasses.field(default_factory=dict)
    blocks: dict[int, list[Any]] = dataclasses.field(default_factory=dict)
    joined: dict[int, jax.Array] = dataclasses.field(default_factory=dict)

    def value(self, i: int) -> jax.Array:
        """Leg i's array as the layout change takes it: staged, or the source itself."""
        return self.vals.get(("staged", i), self.xs[i])

    @property
    def route(self) -> Route:
        return self.batch.route

    @property
    def dsts(self) -> tuple[Sharding, ...]:
        return self.batch.dsts

    @property
    def labels(self) -> list[str | None]:
        return self.batch.labels

    def work_dst(self, i: int) -> Sharding:
        """Leg i's destination in the devices' default memory (where layouts change)."""
        return self.batch.work_dsts[i]

    @functools.cached_property
    def devices(self) -> dict[int, Any]:
        return {d.id: d for x, dst in zip(self.xs, self.dsts) for d in (*x.sharding.device_set, *dst.device_set)}

    def results(self) -> list[jax.Array]:
        for step in self.route.steps:
            out, temps = _OPS[step.op](self, step)
            for key in step.drops:
                self.vals.pop(key, None)
            self.vals.update(out)
            if wants(Phase):
                for m in step.made:
                    value = self.vals[m.key]
                    emit(Made(value if isinstance(value, list) else [value], m.term))
                if step.phase is not None:
                    emit(Phase(step.phase, temps))
            del out
        results = [x if key is None else self.vals[key] for x, key in zip(self.xs, self.route.result_keys)]
        self._log_carried()
        return results

    def _log_carried(self) -> None:
        """A result shard carrying the source's data on its device in a new buffer (moved between memory
        kinds) was copied within its device: logged, so that every destination byte is accounted for."""
        if not wants(Transfer):
            return
        for i, x in enumerate(self.xs):
            key = self.route.uncast_key(i)
            y = x if key is None else self.vals[key]
            if y is x:
                continue
            made = self.produced.get(i, set())
            if len(made) == len(y.sharding.device_set):
                continue
            own = shard_keys(x)
            carried = [(key, n) for key, n in shard_buffers(y) if key not in own and key[1] not in made]
            log_within_devices("same_device", carried, self.labels[i])


Ops = dict[tuple[Any, ...], Any]


def _stage(run: _Run, step: Any) -> tuple[Ops, list]:
    """Sources in another memory kind, brought to the devices' default memory (per device)."""
    xs = [run.xs[i] for i in step.legs]
    return _put_kinds(run, step.legs, "staged", xs, [x.sharding.with_memory_kind(_work_kind(x.sharding)) for x in xs])


def _relabel(run: _Run, step: Any) -> tuple[Ops, list]:
    """Equivalent layouts: the same buffers under the destination's sharding."""
    # Its own shards under the new sharding are the same buffers. Not ``jax.device_put``: across
    # processes it copies even onto an equivalent sharding, and in one it checks each leaf anew.
    relabels = run.batch.relabels
    out = {}
    for i in step.legs:
        x = run.value(i)
        if i not in relabels:
            relabels[i] = Relabel(x, run.work_dst(i))
        out[("out", i)] = relabels[i](x)
    return out, []


def _copy(run: _Run, step: Any) -> tuple[Ops, list]:
    """New buffers of the same layout, on every device (an engine that owns its weights), made by
    one compiled copy program (far faster on a chip than ``device_put(..., may_alias=False)``)."""
    # One program takes arrays of one device order: one per order among the legs (their route's).
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in step.legs:
        groups.setdefault(run.route.legs[i].dst.device_ids, []).append(i)
    out: Ops = {}
    with jax.set_mesh(None):
        for legs in groups.values():
            xs = [run.value(i) for i in legs]
            ys = _jitted(copy_arrays, [run.work_dst(i) for i in legs])(xs)
            for i, x, y in zip(legs, xs, ys):
                run.produced[i] = log_new_shards("same_device", x, y, run.labels[i])
                out[("out", i)] = y
    return out, []


_JITTED = ProgramCache(64)


def _jitted(fun: Any, out_shardings: Sequence[Sharding]) -> Any:
    """``jax.jit(fun, out_shardings=...)``, made once per function and shardings: a wrapper made
    anew at every sync would find its program through JAX's slow path."""
    key = (fun, tuple(out_shardings))
    hit = _JITTED.get(key)
    if hit is None:
        hit = jax.jit(fun, out_shardings=list(out_shardings))
        _JITTED.put(key, hit)
    return hit


def copy_arrays(xs: list[jax.Array]) -> list[jax.Array]:
    """New arrays holding the values of ``xs``: jitted with destination shardings, the copy
    program a same-layout handover runs (a jitted identity would hand back its inputs)."""
    return [jnp.copy(x) for x in xs]


def _nothing(run: _Run, step: Any) -> tuple[Ops, list]:
    """A step that runs nothing: it drops what the route says, at its phase."""
    return {}, []


def _memory_kind(run: _Run, step: Any) -> tuple[Ops, list]:
    """Results moved to their destination's memory kind (pinned host), per device."""
    xs = [run.vals[("out", i)] for i in step.legs]
    return _put_kinds(run, step.legs, "final", xs, [run.dsts[i] for i in step.legs])


def _cast(run: _Run, step: Any) -> tuple[Ops, list]:
    """Each array cast to its destination dtype on its own devices, in one program."""
    r = run.route
    before = {i: run.xs[i] if r.uncast_key(i) is None else run.vals[r.uncast_key(i)] for i in step.legs}
    arrays = [before[i] for i in step.legs]
    dtypes = [r.legs[i].to_dtype for i in step.legs]
    ys, temps = _cast_program_run(arrays, dtypes)
    for i in step.legs if wants(Transfer) else ():
        # The shards still the source's own buffers (a reshard of it kept them) became same-device copies.
        own = shard_keys(run.xs[i])
        log_within_devices("same_device", [(k, n) for k, n in shard_buffers(before[i]) if k in own], run.labels[i])
    return {("cast", i): y for i, y in zip(step.legs, ys)}, [temps] if temps is not None else []


_OPS = {
    "stage": _stage,
    "relabel": _relabel,
    "copy": _copy,
    "program": reshard_xla.run_program,
    "between": reshard_xla.run_between,
    "moves": reshard_xla.run_moves,
    "join": reshard_xla.join,
    "join pieces": reshard_minimal.join,
    "cut": reshard_minimal.cut,
    "send": reshard_minimal.send,
    "assemble": reshard_minimal.assemble,
    "changed": _nothing,
    "memory kind": _memory_kind,
    "settled": _nothing,
    "cast": _cast,
}


def _put_kinds(run: _Run, legs: Any, key: str, xs: list[jax.Array], dsts: list[Sharding]) -> tuple[Ops, list]:
    """Moves between memory kinds (per device: the transfer guard allows them), logged; results by ``(key, leg)``."""
    ys = jax.device_put(xs, dsts)
    for i, x, y in zip(legs, xs, ys):
        log_new_shards("memory_kind", x, y, run.labels[i])
    return {(key, i): y for i, y in zip(legs, ys)}, []


def _work_kind(s: Sharding) -> str:
    """The default memory kind of the devices ``s`` is on (where layout changes run)."""
    return next(iter(s.device_set)).default_memory().kind


def cast_many(xs: Sequence[jax.Array], dtypes: Sequence[Any]) -> list[jax.Array]:
    """Each array cast to its dtype on its own devices (those already in it as they are), in one
    jitted program per set of devices: eager ``astype`` would compile one per shape."""
    out = list(xs)
    groups: dict[Any, list[int]] = {}
    for i, (x, dtype) in enumerate(zip(xs, dtypes)):
        if x.dtype != np.dtype(dtype):
            groups.setdefault(tuple(x.sharding.device_set), []).append(i)
    for idx in groups.values():
        ys, _ = _cast_program_run([xs[i] for i in idx], [dtypes[i] for i in idx])
        for i, y in zip(idx, ys):
            out[i] = y
    return out


def _cast_program_run(arrays: list[jax.Array], dtypes: list[Any]) -> tuple[list[jax.Array], Any]:
    """The cast program run on ``arrays`` (one set of devices), and its temporaries when a peak walk watches."""
    names = tuple(str(np.dtype(d)) for d in dtypes)
    with jax.set_mesh(None):
        ys = _jitted(_cast_program(names), [x.sharding for x in arrays])(arrays)
    temps = cast_temporaries_of(arrays, dtypes) if wants(Phase) else None
    return list(ys), temps


_CAST_TEMPORARIES = ProgramCache(64)


def cast_temporaries_of(arrays: Sequence[Any], dtypes: Sequence[Any]) -> tuple[tuple[int, ...], int]:
    """(device ids, temporary bytes per device) of ``cast_many``'s program for ``arrays`` (or their
    shapes), compiled once per signature; the planner reads the same figure."""
    names = tuple(str(np.dtype(d)) for d in dtypes)
    key = (names, tuple((tuple(x.shape), str(np.dtype(x.dtype)), x.sharding) for x in arrays))
    hit: tuple[tuple[int, ...], int] | None = _CAST_TEMPORARIES.get(key)
    if hit is None:
        compiled, _ = compile_outside_mesh(_jitted(_cast_program(names), [x.sharding for x in arrays]), list(arrays))
        hit = phases.program_temporaries(compiled, list(arrays[0].sharding.device_set))
        _CAST_TEMPORARIES.put(key, hit)
    return hit


@functools.lru_cache(maxsize=32)
def _cast_program(dtypes: tuple[str, ...]) -> Any:
    def cast(arrays: list[jax.Array]) -> list[jax.Array]:
        return [x.astype(d) for x, d in zip(arrays, dtypes)]

    return cast
