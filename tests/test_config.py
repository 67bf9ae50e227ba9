"""Cluster configuration and its validation (P6 at config level)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlcluster_lab.core.config import (
    ClusterConfig,
    ConfigError,
    RolloutConfig,
    TrainingConfig,
    max_kv_cache_size,
)
from rlcluster_lab.core.meshes import layout_meshes, make_mesh
from rlcluster_lab.core.options import ENGINES as KNOWN_ENGINES
from rlcluster_lab.core.options import dtype_name
from rlcluster_lab.core.roles import Mode, Role
from rlcluster_lab.engines import ENGINES as ENGINE_CLASSES
from rlcluster_lab.engines import RolloutEngine, SglangJaxStyleEngine, VanillaEngine, VllmStyleEngine
from rlcluster_lab.rules.validation import p6_engine_choice, p6_rollout_config

DEVICES = jax.devices()


def check_rollout_config(config):
    return p6_rollout_config(config.rollout_config)[0]


def check_engine_choice(engine, is_engine_class):
    return p6_engine_choice(engine, is_engine_class, str(engine))[0]


def _is_engine_class(obj):
    return isinstance(obj, type) and issubclass(obj, RolloutEngine)


class _MyEngine(RolloutEngine):
    def model(self):
        return None


class _NotAnEngine:
    pass


def _meshes():
    return {Role.ACTOR: make_mesh(DEVICES, (2, 4)), Role.ROLLOUT: make_mesh(DEVICES, (8, 1))}


def _config(**kwargs):
    return ClusterConfig(role_to_mesh=kwargs.pop("role_to_mesh", _meshes()), **kwargs)


# --- P6: rollout config ------------------------------------------------------


def test_p6_rollout_config_none_raises_with_fix():
    with pytest.raises(ConfigError) as err:
        check_rollout_config(_config(rollout_config=None))
    msg = str(err.value)
    assert "rollout_config is None" in msg
    assert "RolloutConfig(" in msg


def test_p6_rollout_config_dict_without_train_raises():
    cfg = _config(rollout_config={Mode.EVAL: RolloutConfig()})
    with pytest.raises(ConfigError) as err:
        check_rollout_config(cfg)
    msg = str(err.value)
    assert "Mode.TRAIN" in msg
    assert "eval" in msg


def test_p6_rollout_config_dict_with_train_returns_train_entry():
    train, evaluation = RolloutConfig(temperature=0.5), RolloutConfig(temperature=0.0)
    cfg = _config(rollout_config={Mode.TRAIN: train, Mode.EVAL: evaluation})
    assert check_rollout_config(cfg) is train
    assert cfg.rollout_config_for(Mode.EVAL) is evaluation


def test_p6_rollout_config_single_is_returned():
    rc = RolloutConfig(max_tokens_to_generate=3)
    assert check_rollout_config(_config(rollout_config=rc)) is rc


def test_p6_rollout_config_dict_accepts_string_modes():
    train = RolloutConfig()
    cfg = _config(rollout_config={"train": train})
    assert check_rollout_config(cfg) is train


def test_p6_rollout_config_dict_unknown_mode_raises():
    with pytest.raises(ConfigError, match="unknown rollout mode"):
        _config(rollout_config={"warmup": RolloutConfig()})


def test_rollout_config_for_missing_mode_raises():
    cfg = _config(rollout_config={Mode.TRAIN: RolloutConfig()})
    with pytest.raises(ConfigError, match="no entry for mode eval"):
        cfg.rollout_config_for(Mode.EVAL)


def test_max_kv_cache_size_over_modes():
    cfg = _config(
        rollout_config={Mode.TRAIN: RolloutConfig(kv_cache_size=64), Mode.EVAL: RolloutConfig(kv_cache_size=96)}
    )
    assert max_kv_cache_size(cfg) == 96


# --- P6: engine choice -------------------------------------------------------


@pytest.mark.parametrize("name", ["vanilla", "vllm", "sglang_jax"])
def test_p6_known_engine_strings_accepted(name):
    assert check_engine_choice(name, _is_engine_class) == name


def test_p6_known_engines_are_the_reference_three():
    assert set(KNOWN_ENGINES) == {"vanilla", "vllm", "sglang_jax"}


def test_each_engine_name_gets_its_own_class():
    # The classes are paired with core.options.ENGINES by position: a reordering shows here.
    assert tuple(ENGINE_CLASSES) == KNOWN_ENGINES
    assert ENGINE_CLASSES["vanilla"] is VanillaEngine
    assert ENGINE_CLASSES["vllm"] is VllmStyleEngine
    assert ENGINE_CLASSES["sglang_jax"] is SglangJaxStyleEngine


def test_p6_unknown_engine_string_lists_known_engines():
    with pytest.raises(ConfigError) as err:
        check_engine_choice("tensorrt", _is_engine_class)
    msg = str(err.value)
    assert "'tensorrt'" in msg
    for name in ("vanilla", "vllm", "sglang_jax"):
        assert name in msg


def test_p6_engine_string_is_case_sensitive():
    with pytest.raises(ConfigError):
        check_engine_choice("VLLM", _is_engine_class)


def test_p6_non_engine_class_is_not_supported():
    with pytest.raises(NotImplementedError, match="RolloutEngine"):
        check_engine_choice(_NotAnEngine, _is_engine_class)


def test_p6_partial_of_non_engine_class_is_not_supported():
    with pytest.raises(NotImplementedError, match="functools.partial"):
        check_engine_choice(functools.partial(_NotAnEngine), _is_engine_class)


def test_p6_engine_instance_is_not_a_class_is_not_supported():
    with pytest.raises(NotImplementedError):
        check_engine_choice(object(), _is_engine_class)


def test_p6_rollout_engine_subclass_is_custom():
    assert check_engine_choice(_MyEngine, _is_engine_class) == "custom"


def test_p6_builtin_engine_class_is_custom():
    assert check_engine_choice(VanillaEngine, _is_engine_class) == "custom"


def test_p6_partial_of_rollout_engine_subclass_is_custom():
    assert check_engine_choice(functools.partial(_MyEngine, mesh=None), _is_engine_class) == "custom"


def test_engine_name_of_partial():
    cfg = _config(rollout_engine=functools.partial(_MyEngine))
    assert cfg.engine_name() == "partial(_MyEngine)"


def test_engine_name_of_class_and_string():
    assert _config(rollout_engine=_MyEngine).engine_name() == "_MyEngine"
    assert _config().engine_name() == "vanilla"


# --- ClusterConfig meshes ----------------------------------------------------


@pytest.mark.parametrize("missing", [Role.ACTOR, Role.ROLLOUT])
def test_cluster_config_without_actor_or_rollout_mesh_raises(missing):
    meshes = _meshes()
    del meshes[missing]
    with pytest.raises(ConfigError) as err:
        ClusterConfig(role_to_mesh=meshes)
    msg = str(err.value)
    assert missing.value in msg
    assert "layout_meshes" in msg


def test_cluster_config_non_mesh_value_raises():
    meshes = _meshes()
    meshes[Role.ROLLOUT] = list(DEVICES)
    with pytest.raises(ConfigError, match=r"role_to_mesh\[rollout\] is list, expected a jax.sharding.Mesh"):
        ClusterConfig(role_to_mesh=meshes)


def test_cluster_config_non_mesh_reference_raises():
    meshes = {**_meshes(), Role.REFERENCE: "devices 0-3"}
    with pytest.raises(ConfigError, match=r"role_to_mesh\[reference\]"):
        ClusterConfig(role_to_mesh=meshes)


def test_cluster_config_reference_reward_critic_default_to_actor_mesh():
    cfg = _config()
    actor = cfg.role_to_mesh[Role.ACTOR]
    for role in (Role.REFERENCE, Role.REWARD, Role.CRITIC):
        assert cfg.role_to_mesh[role] is actor
    assert cfg.role_to_mesh[Role.ROLLOUT] is not actor


def test_cluster_config_given_reference_mesh_is_kept():
    other = make_mesh(DEVICES[:4], (2, 2))
    cfg = _config(role_to_mesh={**_meshes(), Role.REFERENCE: other})
    assert cfg.role_to_mesh[Role.REFERENCE] is other
    assert cfg.role_to_mesh[Role.REWARD] is cfg.role_to_mesh[Role.ACTOR]


def test_cluster_config_accepts_role_names_as_keys():
    m = _meshes()
    cfg = ClusterConfig(role_to_mesh={"actor": m[Role.ACTOR], "ROLLOUT": m[Role.ROLLOUT]})
    assert cfg.role_to_mesh[Role.ROLLOUT] is m[Role.ROLLOUT]
    assert set(cfg.role_to_mesh) == set(Role)


def test_cluster_config_unknown_role_name_raises():
    m = _meshes()
    with pytest.raises(ValueError, match="unknown role"):
        ClusterConfig(role_to_mesh={**m, "judge": m[Role.ACTOR]})


def test_cluster_config_role_to_mesh_is_read_only():
    cfg = _config()
    with pytest.raises(TypeError):
        cfg.role_to_mesh[Role.ROLLOUT] = cfg.role_to_mesh[Role.ACTOR]


def test_cluster_config_is_frozen():
    cfg = _config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.role_to_mesh = {}


def test_cluster_config_copies_given_dict():
    meshes = _meshes()
    cfg = ClusterConfig(role_to_mesh=meshes)
    meshes[Role.ROLLOUT] = meshes[Role.ACTOR]
    assert cfg.role_to_mesh[Role.ROLLOUT] != cfg.role_to_mesh[Role.ACTOR]


def test_cluster_config_rollout_dict_is_read_only():
    cfg = _config(rollout_config={Mode.TRAIN: RolloutConfig()})
    with pytest.raises(TypeError):
        cfg.rollout_config[Mode.EVAL] = RolloutConfig()


def test_cluster_config_layout_meshes_accepted():
    cfg = ClusterConfig(role_to_mesh=layout_meshes("split"))
    assert cfg.rollout_engine == "vanilla"
    assert cfg.offload_to_cpu is False
    assert isinstance(cfg.rollout_config, RolloutConfig)


# --- RolloutConfig -----------------------------------------------------------


def test_rollout_config_negative_temperature_raises():
    with pytest.raises(ConfigError, match="temperature must be >= 0"):
        RolloutConfig(temperature=-0.1)


def test_rollout_config_zero_temperature_allowed():
    assert RolloutConfig(temperature=0.0).temperature == 0.0


def test_rollout_config_unknown_data_type_lists_known():
    with pytest.raises(ConfigError) as err:
        RolloutConfig(data_type="int8")
    msg = str(err.value)
    assert "'int8'" in msg and "bfloat16" in msg and "float32" in msg


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", None])
def test_rollout_config_known_data_types_allowed(dtype):
    assert RolloutConfig(data_type=dtype).data_type == dtype


@pytest.mark.parametrize(
    "dtype, name",
    [
        (jnp.bfloat16, "bfloat16"),
        (jnp.float16, "float16"),
        (np.float32, "float32"),
        (np.dtype("float16"), "float16"),
        (jnp.dtype("bfloat16"), "bfloat16"),
        ("bfloat16", "bfloat16"),
    ],
)
def test_rollout_config_keeps_the_dtype_object_it_was_given(dtype, name):
    # As in the reference, the field holds the user's value; the name is read where it is used.
    cfg = RolloutConfig(data_type=dtype)
    assert cfg.data_type is dtype
    assert dtype_name(cfg.data_type) == name


@pytest.mark.parametrize("dtype", [jnp.int8, np.int32, "int8", object()])
def test_rollout_config_unknown_dtype_object_is_a_config_error_naming_the_argument(dtype):
    with pytest.raises(ConfigError, match=r"data_type: unsupported dtype .*use one of float32, bfloat16, float16"):
        RolloutConfig(data_type=dtype)


def test_model_and_plan_dtype_knobs_take_jax_dtypes():
    from rlcluster_lab.model.transformer import get_model_config
    from rlcluster_lab.planner.request import PlanRequest
    from rlcluster_lab.planner.tables import topology

    config = dataclasses.replace(get_model_config("tiny"), param_dtype=jnp.bfloat16)
    assert config.param_dtype == "bfloat16" and config.dtype == jnp.dtype("bfloat16")
    knobs = dict(model=get_model_config("tiny"), model_name="tiny", topology=topology("local"))
    request = PlanRequest(**knobs, rollout_dtype=jnp.bfloat16)
    assert request.rollout_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="rollout_dtype: unsupported dtype"):
        PlanRequest(**knobs, rollout_dtype=np.int8)


def test_rollout_config_zero_max_tokens_raises():
    with pytest.raises(ConfigError, match="max_tokens_to_generate"):
        RolloutConfig(max_tokens_to_generate=0)


def test_rollout_config_tiny_kv_cache_raises():
    with pytest.raises(ConfigError, match="kv_cache_size"):
        RolloutConfig(kv_cache_size=1)


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)


# --- TrainingConfig ----------------------------------------------------------


def test_training_config_zero_mini_batch_raises():
    with pytest.raises(ConfigError, match="mini_batch_size"):
        TrainingConfig(mini_batch_size=0)


def test_training_config_zero_iterations_raises():
    with pytest.raises(ConfigError, match="num_iterations"):
        TrainingConfig(num_iterations=0)


def test_training_config_axis_rules_keyed_by_role_and_read_only():
    tc = TrainingConfig(role_to_logical_axis_rule={"actor": [("embed", "fsdp"), ("vocab", None)]})
    assert dict(tc.role_to_logical_axis_rule) == {Role.ACTOR: (("embed", "fsdp"), ("vocab", None))}
    with pytest.raises(TypeError):
        tc.role_to_logical_axis_rule[Role.ROLLOUT] = ()


def test_cluster_config_logical_axis_rules_per_role():
    rules = (("embed", "fsdp"),)
    cfg = _config(training_config=TrainingConfig(role_to_logical_axis_rule={Role.ACTOR: rules}))
    assert cfg.logical_axis_rules(Role.ACTOR) == rules
    assert cfg.logical_axis_rules(Role.ROLLOUT) is None
    assert _config().logical_axis_rules(Role.ACTOR) is None


def test_training_config_default_optimizer_and_given_one():
    given = optax.sgd(0.1)
    assert TrainingConfig(optimizer=given).actor_optimizer() is given
    default = TrainingConfig().actor_optimizer()
    assert isinstance(default, optax.GradientTransformation)
