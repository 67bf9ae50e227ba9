"""How a batch of arrays changes layout: one description, which the move runs and the planner reads.

``route`` works out, from shapes and layouts alone, every step a reshard takes and every buffer
each step makes:

- ``stage``: a source in another memory kind (pinned host) is brought to device memory first;
- an equivalent layout (same devices in the same order, same shard boxes) is re-labelled: the
  source's own buffers (``relabel``), or copies of them (``copy``) when new buffers are asked for;
- ``xla`` strategy, same devices in the same order: one compiled program (``program``);
- ``xla`` strategy, as many devices in another order or set: a program onto the source devices
  laid out as the destination where the source is not laid out so already (``between``), then
  each destination shard crosses whole, or stays where ``jax.device_put`` keeps it (``moves``);
- anything else, and every layout change with the ``minimal`` strategy, shard by shard:
  pieces cut and packed on each source device (``cut``), sent (``send``) and assembled on each
  destination device (``assemble``), a block already there kept;
- ``resharded``: every layout changed, the staged sources dropped (a phase of the peak walk);
- ``memory kind``: results moved to the destination's memory kind (pinned host);
- ``cast``: to the destination dtype, on the destination devices.

``placement.reshard`` executes the steps on arrays, ``planner.sync_peak`` adds up their buffers
on paper: a sync's planned and measured transient peaks come from one description.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.placement import phases
from rlcluster_lab.placement.boxes import box_size, device_put_keeps, plan_reshard
from rlcluster_lab.placement.layout import Layout, PlannedMesh, id_ranges, mesh_words
from rlcluster_lab.placement.programs import cleared_with_programs

WORK = "device"  # the memory kind layouts change in (every platform's default)


@dataclasses.dataclass(frozen=True)
class Leg:
    """One array of the batch: shape, dtype, where it is and goes, and the dtype it ends in (None: its own)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    src: Layout
    dst: Layout
    to_dtype: np.dtype | None = None

    def shard_bytes(self, layout: Layout, dtype: Any = None) -> int:
        return layout.shard_bytes(self.shape, np.dtype(dtype or self.dtype).itemsize)

    def buffers(self, layout: Layout, dtype: Any = None) -> tuple[tuple[int, int], ...]:
        """(device id, bytes) of this leg's shard on every device of ``layout``."""
        n = self.shard_bytes(layout, dtype)
        return tuple((d, n) for d in layout.device_ids)

    def on(self, layout: Layout, term: str, key: tuple[Any, ...], dtype: Any = None) -> Made:
        """New buffers of this leg on every device of ``layout``."""
        return Made(key, term, layout.kind, self.buffers(layout, dtype))


@dataclasses.dataclass(frozen=True)
class Made:
    """Buffers a step makes, on paper: a value's key, what it is (``placement.phases``), its memory kind,
    and (device id, bytes) of each new buffer (a re-labelled or kept one was alive before)."""

    key: tuple[Any, ...]
    term: str
    kind: str
    bytes: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a reshard: the values it drops as it starts, those it makes, the phase it ends at
    (where it holds the most before dropping anything; None: none), and the group it runs."""

    op: str
    legs: tuple[int, ...] = ()
    drops: tuple[tuple[Any, ...], ...] = ()
    made: tuple[Made, ...] = ()
    phase: str | None = None
    group: int | None = None


@dataclasses.dataclass(frozen=True)
class ProgramGroup:
    """Leaves one compiled program lays out together (the same source and destination device orders):
    ``members`` every leaf of these orders, ``legs`` those the program takes; ``between``: it lays
    them out as the destination over the *source* devices, then shards move."""

    src_order: tuple[int, ...]
    dst_order: tuple[int, ...]
    members: tuple[int, ...]
    legs: tuple[int, ...]
    between: bool

    @property
    def copies(self) -> int:
        """How many copies of the destination layout a ``between`` program makes over the
        source devices (the source has that many times the destination's devices)."""
        return len(self.src_order) // len(self.dst_order)

    def inter(self, leg: Leg) -> Layout:
        """The layout a ``between`` program gives ``leg``: the destination's over the source
        devices (in their order, as a program needs), ``copies`` times over a leading axis."""
        m = leg.dst.mesh
        if self.copies == 1:
            return Layout(PlannedMesh(self.src_order, m.axis_sizes, m.axis_names, m.axis_types), leg.dst.spec, WORK)
        sizes, names = (self.copies, *m.axis_sizes), (COPIES, *m.axis_names)
        return Layout(PlannedMesh(self.src_order, sizes, names, ("Auto", *m.axis_types)), leg.dst.spec, WORK)


_RELABEL = "re-labelled: the same buffers under the destination's sharding (an equivalent layout)"
COPIES = "copies"  # the leading axis of a between program's layout when the source has more devices


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a ``moves`` leaf's shard at one destination position comes from: ``kept`` (the source's
    buffer), ``ran`` (the program's result), ``copy`` (within the device) or ``send`` (``src`` to ``dst``)."""

    how: str
    src: int
    dst: int


@dataclasses.dataclass(frozen=True)
class Pieces:
    """The shard-by-shard schedule of every ``pieces`` leaf of a batch, worked out once.

    A pack is the pieces one source device sends one destination device (of one dtype), raveled
    and concatenated so they cross in one transfer. ``cuts``: per source device, the legs it
    cuts from and, per pack it makes, (slot, starts, limits) of each piece. ``places``: per
    destination device, the legs it reads locally, the packs it reads, and per block (shape,
    dtype, local pieces (slot, starts, limits, offset), remote pieces (pack slot, start, shape,
    offset)). ``whole``: (leg, block, source device, destination device) of a whole source shard
    that crosses as it is; ``kept``/``copied``: (leg, block, device) of a block its device holds
    (kept as it is, or copied within the device)."""

    legs: tuple[int, ...]
    cuts: tuple[tuple[int, tuple[int, ...], Any, tuple[int, ...]], ...]
    pack_devices: tuple[int, ...]
    pack_sources: tuple[int, ...]
    pack_bytes: tuple[int, ...]
    cross_log: tuple[tuple[int, int, int, int], ...]  # src device, dst device, bytes, leg
    places: tuple[tuple[int, tuple[int, ...], tuple[int, ...], Any, tuple[tuple[int, int], ...]], ...]
    same_log: tuple[tuple[int, int, int], ...]  # device, bytes, leg
    kept: tuple[tuple[int, int, int], ...]
    copied: tuple[tuple[int, int, int], ...]
    whole: tuple[tuple[int, int, int, int], ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Route:
    """Every step of one batch's reshard, and what the steps run (see the module docstring). ``how`` per
    leg: ``kept``, ``relabel``, ``copy``, ``program``, ``moves`` or ``pieces``; ``staged``/``final``:
    legs brought to device memory first / moved to their memory kind last."""

    legs: tuple[Leg, ...]
    how: tuple[str, ...]
    staged: frozenset[int]
    final: frozenset[int]
    programs: tuple[ProgramGroup, ...]
    positions: dict[int, tuple[Position, ...]]
    pieces: Pieces | None
    casts: tuple[tuple[int, ...], ...]  # legs cast together (one program per set of devices)
    steps: tuple[Step, ...]

    @functools.cached_property
    def lines(self) -> tuple[str, ...]:
        """The route in words, one line per group of leaves that change together: what moves,
        from which devices to which, and how (the sync report's ``plan``; the planner's too)."""
        legs, out = self.legs, []

        def some(idx: Sequence[int]) -> str:
            return f"{len(idx)} lea{'f' if len(idx) == 1 else 'ves'}"

        def pairs(sent: Sequence[tuple[int, int, int]]) -> str:
            """(source, destination, bytes) of each crossing, summed per device pair."""
            per: dict[tuple[int, int], int] = {}
            for a, b, n in sent:
                per[a, b] = per.get((a, b), 0) + n
            said = [f"{a}->{b} {fmt_bytes(n)}" for (a, b), n in sorted(per.items())]
            return ", ".join(said[:8]) + (f" and {len(said) - 8} more pairs" if len(said) > 8 else "")

        if self.staged:
            out.append(f"{some(self.staged)} staged from pinned host to device memory first (P14)")
        for how, words in (("kept", "kept: already in the destination sharding"), ("relabel", _RELABEL)):
            if idx := [i for i, h in enumerate(self.how) if h == how]:
                out.append(f"{some(idx)} {words}")
        copies = [i for i, h in enumerate(self.how) if h == "copy"]
        for order in dict.fromkeys(legs[i].dst.device_ids for i in copies):
            idx = [i for i in copies if legs[i].dst.device_ids == order]
            out.append(f"{some(idx)} copied within devices {id_ranges(order)} by one compiled copy program")
        for g in self.programs:
            at = f"devices {id_ranges(g.src_order)}"
            if not g.between:
                meshes = dict.fromkeys(
                    f"{mesh_words(legs[i].src.mesh.shape)} -> {mesh_words(legs[i].dst.mesh.shape)}" for i in g.legs
                )
                out.append(f"{some(g.legs)} laid out anew on {at} ({'; '.join(meshes)}) by one compiled program")
                continue
            sent, held = [], {"copy": 0, "kept": 0, "ran": 0}
            for i in g.members:
                n = legs[i].shard_bytes(legs[i].dst)
                for p in self.positions[i]:
                    if p.how == "send":
                        sent.append((p.src, p.dst, n))
                    else:
                        held[p.how] += 1
            first = f"a program lays {some(g.legs)} out as the destination on {at}, then " if g.legs else ""
            stay = ", ".join(f"{k} {v} shards" for k, v in (("copied", held["copy"]), ("kept", held["kept"])) if v)
            out.append(
                f"{some(g.members)} from {at} to devices {id_ranges(g.dst_order)}: {first}"
                f"{len(sent)} whole shards cross ({pairs(sent)})" + (f"; {stay} within their device" if stay else "")
            )
        if self.pieces is not None:
            s = self.pieces
            sent = [(a, b, n) for a, b, n in zip(s.pack_sources, s.pack_devices, s.pack_bytes)]
            sent += [(a, b, legs[s.legs[leg]].shard_bytes(legs[s.legs[leg]].dst)) for leg, _, a, b in s.whole]
            stay = ", ".join(f"{k} {len(v)} blocks" for k, v in (("kept", s.kept), ("copied", s.copied)) if v)
            out.append(
                f"{some(s.legs)} shard by shard, only the pieces a device lacks: {len(sent)} transfers "
                f"({pairs(sent)})" + (f"; {stay} within their device" if stay else "")
            )
        if self.final:
            out.append(f"{some(self.final)} moved to pinned host memory after (P14)")
        for group in self.casts:
            dtype, ids = legs[group[0]].to_dtype, legs[group[0]].dst.device_ids
            out.append(f"{some(group)} cast to {np.dtype(dtype)} on devices {id_ranges(sorted(ids))} by one program")
        return tuple(out)

    @functools.cached_property
    def result_keys(self) -> tuple[tuple[Any, ...] | None, ...]:
        """Per leg, the value that ends as its result (None: the source itself); read at every run."""
        cast = {i for c in self.casts for i in c}
        return tuple(("cast", i) if i in cast else self.uncast_key(i) for i in range(len(self.how)))

    def uncast_key(self, i: int) -> tuple[Any, ...] | None:
        """Leg i's value before any cast: its layout changed (None: the source itself)."""
        if self.how[i] == "kept":
            return None
        return ("final", i) if i in self.final else ("out", i)


@functools.lru_cache(maxsize=256)
def route(legs: tuple[Leg, ...], copy: bool, strategy: str) -> Route:
    """The route of a batch (see the module docstring); pure, and cached per batch signature."""
    how: list[str] = []
    staged, final = set(), set()
    for i, leg in enumerate(legs):
        if leg.src == leg.dst:
            how.append("copy" if copy else "kept")
            continue
        if leg.src.kind != WORK:
            staged.add(i)
        if leg.dst.kind != WORK:
            final.add(i)
        src, dst = leg.src.in_kind(WORK), leg.dst.in_kind(WORK)
        if _equivalent(src, dst, leg.shape):
            how.append("copy" if copy and i not in staged else "relabel")
        elif strategy == "xla" and len(src.device_ids) % len(dst.device_ids) == 0:
            how.append("program" if src.device_ids == dst.device_ids else "moves")
        else:
            how.append("pieces")
    programs = _program_groups(legs, how)
    positions = {i: _positions(legs[i], g, i in g.legs, copy) for g in programs if g.between for i in g.members}
    pieces_legs = tuple(i for i, h in enumerate(how) if h == "pieces")
    pieces = _pieces(legs, pieces_legs, copy, strategy) if pieces_legs else None
    casts = _cast_groups(legs)
    r = Route(legs, tuple(how), frozenset(staged), frozenset(final), programs, positions, pieces, casts, ())
    return dataclasses.replace(r, steps=tuple(_steps(r, copy)))


cleared_with_programs(route.cache_clear)  # routes are worked out afresh once the programs are forgotten


def plan_lines(routes: Sequence[Route]) -> tuple[str, ...]:
    """A sync's routes in words (``Route.lines``), each line of a chunk's route marked with its chunk."""
    n = len(routes)
    return tuple(f"chunk {k}/{n}: {line}" if n > 1 else line for k, r in enumerate(routes, 1) for line in r.lines)


def _equivalent(a: Layout, b: Layout, shape: tuple[int, ...]) -> bool:
    """Same devices in the same order, each holding the same box (``Sharding.is_equivalent_to``)."""
    return a.kind == b.kind and a.device_ids == b.device_ids and a.boxes(shape) == b.boxes(shape)


def _program_groups(legs: Sequence[Leg], how: Sequence[str]) -> tuple[ProgramGroup, ...]:
    orders: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for i, leg in enumerate(legs):
        if how[i] in ("program", "moves"):
            orders.setdefault((leg.src.device_ids, leg.dst.device_ids), []).append(i)
    groups = []
    for (src, dst), idx in orders.items():
        between = src != dst
        # Where every destination block is some source shard already, the shards move as they are.
        ran = tuple(i for i in idx if not between or not _holds_every_block(legs[i]))
        groups.append(ProgramGroup(src, dst, tuple(idx), ran, between))
    return tuple(groups)


def _holds_every_block(leg: Leg) -> bool:
    have = {box for _, box in leg.src.boxes(leg.shape)}
    return all(box in have for _, box in leg.dst.boxes(leg.shape))


def _positions(leg: Leg, g: ProgramGroup, ran: bool, copy: bool) -> tuple[Position, ...]:
    """Per destination position of a ``moves`` leaf: where its shard comes from. After a program,
    the block is on each source device at p in every copy of the layout (the destination's own
    if among them, else it crosses from the first). Without one, a device keeps its buffer where
    ``jax.device_put`` would, copies a block it holds otherwise, and any other block crosses from
    the source device at the same position when that one holds it, else from the first that does."""
    n = len(g.dst_order)
    out = []
    if ran:
        for p, d in enumerate(g.dst_order):
            rows = [g.src_order[r * n + p] for r in range(g.copies)]
            out.append(Position("ran", d, d) if d in rows else Position("send", rows[0], d))
        return tuple(out)
    src, dst = leg.src.boxes(leg.shape), leg.dst.boxes(leg.shape)
    keeps = device_put_keeps(src, dst)
    holders: dict[Any, list[int]] = {}
    for dev, box in src:
        holders.setdefault(box, []).append(dev)
    at = dict(enumerate(g.src_order))
    for p, (d, box) in enumerate(dst):
        if keeps[p]:
            out.append(Position("copy" if copy else "kept", d, d))
        elif d in holders[box]:
            out.append(Position("copy", d, d))
        else:
            s = at.get(p) if at.get(p) in holders[box] else holders[box][0]
            out.append(Position("send", s, d))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def whole_move(r: Route, i: int) -> bool:
    """Leg i's every shard crosses from the source device at its position onto another set of
    devices: one ``device_put`` of the array moves them all (a bare device_put's cost)."""
    g = next(g for g in r.programs if i in g.members)
    positions = r.positions[i]
    return (
        g.copies == 1
        and not set(g.src_order) & set(g.dst_order)
        and all(p.how == "send" and p.src == g.src_order[k] for k, p in enumerate(positions))
        and (i in g.legs or _equivalent(r.legs[i].src.in_kind(WORK), g.inter(r.legs[i]), r.legs[i].shape))
    )


cleared_with_programs(whole_move.cache_clear)


def _cast_groups(legs: Sequence[Leg]) -> tuple[tuple[int, ...], ...]:
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, leg in enumerate(legs):
        if leg.to_dtype is not None and np.dtype(leg.to_dtype) != leg.dtype:
            groups.setdefault(tuple(sorted(leg.dst.device_ids)), []).append(i)
    return tuple(tuple(g) for g in groups.values())


def _pieces(legs: Sequence[Leg], idx: tuple[int, ...], copy: bool, strategy: str) -> Pieces:
    packs: dict[tuple[int, int, Any], list[tuple[int, tuple[int, ...], tuple[int, ...]]]] = {}
    fill: dict[tuple[int, int, Any], int] = {}
    per_device: dict[int, list[Any]] = {}
    kept, copied, whole = [], [], []
    for a, i in enumerate(idx):
        leg = legs[i]
        src = leg.src.in_kind(WORK).boxes(leg.shape)
        dst = leg.dst.in_kind(WORK).boxes(leg.shape)
        # The minimal strategy keeps every block its device holds; as the xla fallback, only those device_put keeps.
        keeps = device_put_keeps(src, dst) if strategy == "xla" else None
        for b, block in enumerate(plan_reshard(leg.shape, src, dst)):
            if block.reuses_source_buffer:
                if (keeps is None or keeps[b]) and not copy:
                    kept.append((a, b, block.device))
                else:
                    copied.append((a, b, block.device))
                continue
            if len(block.pieces) == 1 and block.pieces[0].src_box == block.box:
                whole.append((a, b, block.pieces[0].src_device, block.device))
                continue
            local, remote = [], []
            for piece in block.pieces:
                starts = tuple(lo - s0 for (lo, _), (s0, _) in zip(piece.box, piece.src_box))
                limits = tuple(hi - s0 for (_, hi), (s0, _) in zip(piece.box, piece.src_box))
                offset = tuple(lo - w0 for (lo, _), (w0, _) in zip(piece.box, block.box))
                if piece.src_device == block.device:
                    local.append((a, starts, limits, offset))
                else:
                    pk = (piece.src_device, block.device, leg.dtype)
                    packs.setdefault(pk, []).append((a, starts, limits))
                    remote.append((pk, fill.get(pk, 0), tuple(hi - lo for lo, hi in zip(starts, limits)), offset))
                    fill[pk] = fill.get(pk, 0) + box_size(piece.box)
            shape = tuple(hi - lo for lo, hi in block.box)
            per_device.setdefault(block.device, []).append((a, b, shape, leg.dtype, local, remote))
    pack_keys = list(packs)
    cuts = []
    for src_dev in dict.fromkeys(pk[0] for pk in pack_keys):
        ids = tuple(k for k, pk in enumerate(pack_keys) if pk[0] == src_dev)
        arrays = tuple(sorted({a for k in ids for a, _, _ in packs[pack_keys[k]]}))
        slot = {a: s for s, a in enumerate(arrays)}
        spec = tuple(tuple((slot[a], st, lim) for a, st, lim in packs[pack_keys[k]]) for k in ids)
        cuts.append((src_dev, arrays, spec, ids))
    cross_log, pack_bytes = [], []
    for (src_dev, dst_dev, dtype), pieces in packs.items():
        sizes = [box_size(tuple(zip(st, lim))) * np.dtype(dtype).itemsize for _, st, lim in pieces]
        pack_bytes.append(sum(sizes))
        cross_log.extend((src_dev, dst_dev, n, a) for (a, _, _), n in zip(pieces, sizes))
    places, same_log = [], []
    for dev, entries in per_device.items():
        incoming = tuple(k for k, pk in enumerate(pack_keys) if pk[1] == dev)
        arrays = tuple(sorted({a for a, _, _, _, local, _ in entries if local}))
        slot = {a: s for s, a in enumerate(arrays)}
        pslot = {pack_keys[k]: s for s, k in enumerate(incoming)}
        spec = tuple(
            (
                shape,
                str(np.dtype(dtype)),
                tuple((slot[a], st, lim, off) for a, st, lim, off in local),
                tuple((pslot[pk], start, piece_shape, off) for pk, start, piece_shape, off in remote),
            )
            for _, _, shape, dtype, local, remote in entries
        )
        places.append((dev, arrays, incoming, spec, tuple((a, b) for a, b, *_ in entries)))
        for a, _, _, dtype, local, _ in entries:
            itemsize = np.dtype(dtype).itemsize
            same_log.extend((dev, box_size(tuple(zip(st, lim))) * itemsize, a) for _, st, lim, _ in local)
    return Pieces(
        legs=idx,
        cuts=tuple(cuts),
        pack_devices=tuple(dst for _, dst, _ in pack_keys),
        pack_sources=tuple(src for src, _, _ in pack_keys),
        pack_bytes=tuple(pack_bytes),
        cross_log=tuple(cross_log),
        places=tuple(places),
        same_log=tuple(same_log),
        kept=tuple(kept),
        copied=tuple(copied),
        whole=tuple(whole),
    )


def _steps(r: Route, copy: bool) -> list[Step]:
    """The steps in the order the reshard runs them, with the buffers each makes (on paper)."""
    legs, how = r.legs, r.how
    steps: list[Step] = []
    work = {i: legs[i].src.in_kind(WORK) for i in range(len(legs))}
    if r.staged:
        made = tuple(legs[i].on(work[i], phases.STAGED, ("staged", i)) for i in sorted(r.staged))
        steps.append(Step("stage", tuple(sorted(r.staged)), made=made, phase="stage"))
    # Equivalent layouts: the source's (or the staged) buffers re-labelled, or copied.
    relabel = tuple(i for i in range(len(legs)) if how[i] == "relabel")
    if relabel:
        # Re-labelled staged buffers are the sync's own (new); a source's own buffers are not.
        made = tuple(
            Made(("out", i), phases.RESHARDED, WORK, legs[i].buffers(work[i]) if i in r.staged else ()) for i in relabel
        )
        steps.append(Step("relabel", relabel, drops=tuple(("staged", i) for i in relabel if i in r.staged), made=made))
    copies = tuple(i for i in range(len(legs)) if how[i] == "copy")
    if copies:
        target = {i: legs[i].dst if legs[i].src == legs[i].dst else legs[i].dst.in_kind(WORK) for i in copies}
        made = tuple(legs[i].on(target[i], phases.RESHARDED, ("out", i)) for i in copies)
        steps.append(Step("copy", copies, made=made))
    changed: list[int] = []
    for g_index, g in enumerate(r.programs):
        if not g.between:
            made = tuple(legs[i].on(legs[i].dst.in_kind(WORK), phases.RESHARDED, ("out", i)) for i in g.legs)
            steps.append(Step("program", g.legs, made=made, phase="reshard", group=g_index))
            changed.extend(g.legs)
            continue
        members = g.members
        if g.legs:
            made = tuple(legs[i].on(g.inter(legs[i]), phases.IN_FLIGHT, ("inter", i)) for i in g.legs)
            steps.append(Step("between", g.legs, made=made, phase="reshard", group=g_index))
        sent = []
        for i in members:
            n = legs[i].shard_bytes(legs[i].dst)
            new = tuple((p.dst, n) for p in r.positions[i] if p.how in ("send", "copy"))
            sent.append(Made(("sent", i), phases.RESHARDED, WORK, new))
        sends = any(p.how == "send" for i in members for p in r.positions[i])
        steps.append(Step("moves", members, made=tuple(sent), phase="move" if sends else None, group=g_index))
        joined = []
        for i in members:
            # A kept shard of a staged leaf is the staged buffer: new to the sync, and the result's from here on.
            n = legs[i].shard_bytes(legs[i].dst)
            held = tuple((p.dst, n) for p in r.positions[i] if p.how != "kept" or i in r.staged)
            joined.append(Made(("out", i), phases.RESHARDED, WORK, held))
        drops = tuple(("sent", i) for i in members) + tuple(("inter", i) for i in members if i in g.legs)
        steps.append(Step("join", members, drops=drops, made=tuple(joined), group=g_index))
        changed.extend(members)
    if r.pieces is not None:
        steps.extend(_pieces_steps(r, r.pieces))
        changed.extend(r.pieces.legs)
    # Every layout is changed, each staged source dropped, no program's temporaries left: a phase
    # of its own name ("reshard" is the moment the programs run), the last before memory kinds.
    drops = tuple(("staged", i) for i in sorted(r.staged) if how[i] != "relabel")
    steps.append(Step("changed", tuple(changed), drops=drops, phase="resharded"))
    if r.final:
        fin = tuple(sorted(r.final))
        made = tuple(legs[i].on(legs[i].dst, phases.RESHARDED, ("final", i)) for i in fin)
        steps.append(Step("memory kind", fin, made=made, phase="memory kind"))
        steps.append(Step("settled", fin, drops=tuple(("out", i) for i in fin)))
    for c_index, group in enumerate(r.casts):
        made = tuple(legs[i].on(legs[i].dst, phases.CAST, ("cast", i), legs[i].to_dtype) for i in group)
        steps.append(Step("cast", group, made=made, phase="cast", group=c_index))
    return steps


def _pieces_steps(r: Route, s: Pieces) -> list[Step]:
    legs = r.legs
    leg_of = dict(enumerate(s.legs))  # slot in the schedule -> leg of the batch
    packs = tuple(
        Made(("pack", k), phases.IN_FLIGHT, WORK, ((src, n),))
        for k, (src, n) in enumerate(zip(s.pack_sources, s.pack_bytes))
    )
    steps = [Step("cut", s.legs, made=packs)]

    def block(a: int, dev: int, key: tuple[Any, ...], term: str) -> Made:
        leg = legs[leg_of[a]]
        return Made(key, term, WORK, ((dev, leg.shard_bytes(leg.dst)),))

    arrived = tuple(
        Made(("arrived", k), phases.IN_FLIGHT, WORK, ((d, n),))
        for k, (d, n) in enumerate(zip(s.pack_devices, s.pack_bytes))
    )
    wholes = tuple(block(a, dst, ("whole", a, b), phases.IN_FLIGHT) for a, b, _, dst in s.whole)
    moving = bool(s.pack_bytes or s.whole)
    steps.append(Step("send", s.legs, made=arrived + wholes, phase="move" if moving else None))
    blocks = tuple(
        block(a, dev, ("block", a, b), phases.RESHARDED) for dev, _, _, _, where in s.places for a, b in where
    )
    copies = tuple(block(a, dev, ("block", a, b), phases.RESHARDED) for a, b, dev in s.copied)
    drops = tuple(("pack", k) for k in range(len(s.pack_bytes)))
    steps.append(Step("assemble", s.legs, drops=drops, made=blocks + copies, phase="reshard"))
    joined = []
    for a, i in leg_of.items():
        new = [m.bytes[0] for m in (*wholes, *blocks, *copies) if m.key[1] == a]
        if i in r.staged:  # a kept block of a staged leaf is the staged buffer (see the moves above)
            new += [(dev, legs[i].shard_bytes(legs[i].dst)) for b_a, _, dev in s.kept if b_a == a]
        joined.append(Made(("out", i), phases.RESHARDED, WORK, tuple(sorted(new))))
    drops = tuple(("arrived", k) for k in range(len(s.pack_bytes))) + tuple(m.key for m in (*wholes, *blocks, *copies))
    steps.append(Step("join pieces", s.legs, drops=drops, made=tuple(joined)))
    return steps
