"""The built-in sampler: samples with the module it is handed, on that module's mesh."""

from __future__ import annotations

from typing import Any

from flax import nnx

from rlcluster_lab.core.options import RolloutConfig
from rlcluster_lab.engines.base import RolloutEngine
from rlcluster_lab.rules.validation import check_vanilla_model


class VanillaEngine(RolloutEngine):
    """Real autoregressive sampling with a KV cache, on the module it is given: no copy of its own
    (handed the actor, P3 shared, it samples with the actor's buffers) and no mesh (P7)."""

    owns_weights = False

    @classmethod
    def check(cls, rollout_actor: nnx.Module, rollout_config: RolloutConfig) -> dict[str, Any]:
        has_config = hasattr(rollout_actor, "config")
        check_vanilla_model(has_config)
        return {"has_config": has_config}

    def model(self) -> nnx.Module:
        return self.rollout_actor
