"""What a worker runs: the same cluster code in every process, then process 0 merges the reports.

A job is JSON (it travels to the workers as a file)::

    {"kind": "reports", "scenarios": [{knobs of a Scenario}, ...], "syncs": 1, "exercise": [false, ...]}

For each scenario every process builds the cluster over all processes' devices, optionally
exercises it, runs ``syncs`` weight syncs (the report keeps the last) and exchanges its report.
"""

from __future__ import annotations

import gc
import socket
import time
from collections.abc import Callable
from typing import Any

PROMPTS = ("the cluster", "weights cross hosts")


def run_job(job: dict[str, Any], progress: Callable[[str], None]) -> dict[str, Any]:
    """Run ``job`` in this process; returns this process's result (process 0's holds the merged reports)."""
    if job.get("kind") != "reports":
        raise ValueError(f"unknown job kind {job.get('kind')!r}; this worker runs 'reports'")
    import jax

    from rlcluster_lab.core.options import Scenario

    scenarios = [Scenario(**knobs) for knobs in job["scenarios"]]
    reports = []
    for n, (scenario, ops) in enumerate(zip(scenarios, job.get("exercise") or [False] * len(scenarios)), start=1):
        engine = "" if scenario.engine == "vanilla" else f", {scenario.engine}"
        label = f"scenario {n}/{len(scenarios)} ({scenario.layout}{', LoRA' if scenario.lora else ''}{engine})"
        reports.append(run_scenario(scenario, int(job.get("syncs", 0)), bool(ops), label, progress))
        gc.collect()
    return {"process_index": jax.process_index(), "reports": reports}


def run_scenario(
    scenario: Any, syncs: int, exercise: bool, label: str, progress: Callable[[str], None]
) -> dict[str, Any] | None:
    """One scenario on every process; process 0 returns the merged report, the others None."""
    import jax
    from flax import nnx

    from rlcluster_lab.app.report import placement_report
    from rlcluster_lab.app.scenario import build_cluster
    from rlcluster_lab.cluster.sync import sync_filter
    from rlcluster_lab.core.gathering import exchange
    from rlcluster_lab.measure.sync import flat_leaves
    from rlcluster_lab.multiprocess.report import crossing_facts, merge_reports

    start = time.perf_counter()
    cluster = build_cluster(scenario)
    seconds = {"build": time.perf_counter() - start}
    progress(f"{label}: built in {seconds['build']:.1f} s")
    checks = exercise_cluster(cluster, seconds, progress, label) if exercise else None
    sync_report = crossing = None
    if syncs:
        filters = sync_filter(cluster.trainable_is_lora)
        for _ in range(syncs):
            sync_report = cluster.sync_weights()
            progress(f"{label}: synced ({sync_report.seconds * 1e3:.1f} ms handover)")
        seconds["sync"] = sync_report.seconds
        actor, rollout = (flat_leaves(nnx.state(m, *filters)) for m in (cluster.actor_model, cluster.rollout.model()))
        crossing = crossing_facts(actor, rollout, sync_report)
        if exercise:
            checks.update(after_sync(cluster, checks, seconds))  # type: ignore[union-attr]
    report = placement_report(cluster, sync=sync_report).to_json()
    report["process"] = {
        "index": jax.process_index(),
        "device_ids": [int(d.id) for d in jax.local_devices()],
        "host": socket.gethostname(),
    }
    report["crossing"] = crossing
    report["seconds"] = seconds
    if checks is not None:
        report["exercise"] = checks
    everyone = exchange(report, "placement report")
    progress(f"{label}: reports gathered")
    del cluster
    if jax.process_index() != 0:
        return None
    merged = merge_reports(everyone)
    merged["seconds_by_process"] = [r["seconds"] for r in everyone]
    if exercise:
        merged["exercise_by_process"] = [r["exercise"] for r in everyone]
    return merged


def exercise_cluster(
    cluster: Any, seconds: dict[str, float], progress: Callable[[str], None], label: str
) -> dict[str, Any]:
    """Every operation once, on every process; returns the sampled tokens, the step's metrics, and how
    far the sampler's log-probs are from the rollout's, the anchor's and (after the step) the live actor's."""
    import numpy as np

    from rlcluster_lab.core.gathering import host_values, stored_facts
    from rlcluster_lab.training.batch import TrainBatch

    start = time.perf_counter()
    out = cluster.generate(list(PROMPTS))
    seconds["generate"] = time.perf_counter() - start
    prompts, tokens = out.left_padded_prompt_tokens, out.tokens
    start = time.perf_counter()
    scorers = (cluster.get_ref_per_token_logps, cluster.get_old_per_token_logps, cluster.get_actor_per_token_logps)
    ref, old, anchor = host_values([score(prompts, tokens) for score in scorers])
    seconds["log_probs"] = time.perf_counter() - start
    progress(f"{label}: generated and scored")
    advantages = np.linspace(-1.0, 1.0, len(prompts), dtype=np.float32)
    start = time.perf_counter()
    metrics = cluster.update_actor(TrainBatch(prompts, tokens, advantages, anchor, ref))
    seconds["update"] = time.perf_counter() - start
    progress(f"{label}: one optimizer step")
    (trained,) = host_values([cluster.get_live_actor_per_token_logps(prompts, tokens)])
    return {
        "finite_flags": finiteness_across_processes(),
        "stored_facts": stored_facts(),
        "tokens": np.asarray(tokens).tolist(),
        "metrics": metrics,
        "sampler_vs_rollout": float(np.max(np.abs(out.logprobs - old))),
        "anchor_vs_rollout": float(np.max(np.abs(anchor - old))),
        # The step changed the actor: its log-probs now differ from those scored before the step.
        "step_changed_log_probs": float(np.max(np.abs(trained - old))),
        "prompts": prompts.tolist(),
    }


def after_sync(cluster: Any, checks: dict[str, Any], seconds: dict[str, float]) -> dict[str, Any]:
    """After the step and the sync: the rollout scores with the weights the actor trained to."""
    import numpy as np

    from rlcluster_lab.core.gathering import host_values

    prompts = np.asarray(checks["prompts"], np.int32)
    tokens = np.asarray(checks["tokens"], np.int32)
    start = time.perf_counter()
    scorers = (cluster.get_old_per_token_logps, cluster.get_live_actor_per_token_logps)
    rollout, live = host_values([score(prompts, tokens) for score in scorers])
    seconds["log_probs_after_sync"] = time.perf_counter() - start
    return {"rollout_vs_trained_actor_after_sync": float(np.max(np.abs(rollout - live)))}


def finiteness_across_processes() -> dict[str, Any]:
    """The sync's NaN check (``training.step.finite_flags``) over arrays spanning every process, in
    device and pinned host memory, each finite or holding one NaN on a block only the last process
    holds: the flags every process finds, and how many programs the check compiled."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from rlcluster_lab.core.compile_cache import count_compilations
    from rlcluster_lab.training.step import finite_flags

    grid = np.array([[d for d in jax.devices() if d.process_index == p] for p in range(jax.process_count())])
    mesh = Mesh(grid, ("processes", "devices"))
    good = np.ones((2 * grid.shape[0], grid.shape[1]), np.float32)
    bad = good.copy()
    bad[-1, -1] = np.nan
    arrays = [
        jax.make_array_from_callback(
            v.shape,
            NamedSharding(mesh, PartitionSpec("processes", "devices"), memory_kind=kind),
            lambda index, v=v: v[index],
        )
        for kind in ("device", "pinned_host")
        for v in (good, bad)
    ]
    with count_compilations() as built:
        flags = finite_flags(arrays)
    return {"flags": flags, "programs_built": len(built)}
