"""Per role, the sharing map beside the measured buffers, in words: what the device grid prints
under its cells and the sharing-map figure in its rows (``placement_figures``).

Two facts that read alike and are not the same: the sharing map is P1/P2's decision of which
roles may share a model; the measured shared buffers are the ones two roles really hold in
common (L2). They differ where P3 hands the actor to an engine that keeps its own copy (linked,
nothing shared), and where a role with no link still holds some of the actor's buffers because
the reshard (P5) left shards that are the same on both meshes in place (replicated leaves in
the reshaped layout). Every word here is read from the report: the map, the trace's branches,
the memory walk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcluster_lab.lab.flow import engine_copy_reason
from rlcluster_lab.lab.style import ROLE_ORDER, fmt_bytes


def shared_bytes(memory: Mapping[str, Any], role: str, other: str, dev: str | None = None) -> int:
    """Bytes ``role`` holds (on ``dev``, or on every device) that are buffers ``other`` holds too."""
    total = 0
    for group in memory.get("shared", []):
        if role in group.get("roles", []) and other in group.get("roles", []):
            if dev is None:
                total += int(group.get("bytes", 0))
            else:
                total += sum(int(v) for v in (group.get("by_device") or {}).get(dev, {}).values())
    return total


def _branch(report: Mapping[str, Any], rule: str, role: str | None = None) -> str | None:
    for d in report.get("decisions", []):
        if d.get("rule") == rule and (role is None or (d.get("values") or {}).get("role") == role):
            return str(d.get("branch"))
    return None


def map_text(report: Mapping[str, Any], role: str) -> str:
    """The sharing map's entry for ``role``, as P1/P2 decided it."""
    links = list(report.get("sharing_map", {}).get(role, []))
    return "sharing map (P1, P2): linked to " + ", ".join(links) if links else "sharing map (P1, P2): no link"


def measured_text(report: Mapping[str, Any], role: str) -> str:
    """What the memory walk found ``role`` to hold of the actor's buffers, and why."""
    memory = report.get("memory") or {}
    held = int(memory.get("by_role", {}).get(role, {}).get("bytes", 0))
    if not held:
        return ""
    if role == "actor":
        others = sorted(
            {r for g in memory.get("shared", []) if "actor" in g.get("roles", []) for r in g["roles"] if r != "actor"},
            key=lambda r: ROLE_ORDER.index(r) if r in ROLE_ORDER else len(ROLE_ORDER),
        )
        return ("measured: its buffers are held by " + ", ".join(others) + " too") if others else ""
    linked = "actor" in report.get("sharing_map", {}).get(role, [])
    shared = shared_bytes(memory, role, "actor")
    if shared >= held:
        why = {"rollout": " (P3: the same object)", "reference": " (P4: one backbone)"}.get(role, "")
        return f"measured: all {fmt_bytes(held)} are the actor's buffers{why}, no copy"
    if role == "rollout" and _branch(report, "P3") == "shared":
        return (
            f"measured: {fmt_bytes(held - shared)} of its own: P3 handed over the actor object, but "
            + engine_copy_reason(report)
        )
    if role == "reference" and linked and _branch(report, "P4") == "avoidable copy":
        return f"measured: {fmt_bytes(held - shared)} of its own (P4: an avoidable copy)"
    if not shared:
        return f"measured: {fmt_bytes(held)} of its own"
    how = (
        "shards the reshard (P5) left in place because they are the same on both meshes (replicated leaves)"
        if _branch(report, "P5", role) == "resharded"
        else "buffers P5 kept as they were"
    )
    text = f"measured: {fmt_bytes(shared)} of its {fmt_bytes(held)} are the actor's buffers: {how}"
    return text + ("" if linked else ", not a link in the map")


def actor_share_text(report: Mapping[str, Any], role: str) -> str:
    """How much of the actor's buffers ``role`` holds, measured: "all", "10.0 KiB of 588.0 KiB", "none"."""
    memory = report.get("memory") or {}
    held = int(memory.get("by_role", {}).get(role, {}).get("bytes", 0))
    if role == "actor" or not held:
        return "-"
    shared = shared_bytes(memory, role, "actor")
    if not shared:
        return "none"
    return f"all {fmt_bytes(held)}" if shared >= held else f"{fmt_bytes(shared)} of {fmt_bytes(held)}"


def role_note(report: Mapping[str, Any], role: str) -> str:
    """One line per role: the map's links, then what the role measurably shares, and why."""
    measured = measured_text(report, role)
    return f"{role}: {map_text(report, role)}" + (f"; {measured}" if measured else "")
