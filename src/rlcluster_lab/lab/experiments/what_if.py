"""The planner in the notebooks (L4): its figures beside a live cluster's measured ones, and
what-if plans of published models on real topologies; each one call that returns rows.

Plans are computed from shapes (``planner``), measurements read from the placement report of
a cluster built through ``build_cluster``; nothing here decides where a model lives.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from rlcluster_lab.app.report import placement_report
from rlcluster_lab.app.scenario import Scenario, build_cluster
from rlcluster_lab.lab.experiments.runs import Tick, each
from rlcluster_lab.planner.budget import gib
from rlcluster_lab.planner.plan import plan_cluster, plan_scenario
from rlcluster_lab.planner.tables import local_topology
from rlcluster_lab.planner.xla_check import check_devices, check_lines, check_plan


def _busiest_device(r: Mapping[str, Any]) -> int:
    return max(k.get("device", 0) for k in r["memory"]["by_device"].values())


# (figure, what is read from the plan and from the measured report, how the two must relate).
# The plan counts the least a sync must move between devices; a compiled reshard (the
# ``xla`` strategy) may relay pieces through another device, which only a measurement sees,
# so "moved" is checked as "at least the plan's figure" and its excess is shown on its own.
PLAN_CHECKS: tuple[tuple[str, Callable[[Mapping[str, Any]], int], str], ...] = (
    ("bytes held (each buffer once)", lambda r: r["memory"]["unique_bytes"], "="),
    ("rollout bytes", lambda r: r["memory"]["by_role"]["rollout"]["bytes"], "="),
    ("anchor bytes", lambda r: r["memory"]["by_role"]["anchor"]["bytes"], "="),
    ("busiest device, device memory", _busiest_device, "="),
    ("sync: least between devices", lambda r: r["sync"]["minimum_cross_device_bytes"], "="),
    ("sync: moved between devices", lambda r: r["sync"]["moved_cross_device_bytes"], ">="),
    ("sync: copied within a device", lambda r: r["sync"]["copied_same_device_bytes"], "="),
    ("sync: reused", lambda r: r["sync"]["reused_bytes"], "="),
)


def agrees(planned: int, measured: int, relation: str, relayed: int = 0) -> str:
    """'yes' when the measurement is what the plan says (or, for ">=", at least that). Above the
    plan, the excess is said with the part of it the measured sync relayed (its own
    ``relayed_cross_device_bytes``, the ledger's figure: synced = moved - relayed + copied +
    reused), and the rest as bytes that arrived from another device beyond the least."""
    if planned == measured:
        return "yes"
    if relation == ">=" and measured > planned:
        excess = measured - planned
        if relayed >= excess:
            return f"yes, +{excess:,} relayed"
        parts = ([f"{relayed:,} relayed"] if relayed else []) + [f"{excess - relayed:,} more arrived than the least"]
        return f"yes, +{excess:,} ({'; '.join(parts)})"
    return "no"


def plan_vs_measured(
    devices: Sequence[jax.Device], scenarios: Mapping[str, Scenario], progress: Tick | None = None
) -> list[dict[str, Any]]:
    """The planner's figures (L4) beside a live cluster's measured ones (L2, L3), scenario by scenario."""
    topo = local_topology(devices)

    def compare(scenario: Scenario) -> list[dict[str, Any]]:
        cluster = build_cluster(scenario, devices=devices)
        measured = placement_report(cluster, sync=cluster.sync_weights()).to_json()
        del cluster
        planned = plan_scenario(scenario, topo).to_json()
        pairs = [(what, int(read(planned)), int(read(measured)), relation) for what, read, relation in PLAN_CHECKS]
        relayed = int(measured["sync"]["relayed_cross_device_bytes"])
        return [{"figure": w, "planned": p, "measured": m, "agrees": agrees(p, m, r, relayed)} for w, p, m, r in pairs]

    compared = each(scenarios.items(), compare, progress)
    return [{"scenario": label, **row} for label, rows in compared.items() for row in rows]


def what_if_rows(
    models: Sequence[str], topologies: Sequence[str], *, layouts: Sequence[str] = ("colocated", "split")
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Plans of published models on real topologies, per layout, full and LoRA (rank 16); rows and each plan's JSON."""
    rows, plans = [], {}
    for model, topo, layout, rank in itertools.product(models, topologies, layouts, (0, 16)):
        plan = plan_cluster(model, topo, layout=layout, lora_rank=rank).to_json()
        actor = f"LoRA {rank}" if rank else "full"
        plans[f"{model} on {topo}, {layout}, {actor}"] = plan
        fits, seconds = plan["fits"], plan["sync"].get("estimated_seconds")
        rows.append(
            {
                "model": model,
                "topology": topo,
                "layout": layout,
                "actor": actor,
                # The fullest device at its peak through a step's phases (planner.budget).
                "busiest device": gib(fits["peak"]["max_device_bytes"]),
                "per device": gib(fits["memory_per_device"]),
                "fits": fits["all_fit"],
                "sync moves": gib(plan["sync"]["moved_cross_device_bytes"]),
                "sync (est.)": "-" if seconds is None else f"{seconds * 1e3:.1f} ms",
            }
        )
    return rows, plans


# ``plan --xla-check`` of one case, run with libtpu (its command, date and commit stored beside it).
STORED_CHECK = Path(__file__).with_name("data") / "xla_check.json"
CHECKED = {"model": "llama3-8b", "topology": "tpu-v5e-8", "layout": "split", "lora_rank": 16}


def xla_check(libtpu: str | None = None) -> str:
    """llama3-8b, split, LoRA rank 16, on a TPU v5e-8, checked by XLA:TPU's own compiler
    (``planner.xla_check``), in the words ``plan --xla-check`` prints: compiled here from libtpu in
    the folder ``libtpu`` (``core.compile_only``; minutes on a small CPU), or, without one, the
    check stored with the lab, under a line that says when and how it was run."""
    if libtpu is None:
        stored = json.loads(STORED_CHECK.read_text(encoding="utf-8"))
        head = f"stored ({stored['date']}, {stored['commit']}, {stored['versions']}): {stored['command']}"
        return "\n".join([head, *check_lines(stored["xla_check"], CHECKED["topology"])])
    plan = plan_cluster(**CHECKED)
    return "\n".join(check_lines(check_plan(plan, check_devices(plan.request.topology, libtpu)), CHECKED["topology"]))
