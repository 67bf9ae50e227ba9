"""Small custom engines that record what the cluster hands them."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from flax import nnx

from rlcluster_lab.core.shardings import state_meshes
from rlcluster_lab.engines import RolloutEngine
from rlcluster_lab.placement.place import place_model


class RecordingEngine(RolloutEngine):
    """Samples with the module it is given; records meshes, calls and syncs."""

    def __init__(
        self,
        rollout_actor: nnx.Module,
        tokenizer: Any,
        *,
        mesh: Any = None,
        rollout_config: Any,
        expose_mesh: Any = None,
        fail: bool = False,
    ) -> None:
        super().__init__(rollout_actor, tokenizer, mesh=mesh, rollout_config=rollout_config)
        if fail:
            # Allocate something first, so a failed construction has buffers to release.
            self.scratch = jax.numpy.ones((1024,))
            raise RuntimeError("engine failed on purpose")
        self.received = rollout_actor
        # Like any engine, sample on the mesh it was given (a no-op when the model is there).
        self._model = (
            rollout_actor
            if mesh is None or state_meshes(nnx.state(rollout_actor)) == {mesh}
            else place_model(rollout_actor, mesh)
        )
        self._expose = expose_mesh
        self.generate_meshes: list[Any] = []
        self.generate_calls = 0
        self.updates: list[tuple[Any, list[str]]] = []

    def model(self) -> nnx.Module:
        return self._model

    def generate(self, prompts: list[str], rollout_config: Any) -> Any:
        self.generate_calls += 1
        self.generate_meshes.append(jax.sharding.get_abstract_mesh())
        return super().generate(prompts, rollout_config)

    def update_params(self, params: Any, filter_types: Any = None) -> None:
        paths = ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(params)]
        self.updates.append((filter_types, paths))
        super().update_params(params, filter_types)


class MeshExposingEngine(RecordingEngine):
    @property
    def mesh(self) -> Any:
        return self._expose


def exposing(mesh: Any) -> functools.partial:
    return functools.partial(MeshExposingEngine, expose_mesh=mesh)


class HostTouchingEngine(RecordingEngine):
    """Round-trips weights through host memory during a sync: the CPU transfer guard must stop it."""

    def update_params(self, params: Any, filter_types: Any = None) -> None:
        if filter_types is not None:
            for _, v in nnx.to_flat_state(params):
                x = v.get_value()
                jax.device_put(np.asarray(x), x.sharding)
        super().update_params(params, filter_types)
