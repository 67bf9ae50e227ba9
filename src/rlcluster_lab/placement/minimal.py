"""The ``minimal`` reshard strategy: every destination shard assembled on its own device from the
overlapping pieces of source shards (``boxes.plan_reshard``), so only the bytes a device lacks
cross. Batched per tree: one program per source device cuts and packs what leaves it, one
transfer call moves every pack, one program per destination device assembles its blocks. Its
price, two small programs per device per new set of shardings, makes ``xla`` the default."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.core.hosts import spans_processes
from rlcluster_lab.placement.events import Built, Ran, Transfer, emit
from rlcluster_lab.placement.programs import cleared_with_programs
from rlcluster_lab.placement.transfers import shard_data


@cleared_with_programs
def clear() -> None:
    """Forget the per-device copy programs (the next reshard of a sharding set builds them again)."""
    _cut_and_pack.clear_cache()
    _assemble_blocks.clear_cache()


Ops = tuple[dict[tuple[Any, ...], Any], list[Any]]


def _shards(run: Any, leg: int) -> dict[int, Any]:
    return {d.id: data for d, data in shard_data(run.value(leg))}


def _counted(run: Any, make: Any) -> Any:
    """``make()``, emitting whether the per-device programs it ran were compiled or loaded."""
    with count_compilations() as built:
        out = make()
    for source in {"persistent cache" if cached else "compiled" for _, _, cached in built}:
        emit(Built(source))
    emit(Ran("minimal"))
    return out


def cut(run: Any, step: Any) -> Ops:
    """On each source device, one program cuts and packs what leaves it (the packs stay there)."""
    s = run.route.pieces
    if jax.process_count() > 1 and any(
        spans_processes(set(run.xs[i].sharding.device_set) | set(run.dsts[i].device_set)) for i in s.legs
    ):
        # multi-process: the pieces are copied one buffer at a time between devices, which JAX does within a process.
        raise NotImplementedError(
            "the minimal reshard strategy copies one buffer at a time between devices, which JAX cannot do "
            "between processes; use reshard='xla' (--reshard xla) when the roles span several processes"
        )

    def make() -> dict[tuple[Any, ...], Any]:
        packed = {}
        for src_dev, slots, spec, ids in s.cuts:
            inputs = tuple(_shards(run, s.legs[a])[src_dev] for a in slots)
            for k, y in zip(ids, _cut_and_pack(inputs, spec)):
                packed[("pack", k)] = y
        return packed

    with jax.set_mesh(None):  # per-device programs must not inherit a role's mesh context
        return _counted(run, make), []


def send(run: Any, step: Any) -> Ops:
    """Every pack, and every whole shard that only changes device, crosses in one call."""
    s = run.route.pieces
    sent = [run.vals[("pack", k)] for k in range(len(s.pack_bytes))]
    sent += [_shards(run, s.legs[a])[src] for a, _, src, _ in s.whole]
    targets = [run.devices[d] for d in s.pack_devices] + [run.devices[dst] for _, _, _, dst in s.whole]
    arrived = list(jax.device_put(sent, targets)) if sent else []
    del sent
    for a, d, n, leg in s.cross_log:
        emit(Transfer("cross_device", a, d, n, run.labels[s.legs[leg]]))
    for (a, _, src, dst), y in zip(s.whole, arrived[len(s.pack_bytes) :]):
        emit(Transfer("cross_device", src, dst, int(y.nbytes), run.labels[s.legs[a]]))
    out = {("arrived", k): y for k, y in enumerate(arrived[: len(s.pack_bytes)])}
    out.update({("whole", a, b): y for (a, b, _, _), y in zip(s.whole, arrived[len(s.pack_bytes) :])})
    return out, []


def assemble(run: Any, step: Any) -> Ops:
    """On each destination device, one program assembles its blocks from its own shards and the
    packs that arrived; a block its device holds but may not keep is copied within the device."""
    s = run.route.pieces

    def make() -> dict[tuple[Any, ...], Any]:
        blocks = {}
        for dev, slots, incoming, spec, where in s.places:
            local = tuple(_shards(run, s.legs[a])[dev] for a in slots)
            outs = _assemble_blocks(local, tuple(run.vals[("arrived", k)] for k in incoming), spec)
            blocks.update({("block", a, b): y for (a, b), y in zip(where, outs)})
        return blocks

    with jax.set_mesh(None):
        out = _counted(run, make)
    for d, n, a in s.same_log:
        emit(Transfer("same_device", d, d, n, run.labels[s.legs[a]]))
    for a, b, dev in s.copied:
        y = out[("block", a, b)] = jax.device_put(_shards(run, s.legs[a])[dev], run.devices[dev], may_alias=False)
        emit(Transfer("same_device", dev, dev, int(y.nbytes), run.labels[s.legs[a]]))
    return out, []


def join(run: Any, step: Any) -> Ops:
    """Each leaf's blocks (assembled, arrived whole, copied or kept) made one array."""
    s = run.route.pieces
    kept = {(a, b): dev for a, b, dev in s.kept}
    out = {}
    for a, i in enumerate(s.legs):
        dst = run.work_dst(i)
        devices = [d.id for d in dst.mesh.devices.flat]
        blocks, made = [], set()
        for b, dev in enumerate(devices):
            if (a, b) in kept:
                blocks.append(_shards(run, i)[dev])
                continue
            blocks.append(run.vals[("whole", a, b)] if ("whole", a, b) in run.vals else run.vals[("block", a, b)])
            made.add(dev)
        out[("out", i)] = jax.make_array_from_single_device_arrays(tuple(run.xs[i].shape), dst, blocks)
        run.produced[i] = made
        del blocks
    return out, []


@functools.partial(jax.jit, static_argnums=(1,))
def _cut_and_pack(inputs: tuple[jax.Array, ...], spec: Any) -> tuple[jax.Array, ...]:
    # Static bounds: no index array is sent from the host.
    packs = [[jax.lax.slice(inputs[k], st, lim).reshape(-1) for k, st, lim in pieces] for pieces in spec]
    return tuple(parts[0] if len(parts) == 1 else jnp.concatenate(parts) for parts in packs)


@functools.partial(jax.jit, static_argnums=(2,))
def _assemble_blocks(locals_: tuple[jax.Array, ...], packs: tuple[jax.Array, ...], spec: Any) -> tuple[jax.Array, ...]:
    out = []
    for shape, dtype, local, remote in spec:
        block = jnp.zeros(shape, dtype)
        for k, st, lim, off in local:
            block = jax.lax.dynamic_update_slice(block, jax.lax.slice(locals_[k], st, lim), off)
        for k, start, piece_shape, off in remote:
            piece = jax.lax.slice(packs[k], (start,), (start + math.prod(piece_shape),)).reshape(piece_shape)
            block = jax.lax.dynamic_update_slice(block, piece, off)
        out.append(block)
    return tuple(out)
