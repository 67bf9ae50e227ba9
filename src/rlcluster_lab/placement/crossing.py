"""Moving shards into another process: one compiled program per set of leaves.

JAX copies a buffer between devices only inside a process (a transfer server across processes
hung with the CPU backend's defaults). So a layout change between processes is a program every
process runs: the sender lays each leaf out as its destination over its own devices
(``placement.xla``); one jitted ``shard_map`` over a mesh stacking those devices on the
destination's moves each distinct block once with ``lax.ppermute``; the receiver's other devices
copy it from where it arrived. Each process logs, from the program's ``collective-permute``
pairs, what landed on its devices; process 0 adds the logs (``multiprocess.report``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from rlcluster_lab.core.compile_options import move_options
from rlcluster_lab.placement import phases
from rlcluster_lab.placement.boxes import to_box
from rlcluster_lab.placement.events import Built, Made, Phase, Relayed, Transfer, Unreadable, emit, wants
from rlcluster_lab.placement.programs import ProgramCache, compile_outside_mesh
from rlcluster_lab.placement.traffic import ProgramTraffic, program_traffic
from rlcluster_lab.placement.transfers import buffer_bytes, shard_data
from rlcluster_lab.placement.xla_analysis import UNTRACED

SIDE = "crossing_side"  # the stacked mesh's leading axis: 0 the sender's devices, 1 the receiver's
# Every process holds the same programs: they are built by the same calls in the same order.
PROGRAMS = ProgramCache(16)


@dataclasses.dataclass(frozen=True)
class LeafRoute:
    """Where one leaf's destination blocks come from: ``sends``, the positions whose block crosses (the
    first of each distinct block per receiving process); ``source``, per position, the sent one it copies."""

    sends: tuple[int, ...]
    source: tuple[int, ...]


def route(dst: NamedSharding, shape: Sequence[int]) -> LeafRoute:
    """The route of one leaf onto ``dst``: pure, from the sharding's blocks and device owners."""
    shape = tuple(shape)
    index = dst.devices_indices_map(shape)
    first: dict[tuple[int, Any], int] = {}
    source = [
        first.setdefault((int(d.process_index), to_box(index[d], shape)), p)
        for p, d in enumerate(dst.mesh.devices.flat)
    ]
    return LeafRoute(sends=tuple(sorted(set(first.values()))), source=tuple(source))


@dataclasses.dataclass
class CrossingProgram:
    """The compiled ppermute program of one set of leaves, and the flows read from it."""

    compiled: Any
    traffic: ProgramTraffic
    source: str = "compiled"  # or "persistent cache": read back from disk


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
    # Linear index over (SIDE, *axes): side * n + the position in the destination mesh.
    perms = [[(p, n + p) for p in r.sends] for r in routes]

    def crossing(leaves: list[jax.Array]) -> list[jax.Array]:
        return [jax.lax.ppermute(v, axes, perm) for v, perm in zip(leaves, perms)]

    fn = jax.shard_map(crossing, mesh=mesh, in_specs=(list(specs),), out_specs=list(specs), check_vma=False)
    options = move_options(list(avals), mesh.devices.flat[0].platform)
    compiled, source = compile_outside_mesh(jax.jit(fn), list(avals), options=options)
    built = CrossingProgram(compiled, program_traffic(compiled, list(mesh.devices.flat)), source)
    PROGRAMS.put(key, built)
    return built, True


def _placeholders(dsts: Sequence[NamedSharding], avals: Sequence[jax.ShapeDtypeStruct]) -> list[jax.Array]:
    """Zeros in each destination sharding, made on the receiver's devices (no host transfer):
    the receiving half of the program's inputs, overwritten by what arrives."""
    shapes = tuple((tuple(a.shape), str(np.dtype(a.dtype))) for a in avals)
    key = ("zeros", shapes, tuple(dsts))
    make = PROGRAMS.get(key)
    if make is None:
        with jax.set_mesh(None):

            def receiving_zeros() -> list[jax.Array]:
                return [jnp.zeros(s, d) for s, d in shapes]

            make = jax.jit(receiving_zeros, out_shardings=list(dsts))
        PROGRAMS.put(key, make)
    return make()


def move_across(
    run: Any, idx: list[int], staged: dict[int, jax.Array], src_a: tuple[Any, ...]
) -> dict[int, tuple[jax.Array, set[int]]]:
    """Disjoint device sets in different processes: ``placement.xla.run_moves`` across processes, every
    process calling it, one program per destination mesh. ``staged[i]`` is leaf i of ``run`` laid
    out as its destination over ``src_a``; returns index -> (the leaf, ids of its own devices holding
    new buffers), logging what landed on them."""
    xs, labels = run.xs, run.labels
    # In the devices' default memory, as every layout change here: a memory kind comes after (P14).
    dsts = {i: run.work_dst(i) for i in idx}
    groups: dict[Mesh, list[int]] = {}
    for i in idx:
        groups.setdefault(dsts[i].mesh, []).append(i)
    me = jax.process_index()
    result: dict[int, tuple[jax.Array, set[int]]] = {}
    for dst_mesh, members in groups.items():
        dst_a = tuple(dst_mesh.devices.flat)
        mesh = stacked_mesh(src_a, dst_mesh)
        avals = [
            jax.ShapeDtypeStruct(xs[i].shape, xs[i].dtype, sharding=NamedSharding(mesh, dsts[i].spec)) for i in members
        ]
        routes = [route(dsts[i], xs[i].shape) for i in members]
        prog, built = crossing_program(mesh, avals, [dsts[i].spec for i in members], routes)
        if built:
            emit(Built(prog.source))
        zeros = _placeholders([dsts[i] for i in members], avals)
        inputs = []
        for k, i in enumerate(members):
            have = dict([*shard_data(staged[i]), *shard_data(zeros[k])])
            gs = avals[k].sharding
            mine = [have[d] for d in gs.addressable_devices_indices_map(avals[k].shape)]
            inputs.append(jax.make_array_from_single_device_arrays(avals[k].shape, gs, mine, dtype=avals[k].dtype))
        emit(Made(zeros, phases.IN_FLIGHT))
        arrived = prog.compiled(inputs)
        if wants(Phase):
            emit(Made(arrived, phases.RESHARDED))
            own = [d for d in mesh.devices.flat if d.process_index == me]  # each process counts its own devices
            emit(Phase("move", [phases.program_temporaries(prog.compiled, own)]))
        del inputs, zeros
        for k, i in enumerate(members):
            got = dict(shard_data(arrived[k]))
            r = routes[k]
            blocks: dict[int, Any] = {p: got[dst_a[p]] for p in r.sends if dst_a[p].process_index == me}
            # The receiver's other devices copy their block from the device it arrived on.
            copies = [p for p, f in enumerate(r.source) if f != p and dst_a[p].process_index == me]
            if copies:
                copied = jax.device_put([blocks[r.source[p]] for p in copies], [dst_a[p] for p in copies])
                emit(Made(copied, phases.RESHARDED))
                for p, y in zip(copies, copied):
                    blocks[p] = y
            y = jax.make_array_from_single_device_arrays(
                xs[i].shape, dsts[i], [blocks[p] for p in sorted(blocks)], dtype=xs[i].dtype
            )
            if wants(Transfer):
                _log(labels[i], prog, k, y, r, dst_a, copies, *run.between.get(i, ("own", 0)))
            result[i] = (y, {int(dst_a[p].id) for p in blocks})
    return result


def _log(
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
    """Emit what landed on this process's devices: the program's flows and the copies inside the
    receiving process; what crossed beyond the destination's bytes was relayed (the sender's own
    re-layout, ``crossed_before``)."""
    if origins is None:
        emit(Unreadable(label, UNTRACED))
    mine = {int(d.id) for d in y.sharding.device_set if d.process_index == jax.process_index()}
    moved = 0
    for f in prog.traffic.flows:
        if f.param == k and f.dst_device in mine:
            emit(Transfer("cross_device", f.src_device, f.dst_device, f.nbytes, label))
            moved += f.nbytes
    for line in prog.traffic.unreadable:
        emit(Unreadable(label, line))
    nbytes = {int(d.id): buffer_bytes(data) for d, data in shard_data(y)}
    for p in copies:
        src, dst = int(dst_a[r.source[p]].id), int(dst_a[p].id)
        emit(Transfer("cross_device", src, dst, nbytes[dst], label))
        moved += nbytes[dst]
    emit(Relayed(label, crossed_before + moved - sum(nbytes.values())))
