"""Tunix's own ``sync_weights`` run under the lab's sync observer and P13 guard (L3). Where a layout
must change Tunix uses ``jax.device_put``, which on CPU goes through the host: the guard's
refusal is the observed outcome. What ``device_put`` copied, which it does not log, is inferred."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from rlcluster_lab.cluster.sync import sync_filter, sync_guard
from rlcluster_lab.measure.sync import ShardFacts, SyncObserver, SyncReport, TransferLog
from rlcluster_lab.model import is_lora
from rlcluster_lab.placement.boxes import plan_reshard, shard_boxes
from rlcluster_lab.placement.buffers import buffer_keys
from rlcluster_lab.placement.events import Transfer
from rlcluster_lab.placement.transfers import shard_buffers
from rlcluster_lab.rules.steps import ParamsBranch, p13_sync_guarded
from rlcluster_lab.tunix.observe import OBSERVED, anchor_decision, anchor_state, has_anchor, observation

COMPLETED = "completed"
REFUSED = "refused by the transfer guard"
INFERRED = (
    "inferred: Tunix reshards with jax.device_put, whose copies are not logged; new destination bytes "
    "count as moved or copied by where their data already was (the least any reshard must move)"
)
METHOD = (
    "measured around Tunix's sync_weights: buffer identity for reuse, the minimum from the two shardings; "
    "moved and copied bytes logged where the lab's reshard ran, inferred per leaf otherwise (see leaves); "
    "seconds cover the whole call (Tunix's handover and anchor re-pin are one call), anchor_seconds is not "
    "separable (0)"
)


@dataclasses.dataclass(frozen=True)
class TunixSync:
    """One run of a Tunix cluster's ``sync_weights``: its outcome (``COMPLETED`` or ``REFUSED``),
    the guard in force, the refusal's first line, the lab's sync report (L3) when it completed,
    and the observed P13 record."""

    outcome: str
    guard: str
    error: str | None
    report: SyncReport | None
    global_steps_before: int
    global_steps_after: int
    rollout_unchanged: bool
    anchor_repinned: bool
    seconds: float
    decision: dict[str, Any]
    source: str = OBSERVED

    @property
    def completed(self) -> bool:
        return self.outcome == COMPLETED


def run_sync(cluster: Any, platform: str) -> TunixSync:
    """Run ``cluster.sync_weights()`` under the lab's guard (chosen from ``platform``) and observer; a
    refusal by the transfer guard is an outcome, any other failure is raised with a note."""
    actor = cluster.actor_trainer.model
    lora = is_lora(actor)
    filter_types = sync_filter(lora)
    watch = SyncObserver()
    watch.before(nnx.state(actor, *filter_types))
    rollout_before = buffer_keys(nnx.state(cluster.rollout.model(), *filter_types))
    anchor_before = anchor_state(cluster)
    steps_before = int(cluster.global_steps)
    error = None
    start = time.perf_counter()
    try:
        with sync_guard(platform), watch.recording():
            cluster.sync_weights()
            jax.block_until_ready(nnx.state(cluster.rollout.model(), *filter_types))
    except Exception as exc:
        if "Disallowed" not in str(exc) or "transfer" not in str(exc):
            exc.add_note("Tunix's sync_weights failed for a reason other than the transfer guard")
            raise
        error = str(exc).splitlines()[0][:400]
    seconds = time.perf_counter() - start
    destination = nnx.state(cluster.rollout.model(), *filter_types)
    anchor_after = anchor_state(cluster)
    report = None
    if error is None:
        watch.after(destination, seconds)
        if anchor_after is not None:
            watch.anchor(anchor_after, anchor_before if anchor_before is not None else {}, 0.0)
        inferred = _infer_transfers(watch.source, watch.destination, watch.log)
        mode = anchor_decision(cluster)["branch"] if has_anchor(cluster) else "none"
        report = watch.report(lora=lora, anchor_mode=mode, global_step=int(cluster.global_steps))
        leaves = tuple(
            dataclasses.replace(leaf, method=INFERRED) if leaf.path in inferred else leaf for leaf in report.leaves
        )
        strategy = report.reshard_strategy if not inferred else "Tunix's reshard_pytree (jax.device_put)"
        report = dataclasses.replace(report, leaves=leaves, method=METHOD, reshard_strategy=strategy)
    outcome = COMPLETED if error is None else REFUSED
    guard = (
        "the lab's P13 guard: explicit host<->device transfers disallowed (cpu devices)"
        if p13_sync_guarded(platform)
        else f"none: P13 guards only CPU devices, these are {platform}"
    )
    return TunixSync(
        outcome=outcome,
        guard=guard,
        error=error,
        report=report,
        global_steps_before=steps_before,
        global_steps_after=int(cluster.global_steps),
        rollout_unchanged=buffer_keys(destination) == rollout_before,
        anchor_repinned=anchor_after is not anchor_before,
        seconds=seconds,
        decision=observation(
            "P13",
            "sync: the actor's LoRA parameters if it has LoRA, else all parameters, to the engine",
            {
                "lora": lora,
                "global_steps": int(cluster.global_steps),
                "platform": platform,
                "guard": guard,
                "outcome": outcome,
            },
            outcome if error is None else f"{outcome}: {error}",
            ParamsBranch.LORA if lora else ParamsBranch.ALL,
        ),
    )


def _infer_transfers(source: dict[str, ShardFacts], destination: dict[str, jax.Array], log: TransferLog) -> set[str]:
    """Add to ``log`` the copies of leaves no lab reshard logged, inferred from shard boxes;
    returns the paths whose copies were inferred."""
    logged = {t.leaf for t in log.transfers}
    inferred = set()
    for path, src in source.items():
        if path in logged:
            continue
        dst, itemsize = destination[path], np.dtype(src.dtype).itemsize
        new = [
            (key[1], box) for (key, _), (_, box) in zip(shard_buffers(dst), shard_boxes(dst)) if key not in src.buffers
        ]
        if not new:
            continue
        inferred.add(path)
        for plan in plan_reshard(src.shape, list(src.boxes), new):
            for piece in plan.pieces:
                kind = "same_device" if piece.src_device == plan.device else "cross_device"
                log.transfers.append(Transfer(kind, piece.src_device, plan.device, piece.size() * itemsize, path))
    return inferred
