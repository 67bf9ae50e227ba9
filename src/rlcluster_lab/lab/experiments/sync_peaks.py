"""Notebook 05's runs on a sync's transient peak (L3, L4): tables of measured peaks, the plan
beside the measurement, and the chunk size against the peak and the time.

Each function builds clusters through ``build_cluster`` (or reads sync reports already
measured) and returns rows for ``runs.format_table`` or points for
``figures.sync.sync_chunk_curve``; nothing here decides where a model lives.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from rlcluster_lab.app.scenario import Scenario, build_cluster
from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.lab.experiments.runs import Devices, Tick
from rlcluster_lab.lab.figures.sync import PANELS, phase_label
from rlcluster_lab.lab.notebook.setup import layout_devices
from rlcluster_lab.planner.plan import plan_scenario
from rlcluster_lab.planner.tables import local_topology


def on_device_at_peak(peak: Mapping[str, Any]) -> str:
    """What the busiest device holds at its device-memory peak, by what it is."""
    device = peak.get("max_device")
    if device is None:
        return "nothing new"
    at = peak["phase_at_peak"][device]
    chunks = int(peak.get("chunks", 1) or 1)
    for p in peak["phases"]:
        if phase_label(p, chunks) == at:
            terms = p["terms"].get(device, {})
            held = [f"{term} {fmt_bytes(terms[term])}" for term, _, _ in PANELS["device"] if terms.get(term, 0) > 0]
            if p["temporaries"].get(device):
                held.append(f"program temporaries {fmt_bytes(p['temporaries'][device])}")
            return ", ".join(held)
    return "?"


def peak_rows(syncs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per measured sync: its device-memory and pinned-host peaks (busiest device, bytes),
    where the device peak is, and what fills it."""
    return [
        {
            "run": label,
            "device peak": int(peak["max_bytes"].get("device", 0)),
            "pinned host peak": int(peak["max_bytes"].get("pinned_host", 0)),
            "busiest device": peak["max_device"] if peak["max_device"] is not None else "-",
            "at": peak["phase_at_peak"].get(peak["max_device"], "-") if peak["max_device"] else "-",
            "on device at the peak": on_device_at_peak(peak),
        }
        for label, peak in ((label, sync["transient_peak"]) for label, sync in syncs.items())
    ]


def peak_answer(syncs: Mapping[str, Mapping[str, Any]]) -> str:
    """Which measured sync has the highest device peak, and which moves the most between
    devices, read from the reports: the answer to notebook 05's question, so its prose never
    names a run the figures contradict."""

    def peak(label: str) -> int:
        return int(syncs[label]["transient_peak"]["max_bytes"].get("device", 0))

    def moved(label: str) -> int:
        return int(syncs[label]["moved_cross_device_bytes"])

    highest, most = max(syncs, key=peak), max(syncs, key=moved)
    at = syncs[highest]["transient_peak"]
    where = f"device {at['max_device']}, at {at['phase_at_peak'][at['max_device']]}"
    said = (
        f"highest device peak: {highest}, {peak(highest):,} bytes ({where}); "
        f"moves the most between devices: {most}, {moved(most):,} bytes"
    )
    return said + (": the same sync" if highest == most else ": another sync")


def planned_peak_rows(
    devices: Devices, scenarios: Mapping[str, Scenario], syncs: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The planner's peak (L4, its reshard programs compiled for their temporaries) beside the
    measured one of the same scenario, busiest device, per memory kind: each planned on the
    devices its layout is built on (``lab.notebook.setup.layout_devices``), as the measured one was."""
    rows = []
    for label, scenario in scenarios.items():
        topo = local_topology(layout_devices(devices, scenario.layout))
        planned = plan_scenario(scenario, topo, sync_programs=True).sync["transient_peak"]
        measured = syncs[label]["transient_peak"]
        rows += [
            {
                "run": label,
                "memory": kind.replace("_", " "),
                "planned": int(planned["max_bytes"].get(kind, 0)),
                "measured": int(measured["max_bytes"].get(kind, 0)),
                "every device agrees": planned["by_device"] == measured["by_device"],
            }
            for kind in ("device", "pinned_host")
        ]
    return rows


def chunk_sweep(
    devices: Devices, scenario: Scenario, chunk_sizes: Sequence[int | None], progress: Tick | None = None
) -> list[dict[str, Any]]:
    """One cluster per chunk size (``None``: one piece): its measured peak (busiest device),
    the planner's, and the median handover time of 5 syncs after one that compiles."""
    devices = layout_devices(devices, scenario.layout)
    topo = local_topology(devices)
    points = []
    for size in chunk_sizes:
        sc = dataclasses.replace(scenario, sync_chunk_bytes=size)
        planned = plan_scenario(sc, topo, sync_programs=True).sync["transient_peak"]
        cluster = build_cluster(sc, devices=devices)
        cluster.sync_weights()  # compiles the chunks' programs
        reports = [cluster.sync_weights() for _ in range(5)]
        peak = reports[-1].peak
        assert peak is not None
        label = "one piece" if size is None else fmt_bytes(size)
        points.append(
            {
                "label": label,
                "chunk_bytes": size,
                "chunks": peak.chunks,
                "largest_chunk_bytes": peak.largest_chunk_bytes,
                "peak": int(peak.max_bytes.get("device", 0)),
                "planned": int(planned["max_bytes"].get("device", 0)),
                "seconds": statistics.median(r.seconds for r in reports),
                "sync": reports[-1].to_json(),
            }
        )
        del cluster, reports
        gc.collect()
        if progress:
            progress(label)
    return points


def sweep_rows(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The sweep as a table: chunk size, chunks, the largest chunk, peak measured and planned
    (not the handover time, which varies run to run)."""
    return [
        {
            "chunk size": p["label"],
            "chunks": p["chunks"],
            "largest chunk": int(p["largest_chunk_bytes"]),
            "device peak": int(p["peak"]),
            "planned": int(p["planned"]),
        }
        for p in points
    ]


def order_rows(peak: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A plan's peaks of the sync's steps in each order (``transient_peak["orders"]``, computed
    from shapes): the most of each memory kind on one device, and the most of all kinds on one
    device at one phase (on CPU devices every kind is the host's RAM). ``counts`` says what the
    figures include: the arrays alone, or the programs' temporaries too (a plan made with
    ``sync_programs=True``, which is what a measured peak includes)."""
    temporaries = str(peak["method"]["program_temporaries"]).startswith("computed")
    counts = "arrays + program temporaries" if temporaries else "arrays only (no program temporaries)"
    return [
        {
            "order": name,
            "device peak": int(o["max_bytes"].get("device", 0)),
            "pinned host peak": int(o["max_bytes"].get("pinned_host", 0)),
            "all kinds, one device": int(o["max_total_bytes"]),
            "counts": counts,
        }
        for name, o in peak["orders"].items()
    ]
