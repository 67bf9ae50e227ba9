"""The RL cluster: where every model of an RL run lives, and the operations on them.

``RLCluster`` (also named ``RLEngine``, P15) validates its inputs
(``cluster.validate``), places every role by running ``cluster.construct``
on real arrays (``cluster.live``), and offers the operations a learner needs
(``cluster.operations``) and the weight sync (``cluster.sync``). Every
decision is taken by a rule function (``rules/``) and kept in ``self.trace``
(L1).
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh

from rlcluster_lab.cluster import operations
from rlcluster_lab.cluster.construct import Keeper, Request, construct
from rlcluster_lab.cluster.contexts import ContextEntry, ContextLog
from rlcluster_lab.cluster.live import LiveExecutor
from rlcluster_lab.cluster.sync import sync_weights
from rlcluster_lab.cluster.validate import check_inputs, engine_class, require_config
from rlcluster_lab.core.config import ClusterConfig, max_kv_cache_size
from rlcluster_lab.core.hosts import home_device
from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES
from rlcluster_lab.core.options import RolloutConfig, dtype_name
from rlcluster_lab.core.roles import Mode, Role
from rlcluster_lab.core.shardings import array_leaves, default_memory_kind
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.engines import OwnCopyEngine, RolloutEngine, RolloutOutput
from rlcluster_lab.measure.sync import SyncReport
from rlcluster_lab.model import is_lora
from rlcluster_lab.model.tokenizer import ByteTokenizer
from rlcluster_lab.placement.buffers import buffer_keys
from rlcluster_lab.placement.reshard import reshard_strategy
from rlcluster_lab.rules.anchor import anchor_is_partial
from rlcluster_lab.rules.reference import AVOIDABLE_COPY_ADVICE
from rlcluster_lab.training.critic import ValueBatch
from rlcluster_lab.training.step import TrainBatch

ModelOrPath = nnx.Module | str | os.PathLike


def _given_modules(*models: Any) -> list[nnx.Module]:
    """The caller's models (not paths), each once."""
    return list({id(m): m for m in models if isinstance(m, nnx.Module)}.values())


def _arrays_of(obj: Any) -> list[jax.Array]:
    """The arrays a model, an engine's model or a pytree (optimizer state, anchor) holds."""
    if isinstance(obj, RolloutEngine):
        try:
            obj = obj.model()
        except Exception:  # an engine that failed half-way: what it holds is not ours to judge
            return []
    if isinstance(obj, nnx.Module):
        obj = nnx.state(obj)
    return array_leaves(obj)


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
        self._constructed = False
        require_config(cluster_config)
        self.cluster_config = cluster_config
        self.trace = Trace()
        self._contexts = ContextLog()  # every role context entered, construction's included
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        # The reference writes the engine's mesh into its role_to_mesh dict (P7);
        # the frozen config keeps what the user asked for, this dict what is used.
        self.role_to_mesh: dict[Role, Mesh] = dict(cluster_config.role_to_mesh)
        self.config_role_to_mesh: dict[Role, Mesh] = dict(cluster_config.role_to_mesh)
        self.mesh_overridden_by_engine = False
        self.global_steps = 0
        self.rollout_branch: str | None = None
        self.warnings: list[str] = []
        self._actor = self._reference = self._reward = self._critic = None
        self._rollout: RolloutEngine | None = None
        self._opt_state: Any = None
        self._anchor_policy_state: Any = None
        self._tx = cluster_config.training_config.actor_optimizer()
        self._critic_tx = cluster_config.training_config.critic_tx()
        self._critic_opt_state: Any = None
        train_cfg, self._engine_kind = check_inputs(cluster_config, actor, reference, reward, critic, self.trace)
        self._train_rollout_config: RolloutConfig = train_cfg

        # Ownership (not timing) decides what a failed construction frees: the arrays that
        # existed before are never touched, the caller's models get their own arrays back
        # (values, buffers and memory kinds), and only what construction made is deleted.
        before = {id(x) for x in jax.live_arrays()}
        saved = [(m, jax.tree.map(lambda x: x, nnx.state(m))) for m in _given_modules(actor, reference, reward, critic)]
        made: dict[str, Any] = {}
        try:
            with reshard_strategy(cluster_config.reshard):
                placed = construct(
                    LiveExecutor(self),
                    Request(
                        actor=actor,
                        reference=reference,
                        reward=reward,
                        critic=critic,
                        role_to_mesh=self.role_to_mesh,
                        engine_kind=self._engine_kind,
                        engine_name=cluster_config.engine_name(),
                        rollout_dtype=None if train_cfg.data_type is None else dtype_name(train_cfg.data_type),
                        offload_to_cpu=cluster_config.offload_to_cpu,
                        anchor_mode=cluster_config.anchor,
                        actor_is_module=isinstance(actor, nnx.Module),
                        reference_is_module=reference is None or isinstance(reference, nnx.Module),
                    ),
                    self.trace,
                    sink=made,
                )
        except BaseException as exc:
            freed = self._abandon(made, saved, before)
            exc.add_note(
                f"RLCluster construction did not finish: the models you passed were given back their own "
                f"arrays and memory kinds, and the {freed} array(s) construction had made were freed."
            )
            raise
        del saved
        self._actor, self._rollout, self._reference = placed.actor, placed.engine, placed.reference
        self._reward, self._critic = placed.reward, placed.critic
        self._opt_state, self._anchor_policy_state = placed.optimizer, placed.anchor
        self._critic_opt_state = placed.critic_optimizer
        self.role_to_mesh, self.sharing_map = placed.role_to_mesh, placed.sharing_map
        self.rollout_branch = placed.rollout_branch.value
        self.mesh_overridden_by_engine = placed.mesh_overridden_by_engine
        self._trainable_filter = nnx.LoRAParam if placed.lora else nnx.Param
        self._keeper: Keeper = placed.keeper
        self.warnings = list(placed.warnings)
        if self.warnings:
            warnings.warn(AVOIDABLE_COPY_ADVICE, AvoidableCopyWarning, stacklevel=2)
        gc.collect()
        self._constructed = True

    def _abandon(self, made: dict[str, Any], saved: list[tuple[nnx.Module, Any]], before: set[int]) -> int:
        """After a failed construction: give the caller's models their arrays back and free
        exactly what construction made. Returns the number of arrays freed.

        Construction's own arrays are those reachable from what it made (``made``) and
        those it put into the caller's models; an array that existed before, or that
        shares a buffer with one of the caller's arrays (a reshard may reuse a source
        buffer), is kept. Arrays anyone else made meanwhile are never reached.
        """
        self._actor = self._reference = self._reward = self._critic = None
        self._rollout = None
        self._anchor_policy_state = self._opt_state = self._critic_opt_state = None
        ours = [x for obj in made.values() for x in _arrays_of(obj)]
        ours += [x for model, _ in saved for x in array_leaves(nnx.state(model))]
        for model, snapshot in saved:
            nnx.update(model, snapshot)
        protected = buffer_keys([snapshot for _, snapshot in saved])
        made.clear()
        freed = 0
        for x in {id(x): x for x in ours}.values():
            if id(x) in before or x.is_deleted() or buffer_keys([x]) & protected:
                continue
            x.delete()
            freed += 1
        gc.collect()
        return freed

    # ------------------------------------------------------------------ models and meshes

    @property
    def rollout(self) -> RolloutEngine:
        self._require_constructed()
        assert self._rollout is not None
        return self._rollout

    @property
    def actor_model(self) -> nnx.Module:
        self._require_constructed()
        assert self._actor is not None
        return self._actor

    @property
    def reference_model(self) -> nnx.Module | None:
        return self._reference

    @property
    def reward_model(self) -> nnx.Module | None:
        return self._reward

    @property
    def critic_model(self) -> nnx.Module | None:
        return self._critic

    @property
    def trainable_is_lora(self) -> bool:
        return is_lora(self.actor_model)

    @property
    def _anchor_is_partial(self) -> bool:
        return self._actor is not None and anchor_is_partial(self.cluster_config.anchor, is_lora(self._actor))

    @property
    def anchor_policy_state(self) -> Any:
        """The state the actor's log-probs are taken with (P10): the last sync's snapshot.

        With anchor='trainable' on a LoRA actor the pinned snapshot holds the
        adapters only; the frozen backbone, which training never changes, is
        the actor's own, so the merged state equals a full snapshot.
        """
        if self._anchor_policy_state is None or not self._anchor_is_partial:
            return self._anchor_policy_state
        assert self._actor is not None
        return nnx.merge_state(nnx.state(self._actor, nnx.Not(nnx.LoRAParam)), self._anchor_policy_state)

    @property
    def pinned_anchor_state(self) -> Any:
        """What the anchor snapshot itself holds in pinned host memory."""
        return self._anchor_policy_state

    @property
    def optimizer_state(self) -> Any:
        """The actor optimizer's state (moments live beside the trainable parameters)."""
        return self._opt_state

    @property
    def critic_optimizer_state(self) -> Any:
        """The critic optimizer's state (None without a critic), on the critic's mesh."""
        return self._critic_opt_state

    def models(self) -> dict[Role, nnx.Module]:
        """The module each present role computes with (the rollout: the engine's model)."""
        out: dict[Role, nnx.Module] = {}
        if self._actor is not None:
            out[Role.ACTOR] = self._actor
        if self._rollout is not None:
            out[Role.ROLLOUT] = self._rollout.model()
        for role, model in (
            (Role.REFERENCE, self._reference),
            (Role.REWARD, self._reward),
            (Role.CRITIC, self._critic),
        ):
            if model is not None:
                out[role] = model
        return out

    def get_rollout_config(self, mode: Mode = Mode.TRAIN) -> RolloutConfig:
        return self.cluster_config.rollout_config_for(mode)

    @property
    def platform(self) -> str:
        """The platform of the devices the cluster's meshes use (one platform per cluster)."""
        return next(iter(self.role_to_mesh[Role.ACTOR].devices.flat)).platform

    def devices(self) -> list[Any]:
        """Every device some role's mesh uses, in id order."""
        found = {d for mesh in self.role_to_mesh.values() for d in mesh.devices.flat}
        return sorted(found, key=lambda d: d.id)

    def rules_for(self, role: Role) -> Any:
        """The role's logical axis rules, or the model family's defaults."""
        rules = self.cluster_config.logical_axis_rules(role)
        return rules if rules is not None else DEFAULT_LOGICAL_AXIS_RULES

    def _device_kind(self, role: Role) -> str:
        """The default memory kind of the devices the role's mesh uses (where it computes)."""
        return default_memory_kind(self.role_to_mesh[role])

    # ------------------------------------------------------------------ the role context

    @property
    def contexts_entered(self) -> tuple[ContextEntry, ...]:
        """The role contexts entered so far (the last 256), oldest first: which operation,
        which role, and the mesh JAX reported as current inside (``cluster.contexts``)."""
        return self._contexts.entries()

    @contextlib.contextmanager
    def _role_context(self, role: Role, operation: str = "(unnamed)") -> Iterator[Mesh]:
        """Enter the role's mesh, its devices as the default ones (arrays made without a
        placement land there, not on JAX's default backend), the configured matmul
        precision, the reshard strategy and, when configured, its logical axis rules;
        ``operation`` names the entry in ``contexts_entered``."""
        mesh = self.role_to_mesh[role]
        rules = self.cluster_config.logical_axis_rules(role)
        with contextlib.ExitStack() as stack:
            stack.enter_context(jax.set_mesh(mesh))
            # multi-process: the mesh's first device this process owns (home_device).
            stack.enter_context(jax.default_device(home_device(mesh)))
            if self.cluster_config.matmul_precision is not None:
                stack.enter_context(jax.default_matmul_precision(self.cluster_config.matmul_precision))
            stack.enter_context(reshard_strategy(self.cluster_config.reshard))
            if rules:
                stack.enter_context(nnx.logical_axis_rules(list(rules)))
            self._contexts.record(operation, role.value, mesh)  # read inside: what JAX has current
            yield mesh

    @contextlib.contextmanager
    def _working(self, role: Role, model: nnx.Module | None, operation: str) -> Iterator[Mesh]:
        """Every operation's bracket: require a finished construction, enter the role's
        context, bring its model to device (P14), work, and offload it again, even when
        the work raised."""
        self._require_constructed()
        with self._role_context(role, operation) as mesh:
            if model is not None:
                self._keeper.to_device(model, role)
            try:
                yield mesh
            finally:
                if model is not None:
                    self._keeper.to_host(model, role)

    def _require_constructed(self) -> None:
        if not self._constructed:
            raise NotConstructedError(
                "this RLCluster did not finish construction (it raised); build a new one "
                "with a corrected config before calling its operations"
            )

    # ------------------------------------------------------------------ operations

    def generate(
        self,
        prompts: Sequence[str],
        mode: Mode = Mode.TRAIN,
        micro_batch_size: int | None = None,
        max_generation_steps: int | None = None,
    ) -> RolloutOutput:
        """P9: sample completions on the rollout mesh, in micro-batches if asked."""
        return operations.generate(self, prompts, mode, micro_batch_size, max_generation_steps)

    def per_token_logps(
        self, role: Role, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        """Per-token log-probs under REFERENCE, ACTOR (the anchor, P10) or ROLLOUT."""
        return operations.per_token_logps(self, Role.parse(role), prompt_tokens, completion_tokens, micro_batch_size)

    def get_ref_per_token_logps(
        self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        return operations.per_token_logps(self, Role.REFERENCE, prompt_tokens, completion_tokens, micro_batch_size)

    def get_old_per_token_logps(
        self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        """Log-probs under the rollout engine's own weights."""
        return operations.per_token_logps(self, Role.ROLLOUT, prompt_tokens, completion_tokens, micro_batch_size)

    def get_actor_per_token_logps(
        self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        """P10: the live actor's graph run over the *anchor* state (P11 says why)."""
        return operations.per_token_logps(self, Role.ACTOR, prompt_tokens, completion_tokens, micro_batch_size)

    def get_live_actor_per_token_logps(
        self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        """The actor's log-probs with its *live* weights: what P11 warns against (not used by training)."""
        return operations.live_actor_logps(self, prompt_tokens, completion_tokens, micro_batch_size)

    def update_actor(self, batch: TrainBatch, on_step: Any = None) -> list[dict[str, float]]:
        """P12: optimizer steps on the actor, on its mesh, one per mini-batch per iteration.

        ``on_step(iteration, rows, live_logps)``, when given, is called before
        each step; ``live_logps(prompt_tokens, completion_tokens)`` scores with
        the actor's weights as they are at that moment (P11 made visible).
        Returns one metrics dict per step.
        """
        return operations.update_actor(self, batch, on_step)

    def update_critic(self, batch: ValueBatch) -> list[dict[str, float]]:
        """P12 for the critic: clipped value-loss steps (``TrainingConfig.clip_range_value``)
        with the critic's own optimizer, on the critic mesh, one per mini-batch per iteration.

        Returns:
            One metrics dict per optimizer step (``loss``, ``vpred_mean``, ``vf_clipfrac``,
            ``return_mean``, ``grad_norm``, ``rejected``).

        Raises:
            ValueError: the cluster has no critic.
            TypeError: ``batch`` is not a ``ValueBatch``.
        """
        return operations.update_critic(self, batch)

    def train(self, role: Role | str, batch: Any, **kwargs: Any) -> list[dict[str, float]]:
        """The reference's generic training primitive: ``update_actor`` for ACTOR (``batch`` a
        ``TrainBatch``, ``on_step`` passed on), ``update_critic`` for CRITIC (a ``ValueBatch``).

        Raises:
            ValueError: any other role ("Unsupported role for train: ...").
        """
        try:
            parsed = Role.parse(role)
        except ValueError:
            parsed = None
        if parsed is Role.ACTOR:
            return self.update_actor(batch, **kwargs)
        if parsed is Role.CRITIC:
            return self.update_critic(batch, **kwargs)
        raise ValueError(f"Unsupported role for train: {role}; train takes Role.ACTOR or Role.CRITIC")

    def sync_weights(self) -> SyncReport:
        """P13: hand the actor's trainable (LoRA) or full parameters to the rollout engine, re-pin
        the anchor, advance the global step; returns what the sync really moved (L3)."""
        return sync_weights(self)

    def rehearse_step(self, prompts: Sequence[str], reward_model: bool = False) -> bool:
        """Run every program one RL step uses, on these prompts' shapes, changing no state."""
        return operations.rehearse_step(self, prompts, reward_model)

    def get_rewards(self, prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        """Scores (B,) from the reward model, on the reward mesh."""
        return operations.score(self, Role.REWARD, prompt_tokens, completion_tokens, per_token=False)

    def get_values(self, prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        """Per-token values (B, C) from the critic, on the critic mesh."""
        return operations.score(self, Role.CRITIC, prompt_tokens, completion_tokens, per_token=True)


RLEngine = RLCluster  # P15: one class, two names


def engine_arguments(cluster: RLCluster, rollout_actor: nnx.Module, mesh: Any) -> tuple[Any, dict[str, Any]]:
    """How the engine is built, as in the reference: every engine gets the TRAIN rollout config
    unchanged; the KV cache size (the largest over modes) travels as its own argument, to the
    engines that take one (vanilla, vllm), never to sglang_jax or a user's engine."""
    config = cluster.cluster_config
    kind = cluster._engine_kind
    kwargs: dict[str, Any] = dict(
        rollout_actor=rollout_actor,
        tokenizer=cluster.tokenizer,
        mesh=mesh,
        rollout_config=cluster._train_rollout_config,
    )
    if kind == "custom":
        return config.rollout_engine, kwargs
    cls = engine_class(config, kind)
    if kind in ("vanilla", "vllm"):
        kwargs["cache_size"] = max_kv_cache_size(config)
    if issubclass(cls, OwnCopyEngine):
        kwargs["logical_axis_rules"] = cluster.rules_for(Role.ROLLOUT)
    return cls, kwargs
