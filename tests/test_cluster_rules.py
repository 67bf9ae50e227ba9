"""Rules P3-P15 on a live cluster, one behaviour per test."""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from engines_for_tests import HostTouchingEngine, RecordingEngine, exposing
from flax import nnx

from rlcluster_lab import (
    AvoidableCopyWarning,
    ClusterConfig,
    ConfigError,
    NotConstructedError,
    RLCluster,
    RLEngine,
    Role,
    RolloutConfig,
    RolloutEngine,
    Scenario,
    TrainBatch,
    TrainingConfig,
    build_cluster,
    init_model,
    layout_meshes,
    make_mesh,
    place_model,
    with_lora,
)
from rlcluster_lab.cluster import operations
from rlcluster_lab.core.config import Mode
from rlcluster_lab.core.shardings import PlacementError, memory_kinds
from rlcluster_lab.placement.buffers import buffer_keys, sharing_backbone
from rlcluster_lab.rules.reference import P4UnlinkedValues

pytestmark = pytest.mark.cluster  # the rules observed on live clusters (construction errors included)

PROMPTS = ["abc", "hello world", "x", "rl"]


def models_on(mesh, *, lora: bool, separate_base: bool = False, size: str = "tiny"):
    reference = place_model(init_model(size), mesh)
    if lora:
        base = place_model(reference, mesh, copy=True) if separate_base else reference
        return with_lora(base, 4, seed=1), reference
    return place_model(reference, mesh, copy=True), reference


def cluster_for(
    layout="colocated",
    *,
    lora=False,
    engine="vanilla",
    offload=False,
    rollout=None,
    separate_base=False,
    training=None,
    role_to_mesh=None,
):
    r2m = role_to_mesh or layout_meshes(layout)
    actor, reference = models_on(r2m[Role.ACTOR], lora=lora, separate_base=separate_base)
    cfg = ClusterConfig(
        role_to_mesh=r2m,
        rollout_config=rollout or RolloutConfig(max_tokens_to_generate=6, rollout_vllm_model_version="tiny"),
        rollout_engine=engine,
        offload_to_cpu=offload,
        training_config=training or TrainingConfig(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AvoidableCopyWarning)
        return RLCluster(actor=actor, reference=reference, cluster_config=cfg)


def a_batch(cluster):
    out = cluster.generate(PROMPTS)
    return out, out.left_padded_prompt_tokens, out.tokens


def values(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


# ---------------------------------------------------------------- P3


def test_p3_linked_rollout_is_the_actor_object():
    c = cluster_for("colocated")
    assert c.rollout_branch == "shared"
    assert c.rollout.model() is c.actor_model
    assert c.trace.by_rule("P3")[0].values.rollout_linked_to_actor is True


def test_p3_vanilla_unlinked_loads_second_copy_on_rollout_mesh():
    c = cluster_for("split")
    assert c.rollout_branch == "second_copy"
    rollout = c.rollout.model()
    assert rollout is not c.actor_model
    assert not (buffer_keys(nnx.state(rollout)) & buffer_keys(nnx.state(c.actor_model)))
    rollout_devices = {d.id for x in jax.tree.leaves(nnx.state(rollout)) for d in x.sharding.device_set}
    assert rollout_devices == {4, 5, 6, 7}
    for a, b in zip(values(nnx.state(rollout)), values(nnx.state(c.actor_model))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", ["bfloat16", jnp.bfloat16])
def test_p3_second_copy_cast_to_rollout_dtype(dtype):
    c = cluster_for("reshaped", rollout=RolloutConfig(max_tokens_to_generate=4, data_type=dtype))
    assert {x.dtype for x in jax.tree.leaves(nnx.state(c.rollout.model()))} == {jnp.dtype("bfloat16")}
    assert {x.dtype for x in jax.tree.leaves(nnx.state(c.actor_model))} == {jnp.dtype("float32")}
    assert "cast to bfloat16" in c.trace.by_rule("P3")[0].outcome


def test_p3_other_engine_gets_the_trainer_model_as_initial_value():
    c = cluster_for("split", engine=RecordingEngine)
    assert c.rollout_branch == "engine_initial_value"
    assert c.rollout.received is c.actor_model


# ---------------------------------------------------------------- P4


def test_p4_separate_base_warns_avoidable_copy():
    r2m = layout_meshes("colocated")
    actor, reference = models_on(r2m[Role.ACTOR], lora=True, separate_base=True)
    cfg = ClusterConfig(role_to_mesh=r2m)
    with pytest.warns(AvoidableCopyWarning, match="avoidable copy"):
        c = RLCluster(actor=actor, reference=reference, cluster_config=cfg)
    assert not sharing_backbone(c.reference_model, c.actor_model)
    assert c.trace.by_rule("P4")[0].values.shares_buffers is False


def test_p4_shared_base_does_not_warn():
    r2m = layout_meshes("colocated")
    actor, reference = models_on(r2m[Role.ACTOR], lora=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AvoidableCopyWarning)
        c = RLCluster(actor=actor, reference=reference, cluster_config=ClusterConfig(role_to_mesh=r2m))
    assert sharing_backbone(c.reference_model, c.actor_model)
    assert not c.warnings


def test_p4_unlinked_reference_is_not_checked():
    c = cluster_for("colocated", lora=False)
    assert c.trace.by_rule("P4")[0].values == P4UnlinkedValues(linked=False)


# ---------------------------------------------------------------- P5


def test_p5_model_on_target_mesh_is_kept_as_is():
    r2m = layout_meshes("colocated")
    actor, reference = models_on(r2m[Role.ACTOR], lora=False)
    c = RLCluster(actor=actor, reference=reference, cluster_config=ClusterConfig(role_to_mesh=r2m))
    assert c.reference_model is reference
    assert c.actor_model is actor
    assert [d.outcome for d in c.trace.by_rule("P5")][:1] == ["kept as is"]


def test_p5_model_on_other_mesh_is_resharded_with_its_own_specs():
    r2m = layout_meshes("split")
    other = make_mesh(jax.devices()[4:], (4, 1))
    actor = place_model(init_model("tiny"), other)
    c = RLCluster(actor=actor, cluster_config=ClusterConfig(role_to_mesh=r2m))
    kernel = c.actor_model.blocks.attn.q.kernel.get_value()
    assert kernel.sharding.mesh == r2m[Role.ACTOR]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tp")
    assert c.actor_model is not actor


def test_p5_reshard_keeps_pinned_host_memory_kind():
    r2m = layout_meshes("split")
    other = make_mesh(jax.devices()[4:], (2, 2))
    actor = place_model(init_model("tiny"), other, memory_kind="pinned_host")
    c = RLCluster(actor=actor, cluster_config=ClusterConfig(role_to_mesh=r2m))
    assert memory_kinds(nnx.state(c.actor_model)) == ["pinned_host"]
    assert "pinned_host" in c.trace.by_rule("P5")[0].outcome


def test_p5_leaf_without_spec_is_replicated():
    r2m = layout_meshes("colocated")
    actor = init_model("tiny")
    actor.extra = nnx.Param(jnp.arange(8.0))  # no partition metadata at all
    assert "out_sharding" not in actor.extra.get_metadata()
    c = RLCluster(actor=actor, cluster_config=ClusterConfig(role_to_mesh=r2m))
    placed = c.actor_model.extra.get_value()
    assert placed.sharding.is_fully_replicated
    assert len(placed.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(placed), np.arange(8.0))


def test_p5_mesh_without_model_axes_is_a_clear_error():
    devices = np.array(jax.devices()).reshape(2, 4)
    mesh = jax.sharding.Mesh(devices, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    cfg = ClusterConfig(role_to_mesh={Role.ACTOR: mesh, Role.ROLLOUT: mesh})
    with pytest.raises(PlacementError, match="does not have.*role_to_logical_axis_rule"):
        RLCluster(actor=init_model("tiny"), cluster_config=cfg)


def test_p5_logical_rules_map_onto_other_axis_names():
    devices = np.array(jax.devices()).reshape(2, 4)
    mesh = jax.sharding.Mesh(devices, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rules = (("embed", "data"), ("vocab", "model"), ("q_heads", "model"), ("kv_heads", "model"), ("mlp", "model"))
    cfg = ClusterConfig(
        role_to_mesh={Role.ACTOR: mesh, Role.ROLLOUT: mesh},
        training_config=TrainingConfig(role_to_logical_axis_rule={Role.ACTOR: rules, Role.ROLLOUT: rules}),
    )
    c = RLCluster(actor=init_model("tiny"), cluster_config=cfg)
    assert c.actor_model.blocks.mlp.up.kernel.get_value().sharding.spec == jax.sharding.PartitionSpec(
        None, "data", "model"
    )
    assert len(c.generate(["hi"]).text) == 1


# ---------------------------------------------------------------- P6 (through the cluster)


def test_p6_missing_rollout_config():
    cfg = ClusterConfig(role_to_mesh=layout_meshes("colocated"), rollout_config=None)
    with pytest.raises(ConfigError, match="rollout_config is None"):
        RLCluster(actor=init_model("tiny"), cluster_config=cfg)


def test_p6_per_mode_dict_without_train():
    cfg = ClusterConfig(role_to_mesh=layout_meshes("colocated"), rollout_config={Mode.EVAL: RolloutConfig()})
    with pytest.raises(ConfigError, match="without a Mode.TRAIN entry"):
        RLCluster(actor=init_model("tiny"), cluster_config=cfg)


def test_p6_per_mode_dict_with_train_works_and_sizes_cache_from_the_largest():
    cfg = ClusterConfig(
        role_to_mesh=layout_meshes("colocated"),
        rollout_config={Mode.TRAIN: RolloutConfig(kv_cache_size=64), Mode.EVAL: RolloutConfig(kv_cache_size=96)},
    )
    c = RLCluster(actor=init_model("tiny"), cluster_config=cfg)
    # The engine gets the TRAIN config unchanged and the largest cache as its own argument.
    assert c.rollout.rollout_config.kv_cache_size == 64
    assert c.rollout.cache_size == 96


def test_p6_unknown_engine_string():
    cfg = ClusterConfig(role_to_mesh=layout_meshes("colocated"), rollout_engine="tgi")
    with pytest.raises(ConfigError, match="'vanilla', 'vllm', 'sglang_jax'"):
        RLCluster(actor=init_model("tiny"), cluster_config=cfg)


def test_p6_vanilla_needs_a_config_attribute():
    class NoConfig(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones((8, 8)))

    cfg = ClusterConfig(role_to_mesh=layout_meshes("colocated"))
    with pytest.raises(ConfigError, match="`config` attribute"):
        RLCluster(actor=NoConfig(), cluster_config=cfg)


def test_p6_vllm_needs_a_model_version():
    cfg = ClusterConfig(role_to_mesh=layout_meshes("colocated"), rollout_engine="vllm", rollout_config=RolloutConfig())
    with pytest.raises(ConfigError, match="rollout_vllm_model_version"):
        RLCluster(actor=init_model("tiny"), cluster_config=cfg)


def test_p6_sglang_lora_needs_static_lora_settings():
    r2m = layout_meshes("colocated")
    actor, reference = models_on(r2m[Role.ACTOR], lora=True)
    cfg = ClusterConfig(role_to_mesh=r2m, rollout_engine="sglang_jax")
    with pytest.raises(ConfigError, match="static-LoRA"):
        RLCluster(actor=actor, reference=reference, cluster_config=cfg)


def test_p6_sglang_without_lora_needs_nothing_more():
    c = cluster_for("colocated", engine="sglang_jax")
    assert c.rollout_branch == "shared"


def test_p6_custom_engine_must_be_an_engine_class_or_partial():
    class NotAnEngine:
        pass

    cfg = ClusterConfig(role_to_mesh=layout_meshes("colocated"), rollout_engine=NotAnEngine)
    # As in the reference: an engine value that is not supported is a NotImplementedError.
    with pytest.raises(NotImplementedError, match="subclass of rlcluster_lab.RolloutEngine"):
        RLCluster(actor=init_model("tiny"), cluster_config=cfg)
    ok = ClusterConfig(role_to_mesh=layout_meshes("colocated"), rollout_engine=functools.partial(RecordingEngine))
    assert isinstance(RLCluster(actor=init_model("tiny"), cluster_config=ok).rollout, RecordingEngine)


# ---------------------------------------------------------------- P7


def test_p7_engine_mesh_replaces_rollout_mesh_without_rebuilding_map():
    r2m = layout_meshes("colocated")
    engine_mesh = make_mesh(jax.devices(), (1, 8))
    c = cluster_for(role_to_mesh=r2m, engine=exposing(engine_mesh))
    assert c.role_to_mesh[Role.ROLLOUT] is engine_mesh
    assert c.config_role_to_mesh[Role.ROLLOUT] is r2m[Role.ROLLOUT]
    assert c.mesh_overridden_by_engine
    # Still registered as sharing: the map came from the config's meshes.
    assert Role.ROLLOUT in c.sharing_map[Role.ACTOR]
    assert c.trace.by_rule("P7")[0].values.still_registered_as_sharing is True


def test_p7_engine_exposing_none_keeps_the_config_mesh():
    r2m = layout_meshes("split")
    c = cluster_for(role_to_mesh=r2m, engine=exposing(None))
    assert c.role_to_mesh[Role.ROLLOUT] is r2m[Role.ROLLOUT]
    assert not c.mesh_overridden_by_engine


def test_p7_vllm_exposes_its_rearranged_mesh():
    c = cluster_for("colocated", engine="vllm")
    assert dict(c.role_to_mesh[Role.ROLLOUT].shape) == {"fsdp": 1, "tp": 8}
    assert c.mesh_overridden_by_engine


def test_p7_sglang_is_given_a_mesh_but_does_not_expose_it():
    c = cluster_for("reshaped", engine="sglang_jax")
    assert getattr(c.rollout, "mesh", None) is None
    assert c.role_to_mesh[Role.ROLLOUT] is c.config_role_to_mesh[Role.ROLLOUT]


def test_p7_later_operations_use_the_engine_mesh():
    engine_mesh = make_mesh(jax.devices(), (1, 8))
    c = cluster_for("colocated", engine=exposing(engine_mesh))
    c.generate(["a"])
    assert dict(c.rollout.generate_meshes[-1].shape) == {"fsdp": 1, "tp": 8}


# ---------------------------------------------------------------- P8


def test_p8_anchor_is_a_pinned_host_snapshot_of_the_full_actor():
    c = cluster_for("colocated", lora=True)
    anchor = c.anchor_policy_state
    assert memory_kinds(anchor) == ["pinned_host"]
    live = nnx.state(c.actor_model)
    assert jax.tree.structure(anchor) == jax.tree.structure(live)
    for a, b in zip(values(anchor), values(live)):
        np.testing.assert_array_equal(a, b)
    assert not (buffer_keys(anchor) & buffer_keys(live))


# ---------------------------------------------------------------- P9


def test_p9_generate_runs_on_the_rollout_mesh_in_micro_batches():
    r2m = layout_meshes("split")
    c = cluster_for(role_to_mesh=r2m, engine=RecordingEngine)
    out = c.generate(["a", "bb", "ccc", "dddd", "e"], micro_batch_size=2)
    assert c.rollout.generate_calls == 3
    assert len(out.text) == 5 and out.tokens.shape[0] == 5
    assert dict(c.rollout.generate_meshes[0].shape) == dict(r2m[Role.ROLLOUT].shape)


def test_p9_empty_prompt_list_is_an_error():
    c = cluster_for("colocated")
    with pytest.raises(ValueError, match="empty list of prompts"):
        c.generate([])


# ---------------------------------------------------------------- P10 / P11 / P12


def test_p10_actor_logps_use_the_anchor_not_live_weights():
    c = cluster_for("colocated", training=TrainingConfig(learning_rate=1e-2))
    out, p, comp = a_batch(c)
    before = np.asarray(c.per_token_logps(Role.ACTOR, p, comp))
    np.testing.assert_allclose(before, out.logprobs, atol=1e-4)
    ref = np.asarray(c.per_token_logps(Role.REFERENCE, p, comp))
    c.update_actor(TrainBatch(p, comp, np.array([1.0, -1.0, 0.5, -0.5]), before, ref))
    after = np.asarray(c.per_token_logps(Role.ACTOR, p, comp))
    live = np.asarray(c.get_live_actor_per_token_logps(p, comp))
    np.testing.assert_allclose(after, before, atol=1e-5)
    assert np.abs(live - before).max() > 1e-3
    c.sync_weights()
    np.testing.assert_allclose(np.asarray(c.per_token_logps(Role.ACTOR, p, comp)), live, atol=1e-5)


def test_p10_missing_anchor_asks_for_a_sync():
    c = cluster_for("colocated")
    _, p, comp = a_batch(c)
    # No public call leaves a cluster without an anchor: the actor's log-probs operation is
    # run on a copy of the cluster's state whose anchor is None.
    no_anchor = dataclasses.replace(c.state, placed=dataclasses.replace(c.state.placed, anchor=None))
    with pytest.raises(ValueError, match="sync_weights"):
        operations.anchor_logps(no_anchor, p, comp, None)
    assert c.pinned_anchor_state is not None  # the cluster itself keeps its anchor


@pytest.mark.parametrize("role", [Role.ACTOR, Role.REFERENCE, Role.ROLLOUT])
def test_p10_empty_batch_is_an_error(role):
    c = cluster_for("colocated")
    with pytest.raises(ValueError, match="empty batch"):
        c.per_token_logps(role, np.zeros((0, 4), np.int32), np.zeros((0, 4), np.int32))


def test_p11_later_mini_batches_see_a_moved_actor_but_the_anchor_does_not():
    c = cluster_for("colocated", training=TrainingConfig(learning_rate=1e-2, mini_batch_size=2))
    out, p, comp = a_batch(c)
    anchor = np.asarray(c.per_token_logps(Role.ACTOR, p, comp))
    seen = []
    c.update_actor(
        TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0]), anchor),
        on_step=lambda it, rows, live: seen.append(np.abs(np.asarray(live(p[rows], comp[rows])) - anchor[rows]).max()),
    )
    assert len(seen) == 2
    assert seen[0] < 1e-5  # nothing has stepped yet
    assert seen[1] > 1e-3  # the actor stepped on the first mini-batch
    np.testing.assert_allclose(anchor, out.logprobs, atol=1e-4)  # the anchor is the sampler's policy


def test_p11_more_iterations_also_move_the_actor():
    c = cluster_for("colocated", training=TrainingConfig(learning_rate=1e-2, num_iterations=2))
    _, p, comp = a_batch(c)
    anchor = np.asarray(c.per_token_logps(Role.ACTOR, p, comp))
    seen = []
    c.update_actor(
        TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0]), anchor),
        on_step=lambda it, rows, live: seen.append((it, np.abs(np.asarray(live(p, comp)) - anchor).max())),
    )
    assert [it for it, _ in seen] == [0, 1]
    assert seen[0][1] < 1e-5 and seen[1][1] > 1e-3


def test_p12_lora_update_changes_only_adapters_and_keeps_shardings():
    c = cluster_for("colocated", lora=True, training=TrainingConfig(learning_rate=1e-2))
    _, p, comp = a_batch(c)
    frozen_before = buffer_keys(nnx.state(c.actor_model, nnx.Not(nnx.LoRAParam)))
    lora_before = values(nnx.state(c.actor_model, nnx.LoRAParam))
    shardings = [x.sharding for x in jax.tree.leaves(nnx.state(c.actor_model))]
    anchor = np.asarray(c.per_token_logps(Role.ACTOR, p, comp))
    c.update_actor(TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0]), anchor))
    assert buffer_keys(nnx.state(c.actor_model, nnx.Not(nnx.LoRAParam))) == frozen_before
    changed = [not np.array_equal(a, b) for a, b in zip(lora_before, values(nnx.state(c.actor_model, nnx.LoRAParam)))]
    assert any(changed)
    assert [x.sharding for x in jax.tree.leaves(nnx.state(c.actor_model))] == shardings
    assert sharing_backbone(c.reference_model, c.actor_model)


def test_p12_full_update_changes_base_weights():
    c = cluster_for("split", training=TrainingConfig(learning_rate=1e-2))
    _, p, comp = a_batch(c)
    before = np.asarray(c.actor_model.blocks.mlp.up.kernel.get_value())
    anchor = np.asarray(c.per_token_logps(Role.ACTOR, p, comp))
    metrics = c.update_actor(TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0]), anchor))
    assert len(metrics) == 1 and np.isfinite(metrics[0]["loss"])
    assert not np.array_equal(before, np.asarray(c.actor_model.blocks.mlp.up.kernel.get_value()))


def test_p12_empty_train_batch_is_an_error():
    with pytest.raises(ValueError, match="empty batch"):
        TrainBatch(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0), np.zeros((0, 3)))


# ---------------------------------------------------------------- P13


def test_p13_colocated_shared_sync_moves_nothing():
    c = cluster_for("colocated")
    before = buffer_keys(nnx.state(c.rollout.model()))
    c.sync_weights()
    assert buffer_keys(nnx.state(c.rollout.model())) == before
    assert c.global_steps == 1


def test_p13_sync_hands_lora_params_only_with_their_filter():
    r2m = layout_meshes("split")
    c = cluster_for(role_to_mesh=r2m, lora=True, engine=RecordingEngine)
    c.sync_weights()
    filter_types, paths = c.rollout.updates[-1]
    assert filter_types == (nnx.LoRAParam,)
    assert paths and all(p.endswith(("lora_a", "lora_b")) for p in paths)


def test_p13_sync_hands_all_params_without_lora():
    c = cluster_for("split", engine=RecordingEngine)
    c.sync_weights()
    filter_types, paths = c.rollout.updates[-1]
    assert filter_types == (nnx.Param,)
    assert len(paths) == len(jax.tree.leaves(nnx.state(c.actor_model)))


def test_p13_split_sync_writes_new_buffers_with_the_actor_values():
    c = cluster_for("split", training=TrainingConfig(learning_rate=1e-2))
    _, p, comp = a_batch(c)
    anchor = np.asarray(c.per_token_logps(Role.ACTOR, p, comp))
    c.update_actor(TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0]), anchor))
    before = buffer_keys(nnx.state(c.rollout.model()))
    c.sync_weights()
    after = buffer_keys(nnx.state(c.rollout.model()))
    assert not (before & after)
    for a, b in zip(values(nnx.state(c.rollout.model())), values(nnx.state(c.actor_model))):
        np.testing.assert_array_equal(a, b)
    devices = {d.id for x in jax.tree.leaves(nnx.state(c.rollout.model())) for d in x.sharding.device_set}
    assert devices == {4, 5, 6, 7}


def test_p13_sync_repins_the_anchor_and_counts_the_step():
    c = cluster_for("colocated", training=TrainingConfig(learning_rate=1e-2))
    _, p, comp = a_batch(c)
    old = c.anchor_policy_state
    anchor = np.asarray(c.per_token_logps(Role.ACTOR, p, comp))
    c.update_actor(TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0]), anchor))
    c.sync_weights()
    new = c.anchor_policy_state
    assert new is not old and memory_kinds(new) == ["pinned_host"]
    for a, b in zip(values(new), values(nnx.state(c.actor_model))):
        np.testing.assert_array_equal(a, b)
    assert c.global_steps == 1


def test_p13_sync_runs_under_the_cpu_transfer_guard():
    c = cluster_for("split", engine=HostTouchingEngine)
    with pytest.raises(Exception, match="[Dd]isallowed host-to-device"):
        c.sync_weights()


@pytest.mark.parametrize("layout", ["colocated", "reshaped", "split"])
def test_p13_every_layout_syncs_under_the_guard(layout):
    c = cluster_for(layout, lora=True)
    c.sync_weights()
    assert c.global_steps == 1


# ---------------------------------------------------------------- P14


def test_p14_offload_keeps_every_role_on_pinned_host_between_uses():
    c = cluster_for("colocated", lora=True, offload=True)

    def kinds():
        return {r: memory_kinds(nnx.state(m)) for r, m in c.models().items()}

    assert set(map(tuple, kinds().values())) == {("pinned_host",)}
    out, p, comp = a_batch(c)
    anchor = np.asarray(c.per_token_logps(Role.ACTOR, p, comp))
    ref = np.asarray(c.per_token_logps(Role.REFERENCE, p, comp))
    c.update_actor(TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0]), anchor, ref))
    c.sync_weights()
    assert set(map(tuple, kinds().values())) == {("pinned_host",)}
    assert memory_kinds(c.optimizer_state) == ["pinned_host"]
    # Roles that share weights were updated together.
    assert sharing_backbone(c.reference_model, c.actor_model)
    assert c.rollout.model() is c.actor_model


def test_p14_offloaded_ops_match_on_device_ops():
    on = cluster_for("colocated", offload=True)
    off = cluster_for("colocated", offload=False)
    out = on.generate(PROMPTS)
    a = np.asarray(on.per_token_logps(Role.REFERENCE, out.left_padded_prompt_tokens, out.tokens))
    b = np.asarray(off.per_token_logps(Role.REFERENCE, out.left_padded_prompt_tokens, out.tokens))
    np.testing.assert_allclose(a, b, atol=1e-5)


# ---------------------------------------------------------------- P15 and bad input


def test_p15_rlengine_and_rlcluster_are_one_class():
    assert RLEngine is RLCluster


def test_reference_with_another_tree_is_rejected():
    r2m = layout_meshes("colocated")
    with pytest.raises(ConfigError, match="reference model's parameter tree does not match"):
        RLCluster(
            actor=init_model("tiny"), reference=init_model("small"), cluster_config=ClusterConfig(role_to_mesh=r2m)
        )


def test_critic_with_another_tree_is_rejected():
    from rlcluster_lab.model.scoring import init_score_model

    r2m = layout_meshes("colocated")
    with pytest.raises(ConfigError, match="critic model's parameter tree does not match"):
        RLCluster(
            actor=init_model("tiny"), critic=init_score_model("small"), cluster_config=ClusterConfig(role_to_mesh=r2m)
        )


def test_failed_construction_leaves_no_stray_buffers():
    import gc

    r2m = layout_meshes("split")
    actor = init_model("tiny")
    cfg = ClusterConfig(role_to_mesh=r2m, rollout_engine=functools.partial(RecordingEngine, fail=True))
    gc.collect()
    before = {id(x) for x in jax.live_arrays()}
    with pytest.raises(RuntimeError, match="on purpose"):
        RLCluster(actor=actor, cluster_config=cfg)
    gc.collect()
    # A view of the caller's own buffers (JAX caches one per shard once a shard's data
    # is read) holds no memory of its own; anything else would be a stray buffer.
    callers = buffer_keys(nnx.state(actor))
    stray = [
        x for x in jax.live_arrays() if id(x) not in before and not x.is_deleted() and not buffer_keys([x]) <= callers
    ]
    assert stray == []
    # The caller's model is untouched and still usable.
    assert all(not x.is_deleted() for x in jax.tree.leaves(nnx.state(actor)))


def test_operations_before_construction_finished_are_refused():
    class BrokenEngine(RolloutEngine):
        def __init__(self, **kwargs):
            raise RuntimeError("engine failed to start")

        def model(self):
            raise AssertionError("never built")

    class KeepsTheObject(RLCluster):
        """Swallows its own construction error, so the half-built object can be used."""

        def __init__(self, **kwargs):
            try:
                super().__init__(**kwargs)
            except RuntimeError:
                pass

    cfg = ClusterConfig(role_to_mesh=layout_meshes("colocated"), rollout_engine=BrokenEngine)
    c = KeepsTheObject(actor=init_model("tiny"), cluster_config=cfg)
    for operation in (c.sync_weights, lambda: c.generate(["abc"]), lambda: c.rollout):
        with pytest.raises(NotConstructedError, match="did not finish construction"):
            operation()


def test_rewards_and_values_run_on_their_meshes():
    from rlcluster_lab.model.scoring import init_score_model

    r2m = layout_meshes("split")
    actor, reference = models_on(r2m[Role.ACTOR], lora=False)
    c = RLCluster(
        actor=actor,
        reference=reference,
        reward=init_score_model("tiny", seed=5),
        critic=init_score_model("tiny", seed=6),
        cluster_config=ClusterConfig(role_to_mesh=r2m, rollout_config=RolloutConfig(max_tokens_to_generate=5)),
    )
    out, p, comp = a_batch(c)
    rewards = c.get_rewards(p, comp)
    vals = c.get_values(p, comp)
    assert rewards.shape == (4,) and vals.shape == comp.shape
    assert c.reward_model.score_head.kernel.get_value().sharding.mesh == r2m[Role.REWARD]


def test_scenario_build_matches_direct_construction():
    c = build_cluster(Scenario(layout="colocated", lora=True))
    assert c.rollout_branch == "shared"
    assert sharing_backbone(c.reference_model, c.actor_model)


@pytest.mark.parametrize("engine", ["vllm", "sglang_jax"])
def test_p14_offload_keeps_an_own_copy_engine_apart_from_the_actor(engine):
    r2m = layout_meshes("colocated")
    c = cluster_for(role_to_mesh=r2m, engine=engine, offload=True)
    out, p, comp = a_batch(c)
    anchor = np.asarray(c.per_token_logps(Role.ACTOR, p, comp))
    c.update_actor(TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0]), anchor))
    c.sync_weights()
    actor_state = nnx.state(c.actor_model)
    assert {x.sharding.mesh for x in jax.tree.leaves(actor_state)} == {r2m[Role.ACTOR]}
    assert not (buffer_keys(actor_state) & buffer_keys(nnx.state(c.rollout.model())))
    assert memory_kinds(nnx.state(c.rollout.model())) == ["pinned_host"]
    assert memory_kinds(actor_state) == ["pinned_host"]
    assert any(d.rule == "P14" and "owns its weights" in d.test for d in c.trace)


@pytest.mark.parametrize(
    "engine, cache",
    [("vanilla", 2048), ("vllm", 2048), ("sglang_jax", None), (RecordingEngine, None)],
    ids=["vanilla", "vllm", "sglang_jax", "custom"],
)
def test_p6_engines_get_the_train_config_unchanged_and_the_cache_size_as_in_the_reference(engine, cache):
    version = "rlcluster-lab/tiny" if engine == "vllm" else None
    train = RolloutConfig(kv_cache_size=1024, rollout_vllm_model_version=version)
    evaluation = RolloutConfig(kv_cache_size=2048, rollout_vllm_model_version=version)
    cfg = ClusterConfig(
        role_to_mesh=layout_meshes("colocated"),
        rollout_engine=engine,
        rollout_config={Mode.TRAIN: train, Mode.EVAL: evaluation},
    )
    c = RLCluster(actor=init_model("tiny"), cluster_config=cfg)
    # The TRAIN config itself, never a copy carrying the EVAL cache size.
    assert c.rollout.rollout_config is train
    assert c.rollout.rollout_config.kv_cache_size == 1024
    # The largest cache over modes travels on its own, only to the engines that take one.
    assert c.rollout.cache_size == cache
