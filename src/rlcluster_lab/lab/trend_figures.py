"""Figures of a run over time and of a plan: the memory timeline of a training step (P14),
the P11 gap between live and anchor log-probs, and a plan's memory against the device's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from rlcluster_lab.lab.mpl import (
    FONT,
    MAX_WIDTH,
    MIN_PT,
    bytes_axis,
    device_order,
    legend_columns,
    new_figure,
    present_keys,
)
from rlcluster_lab.lab.style import ENTRY_ORDER, KIND_COLORS, KINDS, PHYSICAL, ROLE_COLORS, fmt_bytes


def memory_timeline(phases: Sequence[tuple[str, Mapping[str, Any]]]) -> Figure:
    """Unique physical bytes per memory kind at each phase of a step (P14).

    ``phases`` is a list of (label, memory dict) taken one after another.
    """
    labels = [p[0] for p in phases]
    fig = new_figure(max(6.0, 1.2 * len(phases) + 2.0), 3.6)
    ax = fig.add_subplot()
    width = 0.38
    for k, kind in enumerate(KINDS):
        values = [sum(int(kinds.get(kind, 0)) for kinds in m.get("by_device", {}).values()) for _, m in phases]
        bars = ax.bar(
            [i - 0.2 + width * k for i in range(len(phases))], values, width * 0.95, color=KIND_COLORS[kind], label=kind
        )
        for bar, label in zip(bars, labels):
            bar.set_gid(f"bar:phase:{label}:{kind}")
    ax.set_xticks(range(len(phases)), labels, fontsize=MIN_PT, rotation=20, ha="right")
    ax.set_ylabel(PHYSICAL + ",\neach buffer once", fontsize=MIN_PT)
    bytes_axis(ax.yaxis, ax.get_ylim()[1])
    ax.legend(fontsize=MIN_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("memory kinds over one step", fontsize=FONT, loc="left")
    return fig


def p11_gap(result: Mapping[str, Any]) -> Figure:
    """Per optimizer step: how far the live actor's log-probs are from the anchor's,
    and the anchor's from the sampler's (P11), from ``LearnerResult.to_json()``.

    Steps whose actor had not stepped yet in that global step are drawn as
    open circles; later mini-batches and iterations as filled ones.
    """
    records = list(result.get("p11", []))
    xs = list(range(len(records)))
    floor = 1e-9  # a gap of exactly 0 still gets a point on a log axis
    live = [max(float(r["live_vs_anchor"]), floor) for r in records]
    sampler = [max(float(r["anchor_vs_sampler"]), floor) for r in records]
    fresh = [r.get("steps_taken_before", 0) == 0 for r in records]
    fig = new_figure(8.0, 4.2)
    ax = fig.add_subplot()
    ax.set_yscale("log")
    ax.plot(xs, live, color=ROLE_COLORS["actor"], linewidth=0.8, alpha=0.6)
    ax.scatter(
        [x for x, f in zip(xs, fresh) if f],
        [v for v, f in zip(live, fresh) if f],
        facecolors="none",
        edgecolors=ROLE_COLORS["actor"],
        label="live vs anchor, first optimizer step of a global step",
        gid="points:live:first",
    )
    ax.scatter(
        [x for x, f in zip(xs, fresh) if not f],
        [v for v, f in zip(live, fresh) if not f],
        color=ROLE_COLORS["actor"],
        label="live vs anchor, after the actor stepped",
        gid="points:live:later",
    )
    ax.plot(
        xs,
        sampler,
        color=ROLE_COLORS["rollout"],
        marker=".",
        linewidth=0.8,
        label="anchor vs sampler",
        gid="line:sampler",
    )
    ax.set_xlabel("optimizer step", fontsize=MIN_PT)
    ax.set_ylabel("max |difference| of per-token\nlog-prob (nats)", fontsize=MIN_PT)
    labels = ax.get_legend_handles_labels()[1]
    fig.legend(loc="outside lower center", ncols=legend_columns(fig, labels), fontsize=MIN_PT, frameon=False)
    ax.set_title(
        "P11: old log-probs from live weights drift; the anchor matches the sampler", fontsize=FONT, loc="left"
    )
    return fig


def plan_memory(plan: Mapping[str, Any]) -> Figure:
    """A what-if plan's bytes per role and per device, against the device's capacity (L4).

    Everything here is computed from shapes, not measured; the title says so.
    """
    memory = plan.get("memory", {})
    by_role = memory.get("by_role", {})
    entries = present_keys(list(by_role), ENTRY_ORDER)
    by_device = memory.get("by_device", {})
    devices = device_order(list(by_device))
    capacity = _capacity(plan)
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
        ax_role.text(
            left[y],
            y,
            f" {fmt_bytes(by_role[e].get('bytes', 0))}{note}",
            va="center",
            fontsize=MIN_PT,
            color="black" if fits is not False else "#c44e52",
        )
    ax_role.set_xlim(0, max(left + [1]) * 2.2)  # room for the label after the longest bar
    ax_role.set_yticks(range(len(entries)), entries, fontsize=MIN_PT)
    ax_role.invert_yaxis()
    bytes_axis(ax_role.xaxis, ax_role.get_xlim()[1])
    ax_role.set_xlabel(PHYSICAL, fontsize=MIN_PT)
    ax_role.set_title("per role", fontsize=FONT, loc="left")

    totals = [int(by_device[d].get("device", 0)) for d in devices]
    colors = ["#c44e52" if capacity and t > capacity else KIND_COLORS["device"] for t in totals]
    bars = ax_dev.bar(range(len(devices)), totals, color=colors)
    for bar, d in zip(bars, devices):
        bar.set_gid(f"bar:device:{d}:device")
    if capacity:
        ax_dev.axhline(
            capacity,
            color="black",
            linestyle="--",
            linewidth=1.2,
            gid="line:capacity",
            label=f"device memory {fmt_bytes(capacity)}",
        )
    step = max(1, len(devices) // 16)
    ax_dev.set_xticks(
        range(0, len(devices), step), [f"{devices[i]}" for i in range(0, len(devices), step)], fontsize=MIN_PT
    )
    ax_dev.set_xlabel("device", fontsize=MIN_PT)
    bytes_axis(ax_dev.yaxis, ax_dev.get_ylim()[1])
    ax_dev.set_title("device memory per device", fontsize=FONT, loc="left")
    model = plan.get("model", {})
    name = model.get("name", "model") if isinstance(model, Mapping) else str(model)
    topo = plan.get("topology", {})
    topo_name = topo.get("name", "") if isinstance(topo, Mapping) else str(topo)
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


def _capacity(plan: Mapping[str, Any]) -> int | None:
    """Bytes of device memory per device, where the plan gives it."""
    for section in (plan.get("fits", {}), plan.get("topology", {})):
        if not isinstance(section, Mapping):
            continue
        for key in ("memory_per_device", "capacity_bytes"):
            if section.get(key):
                return int(section[key])
    return None
