"""Rows for notebook tables from merged multi-process reports (``run_reports``): pure, JSON in."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROLE_COLUMNS = ("actor", "rollout", "reference", "anchor", "optimizer")


def host_memory_rows(reports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per case and process: the bytes each role holds on that process's devices."""
    rows = []
    for case, data in reports.items():
        for index, host in data["by_host"].items():
            ids = host["device_ids"]
            row: dict[str, Any] = {"case": case, "process": int(index), "devices": f"{ids[0]}-{ids[-1]}"}
            for role in ROLE_COLUMNS:
                row[role] = int(host["memory"]["by_role"].get(role, 0))
            row["unique"] = int(host["memory"]["unique_bytes"])
            rows.append(row)
    return rows


def crossing_rows(reports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per case: what the sync moved across processes and within them, beside the minimums."""
    rows = []
    for case, data in reports.items():
        sync = data["sync"]
        p = sync["processes"]
        rows.append(
            {
                "case": case,
                "synced": int(sync["synced_bytes"]),
                "logical": int(sync["synced_logical_bytes"]),
                "across hosts": int(p["cross_process_bytes"]),
                "min across": int(p["minimum_cross_process_bytes"]),
                "within hosts": int(p["within_process_bytes"]),
                "min within": int(p["minimum_within_process_bytes"]),
                "copied same device": int(sync["copied_same_device_bytes"]),
                "reused": int(sync["reused_bytes"]),
            }
        )
    return rows


def time_rows(reports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per case: the sync's handover and anchor re-pin, per process and overall (ms)."""
    rows = []
    for case, data in reports.items():
        sync = data["sync"]
        row: dict[str, Any] = {"case": case}
        for index, host in data["by_host"].items():
            row[f"handover p{index} (ms)"] = f"{host['sync']['seconds'] * 1e3:.2f}"
        row["handover (ms)"] = f"{sync['seconds'] * 1e3:.2f}"
        row["re-pin (ms)"] = f"{sync['anchor_seconds'] * 1e3:.2f}"
        row["compiled"] = bool(sync["includes_compilation"])
        rows.append(row)
    return rows
