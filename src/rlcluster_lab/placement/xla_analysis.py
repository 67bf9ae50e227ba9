"""Where each destination byte of a compiled reshard program came from, measured by running it.

A probe runs the program once on inputs whose every shard holds its device's tag (its id + 1)
and counts, in every destination shard, the elements from each origin; once per program in a
process (``placement.xla.XlaProgram`` keeps the result).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

UNTRACED = "destination data not traced (dtype cannot hold a device tag)"


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Per leaf, per destination device id: element counts by the id of the device the data
    started on. None for a leaf whose dtype cannot hold a device tag."""

    by_leaf: tuple[dict[int, dict[int, int]] | None, ...]


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
