"""P13: the weight sync. The actor's LoRA (or all) parameters go to the rollout engine, the
anchor is re-pinned, the global step advances; a watch given by the caller measures it from
outside (``measure.sync.SyncObserver``, L3).

All or nothing, in one piece or in chunks (``ClusterConfig.sync_chunk_bytes``):

- In one piece, the rollout's old arrays are kept until the new state, the re-pinned anchor
  and the step count are committed together; a failure puts the very same arrays back (they
  are alive during the whole handover anyway, so keeping them costs no peak).
- In chunks, each chunk's old arrays are dropped once it is committed (that bounds the peak).
  A failure in a later chunk restores every synced leaf from the anchor snapshot, which holds
  exactly what the rollout was given at the last sync (P8), by a reshard onto the rollout's
  shardings: free while syncs succeed, and no second copy of the rollout anywhere. Where the
  anchor does not hold every synced leaf, the old arrays are kept as in one piece.

The anchor re-pin comes last and writes over the old anchor's buffers where nothing else holds
them (P8): a failure after that write commits the sync instead of undoing half of it, and says so.
A rollback writes only the rollout's own leaves: one it shares with the actor (P3 shared) holds
the actor's trained weights, which restoring would overwrite.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any, Protocol

import jax
from flax import nnx

from rlcluster_lab.cluster.state import ClusterState
from rlcluster_lab.cluster.validate import check_finite_leaves
from rlcluster_lab.core.states import model_state
from rlcluster_lab.engines.base import flat_values, leaf_path
from rlcluster_lab.model.lora import trained_params
from rlcluster_lab.placement.place import pin_anchor
from rlcluster_lab.placement.reshard import reshard_many
from rlcluster_lab.rules.steps import p13_sync, p13_sync_guarded, p13_sync_order


class SyncWatch(Protocol):
    """What watches a sync from outside (``measure.sync.SyncObserver``) and writes its report."""

    walk_seconds: float

    def start(self, keep: Any, replaced: Any, devices: Any, *, chunk_bytes: int | None, order: str) -> None: ...
    def before(self, params: Any) -> None: ...
    def recording(self) -> contextlib.AbstractContextManager[Any]: ...
    def after(self, destination: Any, seconds: float) -> None: ...
    def anchor(self, new: Any, old: Any, seconds: float) -> None: ...
    def end(self) -> None: ...
    def report(self, *, lora: bool, anchor_mode: str, global_step: int) -> Any: ...


def sync_weights(s: ClusterState, watch: SyncWatch) -> Any:
    """P13: hand the actor's trainable (LoRA) or full parameters to the rollout engine, re-pin the
    anchor, advance the global step; returns ``watch``'s report (L3). The sharing map is not
    consulted: the engine reshards onto its own copy's shardings, a no-op when that copy is the actor."""
    placed = s.placed
    actor, engine = placed.actor, placed.engine
    # Read once: the actor's Variables do not change in a sync, so the handover's source and
    # the anchor's are filtered from this one state.
    actor_state = model_state(actor)
    check_finite_leaves(actor_state, "actor")  # all or nothing: refused before anything changes
    lora = placed.lora
    filter_types = sync_filter(lora)
    engine_model = engine.model()
    old = engine.held_values(filter_types)
    own = _rollouts_own(engine, filter_types, old, actor_state.filter(*filter_types))
    # P8: whether the anchor holds every leaf a rollback may restore.
    covers = placed.anchor is not None and own.keys() <= flat_values(placed.anchor).keys()
    order = p13_sync_order(s.config.sync_chunk_bytes, s.config.offload_to_cpu, covers)
    watch.start(
        actor_state, (old, placed.anchor), s.contexts.devices(), chunk_bytes=order.chunk_bytes, order=order.text
    )
    # In chunks restored from the anchor only the paths are kept: each chunk's old arrays must go.
    previous, own_keys = (None if order.restore_from_anchor else own), frozenset(own)
    del old, own
    anchor = None
    try:
        # Under offload the reshard stages each piece to device memory itself (P14, ``order.offload``).
        with sync_guard(platform := s.contexts.platform()):
            params = actor_state.filter(*filter_types)
            watch.before(params)
            engine.sync_chunk_bytes = order.chunk_bytes  # P13's chunks (its strategy was set at construction)
            with watch.recording():
                # The handover alone is timed, the peak walk's own time left out.
                start = time.perf_counter()
                engine.update_params(params, filter_types)
                jax.block_until_ready(engine.held_values(filter_types))
                seconds = time.perf_counter() - start - watch.walk_seconds
            watch.after(model_state(engine_model, *filter_types), seconds)
            del params
            decision = p13_sync(lora, s.global_steps + 1, platform, s.config.reshard, order.chunk_bytes)
            # P8: the full state, or the adapters alone (anchor='trainable'), over the old anchor's buffers where free.
            source = actor_state.filter(nnx.LoRAParam) if s.anchor_is_partial else actor_state
            start = time.perf_counter()
            anchor = pin_anchor(source, placed.anchor)
            jax.block_until_ready(anchor)
            watch.anchor(anchor, source, time.perf_counter() - start)
    except BaseException as exc:
        # The old anchor's buffers were written over (donated to a re-pin): some of its arrays are deleted.
        consumed = placed.anchor is not None and any(x.is_deleted() for x in jax.tree.leaves(placed.anchor))
        if anchor is not None and consumed:
            # Past the point of no return (the old anchor's buffers hold the new snapshot): committed, not half undone.
            _commit(s, anchor, decision)
            exc.add_note(
                f"sync_weights finished before this error: the rollout holds the actor's weights, the anchor was "
                f"re-pinned over the old one and the global step is {s.global_steps}; only measuring it failed."
            )
            raise
        if consumed:  # the re-pin failed after taking the old anchor's buffers
            placed.anchor = None  # P10 then asks for a sync, which pins a new one
        _roll_back(s, filter_types, previous, own_keys, exc)
        raise
    finally:
        engine.sync_chunk_bytes = None
    _commit(s, anchor, decision)
    del previous, anchor, actor_state, source
    # Flax's flattening leaves reference cycles holding the replaced anchor's Variables: collected
    # here, the old anchor is released when the sync ends (as P13's peak counts it).
    gc.collect(1)
    watch.end()
    return watch.report(
        lora=lora, anchor_mode="trainable" if s.anchor_is_partial else "full", global_step=s.global_steps
    )


def _commit(s: ClusterState, anchor: Any, decision: Any) -> None:
    """The anchor, the trace and the step count change together, with nothing in between that can fail."""
    s.placed.anchor = anchor
    s.trace.add(decision)
    s.global_steps += 1


def _roll_back(
    s: ClusterState,
    filter_types: tuple[Any, ...],
    previous: dict[tuple[Any, ...], Any] | None,
    own: frozenset[tuple[Any, ...]],
    exc: BaseException,
) -> None:
    """Put the rollout's weights of the last sync back into its own leaves (see the module docstring)."""
    if not own:
        exc.add_note(
            "sync_weights did not finish: the rollout is the actor itself, so nothing was handed over and "
            "nothing was restored (the actor keeps its trained weights); the anchor was not re-pinned and the "
            f"step count did not advance (global step {s.global_steps})."
        )
        return
    how = "its old arrays" if previous is not None else "restored from the anchor snapshot"
    try:
        if previous is not None:
            s.placed.engine.assign(previous, filter_types)
        else:
            restore_from_anchor(s, filter_types, own)
    except BaseException as again:  # noqa: BLE001 - said in the note, the first error is raised
        exc.add_note(
            f"sync_weights did not finish, and restoring the rollout from the anchor failed too "
            f"({type(again).__name__}: {again}); rebuild the cluster."
        )
        return
    exc.add_note(
        f"sync_weights did not finish: the rollout keeps the weights of global step {s.global_steps} "
        f"({how}), the anchor was not re-pinned and the step count did not advance."
    )


def restore_from_anchor(s: ClusterState, filter_types: tuple[Any, ...], keys: Any) -> None:
    """The rollout's leaves ``keys`` set from the anchor (the weights of the last sync), in new buffers
    of the rollout's shardings and dtypes (device-to-device copies only, no host round-trip)."""
    anchor = flat_values(s.placed.anchor)
    targets = {k: t for k, t in s.placed.engine.held_targets(filter_types).items() if k in keys}
    new = reshard_many(
        [anchor[k] for k in targets],
        [t.sharding for t in targets.values()],
        copy=True,
        labels=list(map(leaf_path, targets)),
        dtypes=[t.dtype for t in targets.values()],
        strategy=s.config.reshard,
    )
    s.placed.engine.assign(dict(zip(targets, new)), filter_types)


def _rollouts_own(
    engine: Any, filter_types: tuple[Any, ...], held: list[Any], synced: nnx.State
) -> dict[tuple[Any, ...], Any]:
    """Path -> array of the synced leaves the rollout holds as arrays of its own, not the actor's
    very arrays (P3 shared), which a sync and a rollback leave as they are."""
    actors = flat_values(synced)
    return {k: x for k, x in zip(engine.held_targets(filter_types), held) if x is not actors.get(k)}


def sync_filter(lora: bool) -> tuple[type[nnx.Variable], ...]:
    """P13: what a sync hands over: the LoRA adapters, or every parameter."""
    return (trained_params(lora),)


def sync_guard(platform: str) -> contextlib.AbstractContextManager:
    """P13: on CPU devices, explicit host<->device transfers are disallowed during a sync
    (``platform``: the cluster's own, so CPU devices beside a GPU are guarded)."""
    if not p13_sync_guarded(platform):
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(jax.transfer_guard_device_to_host("disallow_explicit"))
    stack.enter_context(jax.transfer_guard_host_to_device("disallow_explicit"))
    return stack
