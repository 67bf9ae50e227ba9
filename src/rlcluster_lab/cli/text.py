"""The CLI's readable text: a placement report's JSON (with its memory and sync) as lines."""

from __future__ import annotations

from typing import Any

# The report's words are imported where a report is written, not here: a refusal of the CLI's
# flags comes back before JAX is imported (app and measure import it).


def format_report(data: dict[str, Any]) -> str:
    """A readable summary of a placement report's JSON."""
    from rlcluster_lab.app.report import devices_text

    lines = [
        f"on {devices_text(data)}; engine {data['engine']}"
        f"{'; LoRA actor' if data['lora'] else ''}{'; offload to pinned host' if data['offload_to_cpu'] else ''}"
    ]
    lines.append("meshes after construction:")
    for role, mesh in data["role_to_mesh"].items():
        shape = "x".join(f"{k}={v}" for k, v in mesh["shape"].items())
        lines.append(f"  {role:<9} {shape:<14} devices {mesh['device_ids']}")
    if data["mesh_overridden_by_engine"]:
        lines.append("  (the engine replaced the rollout mesh; the sharing map was built from the config's meshes)")
    lines.append("sharing map:")
    for role, others in data["sharing_map"].items():
        lines.append(f"  {role:<9} -> {', '.join(others) if others else '(none)'}")
    lines.append(f"rollout branch (P3): {data['rollout_branch']}")
    lines.append(f"rollout samples with the actor's own buffers: {data['rollout_shares_actor_weights']}")
    lines.append(f"reference shares the actor's frozen backbone: {data['reference_shares_backbone']}")
    anchor = data["anchor"]
    lines.append(f"anchor (P8, mode {anchor['mode']}): {anchor['bytes']:,} bytes pinned in {anchor['memory_kind']}")
    lines.extend(format_memory(data["memory"]))
    if data.get("sync"):
        lines.extend(format_sync(data["sync"]))
    lines += [f"warning: {w}" for w in data["warnings"]]
    lines.append("decisions:")
    for d in data["decisions"]:
        lines += [f"  {d['rule']:>4}  {d['test']}", f"        -> {d['outcome']}"]
    return "\n".join(lines)


def format_memory(memory: dict[str, Any]) -> list[str]:
    """Memory per role (L2) as lines of text."""
    lines = [f"memory (L2, measured{_on(memory)}; {memory['units']}):"]
    for role, r in memory["by_role"].items():
        kinds = ", ".join(f"{k} {v:,}" for k, v in r["by_kind"].items())
        lines.append(f"  {role:<16} {r['bytes']:>14,}  ({kinds})")
    for g in memory["shared"]:
        roles = " + ".join(g["roles"])
        lines.append(f"  shared by {roles}: {g['bytes']:,} bytes in {g['buffers']} buffers (counted once)")
    unique, naive = memory["unique_bytes"], memory["naive_bytes"]
    lines.append(f"  unique {unique:,} bytes; naive (every role its own copy) {naive:,}")
    alloc = memory["allocator"]
    if not alloc["available"]:
        lines.append(f"  allocator: {alloc['note']}")
        return lines
    # The allocator's own figure beside the per-role one, device by device, and why they differ.
    for device, stats in alloc["by_device"].items():
        per_role = int(memory["by_device"].get(device, {}).get("device", 0))
        lines.append(
            f"  {alloc.get('where') or 'allocator'}: device {device}: {stats.get('bytes_in_use', 0):,} bytes in use "
            f"beside {per_role:,} per role in device memory"
        )
    if alloc.get("difference"):
        lines.append(f"  {alloc['difference']}")
    return lines


def _on(report: dict[str, Any]) -> str:
    """ " on TPU v5 lite chip 0": the devices a memory or sync report's figures come from, or ""."""
    return f" on {report['where']}" if report.get("where") else ""


def format_sync(sync: dict[str, Any]) -> list[str]:
    """One weight sync (L3) as lines of text."""
    program = (
        " (the handover includes compiling its copy programs: first sync of these shardings)"
        if sync.get("includes_compilation")
        else " (the handover includes reading its copy programs from the compilation cache)"
        if sync.get("includes_program_load")
        else ""
    )
    lines = [
        f"sync (L3{_on(sync)}, {sync['method']}; physical bytes):",
        f"  synced {sync['synced_bytes']:,} = arrived from other devices {sync['arrived_cross_device_bytes']:,}"
        f" + copied within a device {sync['copied_same_device_bytes']:,} + reused {sync['reused_bytes']:,}",
        f"  moved across devices {sync['moved_cross_device_bytes']:,} (arrived, and relayed: crossed without staying"
        f" {sync['relayed_cross_device_bytes']:,})",
        f"  minimum across devices {sync['minimum_cross_device_bytes']:,}; logical (each leaf once)"
        f" {sync['synced_logical_bytes']:,}",
        f"  anchor re-pin {sync['anchor_bytes']:,} bytes to pinned host; handover {sync['seconds'] * 1e3:.2f} ms,"
        f" re-pin {sync['anchor_seconds'] * 1e3:.2f} ms{program}",
    ]
    if floor := sync.get("device_put_seconds"):
        took = sync["seconds"] / floor
        lines.append(f"  one device_put of the same tree {floor * 1e3:.2f} ms: the handover took {took:.1f}x")
    return lines + plan_text(sync) + _peak_lines(sync.get("transient_peak"))


def plan_text(sync: dict[str, Any], most: int = 12) -> list[str]:
    """The sync's plan (``Route.lines``, measured and planned alike), at most ``most`` lines of it."""
    lines = list(sync.get("plan") or [])
    more = [f"    ... and {len(lines) - most} more lines (the JSON's sync.plan)"] if len(lines) > most else []
    return [f"  plan: {lines[0]}", *(f"        {line}" for line in lines[1:most])] + more if lines else []


def _peak_lines(peak: dict[str, Any] | None) -> list[str]:
    """The sync's transient peak (L3): the busiest device, per memory kind, and where it is."""
    if not peak:
        return []
    top, device = peak["max_bytes"], peak.get("max_device")
    where = f" on device {device}, at {peak['phase_at_peak'][device]}" if device is not None else ""
    from rlcluster_lab.measure.sync_peak import chunk_words

    return [
        f"  transient peak above what was there before (measured, {chunk_words(peak)}): device memory "
        f"{top.get('device', 0):,}{where}; pinned host {top.get('pinned_host', 0):,}"
    ]
