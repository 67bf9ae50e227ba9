"""The RL cluster (Tunix's ``rl_cluster.py``): ``RLCluster`` (also ``RLEngine``, P15) validates its
inputs, places every role with ``cluster.construct`` and keeps the result as its ``state``; the
operations and the sync are functions of that state (the mechanism), joined here with the
instruments that watch them from outside. Every decision is a rule's, kept in ``self.trace`` (L1).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rlcluster_lab.cluster import operations
from rlcluster_lab.cluster.construct import Placed
from rlcluster_lab.cluster.contexts import ContextEntry, RoleContexts
from rlcluster_lab.cluster.live import LiveExecutor, construct_live
from rlcluster_lab.cluster.state import ClusterState
from rlcluster_lab.cluster.sync import sync_weights
from rlcluster_lab.cluster.validate import check_inputs, require_config
from rlcluster_lab.core.compile_cache import compiling_for
from rlcluster_lab.core.compile_options import build, platform_of
from rlcluster_lab.core.config import ClusterConfig
from rlcluster_lab.core.options import RolloutConfig
from rlcluster_lab.core.roles import Mode, Role
from rlcluster_lab.core.states import model_split
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.engines import RolloutEngine, RolloutOutput
from rlcluster_lab.measure.sync import SyncObserver, SyncReport
from rlcluster_lab.model import is_lora
from rlcluster_lab.model.logps import model_compiler_options
from rlcluster_lab.model.tokenizer import ByteTokenizer
from rlcluster_lab.rules.reference import AVOIDABLE_COPY_ADVICE
from rlcluster_lab.rules.sharing import SharingMap
from rlcluster_lab.training.batch import TrainBatch
from rlcluster_lab.training.critic import ValueBatch

ModelOrPath = nnx.Module | str | os.PathLike
_Op = TypeVar("_Op", bound=Callable[..., Any])

# What ``RLCluster.build_ahead`` builds: the anchor's and reference's log-probs, and the actor's update.
AHEAD_PARTS = ("scoring", "update")


def _one_at_a_time(method: _Op) -> _Op:
    """An operation holds the state's (re-entrant) lock: two threads stepping at once would
    both start from the same parameters, and one step would be lost."""

    @functools.wraps(method)
    def serialized(self: RLCluster, *args: Any, **kwargs: Any) -> Any:
        with self.state.lock:
            return method(self, *args, **kwargs)

    return serialized  # type: ignore[return-value]


class AvoidableCopyWarning(UserWarning):
    """P4: reference and actor may share a backbone but hold two copies of it."""


class NotConstructedError(RuntimeError):
    """An operation was called on a cluster whose construction did not finish."""


class RLCluster:
    """Places actor, rollout, reference, reward and critic models on their meshes.

    Args:
        actor: the trained policy (an ``nnx.Module`` or a checkpoint folder).
        reference: the frozen KL anchor, optional.
        reward: a reward model, optional.
        critic: a value model, optional.
        tokenizer: defaults to the byte tokenizer.
        cluster_config: meshes per role, the rollout engine and its settings.

    Raises:
        ConfigError: the configuration cannot work (nothing is allocated).
        NotImplementedError: the rollout engine is not supported.
    """

    def __init__(
        self,
        *,
        actor: ModelOrPath,
        reference: ModelOrPath | None = None,
        reward: ModelOrPath | None = None,
        critic: ModelOrPath | None = None,
        tokenizer: Any | None = None,
        cluster_config: ClusterConfig,
    ) -> None:
        self._state: ClusterState | None = None  # set once construction has finished
        self._ahead: dict[str, threading.Thread] = {}  # build_ahead's helpers, by part
        require_config(cluster_config)
        self.cluster_config = cluster_config
        self.trace = Trace()
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        # P7: the frozen config keeps the meshes asked for, the contexts those in use.
        self._contexts = RoleContexts(cluster_config)
        self.config_role_to_mesh: dict[Role, Mesh] = dict(cluster_config.role_to_mesh)
        train_cfg, engine_kind = check_inputs(cluster_config, actor, reference, reward, critic, self.trace)
        tx, critic_tx = cluster_config.training_config.actor_optimizer(), cluster_config.training_config.critic_tx()
        placed = construct_live(  # a construction that raised gives everything back first
            LiveExecutor(
                self._contexts, self.tokenizer, engine_kind, train_cfg, {Role.ACTOR: tx, Role.CRITIC: critic_tx}
            ),
            {Role.ACTOR: actor, Role.REFERENCE: reference, Role.REWARD: reward, Role.CRITIC: critic},
            self.trace,
        )
        self._contexts.role_to_mesh = placed.role_to_mesh
        self._state = ClusterState(cluster_config, self.trace, self._contexts, placed, tx, critic_tx)
        if placed.warnings:
            warnings.warn(AVOIDABLE_COPY_ADVICE, AvoidableCopyWarning, stacklevel=2)
        gc.collect(1)  # construction's short-lived cycles are young: a full collection frees nothing more

    @property
    def state(self) -> ClusterState:
        """What the cluster holds (``ClusterState``); change it only through the operations.

        Raises:
            NotConstructedError: construction did not finish.
        """
        if self._state is None:
            raise NotConstructedError(
                "this RLCluster did not finish construction (it raised); build a new one "
                "with a corrected config before calling its operations"
            )
        return self._state

    def isolated(self) -> RLCluster:
        """A twin of this cluster on the same arrays (``ClusterState.isolated``), for the lab's rehearsal:
        its operations run this cluster's programs and change, record or wait for nothing of this one's."""
        twin = copy.copy(self)
        twin._state = self.state.isolated()
        twin._ahead = {}  # this cluster's helpers are its own: the twin's calls never wait for them
        twin._contexts, twin.trace = twin._state.contexts, twin._state.trace
        return twin

    def _placed(self) -> Placed | None:
        return None if self._state is None else self._state.placed

    @property
    def rollout(self) -> RolloutEngine:
        return self.state.placed.engine

    @property
    def actor_model(self) -> nnx.Module:
        return self.state.placed.actor

    # What construction placed: None before it finished, or for a role not given.
    @property
    def reference_model(self) -> nnx.Module | None:
        return getattr(self._placed(), "reference", None)

    @property
    def reward_model(self) -> nnx.Module | None:
        return getattr(self._placed(), "reward", None)

    @property
    def critic_model(self) -> nnx.Module | None:
        return getattr(self._placed(), "critic", None)

    @property
    def pinned_anchor_state(self) -> Any:
        """What the anchor snapshot holds in pinned host memory (``ClusterState.anchor_view``: while
        it is held, the next sync pins the anchor into new buffers instead of writing over it)."""
        return None if self._state is None else self._state.anchor_view()

    @property
    def optimizer_state(self) -> Any:
        """The actor optimizer's state (moments beside the trainable parameters)."""
        return getattr(self._placed(), "optimizer", None)

    @property
    def critic_optimizer_state(self) -> Any:
        """The critic optimizer's state, on the critic's mesh."""
        return getattr(self._placed(), "critic_optimizer", None)

    @property
    def sharing_map(self) -> SharingMap | None:
        """P1/P2: which roles share weights, from the config's meshes."""
        return getattr(self._placed(), "sharing_map", None)

    @property
    def trainable_is_lora(self) -> bool:
        return is_lora(self.actor_model)

    @property
    def anchor_policy_state(self) -> Any:
        """The state the actor's log-probs are taken with (P10): the last sync's snapshot, merged
        with the actor's own frozen backbone when it holds the adapters only (anchor='trainable')."""
        return None if self._state is None else self._state.anchor_state()

    @property
    def role_to_mesh(self) -> dict[Role, Mesh]:
        """The mesh each role computes on: the config's, with the engine's mesh for the rollout (P7)."""
        return self._contexts.role_to_mesh

    @property
    def global_steps(self) -> int:
        """The syncs done so far (P13)."""
        return 0 if self._state is None else self._state.global_steps

    @property
    def rollout_branch(self) -> str | None:
        """P3's branch: ``shared``, ``second_copy`` or ``engine_initial_value``."""
        return None if self._state is None else self._state.placed.rollout_branch.value

    @property
    def mesh_overridden_by_engine(self) -> bool:
        """P7: the engine brought a rollout mesh other than the config's."""
        return bool(getattr(self._placed(), "mesh_overridden_by_engine", False))

    @property
    def warnings(self) -> list[str]:
        """P4's advice when reference and actor hold two copies of one backbone."""
        return list(getattr(self._placed(), "warnings", []))

    def models(self) -> dict[Role, nnx.Module]:
        """The module each present role computes with (the rollout: the engine's model)."""
        placed = self._placed()
        if placed is None:
            return {}
        out: dict[Role, nnx.Module] = {Role.ACTOR: placed.actor, Role.ROLLOUT: placed.engine.model()}
        others = {Role.REFERENCE: placed.reference, Role.REWARD: placed.reward, Role.CRITIC: placed.critic}
        return out | {role: model for role, model in others.items() if model is not None}

    def get_rollout_config(self, mode: Mode = Mode.TRAIN) -> RolloutConfig:
        return self.cluster_config.rollout_config_for(mode)

    @property
    def platform(self) -> str:
        """The platform of the devices the cluster's meshes use (one platform per cluster)."""
        return self._contexts.platform()

    def devices(self) -> list[Any]:
        """Every device some role's mesh uses, in id order."""
        return self._contexts.devices()

    def rules_for(self, role: Role) -> Any:
        """The role's logical axis rules, or the model family's defaults."""
        return self._contexts.rules_for(Role.parse(role))  # an unknown role is refused, not given the defaults

    @property
    def contexts_entered(self) -> tuple[ContextEntry, ...]:
        """The role contexts entered so far (the last 256), oldest first (``cluster.contexts``)."""
        return self._contexts.log.entries()

    @_one_at_a_time
    def generate(
        self,
        prompts: Sequence[str],
        mode: Mode = Mode.TRAIN,
        micro_batch_size: int | None = None,
        max_generation_steps: int | None = None,
    ) -> RolloutOutput:
        """P9: sample completions on the rollout mesh, in micro-batches if asked."""
        return operations.generate(self.state, prompts, mode, micro_batch_size, max_generation_steps)

    def generated_shape(
        self,
        prompts: Sequence[str],
        mode: Mode = Mode.TRAIN,
        micro_batch_size: int | None = None,
        max_generation_steps: int | None = None,
    ) -> tuple[int, int, int]:
        """(batch, prompt width, completion length) of what ``generate`` with these arguments
        returns, read from the prompts alone: nothing is sampled."""
        return operations.generated_shape(self.state, prompts, mode, micro_batch_size, max_generation_steps)

    @property
    def scores_reference(self) -> bool:
        """Whether an RL step takes the reference's log-probs: a reference and a KL term (``beta`` > 0)."""
        return self.reference_model is not None and self.cluster_config.training_config.beta > 0

    @_one_at_a_time
    def build_ahead(
        self,
        prompts: Sequence[str],
        parts: bool | str | Sequence[str] = True,
        *,
        mode: Mode = Mode.TRAIN,
        micro_batch_size: int | None = None,
        max_generation_steps: int | None = None,
    ) -> tuple[str, ...]:
        """Start building, on helper threads, the programs a first RL step on ``prompts`` runs after its
        sampling, so that they compile while ``generate`` builds and runs the sampler; returns the parts
        started now (``"scoring"``, ``"update"``; ``parts`` True for both, False for none), empty where
        nothing started. ``mode``, ``micro_batch_size`` and ``max_generation_steps`` as that ``generate``
        will be given them (they set the shapes).

        ``"scoring"`` (the anchor's and, with ``scores_reference``, the reference's log-probs) and
        ``"update"`` (one actor update) each run on a twin (``isolated``) over zeros of the shape
        ``generated_shape`` gives, stopped once compiled (``core.compile_options.build``); the step's own
        calls wait for their helper first. Started only where compiling is the wait
        (``_compiling_is_the_wait``) and on one process (no interleaving with others' collectives). A
        helper's error is dropped: the step's own call meets it. A part not in ``AHEAD_PARTS``: ``ValueError``.
        """
        wanted = _ahead_parts(parts)
        if not wanted or jax.process_count() > 1 or not _compiling_is_the_wait(*model_split(self.actor_model)):
            return ()
        # The update first: its program is the longest to build.
        building = {p for p, thread in self._ahead.items() if thread.is_alive()}
        todo = [p for p in ("update", "scoring") if p in wanted and p not in building]
        try:
            batch, width, length = self.generated_shape(prompts, mode, micro_batch_size, max_generation_steps)
            twins = {p: self.isolated() for p in todo}  # one each: a cluster runs one operation at a time
        except Exception:  # noqa: BLE001 - bad prompts, an engine without a twin: the step's own calls say what is wrong
            return ()
        prompt, completion = np.zeros((batch, width), np.int32), np.zeros((batch, length), np.int32)
        logps = np.zeros((batch, length), np.float32)
        reference = self.scores_reference

        def scoring(twin: RLCluster) -> None:
            build(lambda: twin.get_actor_per_token_logps(prompt, completion))
            if reference:
                build(lambda: twin.get_ref_per_token_logps(prompt, completion))

        def update(twin: RLCluster) -> None:
            zeros = TrainBatch(prompt, completion, np.zeros(batch, np.float32), logps, logps if reference else None)
            build(lambda: twin.update_actor(zeros))

        caller = threading.get_ident()
        work = {"scoring": scoring, "update": update}

        def body(part: str) -> None:
            # Counted as the caller's compilations; an error is dropped: the step's own call meets it and reports it.
            with contextlib.suppress(Exception), compiling_for(caller):
                work[part](twins[part])

        for part in todo:
            # Not a daemon: a daemon thread stopped inside an XLA compilation aborts the process.
            thread = threading.Thread(target=body, args=(part,), name=f"rlcluster-lab-ahead-{part}", daemon=False)
            thread.start()
            self._ahead[part] = thread  # once started: a thread that could not start is never waited for
        return tuple(todo)

    def wait_for_builds(self) -> None:
        """Wait until every helper ``build_ahead`` started has finished (at once when none runs)."""
        for part in list(self._ahead):
            self._wait_for(part)

    def _wait_for(self, part: str) -> None:
        """Before a call that runs ``part``'s programs its helper finishes (no program compiled twice at once)."""
        thread = self._ahead.pop(part, None)
        if thread is not None:
            thread.join()

    @_one_at_a_time
    def per_token_logps(
        self, role: Role, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        """Per-token log-probs under REFERENCE, ACTOR (the anchor, P10) or ROLLOUT, through the
        named shorthand (as in the reference), so a subclass that overrides one changes this too."""
        shorthand = {
            Role.REFERENCE: self.get_ref_per_token_logps,
            Role.ACTOR: self.get_actor_per_token_logps,
            Role.ROLLOUT: self.get_old_per_token_logps,
        }.get(Role.parse(role))
        if shorthand is None:
            raise ValueError(f"per-token log-probs come from actor, reference or rollout, not {Role.parse(role).value}")
        return shorthand(prompt_tokens, completion_tokens, micro_batch_size)

    @_one_at_a_time
    def get_ref_per_token_logps(
        self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        """Log-probs under the reference model, on its mesh."""
        self._wait_for("scoring")
        return operations.reference_logps(self.state, prompt_tokens, completion_tokens, micro_batch_size)

    @_one_at_a_time
    def get_old_per_token_logps(
        self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        """Log-probs under the rollout engine's own weights."""
        return operations.rollout_logps(self.state, prompt_tokens, completion_tokens, micro_batch_size)

    @_one_at_a_time
    def get_actor_per_token_logps(
        self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        """P10: the live actor's graph run over the *anchor* state (P11 says why)."""
        self._wait_for("scoring")
        return operations.anchor_logps(self.state, prompt_tokens, completion_tokens, micro_batch_size)

    @_one_at_a_time
    def get_live_actor_per_token_logps(
        self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        """The actor's log-probs with its *live* weights: what P11 warns against (not used by training)."""
        self._wait_for("scoring")
        return operations.live_actor_logps(self.state, prompt_tokens, completion_tokens, micro_batch_size)

    @_one_at_a_time
    def update_actor(self, batch: TrainBatch, on_step: Any = None) -> list[dict[str, float]]:
        """P12: optimizer steps on the actor, on its mesh, one per mini-batch per iteration; one metrics
        dict per step. ``on_step(iteration, rows, live_logps)`` is called before each step, inside the
        operation, ``live_logps`` scoring with the actor's weights of that moment (P11 made visible)."""
        self._wait_for("update")
        return operations.update_actor(self.state, batch, on_step)

    @_one_at_a_time
    def update_critic(self, batch: ValueBatch) -> list[dict[str, float]]:
        """P12 for the critic: clipped value-loss steps with the critic's own optimizer, on the
        critic mesh, one per mini-batch per iteration; one metrics dict per step.

        Raises:
            ValueError: the cluster has no critic.
            TypeError: ``batch`` is not a ``ValueBatch``.
        """
        return operations.update_critic(self.state, batch)

    @_one_at_a_time
    def train(self, role: Role | str, batch: Any, **kwargs: Any) -> list[dict[str, float]]:
        """The reference's generic training primitive: ``update_actor`` for ACTOR, ``update_critic`` for
        CRITIC (``kwargs`` passed on), so a subclass that overrides one changes this too; any other role
        is a ``ValueError`` ("Unsupported role for train: ...")."""
        trained = {Role.ACTOR.value: self.update_actor, Role.CRITIC.value: self.update_critic}
        update = trained.get(role.value if isinstance(role, Role) else str(role).lower())
        if update is None:
            raise ValueError(f"Unsupported role for train: {role}; train takes Role.ACTOR or Role.CRITIC")
        return update(batch, **kwargs)

    @_one_at_a_time
    def sync_weights(self, *, peak: bool = True) -> SyncReport:
        """P13: hand the actor's trainable (LoRA) or full parameters to the rollout engine, re-pin the
        anchor, advance the global step; returns what moved and (``peak``) the transient peak (L3)."""
        return sync_weights(self.state, SyncObserver(peak=peak))

    @_one_at_a_time
    def get_rewards(self, prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        """Scores (B,) from the reward model, on the reward mesh."""
        return operations.score(self.state, Role.REWARD, prompt_tokens, completion_tokens, per_token=False)

    @_one_at_a_time
    def get_values(self, prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        """Per-token values (B, C) from the critic, on the critic mesh."""
        return operations.score(self.state, Role.CRITIC, prompt_tokens, completion_tokens, per_token=True)


RLEngine = RLCluster  # P15: one class, two names


def _compiling_is_the_wait(graphdef: nnx.GraphDef, state: Any) -> bool:
    """Whether a first step on this model waits on XLA compiling rather than on running: where
    the lab chooses cheaper compiling (a small model on CPU or GPU), and on a TPU, whose compiler
    takes seconds a program at any size. Not for a larger model on CPU, whose cores are busy sampling."""
    return model_compiler_options(graphdef, state) is not None or platform_of(state) == "tpu"


def _ahead_parts(parts: Any) -> tuple[str, ...]:
    """``build_ahead``'s ``parts`` as names from ``AHEAD_PARTS``."""
    if parts is True:
        return AHEAD_PARTS
    if parts is False or parts is None:
        return ()
    names = (parts,) if isinstance(parts, str) else tuple(parts)
    unknown = [p for p in names if p not in AHEAD_PARTS]
    if unknown:
        raise ValueError(
            f"build_ahead builds {' and '.join(map(repr, AHEAD_PARTS))}, not {', '.join(map(repr, unknown))}; "
            "pass True for both or False for none"
        )
    return names
