"""Resharding with XLA: one compiled program per set of shardings, and the bytes it moves.

The ``xla`` strategy of ``reshard.reshard_many``. Where source and destination
use the same devices in the same order (colocated meshes in another shape:
the reshaped layout, the vllm-style engine's mesh), a tree of arrays is
resharded by one jitted identity whose outputs carry the destination
shardings: XLA plans the collectives, and no data goes through the host, so
it runs under the weight sync's transfer guard (P13). Where the device sets
differ but have the same size (the split layout), the program reshards onto
the source devices arranged as the destination mesh, and each resulting
shard then crosses to its destination device whole, all in one transfer
call; when that arrangement already matches the source, nothing is compiled.
Other placements (a rollout mesh over a different number of devices) are
left to the ``minimal`` strategy.

What crossed devices is read from the compiled program itself
(``xla_traffic``): its collectives, their shapes and groups, plus the whole
shards that the transfer call moved. Which destination bytes started on
another device is measured once per program by running it on inputs whose
every shard holds its own device's tag (``Provenance``); the difference
between the two is data XLA moved more than once or moved and dropped
(``relayed``), which the sync report shows as excess over the minimum.

Compiled programs are kept in a bounded least-recently-used cache, so a long
lab session that builds many different clusters holds a bounded number of
them (each compiled CPU program holds memory mappings of its own).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, Sharding

from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.core.hosts import crosses_processes, foreign_device_ids, spans_processes
from rlcluster_lab.placement import phases
from rlcluster_lab.placement.boxes import relabel, to_box
from rlcluster_lab.placement.crossing import move_across
from rlcluster_lab.placement.traffic import ProgramTraffic, program_traffic
from rlcluster_lab.placement.transfers import Transfer, current_log, not_recorded, record_transfers
from rlcluster_lab.placement.xla_analysis import Provenance, identity, probe_provenance, read_analysis, write_analysis

MAX_PROGRAMS = 48

Key = tuple[tuple[tuple[int, ...], Any, Sharding, Sharding], ...]


@dataclasses.dataclass
class XlaProgram:
    """A compiled identity from source to destination shardings, and (once asked for) what it moves.

    ``source``: ``"compiled"`` (by XLA in this process) or ``"persistent cache"``
    (read back from disk). The analysis (``traffic``, ``provenance``) is made
    the first time a recorded reshard needs it: a reshard nobody measures (a
    model loaded at construction) pays only for the program.
    """

    compiled: Any
    devices: tuple[Any, ...]  # partition i runs on devices[i]
    inputs: tuple[Any, ...]  # ShapeDtypeStructs with the source shardings
    outputs: tuple[Sharding, ...]
    source: str = "compiled"
    _analysis: tuple[ProgramTraffic, Provenance] | None = None
    _temporaries: tuple[tuple[int, ...], int] | None = None

    @property
    def temporaries(self) -> tuple[tuple[int, ...], int]:
        """(device ids, temporary bytes per device) from the compiled program's memory analysis."""
        if self._temporaries is None:
            self._temporaries = phases.program_temporaries(self.compiled, self.devices)
        return self._temporaries

    def _analyse(self) -> tuple[ProgramTraffic, Provenance]:
        if self._analysis is None:
            # The flows are read from the program itself; only the probe's result may come from
            # the store, and only once it was checked against this program (xla_analysis).
            traffic = program_traffic(self.compiled, self.devices)
            # multi-process: a program spanning processes is probed by all of them together,
            # never read back by some (their stores may differ) while the others probe it.
            spans = spans_processes(self.devices)
            provenance = (
                None if spans else read_analysis(self.compiled, self.devices, self.inputs, self.outputs, traffic)
            )
            if provenance is None:
                # The probe is a measurement of the program, made once, not part of any sync: it
                # may stage its tagged inputs and outputs through the host even inside a sync's guard.
                with jax.transfer_guard("allow"):
                    provenance = probe_provenance(self.compiled, self.inputs, self.outputs)
                if not spans:
                    write_analysis(self.compiled, self.devices, provenance)
            self._analysis = (traffic, provenance)
        return self._analysis

    @property
    def traffic(self) -> ProgramTraffic:
        return self._analyse()[0]

    @property
    def provenance(self) -> Provenance:
        return self._analyse()[1]


class _LRU:
    """A small thread-safe least-recently-used map of compiled programs."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: collections.OrderedDict[Key, XlaProgram] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # programs compiled (or loaded from the persistent cache) so far

    def get(self, key: Key) -> XlaProgram | None:
        with self._lock:
            hit = self._data.get(key)
            if hit is not None:
                self._data.move_to_end(key)
            return hit

    def put(self, key: Key, value: XlaProgram) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            self.compiled += 1
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


PROGRAMS = _LRU(MAX_PROGRAMS)


def assignment(sharding: Sharding) -> tuple[Any, ...] | None:
    """The device order a jitted program over this sharding runs in (None: not a mesh sharding)."""
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
        return tuple(sharding.mesh.devices.flat)
    return None


def congruent(dst: NamedSharding, devices: Sequence[Any]) -> NamedSharding:
    """``dst``'s layout over ``devices``: the shard at mesh position i sits on devices[i]."""
    mesh = Mesh(
        np.asarray(list(devices), dtype=object).reshape(dst.mesh.devices.shape),
        dst.mesh.axis_names,
        axis_types=dst.mesh.axis_types,
    )
    return NamedSharding(mesh, dst.spec, memory_kind=dst.memory_kind)


def _in_order(sharding: NamedSharding, devices: tuple[Any, ...]) -> NamedSharding | None:
    """``sharding``'s mesh shape and spec over ``devices`` in that order."""
    mesh = sharding.mesh
    try:
        other = Mesh(
            np.asarray(list(devices), dtype=object).reshape(mesh.devices.shape),
            mesh.axis_names,
            axis_types=mesh.axis_types,
        )
    except ValueError:
        return None
    return NamedSharding(other, sharding.spec, memory_kind=sharding.memory_kind)


def program(xs: Sequence[jax.Array], dsts: Sequence[Sharding]) -> tuple[XlaProgram, bool]:
    """The compiled identity for these arrays and destinations; True when it was built now."""
    key: Key = tuple((tuple(x.shape), np.dtype(x.dtype), x.sharding, d) for x, d in zip(xs, dsts))
    hit = PROGRAMS.get(key)
    if hit is not None:
        return hit, False
    devices = assignment(xs[0].sharding)
    assert devices is not None
    abstract = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for x in xs]
    # Outside any role's mesh context: the program's shardings are all explicit.
    with jax.set_mesh(None), count_compilations() as made:
        compiled = jax.jit(identity, out_shardings=list(dsts)).lower(abstract).compile()
    from_disk = bool(made) and all(cached for _, _, cached in made)
    built = XlaProgram(compiled, devices, tuple(abstract), tuple(dsts), "persistent cache" if from_disk else "compiled")
    PROGRAMS.put(key, built)
    return built, True


# The analysis of a program (its flows, and the tagged run's provenance) is a property of
# the compiled program and its devices: stored beside the persistent compilation cache,
# keyed by the program's text and device order, it is read back with the program.


_LOGS = _LRU(MAX_PROGRAMS)  # what a change of layout logs, per (arrays, destinations, copy, labels)


def change_layout(
    xs: Sequence[jax.Array], dsts: Sequence[Sharding], copy: bool, labels: Sequence[str | None]
) -> dict[int, tuple[jax.Array, set[int]]]:
    """Reshard what this strategy can; returns index -> (new array, devices holding new buffers).

    Arrays are grouped by (source device order, destination device order).
    Same order: one program. Same number of devices: one program onto the
    source devices laid out as the destination, then one transfer call for
    the shards that change device. Anything else is left out of the result
    (the caller uses the minimal strategy for it).

    What a change logs depends only on shapes, dtypes, shardings and labels
    (the program's collectives, its tagged run, which shards move): it is
    worked out the first time and added from memory afterwards, so a steady
    sync spends its time moving data, not describing it again.
    """
    log = current_log()
    if log is None:
        return _change_layout(xs, dsts, copy, labels)
    key = (tuple((tuple(x.shape), np.dtype(x.dtype), x.sharding, d) for x, d in zip(xs, dsts)), copy, tuple(labels))
    known = _LOGS.get(key)
    if known is None:
        with record_transfers() as fresh:
            done = _change_layout(xs, dsts, copy, labels)
        _LOGS.put(key, fresh)  # type: ignore[arg-type]
        log.compiled |= fresh.compiled
        log.loaded |= fresh.loaded
        known = fresh
    else:
        with not_recorded():
            done = _change_layout(xs, dsts, copy, labels)
    log.transfers.extend(known.transfers)  # type: ignore[attr-defined]
    for leaf, n in known.relayed.items():  # type: ignore[attr-defined]
        log.relayed[leaf] = log.relayed.get(leaf, 0) + n
    log.unreadable.extend(known.unreadable)  # type: ignore[attr-defined]
    return done


@dataclasses.dataclass
class _Route:
    """How a batch of (shape, dtype, source, destination) changes layout, worked out once.

    ``relabel``: arrays re-labelled into the destination's device order first;
    ``groups``: (source order, destination order, arrays) in the order they run;
    ``inter`` and ``need``: for a group whose device orders differ, each array's layout
    on the source devices and the arrays a program must lay out; ``programs``: each
    group's compiled program once it ran (a steady sync looks nothing up again).
    """

    relabel: tuple[tuple[int, Sharding], ...]
    groups: tuple[tuple[tuple[Any, ...], tuple[Any, ...], tuple[int, ...]], ...]
    inter: dict[int, Sharding]
    need: dict[tuple[Any, ...], tuple[int, ...]]
    programs: dict[Any, XlaProgram] = dataclasses.field(default_factory=dict)


_ROUTES: collections.OrderedDict[Any, _Route] = collections.OrderedDict()
_ROUTES_LOCK = threading.Lock()


def _route(xs: Sequence[jax.Array], dsts: Sequence[Sharding]) -> _Route:
    key = tuple((tuple(x.shape), np.dtype(x.dtype), x.sharding, d) for x, d in zip(xs, dsts))
    with _ROUTES_LOCK:
        hit = _ROUTES.get(key)
        if hit is not None:
            _ROUTES.move_to_end(key)
            return hit
    groups: dict[tuple[Any, Any], list[int]] = {}
    relabels: list[tuple[int, Sharding]] = []
    shardings = [x.sharding for x in xs]
    for i, (x, dst) in enumerate(zip(xs, dsts)):
        src_a, dst_a = assignment(x.sharding), assignment(dst)
        if src_a is None or dst_a is None or len(src_a) != len(dst_a):
            continue
        if src_a != dst_a and set(src_a) == set(dst_a):
            # The same devices in another order: when the source layout reads the same in
            # the destination's order (replicated axes), re-label it, which copies nothing.
            relabelled = _in_order(x.sharding, dst_a)  # type: ignore[arg-type]
            if relabelled is not None and relabelled.is_equivalent_to(x.sharding, x.ndim):
                relabels.append((i, relabelled))
                shardings[i] = relabelled
                src_a = dst_a
        groups.setdefault((src_a, dst_a), []).append(i)
    inter: dict[int, Sharding] = {}
    need: dict[tuple[Any, ...], tuple[int, ...]] = {}
    for (src_a, dst_a), idx in groups.items():
        if src_a != dst_a:
            for i in idx:
                inter[i] = congruent(dsts[i], src_a)  # type: ignore[arg-type]
            need[(src_a, dst_a)] = tuple(i for i in idx if not shardings[i].is_equivalent_to(inter[i], xs[i].ndim))
    route = _Route(tuple(relabels), tuple((a, b, tuple(idx)) for (a, b), idx in groups.items()), inter, need)
    with _ROUTES_LOCK:
        _ROUTES[key] = route
        while len(_ROUTES) > MAX_PROGRAMS:
            _ROUTES.popitem(last=False)
    return route


def _change_layout(
    xs: Sequence[jax.Array], dsts: Sequence[Sharding], copy: bool, labels: Sequence[str | None]
) -> dict[int, tuple[jax.Array, set[int]]]:
    route = _route(xs, dsts)
    xs = list(xs)
    for i, sharding in route.relabel:
        # multi-process: device_put would copy an array spanning processes (relabel).
        xs[i] = relabel(xs[i], sharding) if jax.process_count() > 1 else jax.device_put(xs[i], sharding)
        phases.made([xs[i]], phases.IN_FLIGHT)
    done: dict[int, tuple[jax.Array, set[int]]] = {}
    for src_a, dst_a, idx in route.groups:
        if src_a == dst_a:
            outs = _run(list(idx), xs, [dsts[i] for i in idx], labels, route, (src_a, dst_a))
        else:
            outs = _run_then_move(list(idx), xs, dsts, src_a, dst_a, copy, labels, route)
        done.update(outs)
    return done


def _program_of(route: _Route, group: Any, xs: list[jax.Array], dsts: list[Sharding]) -> tuple[XlaProgram, bool]:
    """The group's program: remembered by the route once it ran, else looked up (or built)."""
    hit = route.programs.get(group)
    if hit is not None:
        return hit, False
    prog, built = program(xs, dsts)
    route.programs[group] = prog
    return prog, built


def _run(
    idx: list[int],
    xs: Sequence[jax.Array],
    dsts: list[Sharding],
    labels: Sequence[str | None],
    route: _Route,
    group: Any,
) -> dict[int, tuple[jax.Array, set[int]]]:
    """One program over the group; every output shard is a new buffer, logged from the program."""
    prog, built = _program_of(route, group, [xs[i] for i in idx], dsts)
    outs = prog.compiled([xs[i] for i in idx])
    if phases.current_probe() is not None:
        phases.made(outs, phases.RESHARDED)
        phases.phase("reshard", [prog.temporaries])
    log = current_log()
    if log is not None:
        _note_built(log, prog, built)
        _log_program(log, prog, [labels[i] for i in idx], [xs[i] for i in idx], outs)
    return {i: (y, {d.id for d in y.sharding.device_set}) for i, y in zip(idx, outs)}


def _run_then_move(
    idx: list[int],
    xs: Sequence[jax.Array],
    dsts: Sequence[Sharding],
    src_a: tuple[Any, ...],
    dst_a: tuple[Any, ...],
    copy: bool,
    labels: Sequence[str | None],
    route: _Route,
) -> dict[int, tuple[jax.Array, set[int]]]:
    """Reshard onto the source devices laid out as the destination, then move whole shards."""
    log = current_log()
    inter = route.inter
    need = list(route.need[(src_a, dst_a)])
    ran = set(need)  # arrays a program lays out anew (their intermediate shards are new buffers)
    staged: dict[int, jax.Array] = {i: xs[i] for i in idx}
    origins: dict[int, dict[int, dict[int, int]] | None] = {}
    crossed: dict[int, int] = {}
    if need:
        prog, built = _program_of(route, ("between", src_a, dst_a), [xs[i] for i in need], [inter[i] for i in need])
        outs = prog.compiled([xs[i] for i in need])
        if phases.current_probe() is not None:
            phases.made(outs, phases.IN_FLIGHT)
            phases.phase("reshard", [prog.temporaries])
        for k, (i, y) in enumerate(zip(need, outs)):
            staged[i] = y
            if log is not None:
                origins[i] = prog.provenance.by_leaf[k]
                crossed[i] = _crossed(prog, k)
        if log is not None:
            _note_built(log, prog, built)
            _log_flows(log, prog, [labels[i] for i in need])
    if not set(src_a) & set(dst_a):
        if crosses_processes(src_a, dst_a):
            # multi-process: whole shards cross into another process in one compiled program.
            return move_across(idx, xs, dsts, staged, src_a, dst_a, origins, crossed, labels, log)
        return _move_whole(idx, xs, dsts, staged, src_a, dst_a, origins, crossed, labels, log)
    if crosses_processes(src_a, dst_a):
        raise NotImplementedError(
            "a layout change between overlapping device sets whose shards would cross processes is not "
            "supported; place the rollout on the same devices as the actor (any shape) or on devices of "
            "its own (the split layout)"
        )
    # Position p of the layout: the shard on src_a[p] belongs on dst_a[p]. Where no program
    # ran and the destination device already holds that very block (a replicated leaf, or
    # a device in both sets), its own buffer serves.
    sends: list[tuple[int, int, Any]] = []  # (array, position, data)
    blocks: dict[int, list[Any]] = {i: [None] * len(dst_a) for i in idx}
    made: dict[int, set[int]] = {i: set() for i in idx}
    came_from: dict[int, list[Any]] = {i: list(src_a) for i in idx}
    for i in idx:
        shape = tuple(xs[i].shape)
        by_device = {s.device: s.data for s in staged[i].addressable_shards}
        own = {}
        if i not in ran:
            have = {s.device: to_box(s.index, shape) for s in xs[i].addressable_shards}
            want = {d: to_box(ix, shape) for d, ix in dsts[i].addressable_devices_indices_map(shape).items()}
            own = {d for d in want if have.get(d) == want[d]}
        for p, (src, dst) in enumerate(zip(src_a, dst_a)):
            if dst in own:
                came_from[i][p] = dst
                data = by_device[dst]
            else:
                data = by_device[src]
            if came_from[i][p] != dst:
                sends.append((i, p, data))
            elif copy and i not in ran:
                blocks[i][p] = jax.device_put(data, dst, may_alias=False)
                phases.made([blocks[i][p]], phases.RESHARDED)
                made[i].add(dst.id)
            else:
                blocks[i][p] = data
                if i in ran:
                    made[i].add(dst.id)
    if sends:
        arrived = jax.device_put([d for _, _, d in sends], [dst_a[p] for _, p, _ in sends])
        if phases.current_probe() is not None:
            phases.made(arrived, phases.RESHARDED)
            phases.phase("move")
        for (i, p, _), y in zip(sends, arrived):
            blocks[i][p] = y
            made[i].add(dst_a[p].id)
    out = {i: jax.make_array_from_single_device_arrays(xs[i].shape, dsts[i], blocks[i]) for i in idx}
    if log is not None:
        for i in idx:
            _log_final(
                log,
                labels[i],
                out[i],
                came_from[i],
                dst_a,
                origins[i] if i in origins else "own",
                moved={p for j, p, _ in sends if j == i},
                made=made[i],
                crossed_before=crossed.get(i, 0),
            )
    return {i: (out[i], made[i]) for i in idx}


def _move_whole(
    idx: list[int],
    xs: Sequence[jax.Array],
    dsts: Sequence[Sharding],
    staged: dict[int, jax.Array],
    src_a: tuple[Any, ...],
    dst_a: tuple[Any, ...],
    origins: dict[int, Any],
    crossed: dict[int, int],
    labels: Sequence[str | None],
    log: Any,
) -> dict[int, tuple[jax.Array, set[int]]]:
    """Disjoint device sets: every shard crosses whole, position p from src_a[p] to dst_a[p],
    all in one device-to-device transfer call (no shard can be kept, none goes through the host)."""
    moved = jax.device_put([staged[i] for i in idx], [dsts[i] for i in idx])
    if phases.current_probe() is not None:
        phases.made(moved, phases.RESHARDED)
        phases.phase("move")
    out = dict(zip(idx, moved))
    made = {d.id for d in dst_a}
    if log is not None:
        every = set(range(len(dst_a)))
        for i in idx:
            _log_final(
                log,
                labels[i],
                out[i],
                src_a,
                dst_a,
                origins[i] if i in origins else "own",
                moved=every,
                made=made,
                crossed_before=crossed.get(i, 0),
            )
    return {i: (out[i], set(made)) for i in idx}


def _log_program(
    log: Any, prog: XlaProgram, labels: list[str | None], xs: list[jax.Array], outs: Sequence[jax.Array]
) -> None:
    _log_flows(log, prog, labels)
    for k, (label, y) in enumerate(zip(labels, outs)):
        origins = prog.provenance.by_leaf[k]
        if origins is None:
            log.unreadable.append((label, "destination data not traced (dtype cannot hold a device tag)"))
            continue
        itemsize = np.dtype(y.dtype).itemsize
        arrived = 0
        for shard in y.addressable_shards:
            dev = shard.device.id
            foreign = sum(c for origin, c in origins[dev].items() if origin != dev) * itemsize
            arrived += foreign
            if shard.data.nbytes - foreign:
                log.transfers.append(Transfer("same_device", dev, dev, int(shard.data.nbytes) - foreign, label))
        _note_relayed(log, label, _crossed(prog, k) - arrived)


def _note_built(log: Any, prog: XlaProgram, built: bool) -> None:
    if built:
        if prog.source == "compiled":
            log.compiled = True
        else:
            log.loaded = True


def _crossed(prog: XlaProgram, k: int) -> int:
    foreign = foreign_device_ids()  # multi-process: the flows onto this process's devices
    return sum(f.nbytes for f in prog.traffic.flows if f.param == k and f.dst_device not in foreign)


def _note_relayed(log: Any, label: str | None, nbytes: int) -> None:
    if nbytes > 0:
        log.relayed[label] = log.relayed.get(label, 0) + nbytes


def _log_flows(log: Any, prog: XlaProgram, labels: list[str | None]) -> None:
    foreign = foreign_device_ids()  # multi-process: each process logs what lands on its devices
    for f in prog.traffic.flows:
        if f.dst_device in foreign:
            continue
        label = labels[f.param] if f.param is not None else None
        log.transfers.append(Transfer("cross_device", f.src_device, f.dst_device, f.nbytes, label))
    for line in prog.traffic.unreadable:
        log.unreadable.append((None, line))


def _log_final(
    log: Any,
    label: str | None,
    y: jax.Array,
    src_a: Sequence[Any],
    dst_a: tuple[Any, ...],
    origins: dict[int, dict[int, int]] | None | str,
    *,
    moved: set[int],
    made: set[int],
    crossed_before: int,
) -> None:
    """Log the whole-shard moves, and what each new destination shard's data started as.

    ``src_a[p]`` is the device the shard for position p came from.

    ``origins``: the intermediate program's provenance for this array, or
    ``"own"`` when no program ran (each shard is the source's data on its
    device). ``crossed_before``: what the program moved for this array.
    """
    if origins is None:
        log.unreadable.append((label, "destination data not traced (dtype cannot hold a device tag)"))
    by_device = {s.device: s for s in y.addressable_shards}
    itemsize = np.dtype(y.dtype).itemsize
    crossed, arrived = crossed_before, 0
    for p, (src, dst) in enumerate(zip(src_a, dst_a)):
        nbytes = int(by_device[dst].data.nbytes)
        if p in moved:
            log.transfers.append(Transfer("cross_device", src.id, dst.id, nbytes, label))
            crossed += nbytes
        if dst.id not in made or origins is None:
            continue  # the source's own buffer, reused (or not traced)
        if origins == "own":
            foreign = nbytes if src != dst else 0
        else:
            # The shard at position p was made on src; its data started where the tags say.
            foreign = sum(c for origin, c in origins[src.id].items() if origin != dst.id) * itemsize
        arrived += foreign
        if nbytes - foreign:
            log.transfers.append(Transfer("same_device", dst.id, dst.id, nbytes - foreign, label))
    _note_relayed(log, label, crossed - arrived)


def clear() -> None:
    """Forget every compiled program (the next reshard of each sharding set compiles again)."""
    PROGRAMS.clear()
    _LOGS.clear()
    with _ROUTES_LOCK:
        _ROUTES.clear()
