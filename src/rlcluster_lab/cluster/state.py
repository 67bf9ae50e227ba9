"""What a constructed cluster holds: the one object its operations and its sync read and change."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from rlcluster_lab.cluster.construct import Placed
from rlcluster_lab.cluster.contexts import ContextLog, RoleContexts
from rlcluster_lab.core.config import ClusterConfig
from rlcluster_lab.core.roles import Mode, Role
from rlcluster_lab.core.states import model_state
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.placement.place import put_on_memory_kind
from rlcluster_lab.rules.anchor import anchor_is_partial

# Which field of ``Placed`` holds each trained role's optimizer state.
OPTIMIZER_FIELD = {Role.ACTOR: "optimizer", Role.CRITIC: "critic_optimizer"}


@dataclasses.dataclass(eq=False)
class ClusterState:
    """A constructed cluster's state (``RLCluster`` keeps nothing else of its own), with the
    syncs done so far (P13) and the operations' re-entrant lock."""

    config: ClusterConfig
    trace: Trace
    contexts: RoleContexts
    placed: Placed
    tx: optax.GradientTransformation
    critic_tx: optax.GradientTransformation
    global_steps: int = 0
    lock: Any = dataclasses.field(default_factory=threading.RLock, repr=False)
    # ``anchor_view``'s last view and the anchor it shows, both by weak reference (see there).
    _view: Any = dataclasses.field(default=None, repr=False)

    @property
    def anchor_is_partial(self) -> bool:
        """P8: the anchor holds the adapters only (anchor='trainable' on a LoRA actor)."""
        return anchor_is_partial(self.config.anchor, self.placed.lora)

    def anchor_view(self) -> Any:
        """The pinned anchor snapshot as a state of its own over the same arrays, the same object
        while anything holds it. While a view is held the next sync pins into new buffers instead
        of writing over these (P8), so a kept snapshot stays as it was; kept by weak reference."""
        anchor = self.placed.anchor
        if anchor is None:
            return None
        view, of = (ref() for ref in self._view) if self._view is not None else (None, None)
        if view is None or of is not anchor:
            view = jax.tree.map(lambda x: x, anchor)
            self._view = (weakref.ref(view), weakref.ref(anchor))
        return view

    def anchor_state(self) -> Any:
        """The state the actor's log-probs are taken with (P10): the pinned snapshot (``anchor_view``),
        merged with the actor's own frozen backbone when it holds the adapters only."""
        view = self.anchor_view()
        if view is None or not self.anchor_is_partial:
            return view
        return nnx.merge_state(model_state(self.placed.actor, nnx.Not(nnx.LoRAParam)), view)

    @property
    def temperature(self) -> float | None:
        """The TRAIN rollout temperature, which every log-prob is taken at."""
        return self.config.rollout_config_for(Mode.TRAIN).temperature

    def pad_id(self) -> int:
        return self.placed.engine.pad_id()

    def isolated(self) -> ClusterState:
        """A twin of this state for the lab's rehearsal: the same config, optimizers, meshes and
        arrays (nothing is copied), held by cloned models (shared weights stay shared), with an
        engine, mover, context record, trace, step count and lock of its own. Its operations run
        the programs this state's would and change, lock or report nothing of this state's.
        """
        placed = self.placed
        engine = placed.engine
        models = (placed.actor, engine.model(), placed.reference, placed.reward, placed.critic)
        originals = [m for m in models if m is not None]
        graphdef, variables = nnx.split(originals)
        # New Variables holding the same arrays (split hands out the models' own Variables).
        clones = dict(zip(map(id, originals), nnx.merge(graphdef, jax.tree.map(lambda x: x, variables))))

        def clone(model: Any) -> Any:
            return None if model is None else clones[id(model)]

        twin_engine = engine.twin(clones)
        if twin_engine.model() is not clones[id(engine.model())]:
            raise TypeError(
                f"the {type(engine).__name__} engine's twin still samples with the engine's own model: override "
                "RolloutEngine.twin to hand it the clone (the rehearsal must not change the cluster's weights)"
            )
        contexts = copy.copy(self.contexts)
        contexts.log = ContextLog()
        twin = dataclasses.replace(
            placed,
            actor=clone(placed.actor),
            engine=twin_engine,
            reference=clone(placed.reference),
            reward=clone(placed.reward),
            critic=clone(placed.critic),
            # The same anchor arrays in Variables of the twin's own: held twice, neither sync writes over them (P8).
            anchor=None if placed.anchor is None else jax.tree.map(lambda x: x, placed.anchor),
            mover=placed.mover.twin(clone, twin_engine),
        )
        return ClusterState(
            self.config, copy.deepcopy(self.trace), contexts, twin, self.tx, self.critic_tx, self.global_steps
        )

    @contextlib.contextmanager
    def working(self, role: Role, model: nnx.Module | None, operation: str) -> Iterator[Mesh]:
        """Every operation's bracket: the role's context entered (recorded under ``operation``),
        its model and sharing partners on device for the work (P14), offloaded again after."""
        with self.contexts.enter(role, operation) as mesh:
            if model is not None:
                self.placed.mover.to_device(model, role)
            try:
                yield mesh
            finally:
                if model is not None:
                    self.placed.mover.to_host(model, role)

    @contextlib.contextmanager
    def optimizer_on_device(self, role: Role) -> Iterator[None]:
        """P14 for ACTOR's or CRITIC's optimizer state: with offload, on device for the steps only."""
        if not self.config.offload_to_cpu:
            yield
            return
        field = OPTIMIZER_FIELD[role]
        setattr(self.placed, field, put_on_memory_kind(getattr(self.placed, field), self.contexts.device_kind(role)))
        try:
            yield
        finally:
            setattr(self.placed, field, put_on_memory_kind(getattr(self.placed, field), "pinned_host"))
