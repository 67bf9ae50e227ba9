"""Where each destination byte of a compiled reshard program came from, stored and checked.

A probe runs the program once on inputs whose every shard holds its device's tag. The result
is stored beside the persistent compilation cache, keyed by the program's fingerprint; a stored
entry is checked against the program (``checked_provenance``) and ignored if it fails, and is
written by ``mkstemp`` and rename in a trusted folder (``core.compile_cache.trusted_folder``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from rlcluster_lab.core.compile_cache import active_cache_dir, trusted_folder
from rlcluster_lab.placement.boxes import box_size, intersect_boxes, to_box
from rlcluster_lab.placement.traffic import ProgramTraffic

# What an entry holds; an entry of another format (an older lab's) is probed again and replaced.
FORMAT = "rlcluster-lab-provenance/2"
# An entry holds a few numbers per leaf and device pair; a file this large is not one.
MAX_ENTRY_BYTES = 16 << 20
UNTRACED = "destination data not traced (dtype cannot hold a device tag)"


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Per leaf, per destination device id: element counts by the id of the device the data
    started on. None for a leaf whose dtype cannot hold a device tag."""

    by_leaf: tuple[dict[int, dict[int, int]] | None, ...]


def analysis_path(compiled: Any, devices: Sequence[Any]) -> Path | None:
    """Where the program's entry is stored, or None (no persistent cache, or a store not trusted)."""
    folder = active_cache_dir()
    if not folder:
        return None
    store = trusted_folder(Path(folder) / "rlcluster-lab-analysis", "the store of XLA program analyses")
    if store is None:
        return None
    ids = ",".join(f"{d.platform}:{d.id}" for d in devices)
    digest = hashlib.sha256((compiled.as_text() + "|" + ids).encode()).hexdigest()[:40]
    return store / f"{digest}.json"


class _Mismatch(ValueError):
    """A stored entry that does not fit the program it is filed under."""


def read_analysis(
    compiled: Any, devices: Sequence[Any], inputs: Sequence[Any], outputs: Sequence[Sharding], traffic: ProgramTraffic
) -> Provenance | None:
    """The stored provenance of this program, checked against its abstract inputs, destination
    shardings and flows; None when none fits, whatever the file holds."""
    path = analysis_path(compiled, devices)
    if path is None:
        return None
    try:
        if path.stat().st_size > MAX_ENTRY_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        return checked_provenance(data, inputs, outputs, traffic)
    except Exception:  # noqa: BLE001 - unreadable or not this program's: probe the program again
        return None


def checked_provenance(
    data: Any, inputs: Sequence[Any], outputs: Sequence[Sharding], traffic: ProgramTraffic
) -> Provenance:
    """``data`` (a parsed entry) as the program's ``Provenance``, every figure checked (one entry per
    leaf and destination device, origins the input sharding names, non-negative counts within what
    origin and destination share, summing to the destination's size, and no more foreign data than
    the program's collectives carry), else a ``ValueError``."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _Mismatch("not an entry of this format")
    raw = data.get("provenance")
    if not isinstance(raw, list) or len(raw) != len(inputs):
        raise _Mismatch("not one entry per program input")
    largest = max(d.id for x in inputs for d in x.sharding.device_set) + 1
    foreign_by_device: dict[int, int] = {}
    leaves: list[dict[int, dict[int, int]] | None] = []
    for x, dst, leaf in zip(inputs, outputs, raw):
        if not tag_dtype_ok(x.dtype, largest):
            if leaf is not None:
                raise _Mismatch("counts for a leaf whose dtype cannot hold a tag")
            leaves.append(None)
            continue
        per_device = _checked_leaf(x, dst, leaf)
        itemsize = np.dtype(x.dtype).itemsize
        for d, counts in per_device.items():
            foreign = sum(c for origin, c in counts.items() if origin != d) * itemsize
            foreign_by_device[d] = foreign_by_device.get(d, 0) + foreign
        leaves.append(per_device)
    if traffic.exact:
        # Data that started on another device reached its destination through a collective.
        into: dict[int, int] = {}
        for f in traffic.flows:
            into[f.dst_device] = into.get(f.dst_device, 0) + f.nbytes
        if any(n > into.get(d, 0) for d, n in foreign_by_device.items()):
            raise _Mismatch("more data arrives from other devices than the program's collectives carry")
    return Provenance(tuple(leaves))


def _checked_leaf(x: Any, dst: Sharding, leaf: Any) -> dict[int, dict[int, int]]:
    shape = tuple(x.shape)
    src_boxes = {d.id: to_box(ix, shape) for d, ix in x.sharding.devices_indices_map(shape).items()}
    dst_boxes = {d.id: to_box(ix, shape) for d, ix in dst.addressable_devices_indices_map(shape).items()}
    if not isinstance(leaf, dict) or len(leaf) != len(dst_boxes):
        raise _Mismatch("not one entry per destination device")
    out: dict[int, dict[int, int]] = {}
    for key, counts in leaf.items():
        d = _device_key(key, dst_boxes)
        if d in out or not isinstance(counts, dict) or len(counts) > len(src_boxes):
            raise _Mismatch("a destination device twice, or counts that are not a map of origins")
        box = dst_boxes[d]
        parsed: dict[int, int] = {}
        for origin_key, count in counts.items():
            origin = _device_key(origin_key, src_boxes)
            if origin in parsed or isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise _Mismatch("an origin twice, or a count that is not a non-negative integer")
            common = intersect_boxes(box, src_boxes[origin])
            if count > (box_size(common) if common is not None else 0):
                raise _Mismatch("more elements from an origin than its shard shares with the destination's")
            parsed[origin] = count
        if sum(parsed.values()) != box_size(box):
            raise _Mismatch("counts that do not add up to the destination shard's size")
        out[d] = parsed
    return out


def _device_key(key: Any, known: dict[int, Any]) -> int:
    """A JSON object key naming one of ``known``'s device ids."""
    if not isinstance(key, str) or not key.isdigit() or len(key) > 12 or int(key) not in known:
        raise _Mismatch("a device id the program's shardings do not name")
    return int(key)


def write_analysis(compiled: Any, devices: Sequence[Any], provenance: Provenance) -> None:
    """Store the program's provenance (best effort), through a new ``mkstemp`` file renamed into
    place: a reader sees a whole entry or none, and no link planted at the name is followed."""
    path = analysis_path(compiled, devices)
    if path is None:
        return
    text = json.dumps({"format": FORMAT, "provenance": list(provenance.by_leaf)})
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if not isinstance(exc, OSError):
            raise


def identity(tree: Any) -> Any:
    return tree


def tag_dtype_ok(dtype: Any, largest: int) -> bool:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return largest <= np.iinfo(dt).max
    if dt.kind == "f" or dt.name in ("bfloat16",):
        # Integers up to 2**(mantissa bits + 1) are exact.
        bits = {2: 8 if dt.name == "bfloat16" else 11, 4: 24, 8: 53}.get(dt.itemsize, 0)
        return largest < 2**bits
    return False


def probe_provenance(compiled: Any, xs: Sequence[jax.Array], dsts: Sequence[Sharding]) -> Provenance:
    """Run the program once on inputs whose every shard holds (its device id + 1); read back,
    for every destination shard, how many of its elements started on each device."""
    largest = max(d.id for x in xs for d in x.sharding.device_set) + 1
    ok = [tag_dtype_ok(x.dtype, largest) for x in xs]
    blocks, devices, counts = [], [], []
    for x, fine in zip(xs, ok):
        placed = x.sharding.addressable_devices_indices_map(x.shape).items()
        for device, index in placed:
            shape = tuple(len(range(*sl.indices(n))) for sl, n in zip(index, x.shape)) if index else ()
            blocks.append(np.full(shape, (device.id + 1) if fine else 0, dtype=x.dtype))
            devices.append(device)
        counts.append(len(placed))
    shards = iter(jax.device_put(blocks, devices))  # every tagged shard in one transfer call
    tagged = [
        jax.make_array_from_single_device_arrays(x.shape, x.sharding, [next(shards) for _ in range(n)], dtype=x.dtype)
        for x, n in zip(xs, counts)
    ]

    def origins(y: jax.Array) -> dict[int, dict[int, int]]:
        # Each element holds its origin's tag (device id + 1): a count per tag, in one pass.
        tags = {s.device.id: np.bincount(np.asarray(s.data).astype(np.int64).ravel()) for s in y.addressable_shards}
        return {d: {v - 1: int(c) for v, c in enumerate(n) if c} for d, n in tags.items()}

    return Provenance(tuple(origins(y) if fine else None for y, fine in zip(compiled(tagged), ok)))
