"""What a compiled reshard program moves, and where each destination byte came from.

``xla.XlaProgram`` asks for this once per program, when a recorded reshard
first needs it: the collectives read from the compiled program
(``placement.traffic``), and a provenance probe that runs the program on
inputs whose every shard holds its own device's tag. Both are kept on disk
beside the persistent compilation cache, keyed by the program's fingerprint,
so a new process reads them back instead of probing again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from rlcluster_lab.core.compile_cache import active_cache_dir
from rlcluster_lab.placement.traffic import Flow, ProgramTraffic


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Per leaf, per destination device id: element counts by the id of the device the data
    started on. None for a leaf whose dtype cannot hold a device tag."""

    by_leaf: tuple[dict[int, dict[int, int]] | None, ...]


def analysis_path(compiled: Any, devices: Sequence[Any]) -> Path | None:
    folder = active_cache_dir()
    if not folder:
        return None
    ids = ",".join(f"{d.platform}:{d.id}" for d in devices)
    digest = hashlib.sha256((compiled.as_text() + "|" + ids).encode()).hexdigest()[:40]
    return Path(folder) / "rlcluster-lab-analysis" / f"{digest}.json"


def read_analysis(compiled: Any, devices: Sequence[Any]) -> tuple[ProgramTraffic, Provenance] | None:
    path = analysis_path(compiled, devices)
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        flows = tuple(Flow(f["op"], f["src"], f["dst"], f["nbytes"], f["param"]) for f in data["flows"])
        traffic = ProgramTraffic(flows, tuple(data["collectives"]), tuple(data["unreadable"]))
        leaves = tuple(
            None
            if leaf is None
            else {int(d): {int(o): int(c) for o, c in counts.items()} for d, counts in leaf.items()}
            for leaf in data["provenance"]
        )
        return traffic, Provenance(leaves)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable: analyse the program again


def write_analysis(compiled: Any, devices: Sequence[Any], traffic: ProgramTraffic, provenance: Provenance) -> None:
    path = analysis_path(compiled, devices)
    if path is None:
        return
    data = {
        "flows": [
            {"op": f.op, "src": f.src_device, "dst": f.dst_device, "nbytes": f.nbytes, "param": f.param}
            for f in traffic.flows
        ],
        "collectives": list(traffic.collectives),
        "unreadable": list(traffic.unreadable),
        "provenance": list(provenance.by_leaf),
    }
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)


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
    tagged = []
    for x, fine in zip(xs, ok):
        shards = []
        for device, index in x.sharding.addressable_devices_indices_map(x.shape).items():
            shape = tuple(len(range(*sl.indices(n))) for sl, n in zip(index, x.shape)) if index else ()
            tag = (device.id + 1) if fine else 0
            shards.append(jax.device_put(np.full(shape, tag, dtype=x.dtype), device))
        tagged.append(jax.make_array_from_single_device_arrays(x.shape, x.sharding, shards))
    outs = compiled(tagged)
    by_leaf: list[dict[int, dict[int, int]] | None] = []
    for y, fine in zip(outs, ok):
        if not fine:
            by_leaf.append(None)
            continue
        per_device = {}
        for s in y.addressable_shards:
            values, counts = np.unique(np.asarray(s.data).astype(np.int64), return_counts=True)
            per_device[s.device.id] = {int(v) - 1: int(c) for v, c in zip(values, counts)}
        by_leaf.append(per_device)
    return Provenance(tuple(by_leaf))
