"""P13: the weight sync. The actor's LoRA (or all) parameters go to the rollout engine, the
anchor is re-pinned, the global step advances; a ``SyncObserver`` measures it (L3)."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import jax
from flax import nnx

from rlcluster_lab.cluster.validate import check_finite_leaves
from rlcluster_lab.engines.base import flat_values, reshard_flat
from rlcluster_lab.measure.sync import SyncObserver, SyncReport
from rlcluster_lab.model import is_lora
from rlcluster_lab.placement.place import put_on_memory_kind
from rlcluster_lab.placement.reshard import reshard_strategy
from rlcluster_lab.rules.steps import p13_sync, p13_sync_guarded

if TYPE_CHECKING:
    from rlcluster_lab.cluster.cluster import RLCluster


def sync_weights(c: RLCluster) -> SyncReport:
    """P13: hand the actor's trainable (LoRA) or full parameters to the rollout engine.

    The sharing map is not consulted: the engine reshards onto its own copy's
    shardings, which moves nothing when that copy is the actor itself. Then
    the anchor is re-pinned and the global step advances. Returns what the
    handover and the re-pin really moved (L3).
    """
    c._require_constructed()
    actor = c.actor_model
    check_finite_leaves(actor, "actor")  # all or nothing: refused before anything changes
    lora = is_lora(actor)
    filter_types = (nnx.LoRAParam,) if lora else (nnx.Param,)
    watch = SyncObserver()
    engine_model = c.rollout.model()
    # All or nothing: the rollout's current arrays are kept until the new state, the
    # re-pinned anchor and the step count can all be committed together.
    previous = jax.tree.map(lambda x: x, nnx.state(engine_model, *filter_types))
    try:
        with sync_guard(c.platform), reshard_strategy(c.cluster_config.reshard):
            params = nnx.state(actor, *filter_types)
            watch.before(params)
            with watch.recording():
                # The handover alone is timed: the engine's update, until its arrays are ready.
                start = time.perf_counter()
                c.rollout.update_params(params, filter_types)
                jax.block_until_ready(c.rollout.held_values(filter_types))
                seconds = time.perf_counter() - start
            watch.after(nnx.state(engine_model, *filter_types), seconds)
            del params
            source = _anchor_source(c)
            start = time.perf_counter()
            anchor = put_on_memory_kind(source, "pinned_host")
            jax.block_until_ready(anchor)
            watch.anchor(anchor, source, time.perf_counter() - start)
            del source
    except BaseException as exc:
        nnx.update(engine_model, previous)
        exc.add_note(
            f"sync_weights did not finish: the rollout keeps the weights of global step {c.global_steps}, "
            "the anchor was not re-pinned and the step count did not advance."
        )
        raise
    c._anchor_policy_state = anchor
    c.trace.add(p13_sync(lora, c.global_steps + 1, c.platform, c.cluster_config.reshard))
    c.global_steps += 1
    return watch.report(
        lora=lora, anchor_mode="trainable" if c._anchor_is_partial else "full", global_step=c.global_steps
    )


def rehearse_sync(c: RLCluster, lora: bool) -> None:
    """The sync's reshard into new buffers that are dropped: compiles its programs, changes nothing."""
    filter_types = (nnx.LoRAParam,) if lora else (nnx.Param,)
    with sync_guard(c.platform), reshard_strategy(c.cluster_config.reshard):
        params = flat_values(nnx.state(c.actor_model, *filter_types))
        dst = flat_values(nnx.state(c.rollout.model(), *filter_types))
        reshard_flat(params, dst, copy=c.rollout.owns_weights)


def _anchor_source(c: RLCluster) -> nnx.State:
    """P8: the actor's full state, or only its adapters with anchor='trainable' and LoRA."""
    if c._anchor_is_partial:
        return nnx.state(c.actor_model, nnx.LoRAParam)
    return nnx.state(c.actor_model)


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
