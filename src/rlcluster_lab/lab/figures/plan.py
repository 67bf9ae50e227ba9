"""A what-if plan's memory as a figure (L4, matplotlib): bytes per role and per device against
the device's capacity, all computed from shapes (``planner.plan_cluster(...).to_json()``).

A pure function of the plan's JSON; it builds a ``matplotlib.figure.Figure`` without
pyplot, which only the notebooks show. Artists carry a ``gid``: ``"bar:role:<entry>:<kind>"``,
``"bar:device:<device>:device"`` (what the device holds at rest), ``"bar:device:<device>:peak"``
(what the step's largest phase adds, on top: the bar's top is the device's peak, ``per_device``),
``"line:capacity"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from matplotlib.figure import Figure

from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.lab.figures.mpl import FONT, MAX_WIDTH, MIN_PT, bytes_axis, legend_columns, new_figure
from rlcluster_lab.lab.figures.style import ENTRY_ORDER, KIND_COLORS, KINDS, PHYSICAL, device_order, in_order


def plan_memory(plan: Mapping[str, Any]) -> Figure:
    """A what-if plan's bytes per role and per device, against the device's capacity (L4).

    Everything here is computed from shapes, not measured; the title says so.
    """
    memory = plan.get("memory", {})
    by_role = memory.get("by_role", {})
    entries = in_order(list(by_role), ENTRY_ORDER)
    by_device = memory.get("by_device", {})
    devices = device_order(list(by_device))
    # Bytes of device memory per device, where the plan gives it.
    sections = (plan.get("fits") or {}, plan.get("topology", {}))
    capacity = next((int(s["memory_per_device"]) for s in sections if s.get("memory_per_device")), None)
    fig = new_figure(MAX_WIDTH, max(3.4, 0.4 * len(entries) + 1.8))
    ax_role, ax_dev = fig.subplots(1, 2, width_ratios=[1, 1.3])
    left = [0] * len(entries)
    for kind in KINDS:
        values = [int(by_role[e].get("by_kind", {}).get(kind, 0)) for e in entries]
        if not any(values):
            continue
        bars = ax_role.barh(range(len(entries)), values, left=left, color=KIND_COLORS[kind], label=kind, height=0.6)
        for bar, e in zip(bars, entries):
            bar.set_gid(f"bar:role:{e}:{kind}")
        left = [a + b for a, b in zip(left, values)]
    verdicts = (plan.get("fits") or {}).get("by_role", {})
    for y, e in enumerate(entries):
        fits = verdicts.get(e, {}).get("fits")
        note = "" if fits is None else ("  fits per device" if fits else "  too big for one device")
        said, color = f" {fmt_bytes(by_role[e].get('bytes', 0))}{note}", "black" if fits is not False else "#c44e52"
        ax_role.text(left[y], y, said, va="center", fontsize=MIN_PT, color=color)
    ax_role.set_xlim(0, max(left + [1]) * 2.2)  # room for the label after the longest bar
    ax_role.set_yticks(range(len(entries)), entries, fontsize=MIN_PT)
    ax_role.invert_yaxis()
    bytes_axis(ax_role.xaxis, ax_role.get_xlim()[1])
    ax_role.set_xlabel(PHYSICAL, fontsize=MIN_PT)
    ax_role.set_title("per role", fontsize=FONT, loc="left")

    totals = [int(by_device[d].get("device", 0)) for d in devices]
    # A device's peak (resident + the step's largest phase) where the plan budgets its step:
    # what "busiest device" and the fit verdict read, so the figure never shows rest alone as if
    # it were what the device must hold.
    budgets = {str(b["device"]): b for b in plan.get("per_device") or ()}
    peaks = [int(budgets[d]["peak_bytes"]) if d in budgets else t for d, t in zip(devices, totals)]
    colors = ["#c44e52" if capacity and p > capacity else KIND_COLORS["device"] for p in peaks]
    rest = "at rest" if budgets else None
    bars = ax_dev.bar(range(len(devices)), totals, color=colors, label=rest)
    for bar, d in zip(bars, devices):
        bar.set_gid(f"bar:device:{d}:device")
    if budgets:
        added = [p - t for p, t in zip(peaks, totals)]
        tops = ax_dev.bar(
            range(len(devices)), added, bottom=totals, color=colors, alpha=0.35, label="the step's largest phase"
        )
        for bar, d in zip(tops, devices):
            bar.set_gid(f"bar:device:{d}:peak")
    if capacity:
        said = f"device memory {fmt_bytes(capacity)}"
        ax_dev.axhline(capacity, color="black", linestyle="--", linewidth=1.2, gid="line:capacity", label=said)
    ticks = range(0, len(devices), max(1, len(devices) // 16))
    ax_dev.set_xticks(ticks, [f"{devices[i]}" for i in ticks], fontsize=MIN_PT)
    ax_dev.set_xlabel("device", fontsize=MIN_PT)
    bytes_axis(ax_dev.yaxis, ax_dev.get_ylim()[1])
    title = "device memory per device, at rest and at the step's peak" if budgets else "device memory per device"
    ax_dev.set_title(title, fontsize=FONT, loc="left")
    name, topo_name = plan.get("model", {}).get("name", "model"), plan.get("topology", {}).get("name", "")
    handles, labels = [], []
    for ax in (ax_role, ax_dev):  # one legend under both panels, over neither's bars or labels
        h, lb = ax.get_legend_handles_labels()
        handles, labels = handles + h, labels + lb
    fig.legend(
        handles, labels, loc="outside lower center", ncols=legend_columns(fig, labels), fontsize=MIN_PT, frameon=False
    )
    fig.suptitle(
        f"plan: {name} on {topo_name}, layout {plan.get('layout', '?')} ({plan.get('source', 'computed from shapes')})",
        fontsize=FONT,
    )
    return fig
