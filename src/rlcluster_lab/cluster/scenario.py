"""From knobs to a cluster: the lab's standard way of building one.

The CLI, the notebooks and the tests all turn their knobs into a
``Scenario`` (``options``, JAX-free) and call ``build_cluster``; nothing else
builds models for them.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from rlcluster_lab.cluster import RLCluster
from rlcluster_lab.core.compile_cache import trim_compiled_programs
from rlcluster_lab.core.config import ClusterConfig, TrainingConfig
from rlcluster_lab.core.meshes import layout_meshes
from rlcluster_lab.core.options import DTYPES, Scenario
from rlcluster_lab.core.roles import Role
from rlcluster_lab.model import DEFAULT_LOGICAL_AXIS_RULES, get_model_config, init_model, with_lora
from rlcluster_lab.model.scoring import init_score_model
from rlcluster_lab.placement.place import place_model

ROLLOUT_DTYPES = DTYPES


def build_models(scenario: Scenario, role_to_mesh: dict[Role, Any]) -> dict[str, nnx.Module]:
    """Actor, reference (and reward/critic when asked), each created on its role's mesh.

    Values are drawn on the host and placed in one transfer per model: no
    program is compiled to build them.
    """
    mesh = role_to_mesh[Role.REFERENCE]
    reference = init_model(scenario.model_size, seed=scenario.seed, mesh=mesh)
    if scenario.lora:
        base = place_model(reference, mesh, copy=True) if scenario.lora_separate_base else reference
        actor = with_lora(base, scenario.lora_rank, seed=scenario.seed + 1)
    else:
        actor = place_model(reference, mesh, copy=True, role="actor")
    models: dict[str, nnx.Module] = {"actor": actor, "reference": reference}
    if scenario.with_reward:
        models["reward"] = init_score_model(scenario.model_size, seed=scenario.seed + 2, mesh=role_to_mesh[Role.REWARD])
    if scenario.with_critic:
        models["critic"] = init_score_model(scenario.model_size, seed=scenario.seed + 3, mesh=role_to_mesh[Role.CRITIC])
    return models


def cluster_config(
    scenario: Scenario, role_to_mesh: dict[Role, Any], training_config: TrainingConfig | None = None
) -> ClusterConfig:
    """The ``ClusterConfig`` a scenario asks for on these meshes (validated, nothing allocated)."""
    return ClusterConfig(
        role_to_mesh=role_to_mesh,
        rollout_config=scenario.rollout_config(),
        rollout_engine=scenario.engine,
        offload_to_cpu=scenario.offload,
        training_config=training_config or TrainingConfig(),
        anchor=scenario.anchor,
        reshard=scenario.reshard,
    )


def validate(
    scenario: Scenario,
    *,
    devices: Sequence[jax.Device] | None = None,
    training_config: TrainingConfig | None = None,
    role_to_mesh: dict[Role, Any] | None = None,
) -> ClusterConfig:
    """Every check a build would make, with nothing allocated and nothing compiled.

    The knobs (``Scenario.check``, P6), the layout on these devices, the
    ``ClusterConfig``, and every role's partition specs on its mesh (axis
    names exist, dimensions divide), read from the models' shapes alone.

    Returns:
        The validated config.

    Raises:
        ConfigError, ValueError: what cannot work, and how to fix it.
    """
    from rlcluster_lab.placement.place import check_spec
    from rlcluster_lab.planner.shapes import abstract_leaves

    scenario.check()
    r2m = dict(role_to_mesh) if role_to_mesh is not None else layout_meshes(scenario.layout, devices)
    config = cluster_config(scenario, r2m, training_config)
    size = get_model_config(scenario.model_size)
    lora = scenario.lora_rank if scenario.lora else 0
    roles = [(Role.ACTOR, "lm", lora), (Role.ROLLOUT, "lm", lora), (Role.REFERENCE, "lm", 0)]
    roles += [(Role.REWARD, "score", 0)] if scenario.with_reward else []
    roles += [(Role.CRITIC, "score", 0)] if scenario.with_critic else []
    for role, kind, rank in roles:
        rules = config.logical_axis_rules(role)
        leaves = abstract_leaves(size, rank, kind, tuple(rules) if rules is not None else DEFAULT_LOGICAL_AXIS_RULES)
        for shape, spec in {(leaf.shape, leaf.spec) for leaf in leaves}:
            check_spec(spec, shape, config.role_to_mesh[role], role.value)
    return config


def build_cluster(
    scenario: Scenario,
    *,
    devices: Sequence[jax.Device] | None = None,
    training_config: TrainingConfig | None = None,
    role_to_mesh: dict[Role, Any] | None = None,
) -> RLCluster:
    """Build the scenario's models and meshes and construct the cluster.

    Every check that follows from the knobs runs first (``Scenario.check``,
    the layout, ``ClusterConfig``), so a combination that cannot work fails
    before a model is built or a program compiled.

    Args:
        scenario: the knobs.
        devices: the devices the layout is built on (default ``jax.devices()``).
        training_config: the actor's training settings.
        role_to_mesh: meshes that replace the layout's (e.g. a custom rollout mesh).

    Returns:
        The constructed cluster.

    Raises:
        ConfigError: for a combination that cannot work, with the fix.
    """
    config = validate(scenario, devices=devices, training_config=training_config, role_to_mesh=role_to_mesh)
    r2m = dict(config.role_to_mesh)
    # A long session builds many clusters: keep the compiled programs under the bound.
    trim_compiled_programs()
    models = build_models(scenario, r2m)
    with warnings.catch_warnings():
        # The cluster keeps its own record of P4 warnings (cluster.warnings).
        warnings.simplefilter("ignore")
        return RLCluster(tokenizer=None, cluster_config=config, **models)
