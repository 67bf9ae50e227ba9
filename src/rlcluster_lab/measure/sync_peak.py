"""A weight sync's transient peak (L3), measured: the bytes alive during it above what was there before.

During a sync the old rollout arrays, the new ones, the reshard's staging and its programs'
temporaries are alive together for a moment: that moment, not the bytes moved, is where a run
runs out of memory. ``PeakWalk`` listens to the reshard's ``Made`` and ``Phase`` events and at
each phase counts (``PeakCount``, shared with the planner) what ``METHOD`` names."""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any

import jax

from rlcluster_lab.placement import phases as ph
from rlcluster_lab.placement.chunks import chunk_leaves
from rlcluster_lab.placement.events import Made, Phase
from rlcluster_lab.placement.transfers import Key, shard_buffers

Buffer = tuple[str, str, int]  # (device id, memory kind, bytes)

METHOD = {
    "arrays": "measured: a walk, at each phase of the handover, of the arrays the sync made (weak references: "
    "an array counts while it is alive) and of those it replaced, buffers counted once by (device, pointer), "
    "those alive before the sync left out",
    "program_temporaries": "measured: the memory analysis of each compiled program that ran (temp_size_in_bytes "
    "per device: the reshard's and the cast's); the minimal strategy's per-device slicing programs are not read",
    "allocator": "measured where the devices report memory_stats() (GPU, TPU): peak_bytes_in_use after the sync "
    "minus bytes_in_use before, where the peak rose during the sync",
}


def array_buffers(x: jax.Array) -> dict[Key, Buffer]:
    """Each buffer of ``x`` by key: (device id, memory kind, bytes), read once while the array lives."""
    kind = str(x.sharding.memory_kind)
    return {key: (str(key[1]), kind, n) for key, n in shard_buffers(x)}


def nonzero(table: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Device -> key -> bytes without the zeros, devices in id order (a plan writes the same)."""
    out = {d: {k: int(v) for k, v in sorted(row.items()) if v} for d, row in table.items()}
    return {d: out[d] for d in sorted(out, key=int) if out[d]}


def tally(table: dict[Any, dict[Any, int]], row_key: Any, key: Any, n: int) -> None:
    """Add ``n`` to ``table[row_key][key]`` (a per-device, per-kind or per-leaf count)."""
    row = table.setdefault(row_key, {})
    row[key] = row.get(key, 0) + n


@dataclasses.dataclass(frozen=True)
class PeakPhase:
    """One phase of a sync: the bytes above what was alive before it, per device.

    ``arrays[device][kind]``: new buffers alive minus buffers released (negative once a chunk frees
    more than it made); ``terms[device][term]``: the same by what they are (``placement.phases``);
    ``temporaries[device]``: compiled programs' scratch (device memory)."""

    name: str
    chunk: int | None  # 1-based; None for the anchor re-pin and the end
    arrays: Mapping[str, Mapping[str, int]]
    terms: Mapping[str, Mapping[str, int]]
    temporaries: Mapping[str, int]

    def on(self, device: str) -> dict[str, int]:
        """Bytes above before on ``device`` per memory kind, the programs' temporaries in ``device``."""
        kinds = {k: int(v) for k, v in self.arrays.get(device, {}).items()}
        if self.temporaries.get(device):
            kinds["device"] = kinds.get("device", 0) + int(self.temporaries[device])
        return kinds

    def label(self, chunks: int) -> str:
        return self.name if self.chunk is None or chunks == 1 else f"chunk {self.chunk}/{chunks}: {self.name}"


@dataclasses.dataclass(frozen=True)
class SyncPeak:
    """A sync's transient peak per device and memory kind (see the module docstring).

    ``by_device[device][kind]``: the most bytes above before at any phase; ``phase_at_peak``: where
    each device's device-memory peak (else its largest kind) is; ``after``: once the sync committed."""

    by_device: Mapping[str, Mapping[str, int]]
    phase_at_peak: Mapping[str, str]
    after: Mapping[str, Mapping[str, int]]
    phases: tuple[PeakPhase, ...]
    chunks: int
    chunk_bytes: int | None
    largest_chunk_bytes: int
    order: str
    method: Mapping[str, str]
    allocator: Mapping[str, Any] | None = None

    @property
    def max_bytes(self) -> dict[str, int]:
        """Per memory kind, the largest peak of any device."""
        out: dict[str, int] = {}
        for kinds in self.by_device.values():
            for kind, n in kinds.items():
                out[kind] = max(out.get(kind, 0), int(n))
        return out

    @property
    def max_device(self) -> str | None:
        """The device with the largest device-memory peak (None: no device memory used)."""
        busiest = max(self.by_device.items(), key=lambda kv: (kv[1].get("device", 0), -int(kv[0])), default=None)
        return None if busiest is None or not busiest[1].get("device", 0) else busiest[0]

    def to_json(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self) | {"max_bytes": self.max_bytes, "max_device": self.max_device}
        keys = "by_device max_bytes max_device phase_at_peak after chunks chunk_bytes largest_chunk_bytes order"
        return {key: fields[key] for key in (*keys.split(), "method", "allocator", "phases")}


def peak_of(
    phases: Sequence[PeakPhase],
    *,
    chunk_bytes: int | None,
    largest_chunk_bytes: int,
    order: str,
    method: Mapping[str, str],
    allocator: Mapping[str, Any] | None = None,
) -> SyncPeak:
    """A sync's phases put together: each device's peak per kind, and where it is (the planner's too)."""
    chunks = max((p.chunk or 0 for p in phases), default=0)
    best: dict[str, dict[str, int]] = {}
    where: dict[str, dict[str, str]] = {}
    for p in phases:
        for d in set(p.arrays) | set(p.temporaries):
            for kind, n in p.on(d).items():
                if n > best.setdefault(d, {}).get(kind, 0):
                    best[d][kind] = n
                    where.setdefault(d, {})[kind] = p.label(chunks)
    by_device = nonzero(best)  # every figure in best is above 0
    at_peak = {}
    for d, kinds in by_device.items():
        kind = "device" if "device" in kinds else max(kinds, key=kinds.get)
        at_peak[d] = where[d][kind]
    return SyncPeak(
        by_device=by_device,
        phase_at_peak=at_peak,
        after=nonzero(phases[-1].arrays) if phases else {},
        phases=tuple(phases),
        chunks=chunks,
        chunk_bytes=chunk_bytes,
        largest_chunk_bytes=largest_chunk_bytes,
        order=order,
        method=method,
        allocator=allocator,
    )


def largest_chunk(sizes: Sequence[int], chunk_bytes: int | None) -> int:
    """The bytes of the largest chunk the leaves of ``sizes`` (their bytes, in path order) go in."""
    return max((sum(sizes[i] for i in r) for r in chunk_leaves(sizes, chunk_bytes)), default=0)


def chunk_words(peak: Mapping[str, Any], size: Callable[[int], str] = lambda n: f"{n:,} bytes") -> str:
    """How a sync's handover was cut (P13), in the peak's own figures (``SyncPeak.to_json()``), the
    words every view uses: one piece, one chunk (the limit above every byte handed over), or that
    many chunks; a leaf is never split, so one above the limit moves whole and the words say so."""
    chunks, limit, largest = int(peak.get("chunks") or 1), peak.get("chunk_bytes"), int(peak["largest_chunk_bytes"])
    if limit is None:
        return "in one piece"
    if chunks <= 1:
        if largest > int(limit):  # a single leaf, above the limit
            return f"in one chunk: the one leaf handed over, {size(largest)}, is above the limit, {size(int(limit))}"
        return f"in one chunk: the limit, {size(int(limit))}, is above the {size(largest)} handed over"
    said = f"in {chunks} chunks of at most {size(int(limit))}"
    if largest > int(limit):
        said += f", but a leaf larger than that moves whole, in a chunk of its own (the largest: {size(largest)})"
    return said


class PeakCount:
    """A sync's phases, each counted from what is alive at it: the one count the live walk
    (``PeakWalk``) and the planner (``planner.sync_peak``) share.

    At a phase: every buffer of a value alive (``made``) that nothing alive before the sync holds
    (``still``), once per key; minus every buffer of a replaced value now gone (``gone``); plus the
    temporaries of the programs run since the last phase. ``commit`` ends the current chunk."""

    def __init__(self) -> None:
        self.phases: list[PeakPhase] = []
        self.chunk = 1

    def count(
        self,
        name: str,
        made: Iterable[tuple[str, Mapping[Any, Buffer]]],
        still: Set[Any],
        gone: Iterable[Mapping[Any, Buffer]],
        programs: Sequence[tuple[tuple[int, ...], int]] = (),
    ) -> None:
        arrays: dict[str, dict[str, int]] = {}
        terms: dict[str, dict[str, int]] = {}

        def add(entries: Iterable[tuple[str, Mapping[Any, Buffer]]], sign: int) -> None:
            # A key counts once on each side: a freed buffer's address may be reused by a new array.
            seen: set[Any] = set()
            for term, bufs in entries:
                for key, (dev, kind, n) in bufs.items():
                    if key not in seen and key not in still:
                        seen.add(key)
                        tally(arrays, dev, kind, sign * n)
                        tally(terms, dev, ph.term_in(term, kind), sign * n)

        add(made, 1)
        add(((ph.RELEASED, bufs) for bufs in gone), -1)
        temps: dict[str, int] = {}
        for ids, n in programs:
            for d in ids:
                if n:  # a program without temporaries adds no entry
                    temps[str(d)] = temps.get(str(d), 0) + int(n)
        chunk = None if name in ("anchor re-pin", "end") else self.chunk
        temporaries = {d: temps[d] for d in sorted(temps, key=int)}
        self.phases.append(PeakPhase(name, chunk, nonzero(arrays), nonzero(terms), temporaries))
        if name == "commit":
            self.chunk += 1


class PeakWalk(PeakCount):
    """The sync's listener to the reshard's ``Made`` and ``Phase`` events (``PeakCount`` on live arrays):
    ``keep``, arrays alive through the whole sync (the actor's state), are never new nor released;
    ``replaced`` ones count as released once nothing holds them."""

    def __init__(self, keep: Iterable[jax.Array], replaced: Iterable[jax.Array]) -> None:
        super().__init__()
        self.keep: set[Key] = {key for x in keep for key in array_buffers(x)}
        self.replaced: list[tuple[weakref.ref, dict[Key, Buffer]]] = [
            (weakref.ref(x), array_buffers(x)) for x in replaced
        ]
        self._made: list[list[Any]] = []  # [weak reference, term, buffers once read]
        self.seconds = 0.0

    kinds = frozenset({Made, Phase})

    def on(self, event: Made | Phase) -> None:
        """An array made counts while alive; at a phase, count what is alive."""
        if isinstance(event, Made):
            self._made.extend([weakref.ref(x), event.term, None] for x in event.arrays)
            return
        start = time.perf_counter()
        # Alive before and still: only against these is a buffer "not new" (a freed address may be reused).
        still: set[Key] = set(self.keep)
        gone: list[dict[Key, Buffer]] = []
        for ref, bufs in self.replaced:
            x = ref()
            if x is not None and not x.is_deleted():
                still.update(bufs)
            else:
                gone.append(bufs)
        kept = []
        for entry in self._made:
            x = entry[0]()
            if x is None or x.is_deleted():
                continue  # dropped: gone from the walk for good
            kept.append(entry)
            if entry[2] is None:
                entry[2] = array_buffers(x)
        self._made = kept
        self.count(event.name, [(term, bufs) for _, term, bufs in kept], still, gone, event.programs)
        self.seconds += time.perf_counter() - start


def allocator_before(devices: Sequence[Any]) -> dict[str, tuple[int, int]] | None:
    """(bytes_in_use, peak_bytes_in_use) per device, where the allocator reports them."""
    out = {}
    for d in devices:
        if d.process_index != jax.process_index():
            continue
        s = d.memory_stats()
        if s and "bytes_in_use" in s and "peak_bytes_in_use" in s:
            out[str(d.id)] = (int(s["bytes_in_use"]), int(s["peak_bytes_in_use"]))
    return out or None


def allocator_peak(devices: Sequence[Any], before: Mapping[str, tuple[int, int]] | None) -> dict[str, Any]:
    """The allocator's view of the sync: per device, the peak above what was in use before,
    where the peak rose during the sync; otherwise None and why."""
    platform = devices[0].platform if devices else "?"
    if not before:
        return {"available": False, "note": f"the {platform} devices report no allocator figures", "by_device": {}}
    by_device: dict[str, int | None] = {}
    for d in devices:
        key = str(d.id)
        if key not in before:
            continue
        s = d.memory_stats() or {}
        in_use, old_peak = before[key]
        peak = int(s.get("peak_bytes_in_use", old_peak))
        by_device[key] = peak - in_use if peak > old_peak else None
    return {
        "available": True,
        "note": "peak_bytes_in_use after the sync minus bytes_in_use before, per device; None where the "
        "process's earlier peak was higher (the allocator keeps one peak per process, never reset)",
        "by_device": by_device,
    }
