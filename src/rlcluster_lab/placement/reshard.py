"""Moving arrays between shardings device to device, never through the host.

Two strategies do a layout change, chosen with ``reshard_strategy`` (the
cluster sets it from ``ClusterConfig.reshard``):

- ``xla`` (the default, ``reshard_xla``): one compiled program per set of
  shardings, in which XLA plans the collectives; where the device sets differ
  (the split layout) whole shards then cross in one transfer call. The bytes
  are read from the program's own collectives, so where XLA moves more than
  the placement requires, the report shows it.
- ``minimal`` (``reshard_minimal``): every destination shard is assembled on
  its own device from the overlapping pieces of source shards, preferring a
  copy already on that device, so only the bytes a device lacks cross
  devices: the least any reshard can move at slice granularity.

On the CPU backend ``jax.device_put`` between layouts gathers through host
memory, which the weight sync's transfer guard (P13) forbids and which would
not show what a real interconnect moves; both strategies avoid it on every
platform. ``plan_reshard`` is the pure part (indices and devices only), so the
same plan serves the minimal strategy, the minimum any reshard must move, and
the planner. Every copy either strategy makes is recorded
(``transfers.record_transfers``): the weight sync's report (L3) counts what
was really copied from that log.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from rlcluster_lab.placement.transfers import (  # noqa: F401  (re-exported: the log lives beside the reshard)
    Transfer,
    TransferLog,
    current_log,
    leaf_label,
    log_new_shards,
    record_transfers,
    shard_key,
    shard_keys,
)

STRATEGIES: tuple[str, ...] = ("xla", "minimal")
_STRATEGY: contextvars.ContextVar[str] = contextvars.ContextVar("rlcluster_lab_reshard_strategy", default="xla")


@contextlib.contextmanager
def reshard_strategy(name: str) -> Iterator[None]:
    """Use strategy ``name`` (``xla`` or ``minimal``) for the layout changes made inside the block."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown reshard strategy {name!r}; use one of {', '.join(STRATEGIES)}")
    token = _STRATEGY.set(name)
    try:
        yield
    finally:
        _STRATEGY.reset(token)


def current_strategy() -> str:
    """The strategy layout changes use here (``xla`` unless a ``reshard_strategy`` block says otherwise)."""
    return _STRATEGY.get()


Box = tuple[tuple[int, int], ...]  # (start, stop) per dimension


@dataclasses.dataclass(frozen=True)
class Piece:
    """Part of one destination shard, cut from one source shard."""

    src_device: int
    src_box: Box  # the source shard's box in the global array
    box: Box  # the piece's box in the global array

    def size(self) -> int:
        return box_size(self.box)


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """How one destination shard is made."""

    device: int
    box: Box
    pieces: tuple[Piece, ...]

    @property
    def reuses_source_buffer(self) -> bool:
        """The whole block is one source shard already on this device."""
        return len(self.pieces) == 1 and self.pieces[0].src_device == self.device and self.pieces[0].src_box == self.box


def minimum_cross_device_elements(
    src_boxes: Sequence[tuple[int, Box]], dst_boxes: Sequence[tuple[int, Box]]
) -> list[int]:
    """Per destination shard: elements that no source shard on its own device holds.

    Shards of one sharding are equal or disjoint, so a device's own source
    shards are one box, and what it lacks is its destination box minus the
    intersection with that box. This is the least any reshard must move.
    """
    local: dict[int, list[Box]] = {}
    for dev, box in src_boxes:
        local.setdefault(dev, []).append(box)
    out = []
    for dev, want in dst_boxes:
        have = 0
        for box in dict.fromkeys(local.get(dev, [])):
            inter = intersect_boxes(box, want)
            if inter is not None:
                have += box_size(inter)
        out.append(box_size(want) - have)
    return out


def shard_boxes(x: jax.Array) -> list[tuple[int, Box]]:
    """(device id, box) of every addressable shard of ``x``."""
    shape = tuple(x.shape)
    return [(s.device.id, to_box(s.index, shape)) for s in x.addressable_shards]


def to_box(index: Sequence[slice], shape: Sequence[int]) -> Box:
    out = []
    for sl, n in zip(index, shape):
        start, stop, _ = sl.indices(n)
        out.append((start, stop))
    # Scalars and trailing unsharded dims.
    for n in shape[len(out) :]:
        out.append((0, n))
    return tuple(out)


def plan_reshard(
    shape: Sequence[int],
    src_boxes: Sequence[tuple[int, Box]],
    dst_boxes: Sequence[tuple[int, Box]],
) -> list[BlockPlan]:
    """For each destination (device, box): the source pieces that fill it.

    ``src_boxes`` lists every source shard as (device id, box); a box held by
    several devices (replication) is a choice, and the destination device's
    own copy is preferred, then the lowest device id.
    """
    holders: dict[Box, list[int]] = {}
    for dev, box in src_boxes:
        holders.setdefault(box, []).append(dev)
    plans = []
    for dev, want in dst_boxes:
        pieces = []
        for box, devs in holders.items():
            inter = intersect_boxes(box, want)
            if inter is None:
                continue
            src = dev if dev in devs else min(devs)
            pieces.append(Piece(src_device=src, src_box=box, box=inter))
        covered = sum(p.size() for p in pieces)
        if covered != box_size(want):
            raise ValueError(
                f"source shards cover {covered} of the {box_size(want)} elements of destination "
                f"box {want}; the source sharding does not tile the array"
            )
        plans.append(BlockPlan(device=dev, box=want, pieces=tuple(pieces)))
    return plans


def array_plan(x: jax.Array, dst: Sharding) -> list[BlockPlan]:
    shape = tuple(x.shape)
    src = shard_boxes(x)
    dst_map = dst.addressable_devices_indices_map(shape)
    dst_boxes = [(d.id, to_box(idx, shape)) for d, idx in dst_map.items()]
    return plan_reshard(shape, src, dst_boxes)


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
    xs: Sequence[jax.Array],
    dsts: Sequence[Sharding],
    *,
    copy: bool = False,
    labels: Sequence[str | None] | None = None,
) -> list[jax.Array]:
    """``reshard`` of many arrays at once; ``labels`` tag their transfers in the log.

    Per array: kept when its sharding is already the destination (unless
    ``copy``); re-wrapped without a copy when the layout is equivalent (same
    devices, same boxes); otherwise its layout changes, with the whole batch
    done by the current strategy. Memory-kind changes are per-device moves on
    either side of the layout change, which the transfer guard allows.
    """
    current = current_log()
    default = current.leaf if current is not None else None
    labels = [default if lab is None else lab for lab in labels] if labels is not None else [default] * len(xs)
    out: list[jax.Array | None] = [None] * len(xs)
    staged: dict[int, tuple[jax.Array, Sharding, bool]] = {}
    for i, (x, dst) in enumerate(zip(xs, dsts)):
        if x.sharding == dst:
            if not copy:
                out[i] = x
            else:
                staged[i] = (x, dst, False)
            continue
        staged[i] = (x, dst, x.sharding.memory_kind != _work_kind(x))
    to_work = [i for i, (x, _, moved) in staged.items() if moved]
    if to_work:
        for i, y in zip(
            to_work,
            _put(
                [staged[i][0] for i in to_work],
                [staged[i][0].sharding.with_memory_kind(_work_kind(staged[i][0])) for i in to_work],
            ),
        ):
            log_new_shards("memory_kind", staged[i][0], y, labels[i])
            staged[i] = (y, staged[i][1], True)

    targets: dict[int, Sharding] = {}
    change: list[int] = []
    direct: list[int] = []
    for i, (x, dst, _moved_kind) in staged.items():
        if x.sharding == dst:  # the forced copy of an unchanged sharding
            direct.append(i)
            targets[i] = dst
            continue
        work = _work_kind(x)
        target = dst.with_memory_kind(work) if dst.memory_kind != work else dst
        targets[i] = target
        (direct if x.sharding.is_equivalent_to(target, x.ndim) else change).append(i)
    # Devices whose destination shard of array i was made by a logged copy.
    produced: dict[int, set[int]] = {i: set() for i in staged}
    # Equivalent layouts: re-labelled in one call (a forced copy where asked, in another).
    for must_copy in (False, True):
        group = [i for i in direct if (copy and not staged[i][2]) is must_copy]
        if not group:
            continue
        if not must_copy and jax.process_count() > 1:
            # multi-process: device_put copies an array spanning processes even onto an
            # equivalent sharding; its own shards, re-labelled, are the same buffers.
            moved = [relabel(staged[i][0], targets[i]) for i in group]
        else:
            moved = jax.device_put(
                [staged[i][0] for i in group], [targets[i] for i in group], may_alias=False if must_copy else None
            )
        for i, y in zip(group, moved):
            produced[i] = log_new_shards("same_device", staged[i][0], y, labels[i]) if current is not None else set()
            out[i] = y
    if change:
        for i, (y, made) in zip(
            change,
            _change_layout(
                [staged[i][0] for i in change], [targets[i] for i in change], copy, [labels[i] for i in change]
            ),
        ):
            out[i] = y
            produced[i] = made
    to_final = [i for i in staged if targets[i] != dsts[i]]
    if to_final:
        for i, y in zip(to_final, _put([out[i] for i in to_final], [dsts[i] for i in to_final])):
            log_new_shards("memory_kind", out[i], y, labels[i])
            out[i] = y
    for i in staged:
        if current is None or out[i] is xs[i] or len(produced[i]) == len(out[i].sharding.device_set):  # type: ignore[union-attr]
            continue  # nothing to log, or every shard's copy is logged already
        # A shard that carries the source's own data on its device but sits in a
        # new buffer (moved between memory kinds on the way) was copied within
        # its device: logged so that every destination byte is accounted for.
        _log_carried(xs[i], out[i], produced[i], labels[i])  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


def _change_layout(
    xs: list[jax.Array], dsts: list[Sharding], copy: bool, labels: list[str | None]
) -> list[tuple[jax.Array, set[int]]]:
    """Layout changes in device memory, by the current strategy; (array, devices with new buffers)."""
    from rlcluster_lab.placement import minimal as reshard_minimal
    from rlcluster_lab.placement import xla as reshard_xla

    log = current_log()
    strategy = current_strategy()
    results: list[tuple[jax.Array, set[int]] | None] = [None] * len(xs)
    rest = list(range(len(xs)))
    if strategy == "xla":
        done = reshard_xla.change_layout(xs, dsts, copy, labels)
        for i, r in done.items():
            results[i] = r
        rest = [i for i in rest if results[i] is None]
        if log is not None and done:
            log.strategies.add("xla")
    if rest:
        _refuse_minimal_across_processes([xs[i] for i in rest], [dsts[i] for i in rest])
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


def relabel(x: jax.Array, dst: Sharding) -> jax.Array:
    """``x``'s own shards as an array on ``dst``, an equivalent sharding (nothing is copied)."""
    return jax.make_array_from_single_device_arrays(x.shape, dst, [s.data for s in x.addressable_shards], dtype=x.dtype)


def _refuse_minimal_across_processes(xs: list[jax.Array], dsts: list[Sharding]) -> None:
    """multi-process: the minimal strategy copies single buffers between devices, which JAX does
    only within a process."""
    from rlcluster_lab.multiprocess.hosts import spans_processes

    if jax.process_count() == 1:
        return
    if any(spans_processes(set(x.sharding.device_set) | set(d.device_set)) for x, d in zip(xs, dsts)):
        raise NotImplementedError(
            "the minimal reshard strategy copies one buffer at a time between devices, which JAX cannot do "
            "between processes; use reshard='xla' (--reshard xla) when the roles span several processes"
        )


def _work_kind(x: jax.Array) -> str:
    """The default memory kind of the devices ``x`` lives on (where layout changes run)."""
    return next(iter(x.sharding.device_set)).default_memory().kind


def cast_many(xs: Sequence[jax.Array], dtypes: Sequence[Any]) -> list[jax.Array]:
    """Each array cast to its dtype on its own devices, all in one compiled program.

    Arrays already in their dtype are returned as they are. Eager ``astype``
    would compile a program per shape; one jitted tree program is compiled
    once per set of shapes, dtypes and shardings.
    """
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
        for i, y in zip(idx, ys):
            out[i] = y
    return out


@functools.lru_cache(maxsize=32)
def _cast_program(dtypes: tuple[str, ...]) -> Any:
    def cast(arrays: list[jax.Array]) -> list[jax.Array]:
        return [x.astype(d) for x, d in zip(arrays, dtypes)]

    return cast


def clear_programs() -> None:
    """Forget the compiled copy programs of both strategies (the next reshard builds them again).

    Programs are bounded caches already; this is for a caller that wants
    their memory back at once (or a test that swaps the planner).
    """
    from rlcluster_lab.placement import minimal as reshard_minimal
    from rlcluster_lab.placement import xla as reshard_xla

    reshard_minimal.clear()
    reshard_xla.clear()
    from rlcluster_lab.multiprocess import crossing  # multi-process: the programs that cross processes

    crossing.clear()


def log_cast(src: jax.Array, before: jax.Array, after: jax.Array, label: str | None) -> None:
    """A cast made new buffers out of ``before`` (a reshard of ``src``): log the shards that
    were still ``src``'s own buffers, which the cast turned into same-device copies."""
    log = current_log()
    if log is None or before is after:
        return
    own = shard_keys(src)
    for s in before.addressable_shards:
        if shard_key(s) in own:
            log.transfers.append(Transfer("same_device", s.device.id, s.device.id, int(s.data.nbytes), label))


def _log_carried(src: jax.Array, out: jax.Array, produced: set[int], label: str | None) -> None:
    log = current_log()
    if log is None:
        return
    src_keys = shard_keys(src)
    for s in out.addressable_shards:
        if shard_key(s) not in src_keys and s.device.id not in produced:
            log.transfers.append(Transfer("same_device", s.device.id, s.device.id, int(s.data.nbytes), label))


def _put(xs: list[Any], dsts: list[Any]) -> list[Any]:
    return list(jax.device_put(xs, dsts)) if xs else []


def intersect_boxes(a: Box, b: Box) -> Box | None:
    """The box two boxes have in common, or None when they do not meet."""
    out = []
    for (a0, a1), (b0, b1) in zip(a, b):
        lo, hi = max(a0, b0), min(a1, b1)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)


def box_size(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= b - a
    return n
