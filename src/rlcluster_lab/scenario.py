"""From knobs to a cluster: the lab's standard way of building one.

The CLI, the notebooks and the tests all turn their knobs into a
``Scenario`` and call ``build_cluster``; nothing else builds models for them.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from rlcluster_lab.cluster import RLCluster
from rlcluster_lab.config import KNOWN_ENGINES, ClusterConfig, ConfigError, RolloutConfig, TrainingConfig
from rlcluster_lab.meshes import LAYOUTS, layout_meshes
from rlcluster_lab.model import MODEL_SIZES, init_model, with_lora
from rlcluster_lab.placement import place_model
from rlcluster_lab.roles import Role
from rlcluster_lab.scoring import init_score_model

ROLLOUT_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """The knobs of one placement experiment.

    With ``lora`` the actor is a LoRA model built over the reference model's
    own frozen buffers (the usual way to share a base model, so P2's sharing
    is real); ``lora_separate_base`` builds it over a copy instead, which P4
    flags as an avoidable copy. Without LoRA the actor is a full copy of the
    reference, as it must be to train.
    """

    layout: str = "colocated"
    lora: bool = False
    lora_rank: int = 4
    lora_separate_base: bool = False
    engine: str = "vanilla"
    offload: bool = False
    rollout_dtype: str | None = None
    model_size: str = "tiny"
    with_reward: bool = False
    with_critic: bool = False
    sglang_static_lora: bool = True
    anchor: str = "full"
    max_tokens: int = 16
    temperature: float = 1.0
    kv_cache_size: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"unknown layout {self.layout!r}; choose one of {', '.join(LAYOUTS)}")
        if self.engine not in KNOWN_ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(KNOWN_ENGINES)}")
        if self.model_size not in MODEL_SIZES:
            raise ConfigError(f"unknown model size {self.model_size!r}; choose one of {', '.join(MODEL_SIZES)}")
        if self.rollout_dtype is not None and self.rollout_dtype not in ROLLOUT_DTYPES:
            raise ConfigError(f"unknown rollout dtype {self.rollout_dtype!r}; choose one of {', '.join(ROLLOUT_DTYPES)}")
        if self.lora_separate_base and not self.lora:
            raise ConfigError("lora_separate_base needs lora: the separate base is the LoRA actor's frozen part")
        if self.lora and self.lora_rank < 1:
            raise ConfigError(f"lora_rank must be >= 1, got {self.lora_rank}")

    def rollout_config(self) -> RolloutConfig:
        static = self.lora and self.engine == "sglang_jax" and self.sglang_static_lora
        return RolloutConfig(
            max_tokens_to_generate=self.max_tokens,
            temperature=self.temperature,
            kv_cache_size=self.kv_cache_size,
            data_type=self.rollout_dtype,
            seed=self.seed,
            rollout_vllm_model_version=f"rlcluster-lab/{self.model_size}" if self.engine == "vllm" else None,
            rollout_sglang_jax_enable_static_lora=static,
            rollout_sglang_jax_lora_target_modules=("q", "k", "v", "o", "gate", "up", "down") if static else (),
            rollout_sglang_jax_max_lora_rank=self.lora_rank if static else None,
            rollout_sglang_jax_lora_scaling=1.0 if static else None,
        )


def build_models(scenario: Scenario, role_to_mesh: dict[Role, Any]) -> dict[str, nnx.Module]:
    """Actor, reference (and reward/critic when asked), the reference already on its mesh."""
    mesh = role_to_mesh[Role.REFERENCE]
    reference = place_model(init_model(scenario.model_size, seed=scenario.seed), mesh, role="reference")
    if scenario.lora:
        base = place_model(reference, mesh, copy=True) if scenario.lora_separate_base else reference
        actor = with_lora(base, scenario.lora_rank, rngs=nnx.Rngs(scenario.seed + 1))
    else:
        actor = place_model(reference, mesh, copy=True, role="actor")
    models: dict[str, nnx.Module] = {"actor": actor, "reference": reference}
    if scenario.with_reward:
        models["reward"] = init_score_model(scenario.model_size, seed=scenario.seed + 2)
    if scenario.with_critic:
        models["critic"] = init_score_model(scenario.model_size, seed=scenario.seed + 3)
    return models


def build_cluster(
    scenario: Scenario,
    *,
    devices: Sequence[jax.Device] | None = None,
    training_config: TrainingConfig | None = None,
    role_to_mesh: dict[Role, Any] | None = None,
) -> RLCluster:
    """Build the scenario's models and meshes and construct the cluster.

    ``role_to_mesh`` overrides the layout's meshes (e.g. a custom rollout mesh).
    """
    r2m = dict(role_to_mesh) if role_to_mesh is not None else layout_meshes(scenario.layout, devices)
    config = ClusterConfig(
        role_to_mesh=r2m,
        rollout_config=scenario.rollout_config(),
        rollout_engine=scenario.engine,
        offload_to_cpu=scenario.offload,
        training_config=training_config or TrainingConfig(),
        anchor=scenario.anchor,
    )
    models = build_models(scenario, r2m)
    with warnings.catch_warnings():
        # The cluster keeps its own record of P4 warnings (cluster.warnings).
        warnings.simplefilter("ignore")
        return RLCluster(tokenizer=None, cluster_config=config, **models)
