"""The built-in sampler: samples with the module it is handed, on that module's mesh."""
from __future__ import annotations

from typing import Any

from flax import nnx

from rlcluster_lab.config import ConfigError, RolloutConfig
from rlcluster_lab.engines.base import RolloutEngine


class VanillaEngine(RolloutEngine):
    """Real autoregressive sampling with a KV cache, on the module it is given.

    It keeps no copy of its own: when the cluster hands it the actor itself
    (P3, shared branch) it samples with the actor's own buffers. It exposes
    no mesh, so the rollout mesh stays the one in the config (P7).
    """

    owns_weights = False

    @classmethod
    def check(cls, rollout_actor: nnx.Module, rollout_config: RolloutConfig) -> dict[str, Any]:
        has_config = hasattr(rollout_actor, "config")
        if not has_config:
            raise ConfigError(
                "the vanilla engine needs a model with a `config` attribute (num_layers, "
                "num_kv_heads, head_dim) to size its KV cache; use rlcluster_lab.TransformerLM "
                "or give your module a config"
            )
        return {"has_config": has_config}

    def model(self) -> nnx.Module:
        return self.rollout_actor
