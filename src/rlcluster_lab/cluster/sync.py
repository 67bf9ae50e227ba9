"""P13: the weight sync. The actor's LoRA (or all) parameters go to the rollout engine, the
anchor is re-pinned, the global step advances; a ``SyncObserver`` measures it (L3)."""

from __future__ import annotations

import contextlib
import time

import jax
from flax import nnx

from rlcluster_lab.cluster.state import ClusterState
from rlcluster_lab.cluster.validate import check_finite_leaves
from rlcluster_lab.measure.sync import SyncObserver, SyncReport
from rlcluster_lab.placement.place import put_on_memory_kind
from rlcluster_lab.placement.reshard import reshard_strategy
from rlcluster_lab.rules.steps import p13_sync, p13_sync_guarded


def sync_weights(s: ClusterState) -> SyncReport:
    """P13: hand the actor's trainable (LoRA) or full parameters to the rollout engine.

    The sharing map is not consulted: the engine reshards onto its own copy's
    shardings, which moves nothing when that copy is the actor itself. Then
    the anchor is re-pinned and the global step advances. Returns what the
    handover and the re-pin really moved (L3).
    """
    placed = s.placed
    actor, engine = placed.actor, placed.engine
    check_finite_leaves(actor, "actor")  # all or nothing: refused before anything changes
    lora = placed.lora
    filter_types = sync_filter(lora)
    watch = SyncObserver()
    engine_model = engine.model()
    # All or nothing: the rollout's current arrays are kept until the new state, the
    # re-pinned anchor and the step count can all be committed together.
    previous = jax.tree.map(lambda x: x, nnx.state(engine_model, *filter_types))
    try:
        with sync_guard(s.platform), reshard_strategy(s.config.reshard):
            params = nnx.state(actor, *filter_types)
            watch.before(params)
            with watch.recording():
                # The handover alone is timed: the engine's update, until its arrays are ready.
                start = time.perf_counter()
                engine.update_params(params, filter_types)
                jax.block_until_ready(engine.held_values(filter_types))
                seconds = time.perf_counter() - start
            watch.after(nnx.state(engine_model, *filter_types), seconds)
            del params
            # P8: the actor's full state, or only its adapters with anchor='trainable' and LoRA.
            source = nnx.state(actor, nnx.LoRAParam) if s.anchor_is_partial else nnx.state(actor)
            start = time.perf_counter()
            anchor = put_on_memory_kind(source, "pinned_host")
            jax.block_until_ready(anchor)
            watch.anchor(anchor, source, time.perf_counter() - start)
            del source
    except BaseException as exc:
        nnx.update(engine_model, previous)
        exc.add_note(
            f"sync_weights did not finish: the rollout keeps the weights of global step {s.global_steps}, "
            "the anchor was not re-pinned and the step count did not advance."
        )
        raise
    placed.anchor = anchor
    s.trace.add(p13_sync(lora, s.global_steps + 1, s.platform, s.config.reshard))
    s.global_steps += 1
    return watch.report(
        lora=lora, anchor_mode="trainable" if s.anchor_is_partial else "full", global_step=s.global_steps
    )


def sync_filter(lora: bool) -> tuple[type[nnx.Variable], ...]:
    """P13: what a sync hands over: the LoRA adapters, or every parameter."""
    return (nnx.LoRAParam,) if lora else (nnx.Param,)


def sync_guard(platform: str) -> contextlib.AbstractContextManager:
    """P13: on CPU devices, explicit host<->device transfers are disallowed during a sync.

    ``platform`` is the cluster's own (its meshes' devices), not JAX's default
    backend: a cluster on simulated CPU devices beside a GPU is guarded.
    """
    if not p13_sync_guarded(platform):
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(jax.transfer_guard_device_to_host("disallow_explicit"))
    stack.enter_context(jax.transfer_guard_host_to_device("disallow_explicit"))
    return stack
