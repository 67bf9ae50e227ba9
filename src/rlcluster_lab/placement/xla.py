"""Resharding with XLA (the ``xla`` strategy of ``reshard.reshard_many``): one compiled program
per set of shardings, and the bytes it moves.

Same devices in the same order (the reshaped layout, the vllm-style engine's mesh): one jitted
identity with the destination shardings; XLA plans the collectives and nothing goes through
the host, so it runs under the sync's transfer guard (P13). Device sets of one size (the
split layout): a program onto the source devices laid out as the destination, then every
shard crosses whole in one transfer call. Anything else is left to the ``minimal`` strategy.
What crossed is read from the program (``placement.traffic``) plus the whole shards moved;
where destination bytes started is measured once per program by a tagged run
(``xla_analysis.Provenance``), and the difference is ``relayed`` (excess over the minimum).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, Sharding

from rlcluster_lab.core.compile_options import options_for
from rlcluster_lab.core.hosts import crosses_processes, foreign_device_ids, spans_processes
from rlcluster_lab.placement import phases
from rlcluster_lab.placement.boxes import device_put_keeps, relabel, to_box
from rlcluster_lab.placement.crossing import move_across
from rlcluster_lab.placement.programs import ProgramCache, compile_outside_mesh
from rlcluster_lab.placement.traffic import ProgramTraffic, program_traffic
from rlcluster_lab.placement.transfers import Transfer, TransferLog, current_log, replay_log
from rlcluster_lab.placement.xla_analysis import (
    UNTRACED,
    Provenance,
    identity,
    probe_provenance,
    read_analysis,
    write_analysis,
)

MAX_PROGRAMS = 48

Key = tuple[tuple[tuple[int, ...], Any, Sharding, Sharding], ...]


@dataclasses.dataclass
class XlaProgram:
    """A compiled identity from source to destination shardings, and (once asked for) what it moves.

    ``source``: ``"compiled"`` or ``"persistent cache"``. The analysis (``traffic``,
    ``provenance``) is made the first time a recorded reshard needs it.
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


PROGRAMS = ProgramCache(MAX_PROGRAMS)
_LOGS = ProgramCache(MAX_PROGRAMS)  # what a change of layout logs, per (arrays, destinations, copy, labels)


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


def _key(xs: Sequence[jax.Array], dsts: Sequence[Sharding]) -> Key:
    return tuple((tuple(x.shape), np.dtype(x.dtype), x.sharding, d) for x, d in zip(xs, dsts))


def program(xs: Sequence[jax.Array], dsts: Sequence[Sharding]) -> tuple[XlaProgram, bool]:
    """The compiled identity for these arrays and destinations; True when it was built now."""
    key = _key(xs, dsts)
    hit = PROGRAMS.get(key)
    if hit is not None:
        return hit, False
    devices = assignment(xs[0].sharding)
    assert devices is not None
    abstract = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for x in xs)
    compiled, source = compile_outside_mesh(
        jax.jit(identity, out_shardings=list(dsts)), list(abstract), options=options_for(list(xs))
    )
    built = XlaProgram(compiled, devices, abstract, tuple(dsts), source)
    PROGRAMS.put(key, built)
    return built, True


def change_layout(
    xs: Sequence[jax.Array], dsts: Sequence[Sharding], copy: bool, labels: Sequence[str | None]
) -> dict[int, tuple[jax.Array, set[int]]]:
    """Reshard what this strategy can; returns index -> (new array, devices holding new buffers).

    Arrays are grouped by (source device order, destination device order) as the module says;
    the rest is left out of the result (for the minimal strategy). What a change logs depends
    only on shapes, dtypes, shardings and labels, so it is recorded once and replayed.
    """
    log = current_log()
    if log is None:
        return _change_layout(xs, dsts, copy, labels)
    key = (_key(xs, dsts), copy, tuple(labels))
    return replay_log(_LOGS, key, lambda: _change_layout(xs, dsts, copy, labels))


@dataclasses.dataclass
class _Route:
    """How a batch of (shape, dtype, source, destination) changes layout, worked out once.

    ``relabel``: arrays re-labelled into the destination's order first; ``groups``: (source
    order, destination order, arrays) as they run; ``inter`` and ``need``: for differing
    orders, each array's layout on the source devices and those a program must lay out;
    ``programs``: each group's compiled program once it ran.
    """

    relabel: tuple[tuple[int, Sharding], ...]
    groups: tuple[tuple[tuple[Any, ...], tuple[Any, ...], tuple[int, ...]], ...]
    inter: dict[int, Sharding]
    need: dict[tuple[Any, ...], tuple[int, ...]]
    programs: dict[Any, XlaProgram] = dataclasses.field(default_factory=dict)


_ROUTES = ProgramCache(MAX_PROGRAMS)  # a route holds its groups' programs: bounded like them


def _route(xs: Sequence[jax.Array], dsts: Sequence[Sharding]) -> _Route:
    key = _key(xs, dsts)
    hit: _Route | None = _ROUTES.get(key)
    if hit is not None:
        return hit
    groups: dict[tuple[Any, Any], list[int]] = {}
    relabels: list[tuple[int, Sharding]] = []
    shardings = [x.sharding for x in xs]
    for i, (x, dst) in enumerate(zip(xs, dsts)):
        src_a, dst_a = assignment(x.sharding), assignment(dst)
        if src_a is None or dst_a is None or len(src_a) != len(dst_a):
            continue
        if src_a != dst_a and set(src_a) == set(dst_a) and jax.process_count() > 1:
            # multi-process, the same devices in another order: when the source layout reads the
            # same in the destination's order (replicated axes), re-label it, which copies
            # nothing (whole shards cannot move between processes one at a time). In one
            # process every shard is made anew, as ``jax.device_put`` does (_run_then_move).
            relabelled = congruent(x.sharding, dst_a)  # type: ignore[arg-type]
            if relabelled.is_equivalent_to(x.sharding, x.ndim):
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
    _ROUTES.put(key, route)
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


def _run(
    idx: list[int],
    xs: Sequence[jax.Array],
    dsts: list[Sharding],
    labels: Sequence[str | None],
    route: _Route,
    group: Any,
) -> dict[int, tuple[jax.Array, set[int]]]:
    """One program over the group; every output shard is a new buffer, logged from the program."""
    log = current_log()
    prog, outs = _run_program([xs[i] for i in idx], dsts, [labels[i] for i in idx], log, route, group)
    if log is not None:
        _log_arrivals(log, prog, [labels[i] for i in idx], outs)
    return {i: (y, {d.id for d in y.sharding.device_set}) for i, y in zip(idx, outs)}


def _run_program(
    xs: list[jax.Array],
    dsts: list[Sharding],
    labels: list[str | None],
    log: TransferLog | None,
    route: _Route,
    group: Any,
    term: str = phases.RESHARDED,
) -> tuple[XlaProgram, list[jax.Array]]:
    """The compiled identity run on ``xs`` (the route remembers it once it ran); logs that it was
    built, and the flows read from it; tells the sync's peak walk what it made (``term``)."""
    prog = route.programs.get(group)
    built = False
    if prog is None:
        prog, built = program(xs, dsts)
        route.programs[group] = prog
    outs = prog.compiled(xs)
    if phases.current_probe() is not None:
        phases.made(outs, term)
        phases.phase("reshard", [prog.temporaries])
    if log is not None:
        if built:
            log.note_built(prog.source)
        _log_flows(log, prog, labels)
    return prog, outs


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
        prog, outs = _run_program(
            [xs[i] for i in need],
            [inter[i] for i in need],
            [labels[i] for i in need],
            log,
            route,
            ("between", src_a, dst_a),
            phases.IN_FLIGHT,
        )
        for k, (i, y) in enumerate(zip(need, outs)):
            staged[i] = y
            if log is not None:
                origins[i] = prog.provenance.by_leaf[k]
                crossed[i] = _crossed(prog, k)
    if crosses_processes(src_a, dst_a):
        if set(src_a) & set(dst_a):
            raise NotImplementedError(
                "a layout change between overlapping device sets whose shards would cross processes is not "
                "supported; place the rollout on the same devices as the actor (any shape) or on devices of "
                "its own (the split layout)"
            )
        # multi-process: whole shards cross into another process in one compiled program.
        return move_across(idx, xs, dsts, staged, src_a, dst_a, origins, crossed, labels, log)
    if not set(src_a) & set(dst_a):
        return _move_whole(idx, dsts, staged, src_a, dst_a, origins, crossed, labels, log)
    # Overlapping device sets. Position p of the layout: the shard on src_a[p] belongs on
    # dst_a[p], and crosses whole, all in one device-to-device transfer call. Where no program
    # ran, a destination device keeps its own buffer exactly where ``jax.device_put`` would
    # (``boxes.device_put_keeps``); every other shard is a new buffer, copied on its device
    # when it is already there (the same devices in another order make every shard anew).
    sends: list[tuple[int, int, Any]] = []  # (array, position, data)
    blocks: dict[int, list[Any]] = {i: [None] * len(dst_a) for i in idx}
    made: dict[int, set[int]] = {i: set() for i in idx}
    came_from: dict[int, list[Any]] = {i: list(src_a) for i in idx}
    for i in idx:
        by_device = {s.device: s.data for s in staged[i].addressable_shards}
        own = set() if i in ran else _kept_by_device_put(xs[i], dsts[i])
        for p, (src, dst) in enumerate(zip(src_a, dst_a)):
            if dst in own:
                came_from[i][p] = dst
                data = by_device[dst]
            else:
                data = by_device[src]
            if came_from[i][p] != dst:
                sends.append((i, p, data))
            elif (copy or dst not in own) and i not in ran:
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


def _kept_by_device_put(x: jax.Array, dst: Sharding) -> set[Any]:
    """The devices whose shard of ``x`` ``jax.device_put`` onto ``dst`` keeps as it is."""
    shape = tuple(x.shape)
    src = [(d.id, to_box(ix, shape)) for d, ix in x.sharding.devices_indices_map(shape).items()]
    want = [(d, to_box(ix, shape)) for d, ix in dst.devices_indices_map(shape).items()]
    keeps = device_put_keeps(src, [(d.id, box) for d, box in want])
    return {d for (d, _), k in zip(want, keeps) if k}


def _move_whole(
    idx: list[int],
    dsts: Sequence[Sharding],
    staged: dict[int, jax.Array],
    src_a: tuple[Any, ...],
    dst_a: tuple[Any, ...],
    origins: dict[int, Any],
    crossed: dict[int, int],
    labels: Sequence[str | None],
    log: TransferLog | None,
) -> dict[int, tuple[jax.Array, set[int]]]:
    """Disjoint device sets: every shard crosses whole, position p from src_a[p] to dst_a[p], in one
    device-to-device transfer call of the arrays as they are (the split layout's steady sync
    costs what a bare ``device_put`` of the same tree costs)."""
    moved = jax.device_put([staged[i] for i in idx], [dsts[i] for i in idx])
    if phases.current_probe() is not None:
        phases.made(moved, phases.RESHARDED)
        phases.phase("move")
    made = {d.id for d in dst_a}
    if log is not None:
        every = set(range(len(dst_a)))
        for i, y in zip(idx, moved):
            origin = origins[i] if i in origins else "own"
            _log_final(
                log, labels[i], y, src_a, dst_a, origin, moved=every, made=made, crossed_before=crossed.get(i, 0)
            )
    return {i: (y, set(made)) for i, y in zip(idx, moved)}


def _log_arrivals(log: TransferLog, prog: XlaProgram, labels: list[str | None], outs: Sequence[jax.Array]) -> None:
    """Per output shard: the bytes whose data started on its own device, as same-device copies;
    what crossed beyond the bytes that arrived from elsewhere was relayed."""
    for k, (label, y) in enumerate(zip(labels, outs)):
        origins = prog.provenance.by_leaf[k]
        if origins is None:
            log.unreadable.append((label, UNTRACED))
            continue
        itemsize = np.dtype(y.dtype).itemsize
        arrived = 0
        for shard in y.addressable_shards:
            dev = shard.device.id
            foreign = sum(c for origin, c in origins[dev].items() if origin != dev) * itemsize
            arrived += foreign
            if shard.data.nbytes - foreign:
                log.transfers.append(Transfer("same_device", dev, dev, int(shard.data.nbytes) - foreign, label))
        log.note_relayed(label, _crossed(prog, k) - arrived)


def _crossed(prog: XlaProgram, k: int) -> int:
    foreign = foreign_device_ids()  # multi-process: the flows onto this process's devices
    return sum(f.nbytes for f in prog.traffic.flows if f.param == k and f.dst_device not in foreign)


def _log_flows(log: TransferLog, prog: XlaProgram, labels: list[str | None]) -> None:
    foreign = foreign_device_ids()  # multi-process: each process logs what lands on its devices
    for f in prog.traffic.flows:
        if f.dst_device not in foreign:
            label = labels[f.param] if f.param is not None else None
            log.transfers.append(Transfer("cross_device", f.src_device, f.dst_device, f.nbytes, label))
    log.unreadable.extend((None, line) for line in prog.traffic.unreadable)


def _log_final(
    log: TransferLog,
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

    ``src_a[p]``: the device the shard for position p came from. ``origins``: the
    intermediate program's provenance for this array, or ``"own"`` when no program ran (each
    shard is the source's data on its device). ``crossed_before``: what the program moved.
    """
    if origins is None:
        log.unreadable.append((label, UNTRACED))
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
    log.note_relayed(label, crossed - arrived)
