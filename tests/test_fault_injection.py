"""Faults injected into construction, the sync and every operation: nothing is lost.

Each test makes one part fail (an engine, ``update_params`` part-way, the anchor
re-pin, a KeyboardInterrupt inside an operation, another thread allocating during
a failing construction) and checks what the cluster promises: weights unchanged
where the operation failed, roles back in their memory kind, the step count
consistent, and no array that someone else owns deleted.
"""

from __future__ import annotations

import functools
import gc
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from engines_for_tests import RecordingEngine
from flax import nnx

from rlcluster_lab import (
    AvoidableCopyWarning,
    ClusterConfig,
    RLCluster,
    Role,
    RolloutConfig,
    TrainBatch,
    init_model,
    layout_meshes,
    place_model,
    with_lora,
)
from rlcluster_lab.cluster import operations
from rlcluster_lab.cluster import sync as sync_module
from rlcluster_lab.core.shardings import memory_kinds
from rlcluster_lab.measure.sync import SyncObserver
from rlcluster_lab.placement import events
from rlcluster_lab.placement.buffers import buffer_keys
from rlcluster_lab.placement.reshard import Batch

pytestmark = pytest.mark.cluster  # faults injected into live clusters

PROMPTS = ["abc", "hello world", "x", "rl"]


def leaves(model):
    return jax.tree.leaves(nnx.state(model))


def values(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def caller_models(layout: str, lora: bool):
    mesh = layout_meshes(layout)[Role.ACTOR]
    reference = place_model(init_model("tiny"), mesh)
    actor = with_lora(reference, 4, seed=1) if lora else place_model(reference, mesh, copy=True)
    return actor, reference


def build(actor, reference, *, layout="colocated", engine="vanilla", offload=False):
    cfg = ClusterConfig(
        role_to_mesh=layout_meshes(layout),
        rollout_config=RolloutConfig(max_tokens_to_generate=4, rollout_vllm_model_version="tiny"),
        rollout_engine=engine,
        offload_to_cpu=offload,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AvoidableCopyWarning)
        return RLCluster(actor=actor, reference=reference, cluster_config=cfg)


class FailingEngine(RecordingEngine):
    """Stores an array of its own in a list the test keeps, then raises."""

    kept: list = []

    def __init__(self, *args, **kwargs):
        FailingEngine.kept.append(jnp.arange(64.0))
        raise RuntimeError("engine failed on purpose")


# ---------------------------------------------------------------- construction


@pytest.mark.parametrize("lora", [False, True])
def test_failed_construction_with_offload_gives_the_callers_models_back(lora):
    actor, reference = caller_models("colocated", lora)
    before = {name: leaves(m) for name, m in (("actor", actor), ("reference", reference))}
    numbers = {name: [np.asarray(x) for x in ls] for name, ls in before.items()}
    with pytest.raises(RuntimeError, match="on purpose") as info:
        build(actor, reference, engine=FailingEngine, offload=True)
    assert "given back their own arrays" in "".join(getattr(info.value, "__notes__", []))
    for name, model in (("actor", actor), ("reference", reference)):
        now = leaves(model)
        # The same array objects (so the same buffers and memory kinds), none deleted.
        assert all(a is b for a, b in zip(now, before[name], strict=True)), name
        assert memory_kinds(nnx.state(model)) == ["device"], name
        assert all(np.array_equal(np.asarray(x), v) for x, v in zip(now, numbers[name], strict=True))
    if lora:
        # Still one backbone between the LoRA actor and its reference.
        frozen = jax.tree.leaves(nnx.state(actor, nnx.Not(nnx.LoRAParam)))
        assert all(a is b for a, b in zip(frozen, leaves(reference), strict=True))


def test_failed_construction_leaves_an_engines_own_arrays_alone():
    FailingEngine.kept.clear()
    actor, reference = caller_models("split", False)
    with pytest.raises(RuntimeError, match="on purpose"):
        build(actor, reference, layout="split", engine=FailingEngine)
    assert len(FailingEngine.kept) == 1
    assert not FailingEngine.kept[0].is_deleted()
    assert float(FailingEngine.kept[0].sum()) == sum(range(64))


def test_failed_construction_never_deletes_arrays_another_thread_makes():
    actor, reference = caller_models("split", True)
    made: list = []
    stop = threading.Event()

    def allocate():
        while not stop.is_set() and len(made) < 2000:
            made.append(jnp.full((8,), float(len(made))))

    class SlowFailingEngine(RecordingEngine):
        def __init__(self, *args, **kwargs):
            while len(made) < 20:  # construction is under way while the thread allocates
                threading.Event().wait(0.01)
            raise RuntimeError("engine failed on purpose")

    worker = threading.Thread(target=allocate)
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="on purpose"):
            build(actor, reference, layout="split", engine=SlowFailingEngine)
    finally:
        stop.set()
        worker.join()
    assert len(made) >= 20
    assert [x for x in made if x.is_deleted()] == []


def test_failed_construction_frees_what_it_made():
    actor, reference = caller_models("split", False)
    gc.collect()
    before = {id(x) for x in jax.live_arrays()}
    with pytest.raises(RuntimeError, match="on purpose"):
        build(actor, reference, layout="split", engine=functools.partial(RecordingEngine, fail=True))
    gc.collect()
    callers = buffer_keys(nnx.state(actor)) | buffer_keys(nnx.state(reference))
    # The engine's scratch array is not construction's to free, but it is no longer
    # reachable once the exception is gone; everything construction made is deleted.
    # (A per-shard view of the caller's own buffers, which JAX caches once a shard is
    # looked at, holds no memory of its own.)
    left = [
        x for x in jax.live_arrays() if id(x) not in before and not x.is_deleted() and not buffer_keys([x]) <= callers
    ]
    assert left == []


# ---------------------------------------------------------------- the sync


class TornEngine(RecordingEngine):
    """Sets the first leaf of a sync, then fails: a torn update unless the sync rolls back."""

    def update_params(self, params, filter_types=None):
        if filter_types is None:
            return super().update_params(params, filter_types)
        index = self._index(filter_types)
        variables = dict(zip(index.keys, index.variables))
        first_key = next(iter(variables))
        source = dict(nnx.to_flat_state(params))
        variables[first_key].set_value(-source[first_key].get_value())
        raise RuntimeError("update_params failed part-way")


def changed_actor(cluster):
    """Take one optimizer step so that a sync has something new to hand over."""
    out = cluster.generate(PROMPTS)
    p, comp = out.left_padded_prompt_tokens, out.tokens
    anchor = np.asarray(cluster.per_token_logps(Role.ACTOR, p, comp))
    cluster.update_actor(TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0], np.float32), anchor))


def test_sync_that_fails_part_way_leaves_the_previous_rollout():
    actor, reference = caller_models("split", False)
    c = build(actor, reference, layout="split", engine=TornEngine)
    changed_actor(c)
    rollout_before = leaves(c.rollout.model())
    anchor_before = c.anchor_policy_state
    with pytest.raises(RuntimeError, match="part-way") as info:
        c.sync_weights()
    assert "did not finish" in "".join(info.value.__notes__)
    assert all(a is b for a, b in zip(leaves(c.rollout.model()), rollout_before, strict=True))
    assert c.anchor_policy_state is anchor_before
    assert c.global_steps == 0


def test_sync_whose_anchor_repin_fails_rolls_the_rollout_back(monkeypatch):
    actor, reference = caller_models("split", False)
    c = build(actor, reference, layout="split")
    changed_actor(c)
    rollout_before = values(nnx.state(c.rollout.model()))
    anchor_before = c.anchor_policy_state

    def fail(*args, **kwargs):
        raise RuntimeError("no pinned host memory left")

    monkeypatch.setattr(sync_module, "pin_anchor", fail)
    with pytest.raises(RuntimeError, match="pinned host"):
        c.sync_weights()
    assert all(np.array_equal(a, b) for a, b in zip(values(nnx.state(c.rollout.model())), rollout_before, strict=True))
    assert c.anchor_policy_state is anchor_before and c.global_steps == 0
    monkeypatch.undo()
    report = c.sync_weights()  # and the next sync works
    assert c.global_steps == 1 and report.global_step == 1
    actor_values = values(nnx.state(c.actor_model, nnx.Param))
    assert all(
        np.array_equal(a, b) for a, b in zip(values(nnx.state(c.rollout.model(), nnx.Param)), actor_values, strict=True)
    )


@pytest.mark.cluster
def test_chunked_sync_that_fails_in_a_later_chunk_restores_the_earlier_ones(monkeypatch):
    """In chunks, each chunk's old arrays are dropped when it is committed; a failure in a
    later chunk restores every synced leaf from the anchor (the weights of the last sync)."""
    actor, reference = caller_models("reshaped", False)
    cfg = ClusterConfig(
        role_to_mesh=layout_meshes("reshaped"),
        rollout_config=RolloutConfig(max_tokens_to_generate=4),
        sync_chunk_bytes=160 << 10,  # the full tree in 3 chunks
    )
    c = RLCluster(actor=actor, reference=reference, cluster_config=cfg)
    changed_actor(c)
    rollout_before = values(nnx.state(c.rollout.model(), nnx.Param))
    anchor_before = c.pinned_anchor_state
    calls = []
    handover = Batch.run  # each chunk's reshard, as the sync's plan runs it

    def fail_third_chunk(self, xs, *args, **kwargs):
        calls.append(xs)
        if len(calls) == 3:
            # The first two chunks are the rollout's already: the actor's new weights.
            held = values(nnx.state(c.rollout.model(), nnx.Param))
            assert sum(not np.array_equal(a, b) for a, b in zip(held, rollout_before)) >= len(calls[0])
            raise RuntimeError("chunk 3 failed")
        return handover(self, xs, *args, **kwargs)

    monkeypatch.setattr(Batch, "run", fail_third_chunk)
    with pytest.raises(RuntimeError, match="chunk 3") as info:
        c.sync_weights()
    assert "restored from the anchor snapshot" in "".join(info.value.__notes__)
    restored = values(nnx.state(c.rollout.model(), nnx.Param))
    assert all(np.array_equal(a, b) for a, b in zip(restored, rollout_before, strict=True))
    assert c.pinned_anchor_state is anchor_before and c.global_steps == 0
    monkeypatch.undo()
    report = c.sync_weights()  # and the next sync works, in chunks
    assert report.peak.chunks > 2 and c.global_steps == 1
    actor_values = values(nnx.state(c.actor_model, nnx.Param))
    assert all(
        np.array_equal(a, b) for a, b in zip(values(nnx.state(c.rollout.model(), nnx.Param)), actor_values, strict=True)
    )


def _fail_on_commit(number: int, exc: type[BaseException]):
    """An ``events.emit`` that raises at the ``number``-th chunk commit of a handover."""
    seen = []
    emit = events.emit

    def wrapped(event):
        if event == events.Phase("commit"):
            seen.append(event)
            if len(seen) == number:
                raise exc(f"fault injected at chunk commit {number}")
        return emit(event)

    return wrapped


def _raise(exc: type[BaseException]):
    def fail(*args, **kwargs):
        raise exc("fault injected")

    return fail


# Where a sync can fail, from the handover's start to the last measurement before the commit:
# (name, what to patch, how many chunks it needs to be reached).
SYNC_FAULTS = {
    "handover starts": lambda c: (c.rollout, "update_params", _raise(KeyboardInterrupt)),
    "first chunk committed": lambda c: (events, "emit", _fail_on_commit(1, RuntimeError)),
    "second chunk committed": lambda c: (events, "emit", _fail_on_commit(2, KeyboardInterrupt)),
    "measured after the handover": lambda c: (SyncObserver, "after", _raise(RuntimeError)),
    "anchor re-pin": lambda c: (sync_module, "pin_anchor", _raise(KeyboardInterrupt)),
    "anchor measured": lambda c: (SyncObserver, "anchor", _raise(RuntimeError)),
}


@pytest.mark.parametrize(
    "layout, lora, chunk, offload",
    [
        (layout, lora, chunk, False)
        for layout in ("colocated", "reshaped", "split")
        for lora in (False, True)
        for chunk in (None, 16 << 10)
    ]
    + [("colocated", True, 16 << 10, True), ("split", False, 16 << 10, True)],
)
def test_a_failed_sync_at_any_phase_keeps_actor_optimizer_rollout_and_anchor(monkeypatch, layout, lora, chunk, offload):
    """A fault (an exception or Ctrl-C) at every phase of a sync, in one piece or in chunks: the
    actor keeps its trained weights (the rollout that *is* the actor is never restored over
    them), the optimizer state, the rollout, the anchor, the trace and the step count stay as
    they were, and the next sync works."""
    actor, reference = caller_models(layout, lora)
    cfg = ClusterConfig(
        role_to_mesh=layout_meshes(layout),
        rollout_config=RolloutConfig(max_tokens_to_generate=4),
        sync_chunk_bytes=chunk,
        offload_to_cpu=offload,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AvoidableCopyWarning)
        c = RLCluster(actor=actor, reference=reference, cluster_config=cfg)
    changed_actor(c)
    trained, optimizer = values(nnx.state(c.actor_model)), values(c.optimizer_state)
    rollout, anchor = values(nnx.state(c.rollout.model())), c.pinned_anchor_state
    decisions = len(c.trace)
    for name, fault in SYNC_FAULTS.items():
        if name == "second chunk committed" and chunk is None:
            continue
        with monkeypatch.context() as patch:
            patch.setattr(*fault(c))
            with pytest.raises((RuntimeError, KeyboardInterrupt), match="fault injected") as info:
                c.sync_weights()
        assert "did not finish" in "".join(getattr(info.value, "__notes__", [])), name
        assert all(map(np.array_equal, values(nnx.state(c.actor_model)), trained)), f"actor changed ({name})"
        assert all(map(np.array_equal, values(c.optimizer_state), optimizer)), f"optimizer changed ({name})"
        assert all(map(np.array_equal, values(nnx.state(c.rollout.model())), rollout)), f"rollout changed ({name})"
        assert c.pinned_anchor_state is anchor and c.global_steps == 0 and len(c.trace) == decisions, name
    c.sync_weights()
    assert c.global_steps == 1
    synced = sync_module.sync_filter(lora)
    assert all(
        map(np.array_equal, values(nnx.state(c.rollout.model(), *synced)), values(nnx.state(c.actor_model, *synced)))
    )
    assert all(map(np.array_equal, values(nnx.state(c.actor_model)), trained))


def test_sync_refuses_an_actor_holding_a_nan_and_changes_nothing():
    """A NaN written into an actor leaf by user code was copied into the rollout and the anchor."""
    actor, reference = caller_models("split", False)
    c = build(actor, reference, layout="split")
    rollout_before = values(nnx.state(c.rollout.model()))
    anchor_before = c.anchor_policy_state
    kernel = c.actor_model.blocks.attn.o.kernel
    kernel.set_value(kernel.get_value().at[1, 3, 4].set(jnp.inf))
    with pytest.raises(ValueError, match=r"actor holds NaN or infinite values in 1 leaf.*blocks/attn/o/kernel"):
        c.sync_weights()
    assert all(np.array_equal(a, b) for a, b in zip(values(nnx.state(c.rollout.model())), rollout_before, strict=True))
    assert c.anchor_policy_state is anchor_before and c.global_steps == 0


# ---------------------------------------------------------------- offload under interrupts


@pytest.fixture(scope="module")
def offloaded():
    actor, reference = caller_models("colocated", True)
    return build(actor, reference, offload=True)


def all_pinned(c) -> bool:
    kinds = {tuple(memory_kinds(nnx.state(m))) for m in c.models().values()}
    return kinds == {("pinned_host",)} and memory_kinds(c.optimizer_state) == ["pinned_host"]


def test_interrupted_generate_offloads_again(offloaded, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(offloaded.rollout, "generate", interrupt)
    with pytest.raises(KeyboardInterrupt):
        offloaded.generate(PROMPTS)
    assert all_pinned(offloaded)


def test_failed_log_probs_offload_again(offloaded, monkeypatch):
    p = np.full((2, 3), 65, np.int32)

    def fail(*args, **kwargs):
        raise RuntimeError("log-probs failed")

    monkeypatch.setattr(operations, "logps_from_state", fail)
    for role in (Role.REFERENCE, Role.ACTOR):
        with pytest.raises(RuntimeError, match="log-probs failed"):
            offloaded.per_token_logps(role, p, p)
        assert all_pinned(offloaded)


def test_interrupted_update_actor_offloads_again_and_keeps_the_weights(offloaded):
    out = offloaded.generate(PROMPTS)
    p, comp = out.left_padded_prompt_tokens, out.tokens
    anchor = np.asarray(offloaded.per_token_logps(Role.ACTOR, p, comp))
    weights = values(nnx.state(offloaded.actor_model))
    optimizer = values(offloaded.optimizer_state)

    def interrupt(iteration, rows, live_logps):
        raise KeyboardInterrupt

    batch = TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0], np.float32), anchor)
    with pytest.raises(KeyboardInterrupt):
        offloaded.update_actor(batch, on_step=interrupt)
    assert all_pinned(offloaded)
    assert all(np.array_equal(a, b) for a, b in zip(values(nnx.state(offloaded.actor_model)), weights, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(values(offloaded.optimizer_state), optimizer, strict=True))


# ---------------------------------------------------------------- inputs of the wrong kind


def test_inputs_of_the_wrong_kind_get_clear_errors():
    from rlcluster_lab import ConfigError

    r2m = layout_meshes("colocated")
    actor = init_model("tiny")
    with pytest.raises(ConfigError, match="role_to_mesh must be a dict from Role"):
        ClusterConfig(role_to_mesh=list(r2m.values()))
    with pytest.raises(ConfigError, match="role_to_mesh: unknown role 'policy'"):
        ClusterConfig(role_to_mesh={"policy": r2m[Role.ACTOR], **r2m})
    with pytest.raises(ConfigError, match="cluster_config must be a ClusterConfig, got dict"):
        RLCluster(actor=actor, cluster_config={"role_to_mesh": r2m})
    with pytest.raises(ConfigError, match="actor is required"):
        RLCluster(actor=None, cluster_config=ClusterConfig(role_to_mesh=r2m))
    with pytest.raises(ConfigError, match="reward must be a score model.*got TransformerLM"):
        RLCluster(actor=actor, reward=init_model("tiny"), cluster_config=ClusterConfig(role_to_mesh=r2m))
    with pytest.raises(ConfigError, match="offload_to_cpu must be True or False"):
        ClusterConfig(role_to_mesh=r2m, offload_to_cpu="yes")
