"""Rows for tables of a plan's budgets (L4): the busiest device term by term, every host,
and one line per plan with its verdict. Figures are the plan's own, computed from shapes."""

from __future__ import annotations

from typing import Any

from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.planner.budget import gib as _gib


def peak_rows(plan: Any) -> list[dict[str, Any]]:
    """The busiest device at its peak: each resident entry, then each phase's terms (the
    phase that sets the peak marked), largest first within each."""
    data = plan.to_json()
    device = data["fits"]["peak"]["device"]
    budget = next(d for d in data["per_device"] if d["device"] == device)
    rows = [
        {"device": device, "when": "resident", "term": name, "bytes": _gib(n)}
        for name, n in sorted(budget["resident"].items(), key=lambda kv: -kv[1])
    ]
    for phase, terms in budget["phases"].items():
        when = phase.replace("_", " ") + (" (peak)" if phase == budget["peak_phase"] else "")
        rows += [
            {"device": device, "when": when, "term": term.replace("_", " "), "bytes": _gib(n)}
            for term, n in sorted(terms.items(), key=lambda kv: -kv[1])
        ]
    rows.append({"device": device, "when": "peak", "term": "total", "bytes": _gib(budget["peak_bytes"])})
    return rows


def host_rows(plan: Any) -> list[dict[str, Any]]:
    """Per host: its devices, its busiest device, its RAM and what a sync brings it."""
    return [
        {
            "host": h["host"],
            "devices": f"{h['device_ids'][0]}..{h['device_ids'][-1]}",
            "busiest device": _gib(h["device_peak_bytes"]),
            "RAM": _gib(h["ram_bytes"]),
            "RAM per host": _gib(h["host_memory"]),
            "sync from other hosts": _gib(h["sync_cross_host_bytes"]),
            "sync within the host": _gib(h["sync_within_host_bytes"]),
        }
        for h in plan.to_json()["per_host"]
    ]


def verdict_row(label: str, plan: Any) -> dict[str, Any]:
    """One plan in a line: its busiest device at rest and at its peak, and whether it fits."""
    fits = plan.to_json()["fits"]
    peak = fits["peak"]
    return {
        "plan": label,
        "resident": _gib(fits["resident"]["max_device_bytes"]),
        "peak": _gib(peak["max_device_bytes"]),
        "during": (peak["phase"] or "-").replace("_", " "),
        "per device": _gib(fits["memory_per_device"]),
        "fits": fits["all_fit"],
    }


def sync_lines(plan: Any) -> str:
    """What one sync of the plan hands over and which link each byte takes, three figures that
    add up: of the bytes from other devices, those that must cross between hosts (each block a
    host needs, once into that host) and the copies of them made inside a host."""
    sync = plan.sync
    moved, across = int(sync["moved_cross_device_bytes"]), int(sync["cross_host_bytes"])
    within = int(sync["within_host_cross_device_bytes"])
    estimated = sync.get("estimated_seconds")
    seconds = (
        f"at least {estimated * 1e3:.2f} ms, each link carrying its own share at once"
        if estimated is not None
        else "no time: the topology gives no link bandwidth"
    )
    return "\n".join(
        [
            f"a sync hands over {fmt_bytes(sync['synced_bytes'])}, {fmt_bytes(moved)} of it from other devices:",
            f"  {fmt_bytes(across)} must cross between hosts (each block a host needs, once into that host)",
            f"  {fmt_bytes(within)} are copies of those blocks made between devices inside a host",
            seconds,
        ]
    )
