"""Figures of a placement (L1, P1-P7): the decision flow and the device grid.

Each function takes a placement report's JSON (``placement_report(...).to_json()``, or a
stored one) and returns an ``Svg``: the markup as a string, which a notebook displays as a
figure (``_repr_svg_``) and the widget lab puts in its views. The notebooks and the widget
call these same functions; nothing else draws these figures. They are pure functions of the
report and recompute no decision.

Why SVG: the widget redraws after every click, and a click should answer within about a
second on 2 CPU cores. Measured on such a machine (tiny model, eight devices, ms, each figure
drawn in a fresh process: the first draw, then the median of seven more), SVG against the
matplotlib 3.10 figures these replace (Figure + PNG at 100 dpi, what a notebook or an
ipywidgets Image needs, after a 0.4-0.6 s import of matplotlib):

    figure            SVG first / warm   matplotlib first / warm
    decision_flow       276 / 0.7           247 / 172
    device_grid         242 / 0.7            86 / 79
    memory_by_device    189 / 0.4           125 / 120
    memory_by_role      198 / 0.2           121 / 98
    sync_bytes          200 / 0.2           107 / 99

An SVG figure's first draw is almost all the one-off read of the font's glyph widths
(``style.text_width``); after it, a Construct's four figures redraw in about 2 ms against about half
a second. SVG also stays sharp at any zoom, keeps its text selectable and says more on
hover (``<title>``).

Elements that tests look up carry an ``id``: ``"P3:shared"`` for a decision's answer,
``"key:P3"`` for its rule, ``"link:P1:P3"`` for an arrow, ``"cell:rollout:5"`` for a device
cell. Bytes are physical bytes, as in the reports: every device shard counted. A buffer that
several roles hold is drawn once, and hatched in its first holder's colour wherever else it
appears ("= actor"). Each figure is ``svg.WIDTH`` px wide and meant to be shown at that width,
where its smallest text (``svg.MIN_FONT``, 12 px) is 9 pt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcluster_lab.app.report import devices_text
from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.lab.figures.flow import (
    FlowRow,
    answer_label,
    flow_links,
    flow_rows,
    link_ends,
    link_lanes,
    mesh_coords,
    role_note,
)
from rlcluster_lab.lab.figures.memory import held_on
from rlcluster_lab.lab.figures.style import (
    HIGHLIGHT,
    IDLE,
    IDLE_TEXT,
    ROLE_ORDER,
    clip,
    in_order,
    role_color,
    text_width,
    wrap,
)
from rlcluster_lab.lab.figures.svg import MIN_FONT, MUTED, TEXT, WIDTH, Canvas, Svg, legend

# How a cell's hover names the memory kind its bytes are in.
_KIND_WORDS = {"device": "device memory", "pinned_host": "pinned host"}


def _option_need(row: FlowRow) -> list[float]:
    """The width each answer's box needs for its label (in bold for the one that fired)."""
    return [max(text_width(answer_label(o), MIN_FONT, bold=o == row.fired) + 14, 56.0) for o in row.options]


def decision_flow(report: Mapping[str, Any]) -> Svg:
    """Every decision of construction (and of any sync) in the order the trace recorded them,
    the answer that fired highlighted, and an arrow from a decision to each one that reads its
    result (P1 -> P3, P2 -> P4, ...), labelled below with the value the later one read (L1)."""
    rows = flow_rows(report)
    row_of: dict[str, int] = {}
    for i, row in enumerate(rows):
        row_of.setdefault(row.key.split(":")[0], i)
    links = [link for link in flow_links(report) if link.src in row_of and link.dst in row_of]
    lanes = link_lanes(links, row_of)
    left = 14 + 10 * max(lanes + [0]) + 14  # room for the arrows' lanes
    q_x = left + 44
    # The question gives up room (it is clipped, whole in its hover) before an answer would.
    needs = [_option_need(r) for r in rows]
    q_w = max(120.0, min(228.0, WIDTH - 8 - 6 - q_x - max(sum(n) + 5 * (len(n) - 1) for n in needs)))
    opt_x = q_x + q_w + 6
    details = [wrap(row.detail, WIDTH - 8 - q_x, MIN_FONT, lines=2) if row.detail else [] for row in rows]
    heights = [30 + 16 * len(d) for d in details]
    top = 40
    arrows = "; ".join(f"{link.src} -> {link.dst} ({link.value})" for link in links)
    footer = wrap(f"arrows: a decision that reads another's result; {arrows}", WIDTH - 16, MIN_FONT, lines=3)
    title = f"Decisions in the order taken (engine {report.get('engine', '?')})"
    if report.get("warnings"):
        title += f"; {len(report['warnings'])} warning(s)"
    c = Canvas(WIDTH, top + sum(heights) + 18 * len(footer) + 8, title)
    mid: dict[str, float] = {}
    y = top
    for row, detail, h, need in zip(rows, details, heights, needs):
        rule = row.key.split(":")[0]
        mid.setdefault(rule, y + 11)
        c.rect(left, y, 38, 22, "#333333", rx=4, id=f"key:{row.key}")
        c.text(left + 19, y + 16, rule, size=MIN_FONT, anchor="middle", weight="bold", fill="white")
        c.text(q_x, y + 16, clip(row.question, q_w), size=MIN_FONT, title=row.question)
        labels = [answer_label(o) for o in row.options]
        # Each answer's box as wide as its label needs, all of them filling the row.
        x, free = opt_x, WIDTH - 8 - opt_x - 5 * (len(need) - 1)
        for option, label, w in zip(row.options, labels, [n * free / sum(need) for n in need]):
            fired = option == row.fired
            box = {"stroke": "#333333", "width": 1.6} if fired else {"stroke": "#cccccc", "width": 0.8}
            title = f"{row.key}: {label}" + (" (fired)" if fired else "")
            c.rect(x, y, w, 22, HIGHLIGHT if fired else IDLE, rx=4, id=f"{row.key}:{option}", title=title, **box)
            word = {"weight": "bold", "fill": TEXT} if fired else {"fill": IDLE_TEXT}
            c.text(x + w / 2, y + 16, clip(label, w - 8, MIN_FONT, bold=fired), size=MIN_FONT, anchor="middle", **word)
            x += w + 5
        c.text_lines(q_x, y + 38, detail, size=MIN_FONT, fill=MUTED, title=row.detail)
        y += h
    for link, lane, (a, b) in zip(links, lanes, link_ends(links)):
        y1, y2 = mid[link.src] + 6 * a, mid[link.dst] + 6 * b
        d = f"M{left - 1},{y1:.1f} H{left - 12 - 10 * lane} V{y2:.1f} H{left - 2}"
        title = f"{link.src} -> {link.dst}: {link.why} ({link.value})"
        c.arrow(d, "#555555", id=f"link:{link.src}:{link.dst}", title=title)
    c.text_lines(8, y + 14, footer, 18, size=MIN_FONT, fill=MUTED)
    return c.render()


def device_grid(report: Mapping[str, Any]) -> Svg:
    """Which devices each role's mesh covers, its mesh coordinate there, and its bytes.

    A cell whose bytes are all the actor's own buffers is hatched in the
    actor's colour over a tint of the role's ("= actor"): the rollout on the
    shared branch, a LoRA reference's backbone. Buffers of the role's own (the
    actor's, a copy, a model of its own) are in its colour. Each cell draws its
    bytes in the memory kind the Memory view puts them in (one account,
    ``figures.memory.held_on``): plain in device memory, dotted in pinned host,
    a cell with bytes in both split between them. When the
    engine replaced the rollout mesh (P7), the mesh the config asked for is
    drawn dashed on a row of its own. Under the grid, per role, the sharing
    map's links (P1, P2) beside what the role measurably shares with the
    actor, and why the two differ where they do.
    """
    meshes = report.get("role_to_mesh", {})
    rows: list[tuple[str, str, Mapping[str, Any]]] = [(r, r, meshes[r]) for r in in_order(list(meshes), ROLE_ORDER)]
    if report.get("mesh_overridden_by_engine") and "rollout" in report.get("config_role_to_mesh", {}):
        at = next(i for i, r in enumerate(rows) if r[0] == "rollout") + 1
        rows.insert(at, ("rollout (config)", "rollout", report["config_role_to_mesh"]["rollout"]))
    # The cluster's own devices (its meshes', the asked-for one included), not every device of the
    # platform: a cluster on one chip (or one device of eight) is drawn as one column.
    ids = sorted({int(d) for _, _, m in rows for d in m.get("device_ids", [])})
    memory = report.get("memory") or {}
    label_w, top, row_h = 150, 48, 42
    cell_w = min(72.0, (WIDTH - label_w - 10) / max(len(ids), 1))
    small = cell_w < text_width("88.8 KiB", MIN_FONT) + 6  # too narrow for bytes: they go in the hover
    actor_color = role_color("actor")
    c = Canvas(WIDTH, 0, f"Devices: {devices_text(report)}; each cell: mesh coordinate and the role's physical bytes")
    for j, dev in enumerate(ids):
        c.text(label_w + j * cell_w + cell_w / 2, top - 8, f"dev {dev}", size=MIN_FONT, anchor="middle", fill=MUTED)
    drawn: set[tuple[str, str]] = set()  # (whose buffers, memory kind) of the cells drawn: the legend's
    for i, (name, role, mesh) in enumerate(rows):
        y = top + i * row_h
        dashed = name.endswith("(config)")
        c.text(8, y + 17, name, size=13, weight="bold")
        c.text(8, y + 33, "mesh " + "x".join(str(v) for v in mesh.get("shape", {}).values()), size=MIN_FONT, fill=MUTED)
        coords = mesh_coords(mesh)
        for j, dev in enumerate(ids):
            x = label_w + j * cell_w
            cell = (x + 2, y + 2, cell_w - 4, row_h - 6)
            if dev not in coords:
                c.rect(*cell, "white", stroke="#dddddd", width=0.6, id=f"cell:{name}:{dev}")
                continue
            color = role_color(role)
            # Where the role's bytes are on this device, per memory kind: the account the Memory
            # view draws too (figures.memory.held_on), so a kind is drawn alike in both views.
            holding = {} if dashed else held_on(memory, role, str(dev))
            parts = {kind: sum(sets.values()) for kind, sets in holding.items()}
            held = sum(parts.values())
            shared = sum(n for sets in holding.values() for s, n in sets.items() if role != "actor" and "actor" in s)
            whose = "actor's" if held and shared >= held else "own"
            if dashed:
                fills, note, whose = {"": "white"}, "asked for", "asked"
            elif whose == "actor's":
                fills = {k: c.hatch(actor_color, color, dotted=k == "pinned_host") for k in parts}
                note = "= actor"
            else:
                fills = {k: c.kind_fill(k, color) for k in parts or ("device",)}
                note = fmt_bytes(held) if held and not small else ""
            drawn.update((whose, k) for k in fills)
            title = f"{name} on device {dev}: mesh coordinate {coords[dev]}"
            title += f"; holds {fmt_bytes(held)} in " + " and ".join(_KIND_WORDS[k] for k in parts) if held else ""
            title += f", of which {fmt_bytes(shared)} are the actor's buffers" if shared else ""
            first, *more = fills
            dash = "4,3" if dashed else None
            style = {"stroke": color, "width": 1.4, "dash": dash, "rx": 3, "title": title}
            c.rect(*cell, fills[first], id=f"cell:{name}:{dev}", nbytes=None if dashed else held, **style)
            # Bytes in a second memory kind: its share of the cell, drawn over the right of it.
            at = cell[0] + cell[2] * parts[first] / held if more else 0
            for k in more:
                w = cell[2] * parts[k] / held
                c.rect(at, cell[1], w, cell[3], fills[k], id=f"part:{name}:{dev}:{k}", nbytes=parts[k], title=title)
                at += w
            fill = fills[first]
            ink = "white" if fill == color else TEXT
            for line, base in ((",".join(map(str, coords[dev])), y + 17), (clip(note, cell_w - 6), y + 32)):
                if not line:
                    continue
                if fill.startswith("url("):  # a white ground under the text, so the stripes do not cross it
                    w = text_width(line, MIN_FONT) + 4
                    c.rect(x + (cell_w - w) / 2, base - 11, w, 14, "white", rx=2, opacity=0.85)
                c.text(x + cell_w / 2, base, line, size=MIN_FONT, anchor="middle", fill=ink)
    swatches = {
        ("own", "device"): ("#9a9a9a", "solid: buffers of its own, in device memory"),
        ("own", "pinned_host"): (c.dots("#9a9a9a"), "dotted: buffers of its own, in pinned host"),
        ("actor's", "device"): (
            c.hatch(actor_color, "#9a9a9a"),
            'hatched "= actor": the actor\'s own buffers, no copy',
        ),
        ("actor's", "pinned_host"): (
            c.hatch(actor_color, "#9a9a9a", dotted=True),
            'hatched and dotted "= actor": the actor\'s own buffers in pinned host, no copy',
        ),
        ("asked", ""): ("white", "dashed: the mesh asked for, replaced by the engine (P7)"),
    }
    items = [swatch for key, swatch in swatches.items() if key in drawn]
    y = legend(c, 8, top + row_h * len(rows) + 16, items)
    for role in [role for name, role, _ in rows if name == role]:  # not the asked-for mesh's row
        for k, line in enumerate(wrap(role_note(report, role), WIDTH - 16 - 14)):
            c.text(8 if k == 0 else 22, y, line, size=MIN_FONT, id=f"note:{role}" if k == 0 else None)
            y += 17
    c.height = y
    return c.render()
