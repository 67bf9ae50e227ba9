"""Placement stand-ins for the vLLM and SGLang-JAX rollouts.

Neither vLLM nor SGLang runs here: these engines sample with the vanilla engine's code and
reproduce only the reference's *placement contract* (P6, P7: each class says its own), each
with its own copy of the weights. Their speed says nothing about vLLM or SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rlcluster_lab.core.config import ConfigError, RolloutConfig
from rlcluster_lab.core.meshes import make_mesh
from rlcluster_lab.core.shardings import default_memory_kind
from rlcluster_lab.engines.base import RolloutEngine
from rlcluster_lab.model import is_lora
from rlcluster_lab.placement.place import place_model
from rlcluster_lab.rules.validation import check_sglang_lora, check_vllm_version


def rearranged_device_grid(device_ids: Sequence[int], tp_size: int | None) -> np.ndarray:
    """P7: the device ids of the vllm engine's own mesh, in the given order, shaped
    (n / tp, tp) with tp = n by default. Pure, so the what-if planner builds the same mesh."""
    ids = [int(i) for i in device_ids]
    n = len(ids)
    tp = n if tp_size is None else int(tp_size)
    if tp < 1 or n % tp:
        raise ConfigError(
            f"rollout_vllm_tensor_parallel_size={tp_size} does not divide the {n} rollout devices; "
            f"use a divisor of {n}",
            knobs=("rollout_vllm_tensor_parallel_size",),
            problem=(
                f"rollout_vllm_tensor_parallel_size (--vllm-tp) is {tp_size}, which does not divide the {n} rollout "
                f"devices; use a divisor of {n}"
            ),
        )
    return np.asarray(ids, dtype=np.int64).reshape(n // tp, tp)


class OwnCopyEngine(RolloutEngine):
    """An engine that keeps its own copy of the weights on a mesh it settles on."""

    owns_weights = True

    def __init__(self, rollout_actor: nnx.Module, tokenizer: Any, *, logical_axis_rules: Any = None, **kwargs: Any):
        """As ``RolloutEngine``'s, plus the logical axis rules the copy is placed with."""
        super().__init__(rollout_actor, tokenizer, **kwargs)
        if self.given_mesh is None:
            raise ConfigError(f"the {type(self).__name__} engine needs the rollout mesh to place its weights on")
        mesh = self._engine_mesh = self.settle_mesh(self.given_mesh, self.rollout_config)
        how = dict(memory_kind=default_memory_kind(mesh), role="rollout", copy=True, strategy=self.reshard)
        self._model = place_model(rollout_actor, mesh, logical_axis_rules, **how)

    def model(self) -> nnx.Module:
        return self._model


class VllmStyleEngine(OwnCopyEngine):
    """Stand-in for the vLLM rollout's placement: its own rearranged mesh, its own copy."""

    @classmethod
    def check(cls, rollout_actor: nnx.Module, rollout_config: RolloutConfig) -> dict[str, Any]:
        version = rollout_config.rollout_vllm_model_version
        check_vllm_version(version)
        return {"model_version": version}

    @classmethod
    def settle_mesh(cls, mesh: Mesh, rollout_config: RolloutConfig) -> Mesh:
        """All the mesh's devices, tensor-parallel first: shape (n / tp, tp), tp = n by default."""
        devices = list(np.asarray(mesh.devices).flatten())
        grid = rearranged_device_grid([d.id for d in devices], rollout_config.rollout_vllm_tensor_parallel_size)
        return make_mesh(devices, grid.shape, tuple(mesh.axis_names))

    @property
    def mesh(self) -> Mesh:
        # P7: exposed, so the cluster records this mesh for the rollout role.
        return self._engine_mesh


class SglangJaxStyleEngine(OwnCopyEngine):
    """Stand-in for the SGLang-JAX rollout's placement: given mesh, own copy, no mesh exposed."""

    @classmethod
    def check(cls, rollout_actor: nnx.Module, rollout_config: RolloutConfig) -> dict[str, Any]:
        lora = is_lora(rollout_actor)
        static = rollout_config.rollout_sglang_jax_enable_static_lora
        check_sglang_lora(lora, static)
        return {"actor_has_lora": lora, "static_lora": static}
