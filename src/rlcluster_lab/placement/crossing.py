"""Moving shards into another process: one compiled program per set of leaves.

JAX copies a buffer from one device to another only inside a process:
``jax.device_put`` onto a device another process owns is refused unless a
socket transfer server is set up for every process, and with the CPU
backend's default settings that path hung in our trials (the notes behind
issue 11 give the details). So a layout change whose source and destination
devices belong to different processes (the split layout: trainer process
against rollout process) is done by a compiled program, which every process
runs together:

1. The sender lays each leaf out as its destination sharding over its own
   devices (``placement.xla`` does this before handing over; nothing runs
   when the layouts already agree).
2. One jitted ``shard_map`` over a mesh that stacks those devices (arranged
   as the destination mesh) on top of the destination devices moves the
   leaves with one ``lax.ppermute`` each. Position p of the sender goes to
   position p of the receiver, and only for the first position of each
   distinct destination block in each receiving process: a block replicated
   on four devices of the rollout process crosses the boundary once.
3. Inside the receiving process, the other devices that need a block copy it
   from the device it arrived on.

What crossed is read from the compiled program itself (its
``collective-permute`` source-target pairs, ``placement.traffic``), and the
copies of step 3 from the copies made; each process logs what landed on its
own devices, and process 0 adds the processes' logs (``multiprocess.report``).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.placement import phases
from rlcluster_lab.placement.boxes import to_box
from rlcluster_lab.placement.traffic import ProgramTraffic, program_traffic
from rlcluster_lab.placement.transfers import Transfer

SIDE = "crossing_side"  # the stacked mesh's leading axis: 0 the sender's devices, 1 the receiver's
MAX_PROGRAMS = 16


@dataclasses.dataclass(frozen=True)
class LeafRoute:
    """Where one leaf's destination blocks come from.

    ``sends``: the destination positions whose block crosses from the sender
    (the first position holding each distinct block in each receiving
    process). ``source``: for every destination position, the position its
    block arrives at (itself for a sent one, else the sent one in its process
    that holds the same block).
    """

    sends: tuple[int, ...]
    source: tuple[int, ...]


def route(dst: NamedSharding, shape: Sequence[int]) -> LeafRoute:
    """The route of one leaf onto ``dst``: pure, from the sharding's blocks and device owners."""
    shape = tuple(shape)
    devices = list(dst.mesh.devices.flat)
    index = dst.devices_indices_map(shape)
    first: dict[tuple[int, Any], int] = {}
    source = []
    for p, d in enumerate(devices):
        key = (int(d.process_index), to_box(index[d], shape))
        source.append(first.setdefault(key, p))
    return LeafRoute(sends=tuple(sorted(set(first.values()))), source=tuple(source))


@dataclasses.dataclass
class CrossingProgram:
    """The compiled ppermute program of one set of leaves, and the flows read from it."""

    compiled: Any
    mesh: Mesh  # the stacked mesh: (SIDE, *destination axes)
    traffic: ProgramTraffic
    source: str = "compiled"  # or "persistent cache": read back from disk


class _Programs:
    """A small least-recently-used map of compiled crossing programs (every process holds the
    same ones: they are built by the same calls in the same order)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._data.get(key)
            if hit is not None:
                self._data.move_to_end(key)
            return hit

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


PROGRAMS = _Programs(MAX_PROGRAMS)


def stacked_mesh(src_a: Sequence[Any], dst_mesh: Mesh) -> Mesh:
    """The sender's devices (in the order they hold the destination layout) over the receiver's."""
    top = np.asarray(list(src_a), dtype=object).reshape(dst_mesh.devices.shape)
    return Mesh(
        np.stack([top, np.asarray(dst_mesh.devices, dtype=object)]),
        (SIDE, *dst_mesh.axis_names),
        axis_types=(AxisType.Auto,) * (1 + len(dst_mesh.axis_names)),
    )


def crossing_program(
    mesh: Mesh, avals: Sequence[jax.ShapeDtypeStruct], specs: Sequence[PartitionSpec], routes: Sequence[LeafRoute]
) -> tuple[CrossingProgram, bool]:
    """The compiled program moving each leaf's sent blocks from side 0 to side 1 of ``mesh``;
    True when it was built now (compiled, or read from the persistent cache)."""
    key = (mesh, tuple((a.shape, np.dtype(a.dtype)) for a in avals), tuple(specs), tuple(r.sends for r in routes))
    hit = PROGRAMS.get(key)
    if hit is not None:
        return hit, False
    n = int(np.prod(mesh.devices.shape[1:]))
    axes = tuple(mesh.axis_names)
    perms = [[(p, n + p) for p in r.sends] for r in routes]

    def body(leaves: list[jax.Array]) -> list[jax.Array]:
        # Linear index over (SIDE, *axes): side * n + the position in the destination mesh.
        return [jax.lax.ppermute(v, axes, perm) for v, perm in zip(leaves, perms)]

    fn = jax.shard_map(body, mesh=mesh, in_specs=(list(specs),), out_specs=list(specs), check_vma=False)
    with jax.set_mesh(None), count_compilations() as made:
        compiled = jax.jit(fn).lower(list(avals)).compile()
    from_disk = bool(made) and all(cached for _, _, cached in made)
    built = CrossingProgram(
        compiled,
        mesh,
        program_traffic(compiled, list(mesh.devices.flat)),
        "persistent cache" if from_disk else "compiled",
    )
    PROGRAMS.put(key, built)
    return built, True


def _placeholders(dsts: Sequence[NamedSharding], avals: Sequence[jax.ShapeDtypeStruct]) -> list[jax.Array]:
    """Zeros in each destination sharding, made on the receiver's devices (no host transfer):
    the receiving half of the program's inputs, overwritten by what arrives."""
    shapes = tuple((tuple(a.shape), str(np.dtype(a.dtype))) for a in avals)
    key = ("zeros", shapes, tuple(dsts))
    make = PROGRAMS.get(key)
    if make is None:

        def zeros() -> list[jax.Array]:
            return [jnp.zeros(s, d) for s, d in shapes]

        with jax.set_mesh(None):
            make = jax.jit(zeros, out_shardings=list(dsts))
        PROGRAMS.put(key, make)
    return make()


def move_across(
    idx: list[int],
    xs: Sequence[jax.Array],
    dsts: Sequence[Any],
    staged: dict[int, jax.Array],
    src_a: tuple[Any, ...],
    dst_a: tuple[Any, ...],
    origins: dict[int, Any],
    crossed: dict[int, int],
    labels: Sequence[str | None],
    log: Any,
) -> dict[int, tuple[jax.Array, set[int]]]:
    """Disjoint device sets in different processes: ``placement.xla._move_whole`` across processes.

    ``staged[i]`` is leaf i laid out as ``dsts[i]`` over ``src_a`` (position p
    on ``src_a[p]``). Returns index -> (the leaf on ``dsts[i]``, ids of this
    process's devices holding new buffers). Every process calls it; each
    gets back arrays holding the shards on its own devices (none on the
    sender's), and logs the transfers that landed on them.
    """
    groups: dict[Mesh, list[int]] = {}
    for i in idx:
        groups.setdefault(dsts[i].mesh, []).append(i)
    out: dict[int, tuple[jax.Array, set[int]]] = {}
    for dst_mesh, members in groups.items():
        out.update(_move_group(members, xs, dsts, staged, src_a, dst_mesh, origins, crossed, labels, log))
    return out


def _move_group(
    members: list[int],
    xs: Sequence[jax.Array],
    dsts: Sequence[Any],
    staged: dict[int, jax.Array],
    src_a: tuple[Any, ...],
    dst_mesh: Mesh,
    origins: dict[int, Any],
    crossed: dict[int, int],
    labels: Sequence[str | None],
    log: Any,
) -> dict[int, tuple[jax.Array, set[int]]]:
    me = jax.process_index()
    dst_a = tuple(dst_mesh.devices.flat)
    mesh = stacked_mesh(src_a, dst_mesh)
    avals, specs, routes, wanted = [], [], [], []
    for i in members:
        x = xs[i]
        dst = dsts[i]
        specs.append(dst.spec)
        avals.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, dst.spec)))
        routes.append(route(dst, x.shape))
        wanted.append(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dst))
    prog, built = crossing_program(mesh, avals, specs, routes)
    if log is not None and built:
        if prog.source == "compiled":
            log.compiled = True
        else:
            log.loaded = True
    zeros = _placeholders([w.sharding for w in wanted], wanted)
    inputs = []
    for k, i in enumerate(members):
        have = {s.device: s.data for s in staged[i].addressable_shards}
        have.update({s.device: s.data for s in zeros[k].addressable_shards})
        gs = avals[k].sharding
        mine = [have[d] for d in gs.addressable_devices_indices_map(avals[k].shape)]
        inputs.append(jax.make_array_from_single_device_arrays(avals[k].shape, gs, mine, dtype=avals[k].dtype))
    phases.made(zeros, phases.IN_FLIGHT)
    arrived = prog.compiled(inputs)
    if phases.current_probe() is not None:
        phases.made(arrived, phases.RESHARDED)
        own = [d for d in mesh.devices.flat if d.process_index == me]  # each process counts its own devices
        phases.phase("move", [phases.program_temporaries(prog.compiled, own)])
    del inputs, zeros
    result: dict[int, tuple[jax.Array, set[int]]] = {}
    for k, i in enumerate(members):
        got = {s.device: s.data for s in arrived[k].addressable_shards}
        r = routes[k]
        blocks: dict[int, Any] = {p: got[dst_a[p]] for p in r.sends if dst_a[p].process_index == me}
        # The receiver's other devices copy their block from the device it arrived on.
        copies = [p for p, f in enumerate(r.source) if f != p and dst_a[p].process_index == me]
        if copies:
            copied = jax.device_put([blocks[r.source[p]] for p in copies], [dst_a[p] for p in copies])
            phases.made(copied, phases.RESHARDED)
            for p, y in zip(copies, copied):
                blocks[p] = y
        mine = [blocks[p] for p in sorted(blocks)]
        y = jax.make_array_from_single_device_arrays(xs[i].shape, dsts[i], mine, dtype=xs[i].dtype)
        made = {int(dst_a[p].id) for p in blocks}
        if log is not None:
            _log(log, labels[i], prog, k, y, r, dst_a, copies, origins.get(i, "own"), crossed.get(i, 0))
        result[i] = (y, made)
    return result


def _log(
    log: Any,
    label: str | None,
    prog: CrossingProgram,
    k: int,
    y: jax.Array,
    r: LeafRoute,
    dst_a: tuple[Any, ...],
    copies: list[int],
    origins: Any,
    crossed_before: int,
) -> None:
    """Log what landed on this process's devices: the program's flows (read from its HLO) and the
    copies inside the receiving process. Every destination byte is foreign (the device sets are
    disjoint), so what crossed beyond the destination's bytes was relayed (the sender's own
    re-layout, counted by ``placement.xla`` as ``crossed_before``)."""
    if origins is None:
        log.unreadable.append((label, "destination data not traced (dtype cannot hold a device tag)"))
    mine = {int(d.id) for d in y.sharding.device_set if d.process_index == jax.process_index()}
    moved = 0
    for f in prog.traffic.flows:
        if f.param == k and f.dst_device in mine:
            log.transfers.append(Transfer("cross_device", f.src_device, f.dst_device, f.nbytes, label))
            moved += f.nbytes
    for line in prog.traffic.unreadable:
        log.unreadable.append((label, line))
    nbytes = {int(s.device.id): int(s.data.nbytes) for s in y.addressable_shards}
    for p in copies:
        src, dst = int(dst_a[r.source[p]].id), int(dst_a[p].id)
        log.transfers.append(Transfer("cross_device", src, dst, nbytes[dst], label))
        moved += nbytes[dst]
    relayed = crossed_before + moved - sum(nbytes.values())
    if relayed > 0:
        log.relayed[label] = log.relayed.get(label, 0) + relayed


def clear() -> None:
    """Forget the compiled crossing programs."""
    PROGRAMS.clear()
