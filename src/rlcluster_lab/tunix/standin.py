"""The vllm scenarios on Tunix's own cluster: a custom Tunix engine with vLLM's placement.

vLLM does not run on these CPUs. An engine class of Tunix's own is the vllm path's twin: it is
handed the trainer's model (P3) and its ``mesh`` replaces the rollout mesh (P7).
``VllmStandInRollout`` wraps the lab's vllm-style stand-in as such an engine, syncing through
Tunix's ``reshard.reshard_pytree``, so the sync measured is Tunix's (its speed says nothing of vLLM).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from flax import nnx

from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES
from rlcluster_lab.core.options import RolloutConfig
from rlcluster_lab.engines.own_copy import VllmStyleEngine
from rlcluster_lab.model.tokenizer import ByteTokenizer
from rlcluster_lab.tunix.extra import require


def lab_rollout_config(tunix_config: Any) -> RolloutConfig:
    """The lab's rollout config with the sampling settings of one of Tunix's."""
    tp = tunix_config.tensor_parallel_size
    return RolloutConfig(
        max_tokens_to_generate=int(tunix_config.max_tokens_to_generate),
        temperature=float(tunix_config.temperature),
        kv_cache_size=int(tunix_config.kv_cache_size),
        seed=int(tunix_config.seed) if tunix_config.seed is not None else 0,
        rollout_vllm_model_version=tunix_config.rollout_vllm_model_version,
        # Tunix's -1 means "every device", the lab's None.
        rollout_vllm_tensor_parallel_size=int(tp) if tp is not None and tp > 0 else None,
    )


@functools.cache
def vllm_stand_in() -> type:
    """The Tunix engine class for the vllm scenarios, made once (``TunixMissingError`` without Tunix)."""
    tunix = require("the vllm stand-in engine for Tunix")
    base = tunix.base_rollout

    class VllmStandInRollout(base.BaseRollout):
        """vLLM's placement as a Tunix engine: own rearranged mesh (P7), own copy, Tunix's reshard."""

        def __init__(self, rollout_actor: nnx.Module, tokenizer: Any, mesh: Any, rollout_config: Any, **_: Any):
            self._config = lab_rollout_config(rollout_config)
            self._engine = VllmStyleEngine(
                rollout_actor,
                ByteTokenizer(),
                mesh=mesh,
                rollout_config=self._config,
                logical_axis_rules=DEFAULT_LOGICAL_AXIS_RULES,
                cache_size=self._config.kv_cache_size,
            )

        @property
        def mesh(self) -> Any:
            return self._engine.mesh

        def model(self) -> nnx.Module:
            return self._engine.model()

        def update_params(self, params: Any, filter_types: tuple[Any, ...] | None = None) -> None:
            model = self._engine.model()
            target = nnx.state(model, *filter_types) if filter_types else nnx.state(model)
            # Tunix's own reshard, as its vLLM sampler uses: the measured sync is Tunix's.
            nnx.update(model, tunix.reshard.reshard_pytree(params, target))

        def generate(self, prompts: list[str], rollout_config: Any, **_: Any) -> Any:
            out = self._engine.generate(prompts, lab_rollout_config(rollout_config))
            return base.RolloutOutput(
                text=list(out.text),
                logits=None,
                tokens=[np.asarray(t) for t in out.tokens],
                left_padded_prompt_tokens=np.asarray(out.left_padded_prompt_tokens),
                logprobs=[np.asarray(p) for p in out.logprobs],
            )

        def get_per_token_logps(self, prompt_tokens: Any, completion_tokens: Any) -> Any:
            return self._engine.get_per_token_logps(prompt_tokens, completion_tokens)

        def pad_id(self) -> int:
            return self._engine.pad_id()

        def eos_id(self) -> int:
            return self._engine.eos_id()

    return VllmStandInRollout
