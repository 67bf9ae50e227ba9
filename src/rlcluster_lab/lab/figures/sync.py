"""Figures of a weight sync (L3): where a sync's bytes went, the same per leaf, what the sync
holds on a device at each phase, and its chunk sizes.

Pure functions of a sync report's JSON (``SyncReport.to_json()``, or a placement report's
``sync``), returning an ``Svg`` that the notebooks and the widget lab both show
(``lab.figures.placement`` says why SVG). Bytes are physical (every destination shard
counted) unless a label says logical (each leaf once). Segments and ticks carry an ``id``
and their bytes (``data-bytes``): ``"seg:sync:<run>:<part>"``, ``"seg:cross:<run>:kept"``
and ``":relayed"``, ``"min:<run>"``, ``"logical:<run>"``, ``"seg:leaf:<path>:<report key>"``,
``"min:leaf:<path>"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.lab.figures.style import RELAYED, ROLE_COLORS, SYNC_PARTS, clip, on_where, text_width, wrap
from rlcluster_lab.lab.figures.svg import MIN_FONT, MUTED, TEXT, WIDTH, Canvas, Svg, legend
from rlcluster_lab.measure.sync_peak import chunk_words
from rlcluster_lab.placement import phases as ph

# The synced bytes' parts (synced = arrived + copied + reused) in SYNC_PARTS' colours.
SYNC_COLORS = {key.split("_")[0]: color for key, _, color in SYNC_PARTS}


def sync_bytes(sync: Mapping[str, Any]) -> Svg:
    """Where a sync's bytes went, with the numbers (L3): one sync report, or
    ``{label: sync report}`` to compare runs on one byte scale.

    The upper bar splits the synced bytes (physical, every destination shard)
    into what arrived from another device, what was made on the device from
    its own data, and what was reused; the lower bar is everything that
    crossed devices against the least the placement forces (the tick), its
    excess relayed (moved again or dropped) drawn dark. The logical figure
    (each leaf once) is beside the physical one, with their ratio, and marked on
    the synced bar as a dotted tick.
    """
    if "synced_bytes" in sync:  # one sync report, or {label: sync report}
        runs = {("LoRA" if sync.get("lora") else "full") + " sync": sync}
    else:
        runs = {str(k): v for k, v in sync.items()}
    left = 78
    widest = max(
        [max(int(s.get("synced_bytes", 0)), int(s.get("moved_cross_device_bytes", 0))) for s in runs.values()] + [1]
    )
    scale = (WIDTH - left - 16) / widest
    c = Canvas(WIDTH, 0, "Weight sync (P13, measured): where the bytes went")
    y = 44
    for label, s in runs.items():
        synced = int(s.get("synced_bytes", 0))
        logical = int(s.get("synced_logical_bytes", 0))
        moved = int(s.get("moved_cross_device_bytes", 0))
        relayed = int(s.get("relayed_cross_device_bytes", 0))
        kept = int(s["arrived_cross_device_bytes"])  # synced = arrived + copied + reused (L3)
        minimum = int(s.get("minimum_cross_device_bytes", 0))
        parts = [(key.split("_")[0], what, int(s.get(key, 0))) for key, what, _ in SYNC_PARTS]
        head = (
            f"{label}{on_where(s)}: {fmt_bytes(synced)} synced (physical: every device's shard), "
            f"{fmt_bytes(logical)} logical (each leaf once)"
        )
        for k, line in enumerate(wrap(head, WIDTH - 16, 13, lines=2, bold=True)):
            c.text(8, y + 17 * k, line, size=13, weight="bold")
            y += 17 * bool(k)
        y += 10
        c.text(left - 8, y + 16, "synced", size=MIN_FONT, anchor="end", fill=MUTED)
        segments = [(v, SYNC_COLORS[k], f"seg:sync:{label}:{k}", f"{w}: {fmt_bytes(v)}") for k, w, v in parts]
        c.bar(left, y + 2, 20, scale, segments)
        if logical:
            lx = left + logical * scale
            c.line(lx, y - 2, lx, y + 26, TEXT, width=2, dash="2,2", id=f"logical:{label}", nbytes=logical)
        y = legend(c, left, y + 42, [(SYNC_COLORS[key], f"{what} {fmt_bytes(v)}") for key, what, v in parts])
        c.text(left - 8, y + 12, "crossed", size=MIN_FONT, anchor="end", fill=MUTED)
        crossed = [
            (kept, SYNC_COLORS["arrived"], f"seg:cross:{label}:kept", f"crossed devices and stayed: {fmt_bytes(kept)}"),
            (relayed, RELAYED, f"seg:cross:{label}:relayed", f"relayed: {fmt_bytes(relayed)} crossed but did not stay"),
        ]
        c.bar(left, y - 2, 18, scale, crossed)
        mx = left + minimum * scale
        c.line(mx, y - 6, mx, y + 20, "black", width=2.5, id=f"min:{label}", nbytes=minimum)
        excess = int(s.get("excess_cross_device_bytes", moved - minimum))
        relay = "" if not relayed else f", {fmt_bytes(relayed)} relayed (dark)"
        if relayed and relayed == excess:
            relay = ", all of it relayed"
        said = f"the least this placement allows: {fmt_bytes(minimum)} (black tick); excess {fmt_bytes(excess)}"
        lines = [(f"{fmt_bytes(moved)} crossed devices; {said}{relay}", TEXT)]
        if logical and synced:
            ratio = (
                f"physical / logical = {synced / logical:.1f} (the dotted tick on the synced bar is the logical "
                "figure): a leaf counts once per device that receives a piece of it, so a replicated one counts on "
                "every device"
            )
            lines.append((ratio, MUTED))
        timing = "" if s.get("seconds") is None else f"; handover {s['seconds'] * 1e3:.1f} ms"
        if timing and s.get("includes_compilation"):
            timing += " incl. compiling"
        elif timing and s.get("includes_program_load"):
            timing += " incl. reading programs from the compilation cache"
        anchor = fmt_bytes(int(s.get("anchor_bytes", 0)))
        lines.append((f"reshard: {s.get('reshard_strategy', '?')}; anchor re-pinned {anchor}{timing}", MUTED))
        y += 36
        for text, fill in lines:
            y = c.text_lines(left, y, wrap(text, WIDTH - left - 8, MIN_FONT, lines=2), size=MIN_FONT, fill=fill)
        y += 18
    c.height = y - 10
    return c.render()


def sync_plan(sync: Mapping[str, Any]) -> Svg:
    """What one sync ran (P13, L3): its plan, one line per group of leaves that changed layout
    together (``SyncReport.plan``, the route the reshard ran: kept, re-labelled, copied, laid out
    anew by one compiled program, whole shards crossing, or shard by shard), and, where measured
    (``measure.sync.with_floor``), the handover's time beside one ``jax.device_put`` of the same
    leaves into the rollout's shardings: on CPU the fastest reshard there is, which gathers
    through host memory and so is closed to the sync (P13's transfer guard)."""
    c = Canvas(WIDTH, 0, f"What the sync ran: its plan{on_where(sync)}")
    y = 44.0
    for line in sync.get("plan") or ["nothing was resharded"]:
        for k, part in enumerate(wrap(line, WIDTH - 40, MIN_FONT, lines=3)):
            c.text(16 if k == 0 else 26, y, ("\u2022 " if k == 0 else "") + part, size=MIN_FONT)
            y += 16
    seconds, floor = sync.get("seconds"), sync.get("device_put_seconds")
    if floor and seconds is not None:
        scale = (WIDTH - 330) / max(seconds, floor)
        y += 6
        for label, value, fill in (("the sync's handover", seconds, SYNC_COLORS["arrived"]), (FLOOR, floor, MUTED)):
            c.text(16, y + 12, label, size=MIN_FONT)
            c.rect(250, y, value * scale, 16, fill, id=f"time:{label}", title=f"{value * 1e3:.3f} ms (measured)")
            c.text(256 + value * scale, y + 12, f"{value * 1e3:.2f} ms", size=MIN_FONT)
            y += 22
        said = f"{seconds / floor:.1f}x one device_put (both measured)"
        if sync.get("moved_cross_device_bytes"):  # layouts changed: device_put's way is not the sync's
            said += "; on CPU device_put gathers through host memory, which P13 closes to the sync"
        c.text(16, y + 8, said, size=MIN_FONT, fill=MUTED)
        y += 24
    c.height = y
    return c.render()


FLOOR = "one device_put, same tree"


def sync_leaves(sync: Mapping[str, Any], top: int | None = None) -> Svg:
    """Per leaf of one sync: its synced bytes as they came (arrived from other devices, copied
    within a device, reused), then, drawn dark after them, the bytes relayed (crossed devices
    without staying: not part of the synced bytes), with the least the placement allows to
    cross as a black tick (L3).

    ``top`` keeps only the leaves with the most synced bytes (ties by path), drawn in path
    order like the rest.
    """
    leaves = list(sync.get("leaves", []))
    if top is not None:
        leaves = sorted(leaves, key=lambda lf: (-int(lf.get("synced_bytes", 0)), lf.get("path", "")))[:top]
        leaves.sort(key=lambda lf: lf.get("path", ""))
    labels = [f"{lf.get('path')} {tuple(lf.get('shape', []))}" for lf in leaves]
    label_w = min(max([text_width(lb, MIN_FONT) for lb in labels] + [60.0]) + 16, 330.0)
    left, row_h = label_w, 18
    bar_w = WIDTH - left - 16
    drawn = (*SYNC_PARTS, ("relayed_cross_device_bytes", "relayed (crossed devices, not kept)", RELAYED))
    widest = max([sum(int(lf.get(key, 0)) for key, _, _ in drawn) for lf in leaves] + [1])
    scale = bar_w / widest
    shown = f"{len(leaves)} of {len(sync.get('leaves', []))} leaves" if top is not None else f"{len(leaves)} leaves"
    c = Canvas(WIDTH, 0, f"Weight sync per leaf{on_where(sync)} ({shown}), physical bytes")
    tick = ("black", "tick: the least the placement allows to cross")
    relays = any(int(lf.get("relayed_cross_device_bytes", 0)) for lf in leaves)
    y = legend(c, 8, 42, [(color, what) for _, what, color in drawn[: 3 + relays]] + [tick])
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        x = left + bar_w * frac
        c.text(x, y, fmt_bytes(widest * frac), size=MIN_FONT, anchor=anchor, fill=MUTED)
        c.line(x, y + 4, x, y + 8 + row_h * len(leaves), "#eeeeee")
    y += 8
    for lf, label in zip(leaves, labels):
        path = str(lf.get("path"))
        c.text(left - 8, y + 13, clip(label, label_w - 12, MIN_FONT), size=MIN_FONT, anchor="end", title=label)
        parts = [
            (v, color, f"seg:leaf:{path}:{k}", f"{path}: {fmt_bytes(v)} {what}")
            for k, what, color in drawn
            if (v := int(lf.get(k, 0)))
        ]
        c.bar(left, y + 3, row_h - 5, scale, parts)
        minimum = int(lf.get("minimum_cross_device_bytes", 0))
        mx = left + minimum * scale
        c.line(mx, y + 1, mx, y + row_h, "black", width=2, id=f"min:leaf:{path}", nbytes=minimum)
        y += row_h
    c.height = y + 10
    return c.render()


TEMPORARIES = "program temporaries"
# The terms drawn in each memory kind's panel, bottom up, with their colours and who they belong to.
PANELS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "device": (
        (ph.STAGED, ROLE_COLORS["actor"], "actor: its leaves brought to device (offload)"),
        (ph.IN_FLIGHT, "#b07aa1", "rollout layout in flight on the actor's devices"),
        (ph.RESHARDED, ROLE_COLORS["rollout"], "rollout: new arrays (net of the old ones released)"),
        (ph.CAST, "#e8b04b", "rollout: cast to its dtype"),
        (TEMPORARIES, "#9d9d9d", "reshard and cast programs' temporaries"),
    ),
    "pinned_host": (
        (ph.MEMORY_KIND, ROLE_COLORS["rollout"], "rollout: new arrays in pinned host (net)"),
        (ph.CAST + ph.PINNED, "#e8b04b", "rollout: cast, in pinned host"),
        (ph.ANCHOR, ROLE_COLORS["anchor"], "anchor: re-pinned"),
    ),
}
RELEASED_COLOR = "#7fb27f"


def phase_label(p: Mapping[str, Any], chunks: int) -> str:
    """A sync phase as the figures name it: ``"chunk 2/3: reshard"`` where the sync ran in chunks."""
    return p["name"] if p["chunk"] is None or chunks <= 1 else f"chunk {p['chunk']}/{chunks}: {p['name']}"


def sync_peak(sync: Mapping[str, Any]) -> Svg:
    """What a sync holds on one device above what was there before, phase by phase (L3).

    ``sync``: a sync report's JSON (or its ``transient_peak``), measured or planned. The device
    drawn is the one with the highest device-memory peak, else the highest peak of any kind.
    One panel per memory kind the sync touches there: per phase, the new arrays stacked by
    what they are (whose they are: the actor's staged leaves, the rollout's new arrays, the
    anchor), the compiled programs' temporaries, and below the line what the sync released;
    the black tick is the net level, the dashed line the device's peak.
    """
    peak = sync.get("transient_peak", sync)
    if not peak or "phases" not in peak:
        raise ValueError("this sync report has no transient_peak (a sync of this lab version measures it)")
    phases = list(peak["phases"])
    chunks = int(peak.get("chunks", 1) or 1)
    by_device = peak.get("by_device", {})
    device = str(
        peak.get("max_device") or max(by_device, key=lambda d: max(by_device[d].values(), default=0), default="0")
    )
    kinds = [k for k in PANELS if any(_panel_level(p, device, k) or _terms(p, device, k) for p in phases)]
    c = Canvas(WIDTH, 0, "Weight sync (P13): bytes alive on one device during the sync, above what was there before")
    method = peak.get("method", {})
    source = "measured" if method.get("arrays", "").startswith("measured") else "computed from shapes"
    mine = by_device.get(device, {})
    sub = (
        f"device {device}{' of ' + sync['where'] if sync.get('where') else ''} ({source}); peak: "
        + (", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in mine.items()) or "nothing new")
        + (f", at {peak['phase_at_peak'][device]}" if device in peak.get("phase_at_peak", {}) else "")
        + f"; {chunk_words(peak, fmt_bytes)}"
    )
    y = c.text_lines(8, 40, wrap(sub, WIDTH - 16, MIN_FONT, lines=2), size=MIN_FONT, fill=MUTED)
    for kind in kinds:
        y = _panel(c, phases, device, kind, chunks, y + 16, mine.get(kind, 0))
    if not kinds:
        c.text(_PANEL_LEFT, y + 20, f"nothing new on device {device} during this sync", size=MIN_FONT, fill=MUTED)
        y += 36
    items = [
        (c.kind_fill(k, color), what)
        for k in kinds
        for term, color, what in PANELS[k]
        if any(_terms(p, device, k).get(term) for p in phases)
    ]
    if any(_released(p, device, k) for p in phases for k in PANELS):
        items.append((RELEASED_COLOR, "released: old arrays (or the old anchor) nothing holds any more"))
    y = legend(c, 8, y + 6, items)
    notes = [f"order: {peak.get('order', '?')}"]
    at = peak.get("phase_at_peak", {}).get(device)
    top = next((p for p in phases if phase_label(p, chunks) == at), None) if "device" in mine else None
    if top is not None:
        held = [what for term, _, what in PANELS["device"] if _terms(top, device, "device").get(term)]
        notes.insert(0, f"on device {device} at its peak: " + "; ".join(held))
    arrays, temporaries = (str(method.get(k, "?")).split(":")[0] for k in ("arrays", "program_temporaries"))
    notes.append(f"arrays: {arrays}; temporaries: {temporaries}")
    for text in notes:
        y = c.text_lines(8, y, wrap(text, WIDTH - 16, MIN_FONT, lines=3), size=MIN_FONT, fill=MUTED)
    c.height = y + 6
    return c.render()


def _terms(p: Mapping[str, Any], device: str, kind: str) -> dict[str, int]:
    """The positive terms of a phase drawn in ``kind``'s panel (temporaries in the device's).

    The old arrays a sync released are netted against the rollout's new arrays of the same
    kind (they are what replaced them), so a chunk shows what it adds, not everything the
    earlier chunks made and freed; what is left of a release is drawn below the line.
    """
    terms = p.get("terms", {}).get(device, {})
    names = {term for term, _, _ in PANELS[kind]}
    out = {t: int(v) for t, v in terms.items() if t in names and v > 0}
    gone = -int(terms.get(ph.term_in(ph.RELEASED, kind), 0))
    for term in (ph.term_in(ph.RESHARDED, kind), ph.term_in(ph.CAST, kind)):
        take = min(gone, out.get(term, 0))
        if take:
            out[term] -= take
            gone -= take
    out = {t: v for t, v in out.items() if v > 0}
    if kind == "device" and p.get("temporaries", {}).get(device):
        out[TEMPORARIES] = int(p["temporaries"][device])
    return out


def _released(p: Mapping[str, Any], device: str, kind: str) -> int:
    """What a phase released in ``kind`` beyond the rollout's new arrays that replaced it (bytes, >= 0)."""
    terms = p.get("terms", {}).get(device, {})
    gone = -int(terms.get(ph.term_in(ph.RELEASED, kind), 0))
    return max(gone - sum(max(int(terms.get(ph.term_in(t, kind), 0)), 0) for t in (ph.RESHARDED, ph.CAST)), 0)


def _panel_level(p: Mapping[str, Any], device: str, kind: str) -> int:
    level = int(p.get("arrays", {}).get(device, {}).get(kind, 0))
    if kind == "device":
        level += int(p.get("temporaries", {}).get(device, 0))
    return level


_PANEL_LEFT = 104  # room for "pinned host" beside its panel


def _panel(
    c: Canvas, phases: Sequence[Mapping[str, Any]], device: str, kind: str, chunks: int, y: float, top: int
) -> float:
    """One memory kind: stacked terms above the zero line, releases below; returns the y below."""
    left, step = _PANEL_LEFT, (WIDTH - _PANEL_LEFT - 16) / max(len(phases), 1)
    right = left + step * len(phases)
    bar = max(min(step * 0.7, 42), 1.5)
    up = max([sum(_terms(p, device, kind).values()) for p in phases] + [1])
    down = max([_released(p, device, kind) for p in phases] + [0])
    height, below = 120.0, 120.0 * down / (up + down) if down else 0.0
    scale = (height - below) / up
    c.text(left - 8, y + 14, kind.replace("_", " "), size=MIN_FONT, anchor="end", weight="bold")
    zero = y + height - below
    c.line(left, zero, right, zero, "#999999")
    c.text(left - 8, zero + 4, "0", size=MIN_FONT, anchor="end", fill=MUTED)
    c.text(left - 8, y + 30, fmt_bytes(up), size=MIN_FONT, anchor="end", fill=MUTED)
    for i, p in enumerate(phases):
        x = left + step * i + (step - bar) / 2
        label, terms = phase_label(p, chunks), _terms(p, device, kind)
        parts = [
            (n, c.kind_fill(kind, color), f"peak:{kind}:{i}:{term}", f"{label}: {what} {fmt_bytes(n)}")
            for term, color, what in PANELS[kind]
            if (n := terms.get(term, 0))
        ]
        c.bar(x, zero, bar, scale, parts, up=True)
        if gone := _released(p, device, kind):
            title = f"{label}: released {fmt_bytes(gone)}"
            c.rect(
                x, zero, bar, gone * scale, RELEASED_COLOR, id=f"peak:{kind}:{i}:released", nbytes=-gone, title=title
            )
        level = _panel_level(p, device, kind)
        ly, title = zero - level * scale, f"{label}: {fmt_bytes(level)} above before"
        c.line(x - 1, ly, x + bar + 1, ly, TEXT, width=2, id=f"level:{kind}:{i}", nbytes=level, title=title)
    if top:
        py = zero - top * scale
        c.line(left, py, right, py, "black", width=1, dash="5,3", id=f"peak-mark:{kind}", nbytes=top)
        c.text(right, py - 4, f"peak {fmt_bytes(top)}", size=MIN_FONT, anchor="end")
    # Phase names under the panel where there is room; chunk boundaries otherwise.
    ty = y + height + 16
    if step >= 60:
        for i, p in enumerate(phases):
            c.text(left + step * (i + 0.5), ty, p["name"], size=MIN_FONT, anchor="middle", fill=MUTED)
    else:
        # Chunk boundaries, a label at most every 80 px; the anchor re-pin and the end at the right.
        last = -1e9
        ends = [i for i, p in enumerate(phases) if p["chunk"] is None]
        stop = right - (text_width("anchor, end", MIN_FONT) + 12 if ends else 0) - 70
        for i, p in enumerate(phases):
            x = left + step * i
            new_chunk = p["chunk"] is not None and (i == 0 or phases[i - 1]["chunk"] != p["chunk"])
            if new_chunk and x - last >= 80 and x <= stop:
                c.line(x, zero, x, zero + 4, "#999999")
                c.text(x, ty, f"chunk {p['chunk']}", size=MIN_FONT, fill=MUTED)
                last = x
        if ends:
            c.text(right, ty, "anchor, end", size=MIN_FONT, anchor="end", fill=MUTED)
    return ty + 10


def sync_chunk_curve(points: Sequence[Mapping[str, Any]], title: str | None = None) -> Svg:
    """The sync's device-memory peak and its handover time against the chunk size (L3).

    ``points``: one per chunk size, in the order to draw, each with ``label`` (the chunk
    size as said), ``peak`` (the largest device-memory peak of any device, bytes), ``seconds``
    (the handover's time) and optionally ``planned`` (the planner's peak, bytes). Two rows of
    bars on one axis of chunk sizes: where chunking stops helping, the peak bars stop falling
    while the time bars keep rising.
    """
    left, right = 130, 16
    c = Canvas(WIDTH, 0, title or "Chunk size against the sync's peak and its time")
    step = (WIDTH - left - right) / max(len(points), 1)
    bar = min(step * 0.6, 60)
    y = 44
    rows = (
        ("peak", ("device peak", "busiest device", "tick: planned"), ROLE_COLORS["rollout"], fmt_bytes),
        ("seconds", ("handover time", "measured"), "#4c72b0", lambda v: f"{v * 1e3:.1f} ms"),
    )
    for key, lines, color, fmt in rows:
        top = max([float(p.get(key) or 0) for p in points] + [1e-12])
        h = 110.0
        base = y + 18 + h  # room above the tallest bar for its number
        c.text(left - 8, y + 30, lines[0], size=MIN_FONT, anchor="end", weight="bold")
        c.text_lines(left - 8, y + 46, lines[1:], size=MIN_FONT, anchor="end", fill=MUTED)
        c.line(left, base, WIDTH - right, base, "#999999")
        for i, p in enumerate(points):
            v = float(p.get(key) or 0)
            x = left + step * i + (step - bar) / 2
            bh = h * v / top
            nbytes, title = int(v) if key == "peak" else None, f"{p['label']}: {fmt(v)}"
            c.rect(x, base - bh, bar, bh, color, id=f"curve:{key}:{i}", nbytes=nbytes, title=title)
            c.text(x + bar / 2, base - bh - 4, fmt(v), size=MIN_FONT, anchor="middle")
            planned = p.get("planned") if key == "peak" else None
            if planned is not None:
                py = base - h * float(planned) / top
                c.line(x - 3, py, x + bar + 3, py, "black", width=2, id=f"curve:planned:{i}", nbytes=int(planned))
        y = base + 8
    for i, p in enumerate(points):
        c.text(left + step * (i + 0.5), y + 10, str(p["label"]), size=MIN_FONT, anchor="middle")
    c.text(left - 8, y + 10, "chunk size", size=MIN_FONT, anchor="end", fill=MUTED)
    c.height = y + 24
    return c.render()
