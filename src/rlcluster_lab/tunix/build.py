"""Building Tunix's own ``RLCluster`` for one of the lab's scenarios, from the lab's models
(``app.scenario.build_models``); what it was handed is kept beside it (``Given``), since some
decisions read only against the state before construction (P5, P7, P4's logged warning).
"""

from __future__ import annotations

import dataclasses
import logging
import logging.handlers
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rlcluster_lab.app.scenario import build_models, validate
from rlcluster_lab.core.config import TrainingConfig
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.options import Scenario
from rlcluster_lab.core.roles import Role
from rlcluster_lab.measure.sync import describe_sharding, flat_leaves
from rlcluster_lab.placement.buffers import buffer_keys
from rlcluster_lab.tunix.adapters import TunixTokenizer, check_model, lab_axis_rules
from rlcluster_lab.tunix.extra import require
from rlcluster_lab.tunix.standin import vllm_stand_in

# The engines whose scenarios Tunix's cluster can be built for here (vllm through the stand-in).
ENGINES = ("vanilla", "vllm")


@dataclasses.dataclass(frozen=True)
class Given:
    """What a Tunix cluster was handed, recorded before construction: the meshes as asked (a copy:
    Tunix writes the engine's mesh into it, P7), per model its buffer keys and leaves' layouts,
    Tunix's warnings, whether offload was asked, and ``host_ranges`` after construction."""

    role_to_mesh: Mapping[Role, Any]
    buffers: Mapping[str, frozenset]
    layouts: Mapping[str, Mapping[str, str]]
    logged: tuple[str, ...]
    offload: bool
    host_ranges: tuple[tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class TunixBuild:
    """A constructed Tunix ``RLCluster`` and what it was handed."""

    cluster: Any
    given: Given


@contextmanager
def logged_warnings() -> Iterator[list[str]]:
    """The warnings Tunix logs (to the ``absl`` logger) inside the block, kept, not printed (the
    list is filled when the block ends)."""
    handler, messages = logging.handlers.BufferingHandler(capacity=1 << 30), []
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("absl")
    saved = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [handler], False
    try:
        yield messages
    finally:
        logger.handlers, logger.propagate = saved
        messages.extend(record.getMessage() for record in handler.buffer)


def leaf_layouts(state: Any) -> dict[str, str]:
    """Leaf path -> its sharding (mesh, devices, partition spec), memory kind (its last word) left out."""
    return {path: describe_sharding(x.sharding).rsplit(" ", 1)[0] for path, x in flat_leaves(state).items()}


def host_ranges(models: Mapping[str, nnx.Module]) -> tuple[tuple[int, int], ...]:
    """The (start, end) addresses of these models' shards and of the host copies JAX keeps of their
    arrays: on CPU a ``jax.device_put`` onto other shards reads the source on host (copied once and
    kept on the array) and may hand back views into it, so two arrays resharded from one source can
    hold the same memory. Without JAX's private copy only views of a shard's own buffer are found."""
    out = set()
    for model in models.values():
        for x in flat_leaves(nnx.state(model)).values():
            out.update(
                (s.data.unsafe_buffer_pointer(), s.data.unsafe_buffer_pointer() + s.data.nbytes)
                for s in x.addressable_shards
            )
            copy = getattr(x, "_npy_value", None)  # noqa: SLF001  (jax.Array's cached host value)
            if copy is not None and copy.nbytes:
                out.add((int(copy.ctypes.data), int(copy.ctypes.data) + int(copy.nbytes)))
    return tuple(sorted(out))


def tunix_config(scenario: Scenario, role_to_mesh: Mapping[Role, Any], training: TrainingConfig | None = None) -> Any:
    """Tunix's ``ClusterConfig`` for a scenario's knobs on these meshes: a ``ConfigError`` for an engine
    other than vanilla or vllm, ``TunixMissingError`` without Tunix."""
    tunix = require("building Tunix's RLCluster")
    if scenario.engine not in ENGINES:
        raise ConfigError(
            f"Tunix's {scenario.engine} engine cannot run here (its serving library is not installed on CPU), "
            f"and the lab has no stand-in for it on Tunix's side; use engine {' or '.join(repr(e) for e in ENGINES)}",
            knobs=("engine",),
        )
    rc = tunix.rl_cluster
    training = training or TrainingConfig()
    rollout = tunix.base_rollout.RolloutConfig(
        max_tokens_to_generate=scenario.max_tokens,
        temperature=scenario.temperature,
        kv_cache_size=scenario.kv_cache_size,
        data_type=jnp.dtype(scenario.rollout_dtype) if scenario.rollout_dtype else None,
        seed=scenario.seed,
        rollout_vllm_model_version=scenario.rollout_config().rollout_vllm_model_version or "",
    )
    return rc.ClusterConfig(
        role_to_mesh={rc.Role(role.value): mesh for role, mesh in role_to_mesh.items()},  # the enums' values match
        rollout_engine=vllm_stand_in() if scenario.engine == "vllm" else scenario.engine,
        offload_to_cpu=scenario.offload,
        training_config=rc.RLTrainingConfig(
            actor_optimizer=training.actor_optimizer(),
            # Tunix's default (None) fails when the critic's trainer is built; the lab's default is given.
            critic_optimizer=training.critic_tx() if scenario.with_critic else None,
            eval_every_n_steps=1,
        ),
        rollout_config=rollout,
    )


def build_tunix_cluster(
    scenario: Scenario,
    *,
    devices: Sequence[jax.Device] | None = None,
    role_to_mesh: Mapping[Role, Any] | None = None,
    training_config: TrainingConfig | None = None,
) -> TunixBuild:
    """Tunix's ``RLCluster`` for ``scenario`` (checked first as ``build_cluster`` checks it), built from
    the lab's models on the lab's meshes.

    Args:
        scenario: the knobs (engine vanilla or vllm; vllm runs through ``standin``).
        devices: the devices the layout is built on (default ``jax.devices()``).
        role_to_mesh: meshes that replace the layout's.
        training_config: the actor's optimizer settings (default: the lab's).

    Raises:
        ConfigError: a combination the lab refuses, or an engine Tunix cannot run here.
        TunixMissingError: Tunix is not installed.
    """
    tunix = require("building Tunix's RLCluster")
    lab_config = validate(scenario, devices=devices, training_config=training_config, role_to_mesh=role_to_mesh)
    skipped = {Role.REWARD: not scenario.with_reward, Role.CRITIC: not scenario.with_critic}
    asked = {r: m for r, m in lab_config.role_to_mesh.items() if not skipped.get(r, False)}
    config = tunix_config(scenario, asked, training_config)
    models = build_models(scenario, asked)
    for name, model in models.items():
        check_model(model, name, scenario.engine)
    buffers = {name: frozenset(buffer_keys(nnx.state(m))) for name, m in models.items()}
    layouts = {name: leaf_layouts(nnx.state(m)) for name, m in models.items()}
    with logged_warnings() as logged, lab_axis_rules():
        cluster = tunix.rl_cluster.RLCluster(tokenizer=TunixTokenizer(), cluster_config=config, **models)
    given = Given(
        role_to_mesh=asked,
        buffers=buffers,
        layouts=layouts,
        logged=tuple(logged),
        offload=scenario.offload,
        host_ranges=host_ranges(models),
    )
    return TunixBuild(cluster=cluster, given=given)
