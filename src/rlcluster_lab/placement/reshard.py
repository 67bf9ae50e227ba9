"""Moving arrays between shardings device to device, never through the host.

Two strategies change a layout (``reshard_strategy``, from ``ClusterConfig.reshard``): ``xla``
(``placement.xla``: one compiled program per set of shardings) and ``minimal``
(``placement.minimal``: each destination shard assembled on its device, so only the bytes a
device lacks cross). On CPU ``jax.device_put`` between layouts gathers through host memory,
which the sync's transfer guard (P13) forbids; both strategies avoid it everywhere. Every
copy is logged (``transfers.record_transfers``) for the sync report (L3), recorded once per
batch signature and replayed. A batch tells the peak walk (``placement.phases``) where it
holds the most, and drops what it no longer needs as it goes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from rlcluster_lab.core.hosts import spans_processes
from rlcluster_lab.core.options import RESHARD_STRATEGIES
from rlcluster_lab.placement import minimal as reshard_minimal
from rlcluster_lab.placement import phases
from rlcluster_lab.placement import xla as reshard_xla
from rlcluster_lab.placement.boxes import relabel
from rlcluster_lab.placement.programs import ProgramCache, compile_outside_mesh
from rlcluster_lab.placement.transfers import Transfer, current_log, log_new_shards, replay_log, shard_key, shard_keys

_STRATEGY: contextvars.ContextVar[str] = contextvars.ContextVar("rlcluster_lab_reshard_strategy", default="xla")


def reshard_strategy(name: str) -> contextlib.AbstractContextManager[str]:
    """Use strategy ``name`` (``xla`` or ``minimal``) for the layout changes made inside the block."""
    if name not in RESHARD_STRATEGIES:
        raise ValueError(f"unknown reshard strategy {name!r}; use one of {', '.join(RESHARD_STRATEGIES)}")
    return phases.bound(_STRATEGY, name)


def reshard(x: jax.Array, dst: Sharding, *, copy: bool = False) -> jax.Array:
    """``x`` laid out as ``dst``, moving only device to device.

    The result reuses ``x`` when its sharding is already ``dst`` (unless
    ``copy``). A memory-kind change is applied after the layout change.
    """
    return reshard_many([x], [dst], copy=copy)[0]


def reshard_tree(values: Any, shardings: Any, *, copy: bool = False) -> Any:
    """``reshard`` over matching trees of arrays and shardings, in one batch."""
    leaves, treedef = jax.tree.flatten(values)
    dsts = treedef.flatten_up_to(shardings)
    return jax.tree.unflatten(treedef, reshard_many(leaves, dsts, copy=copy))


def reshard_many(
    xs: Sequence[jax.Array], dsts: Sequence[Sharding], *, copy: bool = False, labels: Sequence[str | None] | None = None
) -> list[jax.Array]:
    """``reshard`` of many arrays at once; ``labels`` tag their transfers in the log.

    Per array: kept when already in the destination sharding (unless ``copy``), re-wrapped
    when the layout is equivalent, else changed by the current strategy. Memory-kind changes
    are per-device moves on either side of the layout change (the transfer guard allows them).
    """
    current = current_log()
    default = current.leaf if current is not None else None
    labels = [default if lab is None else lab for lab in labels] if labels is not None else [default] * len(xs)
    if current is None:
        return _reshard_many(xs, dsts, copy, labels)
    # Logged once per batch signature, then replayed: a steady sync spends its time moving data.
    key = (
        _STRATEGY.get(),
        copy,
        tuple(labels),
        tuple((tuple(x.shape), np.dtype(x.dtype), x.sharding, d) for x, d in zip(xs, dsts)),
    )
    return replay_log(_DESCRIBED, key, lambda: _reshard_many(xs, dsts, copy, labels))


_DESCRIBED = ProgramCache(64)  # the log each batch signature recorded (cleared with the programs)


def _reshard_many(
    xs: Sequence[jax.Array], dsts: Sequence[Sharding], copy: bool, labels: list[str | None]
) -> list[jax.Array]:
    current = current_log()
    out = list(xs)
    todo = [i for i, (x, dst) in enumerate(zip(xs, dsts)) if copy or x.sharding != dst]
    # A layout change runs in the devices' default memory: arrays elsewhere move there first.
    kind_moved = [i for i in todo if xs[i].sharding != dsts[i] and xs[i].sharding.memory_kind != _work_kind(xs[i])]
    work_shardings = [xs[i].sharding.with_memory_kind(_work_kind(xs[i])) for i in kind_moved]
    if kind_moved:
        brought = _put_kinds([xs[i] for i in kind_moved], work_shardings, [labels[i] for i in kind_moved])
        phases.made(brought, phases.STAGED)
        for i, y in zip(kind_moved, brought):
            out[i] = y
        del brought
        phases.phase("stage")
    targets: dict[int, Sharding] = {}
    change: list[int] = []
    direct: list[int] = []
    for i in todo:
        x, dst = out[i], dsts[i]
        work = _work_kind(x)
        targets[i] = dst if x.sharding == dst or dst.memory_kind == work else dst.with_memory_kind(work)
        # The forced copy of an unchanged sharding, or an equivalent layout, needs no layout change.
        (direct if x.sharding.is_equivalent_to(targets[i], x.ndim) else change).append(i)
    x = y = None  # no loop variable keeps an array alive past its phase (the sync's peak, L3)
    # Devices whose destination shard of array i was made by a logged copy.
    produced: dict[int, set[int]] = {i: set() for i in todo}
    # Equivalent layouts: re-labelled in one call (a forced copy where asked, in another).
    for must_copy in (False, True):
        group = [i for i in direct if (copy and i not in kind_moved) is must_copy]
        if not group:
            continue
        if not must_copy and jax.process_count() > 1:
            # multi-process: device_put copies an array spanning processes even onto an
            # equivalent sharding; its own shards, re-labelled, are the same buffers.
            moved = [relabel(out[i], targets[i]) for i in group]
        else:
            moved = jax.device_put(
                [out[i] for i in group], [targets[i] for i in group], may_alias=False if must_copy else None
            )
        phases.made(moved, phases.RESHARDED)
        for i, y in zip(group, moved):
            produced[i] = log_new_shards("same_device", out[i], y, labels[i]) if current is not None else set()
            out[i] = y
        del moved
    if change:
        changed = _change_layout(
            [out[i] for i in change], [targets[i] for i in change], copy, [labels[i] for i in change]
        )
        for i, (y, made) in zip(change, changed):
            out[i], produced[i] = y, made
        del changed
        # A result assembled from per-device blocks is a new array over their buffers: it is
        # what keeps them alive from here on (the peak walk counts each buffer once).
        phases.made([out[i] for i in change], phases.RESHARDED)  # type: ignore[misc]
    y = None
    # Every layout is changed (each staged source dropped as its layout changed): the most
    # this batch holds in the work memory kind.
    phases.phase("reshard")
    to_final = [i for i in todo if targets[i] != dsts[i]]
    if to_final:
        finals = _put_kinds([out[i] for i in to_final], [dsts[i] for i in to_final], [labels[i] for i in to_final])
        phases.made(finals, phases.MEMORY_KIND)
        phases.phase("memory kind")
        for i, y in zip(to_final, finals):
            out[i] = y
        del finals
        y = None
    for i in todo:
        if current is None or out[i] is xs[i] or len(produced[i]) == len(out[i].sharding.device_set):
            continue  # nothing to log, or every shard's copy is logged already
        # A shard that carries the source's own data on its device but sits in a new buffer
        # (moved between memory kinds on the way) was copied within its device: logged so
        # that every destination byte is accounted for.
        src_keys = shard_keys(xs[i])
        carried = [s for s in out[i].addressable_shards if shard_key(s) not in src_keys]
        _log_same_device([s for s in carried if s.device.id not in produced[i]], labels[i])
    return out


def _put_kinds(xs: list[jax.Array], dsts: list[Sharding], labels: list[str | None]) -> list[jax.Array]:
    """Moves between memory kinds (per device, which the transfer guard allows), logged."""
    if not xs:
        return []
    ys = list(jax.device_put(xs, dsts))
    for x, y, label in zip(xs, ys, labels):
        log_new_shards("memory_kind", x, y, label)
    return ys


def _change_layout(
    xs: list[jax.Array], dsts: list[Sharding], copy: bool, labels: list[str | None]
) -> list[tuple[jax.Array, set[int]]]:
    """Layout changes in device memory, by the current strategy; (array, devices with new buffers)."""
    log = current_log()
    results: list[tuple[jax.Array, set[int]] | None] = [None] * len(xs)
    rest = list(range(len(xs)))
    if _STRATEGY.get() == "xla":
        done = reshard_xla.change_layout(xs, dsts, copy, labels)
        for i, r in done.items():
            results[i] = r
        rest = [i for i in rest if results[i] is None]
        if log is not None and done:
            log.strategies.add("xla")
    if rest:
        if jax.process_count() > 1 and any(
            spans_processes(set(xs[i].sharding.device_set) | set(dsts[i].device_set)) for i in rest
        ):
            # multi-process: the minimal strategy copies single buffers between devices, which
            # JAX does only within a process.
            raise NotImplementedError(
                "the minimal reshard strategy copies one buffer at a time between devices, which JAX cannot do "
                "between processes; use reshard='xla' (--reshard xla) when the roles span several processes"
            )
        # Per-device programs must not inherit a role's mesh context.
        with jax.set_mesh(None):
            built = reshard_minimal.assemble_many(
                [xs[i] for i in rest], [dsts[i] for i in rest], copy, [labels[i] for i in rest]
            )
        for i, r in zip(rest, built):
            results[i] = r
        if log is not None:
            log.strategies.add("minimal")
    return results  # type: ignore[return-value]


def _work_kind(x: jax.Array) -> str:
    """The default memory kind of the devices ``x`` lives on (where layout changes run)."""
    return next(iter(x.sharding.device_set)).default_memory().kind


def cast_many(xs: Sequence[jax.Array], dtypes: Sequence[Any]) -> list[jax.Array]:
    """Each array cast to its dtype on its own devices (those already in it as they are), in one
    jitted program per set of devices: eager ``astype`` would compile one per shape."""
    todo = [i for i, (x, d) in enumerate(zip(xs, dtypes)) if x.dtype != np.dtype(d)]
    out = list(xs)
    if not todo:
        return out
    groups: dict[Any, list[int]] = {}
    for i in todo:
        groups.setdefault(tuple(xs[i].sharding.device_set), []).append(i)
    for idx in groups.values():
        arrays = [xs[i] for i in idx]
        with jax.set_mesh(None):
            cast = _cast_program(tuple(str(np.dtype(dtypes[i])) for i in idx))
            ys = jax.jit(cast, out_shardings=[x.sharding for x in arrays])(arrays)
        if phases.current_probe() is not None:
            phases.made(ys, phases.CAST)
            phases.phase("cast", [cast_temporaries_of(arrays, [dtypes[i] for i in idx])])
        for i, y in zip(idx, ys):
            out[i] = y
    return out


_CAST_TEMPORARIES = ProgramCache(64)


def cast_temporaries_of(arrays: Sequence[Any], dtypes: Sequence[Any]) -> tuple[tuple[int, ...], int]:
    """(device ids, temporary bytes per device) of the program ``cast_many`` runs for ``arrays``
    (arrays or ``ShapeDtypeStruct``s on one set of devices), from its memory analysis; compiled
    once per signature (the planner reads the same figure without allocating)."""
    names = tuple(str(np.dtype(d)) for d in dtypes)
    key = (names, tuple((tuple(x.shape), str(np.dtype(x.dtype)), x.sharding) for x in arrays))
    hit: tuple[tuple[int, ...], int] | None = _CAST_TEMPORARIES.get(key)
    if hit is None:
        compiled, _ = compile_outside_mesh(
            jax.jit(_cast_program(names), out_shardings=[x.sharding for x in arrays]), list(arrays)
        )
        hit = phases.program_temporaries(compiled, list(arrays[0].sharding.device_set))
        _CAST_TEMPORARIES.put(key, hit)
    return hit


@functools.lru_cache(maxsize=32)
def _cast_program(dtypes: tuple[str, ...]) -> Any:
    def cast(arrays: list[jax.Array]) -> list[jax.Array]:
        return [x.astype(d) for x, d in zip(arrays, dtypes)]

    return cast


def log_cast(src: jax.Array, before: jax.Array, after: jax.Array, label: str | None) -> None:
    """A cast made new buffers out of ``before`` (a reshard of ``src``): log the shards that
    were still ``src``'s own buffers, which the cast turned into same-device copies."""
    if before is not after:
        own = shard_keys(src)
        _log_same_device([s for s in before.addressable_shards if shard_key(s) in own], label)


def _log_same_device(shards: Sequence[Any], label: str | None) -> None:
    log = current_log()
    if log is not None:
        log.transfers.extend(
            Transfer("same_device", s.device.id, s.device.id, int(s.data.nbytes), label) for s in shards
        )
