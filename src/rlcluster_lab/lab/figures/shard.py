"""Shards you can see: one weight matrix cut into the boxes each device holds, and what a
sync did with them, device pair by device pair (L3).

``jax.debug.visualize_array_sharding`` draws one array's sharding; these figures add the
bytes of each shard side by side on several meshes, and the pieces a weight sync moved
between devices, copied within a device or reused (the destination shard is the source's
own buffer). Everything drawn is read: boxes from a live array's shards
(``shard_data.shard_layout``), bytes from the sync report's pieces (``shard_data.sync_flows``).

Artists that tests look up carry a ``gid``: ``"shard:<panel>:<box>:<devices>"`` for a box,
``"flow:<how>:<src>:<dst>:<bytes>"`` for a grid cell, ``"bar:<how>:<dst>:<bytes>"`` for a bar.
"""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.textpath import TextPath

from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.lab.figures.mpl import MIN_PT, bytes_axis, new_figure
from rlcluster_lab.lab.figures.shard_data import HOWS, ShardLayout, SyncFlows
from rlcluster_lab.lab.figures.style import PHYSICAL, SYNC_PARTS
from rlcluster_lab.placement.boxes import Box

MIN_FONT = MIN_PT
MAX_WIDTH = 9.6  # inches: at 100 dpi a notebook shows the figure unscaled

# Light colours, one per device, with dark text on them; the sync's own colours (SYNC_PARTS)
# are darker, so a device's box and a kind of copy do not read alike.
DEVICE_COLORS: tuple[str, ...] = tuple(
    "#aec7e8 #ffbb78 #98df8a #f7b6d2 #c5b0d5 #c49c94 #dbdb8d #9edae5 #c7c7c7 #e7cb94".split()
)

_COLOR = {how: color for (_, _, color), how in zip(SYNC_PARTS, HOWS)}
_LEGEND = {"moved": "moved between devices", "copied": "copied within a device", "reused": "reused (same buffer)"}


def device_color(device: int) -> str:
    return DEVICE_COLORS[device % len(DEVICE_COLORS)]


def short_bytes(n: int) -> str:
    """A byte count in at most five characters for a grid cell: 384, 1.5K, 13.1K, 2.0M."""
    if n < 1024:
        return str(int(n))
    if n < 1024**2:
        k = n / 1024
        return f"{k:.1f}K" if round(k, 1) < 100 else f"{k:.0f}K"
    return f"{n / 1024**2:.1f}M"


def _as_2d(box: Box, shape: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int]]:
    """A box as (rows, columns) of a matrix: a vector is one row, a scalar one cell. Leading axes
    that every box spans whole (the layer stack's axis, never split) are drawn as one matrix:
    each layer is cut alike."""
    if any(span != (0, n) for span, n in zip(box[: max(len(shape) - 2, 0)], shape)):
        raise ValueError(
            f"only arrays split along their last two dimensions can be drawn as a matrix; this box {box} of "
            f"shape {shape} splits a leading one"
        )
    return ((0, 1), (0, 1), *box)[-2:]


def _shape_2d(shape: tuple[int, ...]) -> tuple[int, int]:
    (_, rows), (_, cols) = _as_2d(tuple((0, n) for n in shape), shape)
    return rows, cols


def _centred(ax: Any, x: float, y: float, text: str) -> None:
    """``text`` centred on (x, y) at the smallest font; nothing for an empty label (none fits)."""
    if text:
        ax.text(x, y, text, ha="center", va="center", fontsize=MIN_FONT)


def _draw_layout(ax: Any, layout: ShardLayout, width_in: float) -> None:
    """The array as a rectangle cut into its shards' boxes (read from the live array).

    A box one device holds is filled with that device's colour. A box several
    devices hold (replication) is one piece of the array, so it is drawn once,
    in grey, with a chip in each holder's colour. Thin arrays are drawn
    stretched (the ticks give the index ranges). ``width_in`` is about how
    wide the axes will be, to pick labels that fit.
    """
    rows, cols = _shape_2d(layout.shape)
    aspect = _aspect(layout)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_box_aspect(aspect)
    width_pt, height_pt = width_in * 72, width_in * 72 * aspect
    per_pt = (cols / width_pt, rows / height_pt)  # data units per point, across and down
    for box, devices in layout.boxes().items():
        (r0, r1), (c0, c1) = _as_2d(box, layout.shape)
        w_pt, h_pt = (c1 - c0) / cols * width_pt, (r1 - r0) / rows * height_pt
        nbytes = next(s.nbytes for s in layout.shards if s.box == box)
        alone = len(devices) == 1
        face = device_color(devices[0]) if alone else "#eeeeee"
        gid = f"shard:{layout.label}:{'x'.join(f'{a}-{b}' for a, b in box)}:{','.join(map(str, devices))}"
        ax.add_patch(Rectangle((c0, r0), c1 - c0, r1 - r0, facecolor=face, edgecolor="#222222", linewidth=1.2, gid=gid))
        if alone:
            label = _fit([f"dev {devices[0]}\n{fmt_bytes(nbytes)}", f"dev {devices[0]}", str(devices[0])], w_pt, h_pt)
            _centred(ax, (c0 + c1) / 2, (r0 + r1) / 2, label)
            continue
        _chips(ax, devices, (c0, r0, c1, r1), (w_pt, h_pt), per_pt, f"{fmt_bytes(nbytes)} on each")
    ax.set_xticks([0, cols], ["0", str(cols)], fontsize=MIN_FONT)
    ax.set_yticks([0, rows], ["0", str(rows)], fontsize=MIN_FONT) if len(layout.shape) == 2 else ax.set_yticks([])
    ax.tick_params(length=2, pad=1)
    ax.spines[:].set_visible(False)
    where = f"({layout.mesh}) {layout.spec}" if layout.mesh else layout.spec
    ax.set_title(f"{layout.label}\n{where}", fontsize=MIN_FONT, loc="left")
    sizes = sorted({s.nbytes for s in layout.shards})
    each = f"{sizes[0]:,} B" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,} B"
    ax.set_xlabel(
        f"{len(layout.shards)} shards x {each} = {layout.physical_bytes:,} B physical\n"
        f"{layout.logical_bytes:,} B logical; each element on {layout.replicas} device(s)",
        fontsize=MIN_FONT,
        loc="left",
    )


_CHIP, _GAP = 15.0, 3.0  # points: a device chip and the space between chips
_CHIP_EDGE = {"edgecolor": "#555555", "linewidth": 0.6}


def _chips(
    ax: Any,
    devices: Sequence[int],
    frame: tuple[float, float, float, float],
    size_pt: tuple[float, float],
    per_pt: tuple[float, float],
    note: str,
) -> None:
    """A replicated box's holders as chips in their colours, with ``note`` under them where it fits.

    Falls back to one line of text (``dev 0,4``) where no chip row fits.
    """
    c0, r0, c1, r1 = frame
    w_pt, h_pt = size_pt
    step = _CHIP + _GAP
    per_row = int((w_pt - 2 * _GAP) // step)
    lines = -(-len(devices) // per_row) if per_row else 0
    if not per_row or lines * step + _GAP > h_pt:
        held = f"dev {','.join(map(str, devices))}"
        _centred(ax, (c0 + c1) / 2, (r0 + r1) / 2, _fit([f"{held}\n{note}", held], w_pt, h_pt))
        return
    note_fits = bool(_fit([note], w_pt, h_pt - lines * step - _GAP))
    block_h = lines * step - _GAP + (MIN_FONT * 1.4 if note_fits else 0)
    top_pt = (h_pt - block_h) / 2
    for k, dev in enumerate(devices):
        line, col = divmod(k, per_row)
        in_line = min(per_row, len(devices) - line * per_row)
        left_pt = (w_pt - (in_line * step - _GAP)) / 2 + col * step
        x = c0 + left_pt * per_pt[0]
        y = r0 + (top_pt + line * step) * per_pt[1]
        size = (_CHIP * per_pt[0], _CHIP * per_pt[1])
        ax.add_patch(Rectangle((x, y), *size, facecolor=device_color(dev), gid=f"chip:{dev}", **_CHIP_EDGE))
        _centred(ax, x + _CHIP * per_pt[0] / 2, y + _CHIP * per_pt[1] / 2, str(dev))
    if note_fits:
        _centred(ax, (c0 + c1) / 2, r0 + (top_pt + lines * step + MIN_FONT * 0.6) * per_pt[1], note)


def _aspect(layout: ShardLayout) -> float:
    rows, cols = _shape_2d(layout.shape)
    return min(max(rows / cols, 0.3), 1.0)


def _fit(candidates: Sequence[str], w_pt: float, h_pt: float) -> str:
    """The first label whose lines fit in a w x h point box at MIN_FONT, or ''."""
    for text in candidates:
        lines = text.split("\n")
        if max(_width_pt(s) for s in lines) + 4 <= w_pt and len(lines) * MIN_FONT * 1.2 + 2 <= h_pt:
            return text
    return ""


@functools.lru_cache(maxsize=512)
def _width_pt(line: str) -> float:
    """The width of one line of text at MIN_FONT, in points, from the font's own glyphs."""
    return float(TextPath((0, 0), line, size=MIN_FONT).get_extents().width) if line else 0.0


def _device_legend(fig: Figure, devices: Sequence[int]) -> None:
    handles = [Patch(facecolor=device_color(d), edgecolor="#555555", label=f"dev {d}") for d in devices]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=min(len(handles), 10),
        fontsize=MIN_FONT,
        frameon=False,
        handlelength=1.2,
        columnspacing=1.0,
    )


def shard_layouts(layouts: Sequence[ShardLayout], title: str = "") -> Figure:
    """One array's shards on several meshes, two panels a row.

    Each panel is the whole array, cut into the boxes its shards cover (read
    from the live array), coloured by the device holding each one, with the
    bytes of every shard and the physical and logical totals.
    """
    if not layouts:
        raise ValueError("shard_layouts needs at least one layout (shards.shard_layout of a live array)")
    columns = min(2, len(layouts))
    rows = -(-len(layouts) // columns)
    panel = min((MAX_WIDTH - 0.4) / columns - 0.5, 3.3)
    heights = [max(_aspect(lay) for lay in layouts[r * columns : (r + 1) * columns]) for r in range(rows)]
    fig = new_figure(MAX_WIDTH, sum(panel * h + 1.3 for h in heights) + 0.5 + (0.3 if title else 0))
    fig.get_layout_engine().set(h_pad=0.1)
    grid = fig.add_gridspec(rows, columns, height_ratios=[panel * h + 1.3 for h in heights])
    for i, layout in enumerate(layouts):
        _draw_layout(fig.add_subplot(grid[i // columns, i % columns]), layout, panel)
    _device_legend(fig, sorted({d for lay in layouts for d in lay.devices}))
    if title:
        fig.suptitle(title, fontsize=MIN_FONT + 1, x=0.01, ha="left")
    return fig


_CELL_EDGE = {"edgecolor": "white", "linewidth": 1}  # between the device-pair grid's cells


def _draw_grid(ax: Any, flows: SyncFlows, srcs: Sequence[int], dsts: Sequence[int], width_in: float) -> None:
    """Source device (rows) x destination device (columns): bytes moved, copied or reused."""
    ax.set_xlim(0, len(dsts))
    ax.set_ylim(len(srcs), 0)
    ax.set_box_aspect(len(srcs) / len(dsts))
    top = max(list(flows.moved.values()) + [1])
    cell_pt = width_in * 72 / len(dsts)
    for i, s in enumerate(srcs):
        for j, d in enumerate(dsts):
            kept = [("copied", flows.copied.get(d, 0)), ("reused", flows.reused.get(d, 0))]
            parts = [(h, n) for h, n in (kept if s == d else [("moved", flows.moved.get((s, d), 0))]) if n]
            if not parts:
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#f5f5f5", **_CELL_EDGE))
                continue
            for k, (how, n) in enumerate(parts):
                h = 1 / len(parts)
                alpha = 0.3 + 0.7 * n / top if how == "moved" else 0.85
                gid = f"flow:{how}:{s}:{d}:{n}"
                ax.add_patch(Rectangle((j, i + k * h), 1, h, facecolor=_COLOR[how], alpha=alpha, gid=gid, **_CELL_EDGE))
                _centred(ax, j + 0.5, i + (k + 0.5) * h, _fit([short_bytes(n)], cell_pt, cell_pt * h))
    ax.set_xticks([j + 0.5 for j in range(len(dsts))], [str(d) for d in dsts], fontsize=MIN_FONT)
    ax.set_yticks([i + 0.5 for i in range(len(srcs))], [str(s) for s in srcs], fontsize=MIN_FONT)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.tick_params(length=0)
    ax.spines[:].set_visible(False)
    ax.set_xlabel("bytes to device (rollout shard); K = KiB", fontsize=MIN_FONT)
    ax.set_ylabel("from device (actor shard)", fontsize=MIN_FONT)


def _draw_arrivals(ax: Any, flows: SyncFlows, dsts: Sequence[int], width_in: float) -> None:
    """Per destination device: bytes that arrived from other devices, were copied there, or reused.

    ``width_in`` is about how wide the axes will be, to keep the totals over the bars legible.
    """
    values = {
        "moved": [flows.arrived(d) for d in dsts],
        "copied": [flows.copied.get(d, 0) for d in dsts],
        "reused": [flows.reused.get(d, 0) for d in dsts],
    }
    bottom = [0] * len(dsts)
    for how in HOWS:
        bars = ax.bar(range(len(dsts)), values[how], 0.7, bottom=bottom, color=_COLOR[how], label=_LEGEND[how])
        for bar, d, n in zip(bars, dsts, values[how]):
            bar.set_gid(f"bar:{how}:{d}:{n}")
        bottom = [a + b for a, b in zip(bottom, values[how])]
    top = max(bottom + [1])
    upright = all(_fit([short_bytes(t)], width_in * 72 / len(dsts), 2 * MIN_FONT) for t in bottom)
    label = {"ha": "center", "va": "bottom", "fontsize": MIN_FONT, "rotation": 0 if upright else 90}
    for j, total in enumerate(bottom):
        ax.text(j, total + top * 0.02, short_bytes(total), **label)
    ax.set_xticks(range(len(dsts)), [str(d) for d in dsts], fontsize=MIN_FONT)
    ax.set_xlabel("destination device", fontsize=MIN_FONT)
    ax.set_ylim(0, top * (1.18 if upright else 1.3))
    bytes_axis(ax.yaxis, ax.get_ylim()[1])
    ax.tick_params(axis="y", labelsize=MIN_FONT)
    ax.set_ylabel(PHYSICAL.split(" (")[0], fontsize=MIN_FONT)
    title = "what each destination device's shards are made of"
    if flows.relayed_bytes:
        # A relayed byte reached a device and left again: part of what moved, not of any shard.
        title = f"what reached each destination device (moved counts {flows.relayed_bytes:,} B relayed, not kept)"
    ax.set_title(title, fontsize=MIN_FONT, loc="left")
    ax.legend(fontsize=MIN_FONT, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)


def _heading(flows: SyncFlows, head: str) -> str:
    """The figure's title: what it shows, the report's identity with its numbers, and their method."""
    identity = (
        f"synced {flows.synced_bytes:,} B physical ({flows.synced_logical_bytes:,} B logical) = arrived "
        f"from other devices {flows.arrived_bytes:,} ({100 * flows.arrived_share:.1f}%) + copied "
        f"{flows.copied_bytes:,} + reused {flows.reused_bytes:,}"
    )
    if flows.relayed_bytes:
        identity += (
            f"; besides, {flows.relayed_bytes:,} B crossed devices without staying (relayed), "
            f"so {flows.moved_bytes:,} B moved between devices in all"
        )
    least = f"least any reshard must move between devices (from the shards' boxes): {flows.minimum_bytes:,} B"
    on = f" on {flows.where}" if flows.where else ""
    method = textwrap.fill(f"numbers from the {flows.strategy} reshard{on}, {flows.method}", 118)
    return f"{head}\n{textwrap.fill(identity, 118)}\n{least}\n{method}"


def _grid_devices(flows: SyncFlows, src: ShardLayout | None, dst: ShardLayout | None) -> tuple[list[int], list[int]]:
    kept = set(flows.copied) | set(flows.reused)  # on the diagonal: a row and a column each
    srcs = sorted({s for s, _ in flows.moved} | kept | set(src.devices if src else ()))
    dsts = sorted({d for _, d in flows.moved} | kept | set(dst.devices if dst else ()))
    if not srcs or not dsts:
        raise ValueError("this sync carried no bytes (no pieces), so there is nothing to draw")
    return srcs, dsts


def sync_leaf(flows: SyncFlows, src: ShardLayout, dst: ShardLayout) -> Figure:
    """One leaf's sync: the actor's shards, the rollout's, and what moved between them.

    Top: the leaf on the actor's mesh and on the rollout's (``shard_layout`` of
    the live arrays). Bottom left: for every pair of devices, the bytes that
    crossed from the row's device to the column's; on the diagonal, bytes
    copied within the device or reused in place. Bottom right: what each
    destination device's shard is made of. All bytes are the sync report's.
    """
    if src.shape != dst.shape:
        raise ValueError(f"source shape {src.shape} and destination shape {dst.shape} differ: not one leaf")
    srcs, dsts = _grid_devices(flows, src, dst)
    panel = 3.6  # inches: about the width of each panel of the top row and of the grid
    top = panel * max(_aspect(src), _aspect(dst)) + 1.4
    bottom = panel * len(srcs) / len(dsts) + 0.9
    fig = new_figure(MAX_WIDTH, top + bottom + 1.5)
    fig.get_layout_engine().set(h_pad=0.1)
    rows = fig.add_gridspec(2, 1, height_ratios=[top, bottom])
    upper = rows[0].subgridspec(1, 2)
    lower = rows[1].subgridspec(1, 2, width_ratios=[1.25, 1.0])
    _draw_layout(fig.add_subplot(upper[0, 0]), src, panel)
    _draw_layout(fig.add_subplot(upper[0, 1]), dst, panel)
    _draw_grid(fig.add_subplot(lower[0, 0]), flows, srcs, dsts, panel)
    _draw_arrivals(fig.add_subplot(lower[0, 1]), flows, dsts, MAX_WIDTH / 2.25 - 0.7)
    _device_legend(fig, sorted(set(src.devices) | set(dst.devices)))
    fig.suptitle(_heading(flows, f"{flows.label} {src.shape} {src.dtype}"), fontsize=MIN_FONT, x=0.01, ha="left")
    return fig


def sync_summary(flows: SyncFlows) -> Figure:
    """A whole sync (or several leaves) per pair of devices, and per destination device."""
    srcs, dsts = _grid_devices(flows, None, None)
    panel = 3.6
    fig = new_figure(MAX_WIDTH, panel * len(srcs) / len(dsts) + 2.4)
    fig.get_layout_engine().set(h_pad=0.1)
    grid = fig.add_gridspec(1, 2, width_ratios=[1.25, 1.0])
    _draw_grid(fig.add_subplot(grid[0, 0]), flows, srcs, dsts, panel)
    _draw_arrivals(fig.add_subplot(grid[0, 1]), flows, dsts, MAX_WIDTH / 2.25 - 0.7)
    fig.suptitle(_heading(flows, flows.label), fontsize=MIN_FONT, x=0.01, ha="left")
    return fig
