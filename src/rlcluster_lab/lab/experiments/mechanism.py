"""The mechanism behind notebooks 01-04, made visible: the decisions the sharing map takes
without any model, the buffers an own-copy engine holds, which mesh each operation entered,
and the anchor guard (P10), which no public call reaches. Each function reads what a cluster
built through ``build_cluster`` recorded or holds; nothing here takes a decision of its own.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from rlcluster_lab.app.learner import group_advantages, lowercase_reward
from rlcluster_lab.app.report import placement_report
from rlcluster_lab.app.scenario import Scenario, build_cluster
from rlcluster_lab.cluster import operations
from rlcluster_lab.cluster.contexts import context_rows
from rlcluster_lab.core.trace import Decision
from rlcluster_lab.lab.experiments.runs import sharing_map_of
from rlcluster_lab.lab.experiments.step_phases import EVEN_PROMPTS
from rlcluster_lab.lab.notebook.setup import LabDevices, layout_devices
from rlcluster_lab.placement.buffers import buffer_keys
from rlcluster_lab.training.batch import TrainBatch

# --------------------------------------------------------------------------- 01: the sharing map


def sharing_decisions(devices: Sequence[jax.Device], layout: str, *, lora: bool) -> list[Decision]:
    """P1, P2 and P2's propagation for a layout, with no model built: the map reads only the
    meshes and two facts about the models (a LoRA actor, a reference given as a module)."""
    return sharing_map_of(devices, layout, lora=lora)[1]


# --------------------------------------------------------------------------- 02: P3's three branches

# (layout, engine): one case per P3 branch, and both engines that own their copy.
P3_CASES: tuple[tuple[str, str], ...] = (
    ("colocated", "vanilla"),
    ("split", "vanilla"),
    ("split", "vllm"),
    ("split", "sglang_jax"),
)


def p3_branch_rows(
    devices: LabDevices | Sequence[jax.Device], cases: Sequence[tuple[str, str]] = P3_CASES
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """P3's branches, measured on the live buffers: for each (layout, engine), whether the
    rollout model is the actor object, how many of the rollout's device buffers are the
    actor's, and the bytes the memory report finds actor and rollout holding in common.

    Returns:
        The rows, and each case's placement report (JSON), keyed ``"layout, engine"``.
    """
    rows, reports = [], {}
    for layout, engine in cases:
        cluster = build_cluster(Scenario(layout=layout, engine=engine), devices=layout_devices(devices, layout))
        report = placement_report(cluster).to_json()
        rollout = cluster.rollout.model()
        actor_keys = buffer_keys(nnx.state(cluster.actor_model))
        rollout_keys = buffer_keys(nnx.state(rollout))
        common = sum(g["bytes"] for g in report["memory"]["shared"] if {"actor", "rollout"} <= set(g["roles"]))
        rows.append(
            {
                "layout": layout,
                "engine": engine,
                "P3 branch": report["rollout_branch"],
                "rollout model is the actor": rollout is cluster.actor_model,
                "rollout buffers": len(rollout_keys),
                "of them the actor's": len(rollout_keys & actor_keys),
                "bytes shared with actor": common,
                "rollout bytes": report["memory"]["by_role"]["rollout"]["bytes"],
            }
        )
        reports[f"{layout}, {engine}"] = report
        del cluster, rollout
        gc.collect()
    return rows, reports


# --------------------------------------------------------------------------- 04: meshes entered, the P10 guard


def operation_meshes(devices: Sequence[jax.Device]) -> dict[str, Any]:
    """One RL step on the split layout, whose actor and rollout meshes differ, then the cluster's own
    record of the role contexts the step's operations entered (``contexts_entered``).

    Returns:
        ``rows``: operation, role, the mesh JAX had current inside, whether it is the role's;
        ``construction``: the same for what construction entered; ``sync_entries``: how many
        entries ``sync_weights`` added.
    """
    cluster = build_cluster(Scenario(layout="split", max_tokens=8), devices=devices)
    built = len(cluster.contexts_entered)
    prompts = list(EVEN_PROMPTS[:4])
    cluster.build_ahead(prompts)  # the step's later programs compile while it samples (on twins: no context here)
    out = cluster.generate(prompts)
    p, c = out.left_padded_prompt_tokens, out.tokens
    old = np.asarray(cluster.get_actor_per_token_logps(p, c))
    ref = np.asarray(cluster.get_ref_per_token_logps(p, c))
    advantages = group_advantages(lowercase_reward(prompts, out.text), len(prompts))
    cluster.update_actor(TrainBatch(p, c, advantages, old, ref))
    before_sync = len(cluster.contexts_entered)
    cluster.sync_weights()
    entries = cluster.contexts_entered
    result = {
        "rows": context_rows(entries[built:before_sync]),
        "construction": context_rows(entries[:built]),
        "sync_entries": len(entries) - before_sync,
    }
    del cluster
    gc.collect()
    return result


def p10_guard(devices: Sequence[jax.Device]) -> list[dict[str, str]]:
    """The anchor guard (P10), which no public call can reach.

    Construction pins the anchor (P8) before it returns, so on a constructed cluster the
    actor's log-probs can be read before any sync; a construction that raised returns no
    cluster at all, and a sync only replaces the anchor. To show the guard's line run at all,
    the last row removes the anchor by hand, from a copy of the cluster's state, and calls
    the actor's log-probs operation (``cluster.operations.anchor_logps``, what
    ``get_actor_per_token_logps`` runs) on it. The cluster itself is not touched.

    Returns:
        One row per step: what was done, and what the cluster answered.
    """
    cluster = build_cluster(Scenario(layout="colocated", max_tokens=8), devices=devices)
    pinned = "yes" if cluster.pinned_anchor_state is not None else "no"
    said = f"global_steps={cluster.global_steps}, anchor pinned: {pinned} (P8 at construction)"
    rows = [{"step": "just constructed", "result": said}]
    out = cluster.generate(list(EVEN_PROMPTS[:4]))
    p, c = out.left_padded_prompt_tokens, out.tokens
    logps = np.asarray(cluster.get_actor_per_token_logps(p, c))
    agree = bool(np.abs(logps - out.logprobs).max() < 1e-4)
    said = f"shape {logps.shape}, equal to the sampler's within 1e-4: {'yes' if agree else 'no'}"
    rows.append({"step": "actor log-probs before any sync", "result": said})
    state = cluster.state
    no_anchor = dataclasses.replace(state, placed=dataclasses.replace(state.placed, anchor=None))
    try:  # a state no public call leaves: the anchor removed by hand
        operations.anchor_logps(no_anchor, p, c, None)
        answer = "(no error: the guard did not fire)"
    except ValueError as exc:
        answer = f"{type(exc).__name__}: {exc}"
    rows.append({"step": "the same call, anchor removed by hand", "result": answer})
    del cluster
    gc.collect()
    return rows
