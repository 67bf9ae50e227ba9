"""The experiments of notebooks 04 to 08: runs that train, sync, offload and plan.

Like ``lab.experiments`` (which re-exports them), each is one call that
returns plain data for a figure or a table; nothing here decides where a
model lives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig, LearnerResult, group_advantages, lowercase_reward
from rlcluster_lab.app.report import placement_report
from rlcluster_lab.app.scenario import Scenario, build_cluster
from rlcluster_lab.cluster import RLCluster
from rlcluster_lab.core.config import TrainingConfig
from rlcluster_lab.core.meshes import reachable_layouts
from rlcluster_lab.core.options import LAYOUTS
from rlcluster_lab.core.roles import Role
from rlcluster_lab.measure import memory_report
from rlcluster_lab.training.step import TrainBatch

Tick = Callable[[Any], None]


# Prompts of one length: every step then has the same shapes, so the jitted
# programs compile once and a short run spends its time running, not compiling.
EVEN_PROMPTS: tuple[str, ...] = ("abc", "the", "cat", "xyz", "jax", "rl ", "map", "row")


def collect() -> None:
    """Free the buffers of clusters a cell no longer holds, before building the next one."""
    gc.collect()


SYNC_COLUMNS = (
    "synced_bytes",
    "moved_cross_device_bytes",
    "copied_same_device_bytes",
    "reused_bytes",
    "minimum_cross_device_bytes",
    "synced_logical_bytes",
)


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


def _agrees(planned: int, measured: int, relation: str) -> str:
    """'yes' when the measurement is what the plan says (or, for ">=", at least that)."""
    if planned == measured:
        return "yes"
    if relation == ">=" and measured > planned:
        return f"yes, +{measured - planned:,} relayed"
    return "no"


def p11_run(
    devices: Sequence[jax.Device],
    *,
    steps: int = 6,
    mini_batch_size: int = 8,
    iterations: int = 2,
    prompts_per_step: int = 4,
    group_size: int = 4,
    progress: Tick | None = None,
) -> dict[str, Any]:
    """A short GRPO run whose every optimizer step records the P11 gaps; returns its JSON."""
    cluster = build_cluster(
        Scenario(layout="colocated", max_tokens=8),
        devices=devices,
        training_config=TrainingConfig(learning_rate=3e-3, mini_batch_size=mini_batch_size, num_iterations=iterations),
    )
    learner = GRPOLearner(
        cluster,
        LearnerConfig(steps=steps, prompts_per_step=prompts_per_step, group_size=group_size),
        prompts=EVEN_PROMPTS,
    )
    result: LearnerResult = learner.run(
        progress=(lambda s: progress(f"mean reward {s.mean_reward:.2f}")) if progress else None
    )
    out = result.to_json()
    out["config"] = {
        "batch_size": prompts_per_step * group_size,
        "mini_batch_size": mini_batch_size,
        "iterations": iterations,
        "steps": steps,
    }
    return out


def anchor_rows(reports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the anchor (P8) holds in each report, and where."""
    return [
        {
            "scenario": label,
            "anchor mode": r["anchor"].get("mode", "full"),
            "memory kind": r["anchor"]["memory_kind"],
            "anchor bytes": r["anchor"]["bytes"],
            "actor bytes": r["memory"]["by_role"]["actor"]["bytes"],
        }
        for label, r in reports.items()
    ]


def p11_compare(
    devices: Sequence[jax.Device],
    settings: Sequence[tuple[int, int]] = ((16, 1), (8, 1), (8, 2)),
    steps: int = 8,
    progress: Tick | None = None,
) -> dict[str, dict[str, Any]]:
    """One short run per (mini-batch size, iterations) setting, batch 16; label -> run JSON.

    ``progress`` is called once per GRPO step of every run.
    """
    out = {}
    for mini, iterations in settings:
        label = f"mini-batch {mini}, {iterations} iteration{'s' if iterations > 1 else ''}"
        out[label] = p11_run(devices, steps=steps, mini_batch_size=mini, iterations=iterations, progress=progress)
        collect()
    return out


def p11_setting_rows(runs: Mapping[str, Mapping[str, Any]], tolerance: float = 1e-4) -> list[dict[str, Any]]:
    """Per setting: optimizer steps per global step, and on how many of them live == anchor."""
    rows = []
    for label, run in runs.items():
        recs = run["p11"]
        steps = max(run["config"]["steps"], 1)
        same = sum(r["live_vs_anchor"] <= tolerance for r in recs)
        rows.append(
            {
                "setting": label,
                "optimizer steps per global step": len(recs) // steps,
                "live == anchor": f"{same} of {len(recs)}",
                "anchor == sampler": f"{sum(r['anchor_vs_sampler'] <= tolerance for r in recs)} of {len(recs)}",
            }
        )
    return rows


def p11_rows(result: Mapping[str, Any], tolerance: float = 1e-4) -> list[dict[str, Any]]:
    """Per (iteration, mini-batch) position in a global step: do live and anchor agree?

    Agreement is within ``tolerance`` nats (float noise is ~1e-6); the anchor
    and the sampler must agree everywhere.
    """
    groups: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for rec in result["p11"]:
        groups.setdefault((rec["iteration"], rec["rows"][0]), []).append(rec)
    rows = []
    for (iteration, _start), recs in sorted(groups.items()):
        rows.append(
            {
                "iteration": iteration,
                "rows": f"{recs[0]['rows'][0]}-{recs[0]['rows'][1]}",
                "optimizer steps before": recs[0]["steps_taken_before"],
                "live == anchor": all(r["live_vs_anchor"] <= tolerance for r in recs),
                "anchor == sampler": all(r["anchor_vs_sampler"] <= tolerance for r in recs),
            }
        )
    return rows


def sync_matrix(
    devices: Sequence[jax.Device],
    layouts: Sequence[str] = LAYOUTS,
    loras: Sequence[bool] = (False, True),
    engine: str = "vanilla",
    progress: Tick | None = None,
) -> dict[str, dict[str, Any]]:
    """The measured sync (L3) of each layout, with a full and a LoRA actor.

    Each cluster syncs twice and the second sync is kept: the first one also
    compiles the resharding programs, which is not what a sync costs in a run.
    """
    out = {}
    for layout in layouts:
        if layout not in reachable_layouts(devices):
            continue
        for lora in loras:
            cluster = build_cluster(Scenario(layout=layout, lora=lora, engine=engine), devices=devices)
            cluster.sync_weights()
            report = cluster.sync_weights()
            out[f"{layout}, {'LoRA' if lora else 'full'}"] = report.to_json()
            del cluster
            collect()
            if progress:
                progress(f"{layout}, {'LoRA' if lora else 'full'}")
    return out


def sync_rows(syncs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Byte counts of each measured sync (physical bytes), without timings, so they compare run to run."""
    return [{"run": label, **{k.replace("_bytes", ""): s[k] for k in SYNC_COLUMNS}} for label, s in syncs.items()]


def sync_time_rows(syncs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Measured seconds of each sync and of its anchor re-pin (they vary run to run)."""
    return [
        {
            "run": label,
            "sync ms": f"{s['seconds'] * 1e3:.2f}",
            "anchor ms": f"{s['anchor_seconds'] * 1e3:.2f}",
            "moved MB/s": f"{s['moved_cross_device_bytes'] / max(s['seconds'], 1e-9) / 1e6:.0f}",
        }
        for label, s in syncs.items()
    ]


@contextlib.contextmanager
def _during_generate(cluster: RLCluster, snapshot: Callable[[str], None]) -> Iterator[None]:
    """Take a memory snapshot from inside ``generate``, while the rollout model is loaded."""
    engine = cluster.rollout
    original = engine.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        snapshot("during generate")
        return original(*args, **kwargs)

    engine.generate = generate  # an instance attribute: the class is untouched
    try:
        yield
    finally:
        del engine.generate


def offload_timeline(
    devices: Sequence[jax.Device], *, offload: bool = True, layout: str = "colocated", lora: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """Memory (L2) at each phase of one RL step: generate, score, update, sync (P14).

    The snapshots inside ``generate`` and ``update_actor`` are taken while the
    operation holds its model on device; the others between operations.
    """
    cluster = build_cluster(
        Scenario(layout=layout, lora=lora, offload=offload, max_tokens=8),
        devices=devices,
        training_config=TrainingConfig(mini_batch_size=8),
    )
    phases: list[tuple[str, dict[str, Any]]] = []

    def snapshot(label: str) -> None:
        if not any(p[0] == label for p in phases):
            phases.append((label, memory_report(cluster).to_json()))

    snapshot("after construction")
    prompts = [p for p in EVEN_PROMPTS[:4] for _ in range(4)]
    with _during_generate(cluster, snapshot):
        out = cluster.generate(prompts)
    snapshot("after generate")
    anchor = np.asarray(cluster.per_token_logps(Role.ACTOR, out.left_padded_prompt_tokens, out.tokens))
    ref = np.asarray(cluster.per_token_logps(Role.REFERENCE, out.left_padded_prompt_tokens, out.tokens))
    snapshot("after log-probs")
    advantages = group_advantages(lowercase_reward(prompts, out.text), 4)
    batch = TrainBatch(out.left_padded_prompt_tokens, out.tokens, advantages, anchor, ref)
    cluster.update_actor(batch, on_step=lambda *_: snapshot("during update"))
    snapshot("after update")
    cluster.sync_weights()
    snapshot("after sync")
    cluster = None  # the closure above holds the name; drop the cluster itself
    collect()
    return phases


def timeline_rows(phases: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per phase, which entries hold bytes in device memory and which in pinned host memory."""
    rows = []
    for label, mem in phases:
        on = {
            kind: [e for e, v in mem["by_role"].items() if v.get("by_kind", {}).get(kind)]
            for kind in ("device", "pinned_host")
        }
        rows.append({"phase": label, "in device memory": on["device"], "in pinned host": on["pinned_host"]})
    return rows


def _local_topology(devices: Sequence[jax.Device]) -> Any:
    """The planner's ``local`` topology, restricted to the devices the notebook builds on."""
    from rlcluster_lab.planner.tables import local_topology

    return dataclasses.replace(
        local_topology(),
        device_count=len(devices),
        platform=devices[0].platform,
        device_ids=tuple(int(d.id) for d in devices),
    )


def plan_vs_measured(
    devices: Sequence[jax.Device], scenarios: Mapping[str, Scenario], progress: Tick | None = None
) -> list[dict[str, Any]]:
    """The planner's figures (L4) beside a live cluster's measured ones (L2, L3), scenario by scenario."""
    from rlcluster_lab.planner.plan import plan_scenario

    topo = _local_topology(devices)
    rows = []
    for label, scenario in scenarios.items():
        cluster = build_cluster(scenario, devices=devices)
        measured = placement_report(cluster, sync=cluster.sync_weights()).to_json()
        del cluster
        planned = plan_scenario(scenario, topo).to_json()
        for what, read, relation in PLAN_CHECKS:
            p, m = int(read(planned)), int(read(measured))
            agrees = _agrees(p, m, relation)
            rows.append({"scenario": label, "figure": what, "planned": p, "measured": m, "agrees": agrees})
        collect()
        if progress:
            progress(label)
    return rows


def what_if_rows(
    models: Sequence[str],
    topologies: Sequence[str],
    *,
    layouts: Sequence[str] = ("colocated", "split"),
    lora_rank: int = 16,
    **knobs: Any,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Plans of published models on real topologies, per layout, full and LoRA; rows and each plan's JSON."""
    from rlcluster_lab.planner.plan import plan_cluster

    rows, plans = [], {}
    for model, topo, layout, rank in itertools.product(models, topologies, layouts, (0, lora_rank)):
        plan = plan_cluster(model, topo, layout=layout, lora_rank=rank, **knobs).to_json()
        label = f"{model} on {topo}, {layout}, {'LoRA ' + str(rank) if rank else 'full'}"
        plans[label] = plan
        fits = plan["fits"]
        seconds = plan["sync"].get("estimated_seconds")
        rows.append(
            {
                "model": model,
                "topology": topo,
                "layout": layout,
                "actor": f"LoRA {rank}" if rank else "full",
                # The fullest device at its peak through a step's phases (planner.budget).
                "busiest device": _gib(fits["peak"]["max_device_bytes"]),
                "per device": _gib(fits["memory_per_device"]),
                "fits": fits["all_fit"],
                "sync moves": _gib(plan["sync"]["moved_cross_device_bytes"]),
                "sync (est.)": "-" if seconds is None else f"{seconds * 1e3:.1f} ms",
            }
        )
    return rows, plans


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f} GiB"
