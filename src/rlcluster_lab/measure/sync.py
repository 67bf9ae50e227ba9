"""What one weight sync moved (L3): per leaf and in total, against the least the placement allows,
in physical bytes (every device shard counted). Built from the source's shard facts, the
destination arrays and the reshard's log of its copies (``TransferLog``), not from JAX's transfer
guard, which does not see device-to-device copies on CPU."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict
from jax.sharding import NamedSharding, Sharding

from rlcluster_lab.cluster.sync import sync_filter
from rlcluster_lab.core.shardings import array_leaves
from rlcluster_lab.engines.base import flat_values, leaf_path
from rlcluster_lab.measure.memory import UNITS, _plain, own_devices_words
from rlcluster_lab.measure.sync_peak import (
    METHOD,
    PeakWalk,
    SyncPeak,
    allocator_before,
    allocator_peak,
    array_buffers,
    largest_chunk,
    peak_of,
    tally,
)
from rlcluster_lab.placement import phases
from rlcluster_lab.placement.boxes import box_size, minimum_cross_device_elements, shard_boxes
from rlcluster_lab.placement.events import (
    LEDGER,
    Built,
    Made,
    Phase,
    Ran,
    Relayed,
    Routed,
    Transfer,
    Unreadable,
    listening,
)
from rlcluster_lab.placement.layout import Layout, id_ranges, mesh_words
from rlcluster_lab.placement.programs import ProgramCache
from rlcluster_lab.placement.reshard import copy_arrays
from rlcluster_lab.placement.route import plan_lines
from rlcluster_lab.placement.transfers import shard_buffers, shard_keys


@dataclasses.dataclass
class TransferLog:
    """The copies a reshard made while it listened (``events.listening(log)``): the mover's ledger
    events (``placement.events.LEDGER``), whichever strategy made them; ``compiled``/``loaded``: a
    program that ran meanwhile was compiled here / read back from the persistent cache."""

    transfers: list[Transfer] = dataclasses.field(default_factory=list)
    relayed: dict[str | None, int] = dataclasses.field(default_factory=dict)
    strategies: set[str] = dataclasses.field(default_factory=set)
    unreadable: list[tuple[str | None, str]] = dataclasses.field(default_factory=list)
    compiled: bool = False
    loaded: bool = False
    routes: list[Any] = dataclasses.field(default_factory=list)  # each reshard's route, in order (one per chunk)
    kinds = LEDGER

    def on(self, event: Any) -> None:
        """Take one ledger event."""
        if isinstance(event, Transfer):
            self.transfers.append(event)
        elif isinstance(event, Relayed) and event.nbytes > 0:
            self.relayed[event.leaf] = self.relayed.get(event.leaf, 0) + event.nbytes
        elif isinstance(event, Unreadable):
            self.unreadable.append((event.leaf, event.why))
        elif isinstance(event, Ran):
            self.strategies.add(event.strategy)
        elif isinstance(event, Built):
            self.compiled |= event.source == "compiled"
            self.loaded |= event.source != "compiled"
        elif isinstance(event, Routed):
            self.routes.append(event.route)


@dataclasses.dataclass(frozen=True)
class SyncPiece:
    """Bytes of one leaf reaching one destination device (L3), ``how``: ``"moved"`` (from
    ``src_device``), ``"copied"`` (a new buffer from data on ``dst_device``) or ``"reused"`` (the
    source's own buffer). Per leaf and kind the pieces sum to the leaf's figures."""

    how: str
    src_device: int
    dst_device: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class LeafSync:
    """One synced leaf (``SyncReport`` says what each figure counts), bytes physical in the source's
    dtype; ``pieces``: the same bytes per (how, source device, destination device)."""

    path: str
    dtype: str
    dst_dtype: str
    shape: tuple[int, ...]
    src_sharding: str
    dst_sharding: str
    synced_bytes: int
    moved_cross_device_bytes: int
    copied_same_device_bytes: int
    reused_bytes: int
    minimum_cross_device_bytes: int
    logical_bytes: int
    relayed_cross_device_bytes: int = 0
    method: str = "logged copies"
    pieces: tuple[SyncPiece, ...] = ()

    @property
    def arrived_cross_device_bytes(self) -> int:
        return self.moved_cross_device_bytes - self.relayed_cross_device_bytes

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["arrived_cross_device_bytes"] = self.arrived_cross_device_bytes
        out["shape"] = list(self.shape)
        out["pieces"] = [dataclasses.asdict(p) for p in self.pieces]
        return out


@dataclasses.dataclass(frozen=True)
class SyncReport:
    """What one ``sync_weights`` moved (P13, L3).

    Every destination shard's bytes were *reused* (a source buffer), *copied within its device*, or
    arrived from another device: ``synced = arrived + copied + reused`` and ``arrived = moved -
    relayed``, where ``relayed`` crossed but did not end as destination data where it crossed to (0
    for the minimal strategy). A sentence comparing bytes with the synced bytes compares ``arrived``,
    never ``moved`` (which can exceed them). ``minimum_cross_device_bytes``: what the two shardings
    force to cross; ``excess``: how much more moved. ``anchor_bytes``/``anchor_seconds``: the anchor
    re-pin (P8). ``peak_extra_bytes`` per device and kind: the new buffers; ``peak`` (JSON
    ``transient_peak``): what is alive at the worst moment (``measure.sync_peak``). A cast is not
    movement. ``seconds``: the handover alone, including building its programs on a first sync
    (``includes_compilation``, ``includes_program_load``)."""

    method: str
    lora: bool
    leaves: tuple[LeafSync, ...]
    anchor_bytes: int
    anchor_mode: str
    seconds: float
    anchor_seconds: float
    arrived_by_device: Mapping[str, int]
    peak_extra_bytes: Mapping[str, Mapping[str, int]]
    global_step: int
    includes_compilation: bool = False
    includes_program_load: bool = False
    reshard_strategy: str = "minimal"
    units: str = UNITS
    peak: SyncPeak | None = None  # None where not watched
    # Every logged cross-device copy, which multiprocess.report splits by process (not in the JSON).
    transfers: tuple[Transfer, ...] = dataclasses.field(default=(), repr=False, compare=False)
    # The devices the sync ran on, in words (``core.devices.devices_words``): where its figures come from.
    where: str = ""
    # The plan the handover ran: one line per group of leaves that changed together (``Route.lines``).
    plan: tuple[str, ...] = ()
    # One jax.device_put of the same leaves into the rollout's shardings, where measured (``with_floor``).
    device_put_seconds: float | None = None

    def _sum(self, field: str) -> int:
        return int(sum(getattr(leaf, field) for leaf in self.leaves))

    # The totals: each the sum of the leaves' figure.
    synced_bytes = property(lambda self: self._sum("synced_bytes"))
    moved_cross_device_bytes = property(lambda self: self._sum("moved_cross_device_bytes"))
    copied_same_device_bytes = property(lambda self: self._sum("copied_same_device_bytes"))
    reused_bytes = property(lambda self: self._sum("reused_bytes"))
    relayed_cross_device_bytes = property(lambda self: self._sum("relayed_cross_device_bytes"))
    arrived_cross_device_bytes = property(lambda self: self._sum("arrived_cross_device_bytes"))
    minimum_cross_device_bytes = property(lambda self: self._sum("minimum_cross_device_bytes"))
    synced_logical_bytes = property(lambda self: self._sum("logical_bytes"))

    @property
    def excess_cross_device_bytes(self) -> int:
        return self.moved_cross_device_bytes - self.minimum_cross_device_bytes

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in _REPORT_KEYS} | {
            "arrived_by_device": _plain(self.arrived_by_device),
            "peak_extra_bytes": _plain(self.peak_extra_bytes),
            "transient_peak": None if self.peak is None else self.peak.to_json(),
            "plan": list(self.plan),
            "device_put_seconds": self.device_put_seconds,
            "leaves": [leaf.to_json() for leaf in self.leaves],
        }


# The report's JSON keys read as they are, in the order the CLI prints them (the rest follow in to_json).
_REPORT_KEYS = (
    "units where method lora global_step synced_bytes moved_cross_device_bytes copied_same_device_bytes "
    "reused_bytes relayed_cross_device_bytes arrived_cross_device_bytes minimum_cross_device_bytes "
    "excess_cross_device_bytes reshard_strategy synced_logical_bytes anchor_bytes anchor_mode seconds "
    "anchor_seconds includes_compilation includes_program_load"
).split()


@dataclasses.dataclass(frozen=True)
class ShardFacts:
    """What the accounting needs of one array, read before the sync replaces anything."""

    shape: tuple[int, ...]
    dtype: Any
    sharding: str
    boxes: tuple[tuple[int, Any], ...]  # (device id, box) per shard
    buffers: frozenset[tuple[int, int]]  # (device id, pointer) per shard


def shard_facts(x: jax.Array) -> ShardFacts:
    return ShardFacts(
        shape=tuple(x.shape),
        dtype=x.dtype,
        sharding=describe_sharding(x.sharding),
        boxes=tuple(shard_boxes(x)),
        buffers=frozenset(shard_keys(x)),
    )


def flat_leaves(state: Any) -> dict[str, jax.Array]:
    """Path -> array for every array leaf of a state."""
    values = nnx.to_pure_dict(state) if isinstance(state, nnx.State) else state
    return {leaf_path(k): v for k, v in flatten_dict(values).items() if isinstance(v, jax.Array)}


def sync_report(
    ledger: Ledger,
    log: TransferLog,
    *,
    lora: bool,
    seconds: float,
    new_anchor_shards: Sequence[tuple[int, str, int]],
    anchor_mode: str,
    anchor_seconds: float,
    global_step: int,
    transient_peak: SyncPeak | None = None,
    where: str = "",
) -> SyncReport:
    """Build the report from the sync plan's ledger and this sync's log; ``new_anchor_shards``:
    (device id, memory kind, bytes) of every buffer the anchor re-pin allocated."""
    peak = {device: dict(kinds) for device, kinds in ledger.new_buffers.items()}
    for dev, kind, n in new_anchor_shards:
        tally(peak, str(dev), kind, n)
    return SyncReport(
        method=ledger.method,
        lora=lora,
        leaves=ledger.leaves,
        anchor_bytes=sum(n for *_, n in new_anchor_shards),
        anchor_mode=anchor_mode,
        seconds=seconds,
        anchor_seconds=anchor_seconds,
        arrived_by_device=ledger.arrived_by_device,
        peak_extra_bytes={k: peak[k] for k in sorted(peak, key=int)},
        global_step=global_step,
        includes_compilation=log.compiled,
        includes_program_load=log.loaded,
        reshard_strategy=ledger.strategy,
        peak=transient_peak,
        transfers=ledger.transfers,
        where=where,
        plan=ledger.plan,
    )


@dataclasses.dataclass(frozen=True)
class Ledger:
    """What one sync plan moves, per leaf and in total (L3), worked out once per plan (the same
    layouts and logged copies give the same figures). ``new_buffers``: device -> kind -> bytes."""

    leaves: tuple[LeafSync, ...]
    arrived_by_device: Mapping[str, int]
    new_buffers: Mapping[str, Mapping[str, int]]
    method: str
    strategy: str
    transfers: tuple[Transfer, ...]
    plan: tuple[str, ...]


def sync_ledger(source: Mapping[str, ShardFacts], destination: Mapping[str, jax.Array], log: TransferLog) -> Ledger:
    """The ledger of one sync from the source's facts, the destination arrays and the transfer log."""
    totals: dict[str, dict[str, int]] = {"moved": {}, "copied": {}, "arrived": {}}
    # Per leaf: (how, source device, destination device) -> bytes, for the figures of a sync.
    pieces: dict[str, dict[tuple[str, int, int], int]] = {}
    for t in log.transfers:
        part = {"cross_device": "moved", "same_device": "copied"}.get(t.kind)
        if t.leaf is None or part is None:
            continue
        tally(totals, part, t.leaf, t.nbytes)
        if part == "moved":
            tally(totals, "arrived", str(t.dst_device), t.nbytes)
        tally(pieces, t.leaf, (part, int(t.src_device), int(t.dst_device)), t.nbytes)
    cross, same, arrived = totals["moved"], totals["copied"], totals["arrived"]
    untraced: dict[str | None, list[str]] = {}
    for leaf, why in log.unreadable:
        untraced.setdefault(leaf, []).append(why)
    program = "xla" in log.strategies
    peak: dict[str, dict[str, int]] = {}
    leaves = []
    for path in sorted(source):
        src, dst = source[path], destination[path]
        itemsize = np.dtype(src.dtype).itemsize
        dst_boxes = shard_boxes(dst)
        lacking = minimum_cross_device_elements(src.boxes, dst_boxes)
        synced = reused = 0
        kind = str(dst.sharding.memory_kind)
        for (key, nbytes), (_, box) in zip(shard_buffers(dst), dst_boxes):
            elements = box_size(box)
            synced += elements * itemsize
            if key in src.buffers:
                reused += elements * itemsize
                tally(pieces, path, ("reused", key[1], key[1]), elements * itemsize)
                continue
            tally(peak, str(key[1]), kind, nbytes)
        how = "logged copies" if not program else "logged copies and compiled-program collectives"
        if path in untraced or None in untraced:
            how = "not fully derivable: " + "; ".join(untraced.get(path, []) + untraced.get(None, []))[:300]
        leaves.append(
            LeafSync(
                path=path,
                dtype=str(np.dtype(src.dtype)),
                dst_dtype=str(np.dtype(dst.dtype)),
                shape=src.shape,
                src_sharding=src.sharding,
                dst_sharding=describe_sharding(dst.sharding),
                synced_bytes=synced,
                moved_cross_device_bytes=cross.get(path, 0),
                copied_same_device_bytes=same.get(path, 0),
                reused_bytes=reused,
                minimum_cross_device_bytes=sum(lacking) * itemsize,
                logical_bytes=int(np.prod(src.shape, dtype=np.int64)) * itemsize,
                relayed_cross_device_bytes=log.relayed.get(path, 0),
                method=how,
                pieces=tuple(SyncPiece(k, a, b, n) for (k, a, b), n in sorted(pieces.get(path, {}).items())),
            )
        )
    strategy = "+".join(sorted(log.strategies)) or "none (no layout changed)"
    method = (
        "measured: copies logged by the reshard, bytes read from the compiled program's collectives "
        "and traced per destination shard, buffer identity for reuse"
        if program
        else "measured: every copy the reshard made, and buffer identity for reuse"
    )
    if untraced:
        method += f"; {sum(len(v) for v in untraced.values())} item(s) could not be derived (see leaves)"
    return Ledger(
        leaves=tuple(leaves),
        arrived_by_device={k: arrived[k] for k in sorted(arrived, key=int)},
        new_buffers=peak,
        method=method,
        strategy=strategy,
        transfers=tuple(t for t in log.transfers if t.kind == "cross_device" and t.leaf is not None),
        plan=plan_lines(log.routes),
    )


def sync_floor(cluster: Any, report: SyncReport, repeats: int = 5, copy: bool = True) -> dict[str, float | None]:
    """What a sync's time is measured against (L3): the median seconds of one batched
    ``jax.device_put`` of the handed-over leaves into the rollout's shardings (on CPU it gathers
    through the host, which P13 forbids the sync) and of one jitted copy (``copy``; None where one
    program cannot take both device sets), both making new buffers where the sync did."""
    handed = sync_filter(report.lora)
    source = flat_values(nnx.state(cluster.actor_model, *handed))
    engine = cluster.rollout
    held = dict(zip(engine.held_targets(handed), engine.held_values(handed)))
    leaves, shardings = [source[k] for k in held], [x.sharding for x in held.values()]
    new = report.reused_bytes < report.synced_bytes
    put = median_seconds(lambda: jax.device_put(leaves, shardings, may_alias=not new), repeats)
    out: dict[str, float | None] = {"device_put": put, "compiled copy": None}
    if copy:
        with contextlib.suppress(ValueError):  # disjoint device sets: no one program takes and gives them
            program = jax.jit(copy_arrays if new else (lambda xs: xs), out_shardings=shardings)
            out["compiled copy"] = median_seconds(lambda: program(leaves), repeats)
    return out


def with_floor(cluster: Any, report: SyncReport) -> SyncReport:
    """``report`` with ``device_put_seconds`` measured now (a copy of the handed-over leaves for a moment)."""
    return dataclasses.replace(report, device_put_seconds=sync_floor(cluster, report, 3, copy=False)["device_put"])


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> float:
    """The median wall time of ``fn()`` until its arrays are ready, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


LEDGERS = ProgramCache(16)  # each sync plan's ledger (cleared with the programs)


def new_shards(after: Any, before: Any) -> list[tuple[int, str, int]]:
    """(device id, memory kind, bytes) of the shards of ``after`` that are not buffers of ``before``."""
    old = {key for x in array_leaves(before) for key in array_buffers(x)}
    return [
        (int(device), kind, nbytes)
        for x in array_leaves(after)
        for key, (device, kind, nbytes) in array_buffers(x).items()
        if key not in old
    ]


@functools.lru_cache(maxsize=1024)
def describe_sharding(s: Sharding) -> str:
    """A short readable sharding: mesh axes, device ids, partition spec, memory kind."""
    if isinstance(s, NamedSharding):
        return describe_layout(Layout.of(s))
    ids = sorted(d.id for d in s.device_set)
    return f"{type(s).__name__} devices {id_ranges(ids)} {s.memory_kind}"


def describe_layout(layout: Layout) -> str:
    """A mesh sharding as ``describe_sharding`` writes it (the planner writes its arrays so too)."""
    parts = ", ".join("None" if p is None else repr(p) for p in layout.spec)
    return f"{mesh_words(layout.mesh.shape)} devices {id_ranges(layout.device_ids)} P({parts}) {layout.kind}"


class SyncObserver:
    """Watches one weight sync and writes its report (L3); the sync only calls its hooks
    (``cluster.sync.SyncWatch``). The transient peak is walked only when asked (``peak``)."""

    def __init__(self, *, peak: bool = True) -> None:
        self.watch_peak = peak
        self.params: dict[str, jax.Array] = {}
        self.destination: dict[str, jax.Array] = {}
        self.log = TransferLog()
        self.seconds = 0.0
        self.anchor_seconds = 0.0
        self.new_anchor: list[tuple[int, str, int]] = []
        self.chunk_bytes: int | None = None
        self.order = ""
        self.walk: PeakWalk | None = None
        self._devices: list[Any] = []
        self._allocator: dict[str, tuple[int, int]] | None = None
        self._sizes: list[int] = []

    def start(
        self, keep: Any, replaced: Any, devices: Sequence[Any], *, chunk_bytes: int | None = None, order: str = ""
    ) -> None:
        """What is alive before the sync: ``keep`` (the actor's state, never freed) and ``replaced`` (the
        rollout's old leaves, the old anchor); the chunk size and the order of the sync's steps (P13)."""
        self.chunk_bytes, self.order = chunk_bytes, order
        if self.watch_peak:
            self.walk = PeakWalk(array_leaves(keep), array_leaves(replaced))
            self._devices = list(devices)
            self._allocator = allocator_before(self._devices)

    @property
    def walk_seconds(self) -> float:
        """Time the peak walk took so far (kept out of the sync's timed figures)."""
        return 0.0 if self.walk is None else self.walk.seconds

    def before(self, params: Any) -> None:
        """The handover's source (the actor's arrays, which the sync never replaces)."""
        self.params = flat_leaves(params)
        self._sizes = [int(self.params[path].nbytes) for path in sorted(self.params)]

    @functools.cached_property
    def source(self) -> dict[str, ShardFacts]:
        """The source's shard facts, read only where this sync's plan has no ledger yet."""
        return {path: shard_facts(x) for path, x in self.params.items()}

    @contextlib.contextmanager
    def recording(self) -> Iterator[TransferLog]:
        """The handover's block: the log and the peak walk listen to the reshard's events."""
        self.log = TransferLog()
        with listening(self.log, *filter(None, [self.walk])):
            yield self.log

    def after(self, destination: Any, seconds: float) -> None:
        self.destination = flat_leaves(destination)
        self.seconds = seconds

    def anchor(self, new: Any, old: Any, seconds: float) -> None:
        self.new_anchor = new_shards(new, old)
        self.anchor_seconds = seconds
        if self.walk is not None:
            self.walk.on(Made(array_leaves(new), phases.ANCHOR))
            self.walk.on(Phase("anchor re-pin"))

    def end(self) -> None:
        """The sync committed (the replaced arrays dropped): the bytes above before now."""
        if self.walk is not None:
            self.walk.on(Phase("end"))

    def peak(self) -> SyncPeak | None:
        if self.walk is None:
            return None
        return peak_of(
            self.walk.phases,
            chunk_bytes=self.chunk_bytes,
            largest_chunk_bytes=largest_chunk(self._sizes, self.chunk_bytes),
            order=self.order,
            method=METHOD,
            allocator=allocator_peak(self._devices, self._allocator),
        )

    def ledger(self) -> Ledger:
        """This sync's ledger, kept per plan (``LEDGERS``): its layouts and the copies its reshard logged."""
        log = self.log
        key = (
            tuple((path, x.sharding, x.shape, x.dtype) for path, x in self.params.items()),
            tuple((path, y.sharding, y.dtype) for path, y in self.destination.items()),
            tuple(log.transfers),
            tuple(log.relayed.items()),
            tuple(log.unreadable),
            tuple(sorted(log.strategies)),
            tuple(log.routes),
        )
        hit = LEDGERS.get(key)
        if hit is None:
            hit = sync_ledger(self.source, self.destination, log)
            LEDGERS.put(key, hit)
        return hit

    def report(self, *, lora: bool, anchor_mode: str, global_step: int) -> SyncReport:
        return sync_report(
            self.ledger(),
            self.log,
            lora=lora,
            seconds=self.seconds,
            new_anchor_shards=self.new_anchor,
            anchor_mode=anchor_mode,
            anchor_seconds=self.anchor_seconds,
            global_step=global_step,
            transient_peak=self.peak(),
            where=own_devices_words(self._devices),
        )
