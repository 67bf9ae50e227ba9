"""Resharding with XLA (the ``xla`` strategy): one compiled program per set of shardings.

Same devices in the same order: one jitted identity with the destination shardings, run under
the sync's transfer guard (P13). Device sets of one size (the split layout): a program onto the
source devices laid out as the destination, then every shard crosses whole in one transfer
call. Anything else is left to the ``minimal`` strategy. What crossed is read from the program
(``placement.traffic``); where destination bytes started is measured once per program by a
tagged run (``xla_analysis``), and the difference is ``relayed``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, Sharding

from rlcluster_lab.core.compile_options import move_options
from rlcluster_lab.core.hosts import crosses_processes, foreign_device_ids
from rlcluster_lab.placement import phases
from rlcluster_lab.placement.crossing import move_across
from rlcluster_lab.placement.events import Built, Ran, Relayed, Transfer, Unreadable, emit, wants
from rlcluster_lab.placement.layout import Layout
from rlcluster_lab.placement.programs import ProgramCache, compile_outside_mesh
from rlcluster_lab.placement.route import whole_move
from rlcluster_lab.placement.traffic import ProgramTraffic, program_traffic
from rlcluster_lab.placement.transfers import buffer_bytes, shard_data
from rlcluster_lab.placement.xla_analysis import UNTRACED, Provenance, identity, probe_provenance


@dataclasses.dataclass
class XlaProgram:
    """A compiled identity from source to destination shardings (``source``: ``"compiled"`` or
    ``"persistent cache"``), and what it moves, analysed the first time a recorded reshard needs it."""

    compiled: Any
    devices: tuple[Any, ...]  # partition i runs on devices[i]
    inputs: tuple[Any, ...]  # ShapeDtypeStructs with the source shardings
    outputs: tuple[Sharding, ...]
    source: str = "compiled"
    _analysis: tuple[ProgramTraffic, Provenance] | None = None

    @functools.cached_property
    def temporaries(self) -> tuple[tuple[int, ...], int]:
        """(device ids, temporary bytes per device) from the compiled program's memory analysis."""
        return phases.program_temporaries(self.compiled, self.devices)

    def _analyse(self) -> tuple[ProgramTraffic, Provenance]:
        if self._analysis is None:
            traffic = program_traffic(self.compiled, self.devices)
            # The probe measures the program once, outside any sync: it may go through the host inside a guard.
            # A program spanning processes is probed by all of them together (a collective run).
            with jax.transfer_guard("allow"):
                provenance = probe_provenance(self.compiled, self.inputs, self.outputs)
            self._analysis = (traffic, provenance)
        return self._analysis

    @property
    def traffic(self) -> ProgramTraffic:
        return self._analyse()[0]

    @property
    def provenance(self) -> Provenance:
        return self._analyse()[1]


PROGRAMS = ProgramCache(48)


def layout_sharding(layout: Layout, devices: Mapping[int, Any]) -> NamedSharding:
    """A layout on paper as a sharding over these devices (by id)."""
    m = layout.mesh
    grid = np.asarray([devices[i] for i in m.device_ids], dtype=object).reshape(m.axis_sizes)
    mesh = Mesh(grid, m.axis_names, axis_types=tuple(getattr(AxisType, t) for t in m.axis_types))
    return NamedSharding(mesh, layout.spec, memory_kind=layout.kind)


def program(xs: Sequence[jax.Array], dsts: Sequence[Sharding]) -> tuple[XlaProgram, bool]:
    """The compiled identity for these arrays and destinations; True when it was built now."""
    key = tuple((tuple(x.shape), np.dtype(x.dtype), x.sharding, d) for x, d in zip(xs, dsts))
    hit = PROGRAMS.get(key)
    if hit is not None:
        return hit, False
    devices = tuple(xs[0].sharding.mesh.devices.flat)  # partition i runs on the mesh's i-th device
    abstract = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for x in xs)
    jitted = jax.jit(identity, out_shardings=list(dsts))
    compiled, source = compile_outside_mesh(jitted, list(abstract), options=move_options(xs))
    built = XlaProgram(compiled, devices, abstract, tuple(dsts), source)
    PROGRAMS.put(key, built)
    return built, True


def run_program(run: Any, step: Any) -> tuple[dict[tuple[Any, ...], Any], list[Any]]:
    """A ``program`` step: one compiled identity over the group, from the source to the
    destination shardings (the same devices in the same order); every result shard is new."""
    g = run.route.programs[step.group]
    xs = [run.value(i) for i in g.legs]
    labels = [run.labels[i] for i in g.legs]
    prog, outs = _run_program(xs, [run.work_dst(i) for i in g.legs], labels)
    if wants(Transfer):
        _log_arrivals(prog, labels, outs)
    run.produced.update({i: {d.id for d in y.sharding.device_set} for i, y in zip(g.legs, outs)})
    return {("out", i): y for i, y in zip(g.legs, outs)}, [prog.temporaries]


def run_between(run: Any, step: Any) -> tuple[dict[tuple[Any, ...], Any], list[Any]]:
    """A ``between`` step: the group's leaves laid out as their destination over the source
    devices (the destination's shard at position p on the p-th source device)."""
    g = run.route.programs[step.group]
    xs = [run.value(i) for i in g.legs]
    inters = [layout_sharding(g.inter(run.route.legs[i]), run.devices) for i in g.legs]
    prog, outs = _run_program(xs, inters, [run.labels[i] for i in g.legs])
    if wants(Transfer):
        for k, i in enumerate(g.legs):
            run.between[i] = (prog.provenance.by_leaf[k], _crossed(prog, k))
    return {("inter", i): y for i, y in zip(g.legs, outs)}, [prog.temporaries]


def _run_program(xs: list[jax.Array], dsts: list[Sharding], labels: list[str | None]) -> tuple[XlaProgram, list[Any]]:
    prog, built = program(xs, dsts)
    outs = prog.compiled(xs)
    emit(Ran("xla"))
    if built:
        emit(Built(prog.source))
    if wants(Transfer):
        _log_flows(prog, labels)
    return prog, list(outs)


def run_moves(run: Any, step: Any) -> tuple[dict[tuple[Any, ...], Any], list[Any]]:
    """A ``moves`` step: each destination shard crosses whole from the device the route names, stays
    (kept, or the program's result), or is copied within its device; all crossings in one call."""
    g = run.route.programs[step.group]
    src_a = tuple(run.devices[d] for d in g.src_order)
    dst_a = tuple(run.devices[d] for d in g.dst_order)
    members = list(step.legs)
    current = {i: run.vals.get(("inter", i), run.value(i)) for i in members}
    if crosses_processes(src_a, dst_a):
        if set(src_a) & set(dst_a):
            raise NotImplementedError(
                "a layout change between overlapping device sets whose shards would cross processes is not "
                "supported; place the rollout on the same devices as the actor (any shape) or on devices of "
                "its own (the split layout)"
            )
        # multi-process: whole shards cross into another process in one compiled program.
        done = move_across(run, members, current, src_a)
        for i, (y, made) in done.items():
            run.produced[i] = made
            run.joined[i] = y
        return {("sent", i): [done[i][0]] for i in members}, []
    whole = [i for i in members if whole_move(run.route, i)]
    if whole:
        # Every shard crosses: the arrays as they are, in one call (a bare device_put's cost).
        run.joined.update(zip(whole, jax.device_put([current[i] for i in whole], [run.work_dst(i) for i in whole])))
    sends: list[tuple[int, int, Any]] = []
    out: dict[tuple[Any, ...], Any] = {("sent", i): [run.joined[i]] if i in whole else [] for i in members}
    for i in members:
        if i in run.joined:
            continue
        by_device = {d.id: data for d, data in shard_data(current[i])}
        blocks: list[Any] = [None] * len(dst_a)
        for p, pos in enumerate(run.route.positions[i]):
            if pos.how == "send":
                sends.append((i, p, by_device[pos.src]))
            elif pos.how == "copy":
                blocks[p] = jax.device_put(by_device[pos.dst], dst_a[p], may_alias=False)
                out[("sent", i)].append(blocks[p])
            else:
                blocks[p] = by_device[pos.dst]
        run.blocks[i] = blocks
    if sends:
        arrived = jax.device_put([d for _, _, d in sends], [dst_a[p] for _, p, _ in sends])
        for (i, p, _), y in zip(sends, arrived):
            run.blocks[i][p] = y
            out[("sent", i)].append(y)
    return out, []


def join(run: Any, step: Any) -> tuple[dict[tuple[Any, ...], Any], list[Any]]:
    """Each ``moves`` leaf's shards made one array with its destination sharding; what crossed,
    and what each new shard's data started as, logged."""
    g = run.route.programs[step.group]
    src_a = tuple(run.devices[d] for d in g.src_order)
    dst_a = tuple(run.devices[d] for d in g.dst_order)
    emit(Ran("xla"))
    describe = wants(Transfer)
    out = {}
    for i in step.legs:
        positions = run.route.positions[i]
        y = run.joined.pop(i, None)
        if y is None:
            y = jax.make_array_from_single_device_arrays(run.xs[i].shape, run.work_dst(i), run.blocks.pop(i))
        out[("out", i)] = y
        made = {p.dst for p in positions if p.how != "kept"}
        run.produced.setdefault(i, made)
        if describe and not crosses_processes(src_a, dst_a):
            origin, crossed = run.between.get(i, ("own", 0))
            came_from = [run.devices[p.src] for p in positions]
            moved = {k for k, p in enumerate(positions) if p.how == "send"}
            _log_final(run.labels[i], y, came_from, dst_a, origin, moved=moved, made=made, crossed_before=crossed)
    return out, []


def _log_arrivals(prog: XlaProgram, labels: list[str | None], outs: Sequence[jax.Array]) -> None:
    """Per output shard: the bytes whose data started on its own device, as same-device copies;
    what crossed beyond the bytes that arrived from elsewhere was relayed."""
    for k, (label, y) in enumerate(zip(labels, outs)):
        origins = prog.provenance.by_leaf[k]
        if origins is None:
            emit(Unreadable(label, UNTRACED))
            continue
        itemsize = np.dtype(y.dtype).itemsize
        arrived = 0
        for device, data in shard_data(y):
            dev = device.id
            foreign = sum(c for origin, c in origins[dev].items() if origin != dev) * itemsize
            arrived += foreign
            own = buffer_bytes(data) - foreign
            if own:
                emit(Transfer("same_device", dev, dev, own, label))
        emit(Relayed(label, _crossed(prog, k) - arrived))


def _crossed(prog: XlaProgram, k: int) -> int:
    foreign = foreign_device_ids()  # multi-process: the flows onto this process's devices
    return sum(f.nbytes for f in prog.traffic.flows if f.param == k and f.dst_device not in foreign)


def _log_flows(prog: XlaProgram, labels: list[str | None]) -> None:
    foreign = foreign_device_ids()  # multi-process: each process logs what lands on its devices
    for f in prog.traffic.flows:
        if f.dst_device not in foreign:
            label = labels[f.param] if f.param is not None else None
            emit(Transfer("cross_device", f.src_device, f.dst_device, f.nbytes, label))
    for line in prog.traffic.unreadable:
        emit(Unreadable(None, line))


def _log_final(
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
    """Emit the whole-shard moves, and what each new destination shard's data started as: ``src_a[p]``
    sent position p; ``origins``, the intermediate program's provenance, or ``"own"`` when no
    program ran; ``crossed_before``, what the program moved."""
    if origins is None:
        emit(Unreadable(label, UNTRACED))
    by_device = dict(shard_data(y))
    itemsize = np.dtype(y.dtype).itemsize
    crossed, arrived = crossed_before, 0
    for p, (src, dst) in enumerate(zip(src_a, dst_a)):
        nbytes = buffer_bytes(by_device[dst])
        if p in moved:
            emit(Transfer("cross_device", src.id, dst.id, nbytes, label))
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
            emit(Transfer("same_device", dst.id, dst.id, nbytes - foreign, label))
    emit(Relayed(label, crossed - arrived))
