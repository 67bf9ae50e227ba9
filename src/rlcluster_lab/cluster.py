"""The RL cluster: where every model of an RL run lives, and the operations on them.

``RLCluster`` (also named ``RLEngine``, P15) reproduces the placement rules
P1-P14 of the reference cluster and records each branch it takes in
``self.trace`` (L1).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict
from jax.sharding import Mesh

from rlcluster_lab import checkpoint
from rlcluster_lab.config import (
    ClusterConfig,
    ConfigError,
    RolloutConfig,
    check_engine_choice,
    check_rollout_config,
    max_kv_cache_size,
    parse_dtype,
)
from rlcluster_lab.engines import ENGINES, OwnCopyEngine, RolloutEngine, RolloutOutput
from rlcluster_lab.engines.base import flat_values, reshard_flat
from rlcluster_lab.measure import SyncReport, flat_leaves, new_shards, shard_facts, sync_report
from rlcluster_lab.meshes import describe_mesh
from rlcluster_lab.model import DEFAULT_LOGICAL_AXIS_RULES, is_lora, logps_from_state
from rlcluster_lab.placement import (
    array_leaves,
    default_memory_kind,
    load_model,
    move_model,
    put_on_memory_kind,
)
from rlcluster_lab.reshard import record_transfers, reshard_strategy, shard_keys
from rlcluster_lab.roles import Mode, Role
from rlcluster_lab.sharing import SharingMap, build_sharing_map, rollout_branch, shares
from rlcluster_lab.tokenizer import ByteTokenizer
from rlcluster_lab.trace import Trace
from rlcluster_lab.training import TrainBatch, batch_arrays, init_optimizer_state, mini_batches, train_step

ModelOrPath = Union[nnx.Module, str, os.PathLike]

ROLLOUT_BRANCHES = ("shared", "second_copy", "engine_initial_value")


class AvoidableCopyWarning(UserWarning):
    """P4: reference and actor may share a backbone but hold two copies of it."""


class NotConstructedError(RuntimeError):
    """An operation was called on a cluster whose construction did not finish."""


class RLCluster:
    """Places actor, rollout, reference, reward and critic models on their meshes.

    Construction follows the reference order: sharing map from the config's
    meshes (P1, P2); the actor, then the rollout model (P3), the reference
    (P4), critic and reward, each loaded onto its mesh (P5); the rollout
    engine, which may replace the rollout mesh (P6, P7); the optimizer; the
    anchor snapshot on pinned host (P8). Every branch is in ``self.trace``.
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
        self.cluster_config = cluster_config
        self.trace = Trace()
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        # The reference writes the engine's mesh into its role_to_mesh dict (P7);
        # the frozen config keeps what the user asked for, this dict what is used.
        self.role_to_mesh: dict[Role, Mesh] = dict(cluster_config.role_to_mesh)
        self.config_role_to_mesh: dict[Role, Mesh] = dict(cluster_config.role_to_mesh)
        self.mesh_overridden_by_engine = False
        self.global_steps = 0
        self.rollout_branch: str | None = None
        self.warnings: list[str] = []
        self._anchor_policy_state: Any = None
        self._actor: nnx.Module | None = None
        self._reference: nnx.Module | None = None
        self._reward: nnx.Module | None = None
        self._critic: nnx.Module | None = None
        self._rollout: RolloutEngine | None = None
        self._opt_state: Any = None

        before = {id(x) for x in jax.live_arrays()}
        try:
            with reshard_strategy(cluster_config.reshard):
                self._construct(actor, reference, reward, critic)
        except BaseException:
            self._release_new_buffers(before, keep=(actor, reference, reward, critic))
            raise
        self._constructed = True

    # ------------------------------------------------------------------ construction

    def _construct(self, actor: Any, reference: Any, reward: Any, critic: Any) -> None:
        cfg = self.cluster_config
        actor_is_module = isinstance(actor, nnx.Module)
        reference_is_module = reference is None or isinstance(reference, nnx.Module)
        self._check_inputs(actor, reference, reward, critic)

        # P1, P2 from the config's meshes, before any model or engine exists.
        self.sharing_map: SharingMap = build_sharing_map(
            self.role_to_mesh,
            actor_is_module=actor_is_module,
            actor_has_lora=actor_is_module and is_lora(actor),
            has_reference=reference is not None,
            reference_is_module=reference_is_module,
            trace=self.trace,
        )

        actor_src = self._as_module(actor, "actor")
        self._actor = self._load(actor_src, Role.ACTOR)

        # P3: one object, a second copy, or an initial value for the engine.
        rollout_cfg = cfg.rollout_config_for(Mode.TRAIN)
        linked = shares(self.sharing_map, Role.ACTOR, Role.ROLLOUT)
        self.rollout_branch = rollout_branch(linked, self._engine_kind)
        if self.rollout_branch == "shared":
            rollout_actor = self._actor
            outcome = "rollout model is the actor model: one object, no second copy"
        elif self.rollout_branch == "second_copy":
            # A fresh load of the actor as given (a path is read again).
            src = actor if actor_is_module else self._as_module(actor, "actor")
            rollout_actor = self._load(src, Role.ROLLOUT, dtype=parse_dtype(rollout_cfg.data_type))
            outcome = "actor loaded a second time onto the rollout mesh" + (
                f", cast to {rollout_cfg.data_type}" if rollout_cfg.data_type else ""
            )
        else:
            rollout_actor = self._actor
            outcome = f"the {cfg.engine_name()} engine gets the trainer's model as its initial weights"
        self.trace.record(
            "P3",
            "ROLLOUT in sharing_map[ACTOR]; else engine == 'vanilla'",
            {"rollout_linked_to_actor": linked, "engine": cfg.engine_name(), "rollout_dtype": rollout_cfg.data_type},
            outcome,
        )

        if reference is not None:
            self._reference = self._load(self._as_module(reference, "reference"), Role.REFERENCE)
            if shares(self.sharing_map, Role.ACTOR, Role.REFERENCE):
                same = sharing_backbone(self._reference, self._actor)
                note = (
                    "; with offload_to_cpu these are the two host copies made during construction, "
                    "which P14 joins again when a shared role is next loaded"
                    if cfg.offload_to_cpu
                    else ""
                )
                self.trace.record(
                    "P4",
                    "reference linked to actor: its frozen buffers are the actor's",
                    {"linked": True, "shares_buffers": same, "offload_to_cpu": cfg.offload_to_cpu},
                    "one backbone in memory" if same else "warning: avoidable copy of the backbone" + note,
                )
                if not same:
                    self.warnings.append("P4: avoidable copy of the backbone (reference and actor hold two copies)" + note)
                    warnings.warn(
                        "The reference and the actor are on one mesh and may share the frozen "
                        "backbone, but they hold two copies of it: an avoidable copy that costs "
                        "device memory. Build the LoRA actor over the reference model's own "
                        "weights (rlcluster_lab.with_lora(reference, rank, ...)) to share it.",
                        AvoidableCopyWarning,
                        stacklevel=3,
                    )
            else:
                self.trace.record(
                    "P4",
                    "reference linked to actor",
                    {"linked": False},
                    "reference holds its own weights on its mesh",
                )
        if critic is not None:
            self._critic = self._load(self._as_module(critic, "critic"), Role.CRITIC)
        if reward is not None:
            self._reward = self._load(self._as_module(reward, "reward"), Role.REWARD)

        self._init_engine(rollout_actor, rollout_cfg)
        self._init_trainer()
        self._pin_anchor()
        gc.collect()

    def _check_inputs(self, actor: Any, reference: Any, reward: Any, critic: Any) -> None:
        """Every P6 check, and the input checks, before anything is allocated."""
        cfg = self.cluster_config
        rollout_cfg = check_rollout_config(cfg)
        self.trace.record(
            "P6",
            "rollout_config is set, and a per-mode dict has a TRAIN entry",
            {"per_mode": not isinstance(cfg.rollout_config, RolloutConfig)},
            "ok",
        )
        self._engine_kind = check_engine_choice(cfg.rollout_engine, _is_engine_class)
        self.trace.record(
            "P6",
            "rollout_engine is vanilla, vllm, sglang_jax, or a RolloutEngine subclass / partial of one",
            {"engine": cfg.engine_name()},
            f"ok: {self._engine_kind}",
        )
        for name, model in (("actor", actor), ("reference", reference), ("reward", reward), ("critic", critic)):
            if model is not None and not isinstance(model, (nnx.Module, str, os.PathLike)):
                raise ConfigError(
                    f"{name} must be an nnx.Module or a checkpoint path, got {type(model).__name__}"
                )
        actor_module = actor if isinstance(actor, nnx.Module) else None
        if actor_module is not None:
            # P6: the engine's own checks, run before anything is allocated (the
            # engine's constructor runs them again, for a model read from a path).
            engine_cls = self._engine_class()
            try:
                seen = engine_cls.check(actor_module, rollout_cfg)
            except ConfigError:
                self.trace.record("P6", f"{cfg.engine_name()} engine accepts the actor and rollout config", {}, "error")
                raise
            self.trace.record("P6", f"{cfg.engine_name()} engine accepts the actor and rollout config", seen, "ok")
            for name, other in (("reference", reference), ("critic", critic)):
                if isinstance(other, nnx.Module):
                    check_same_backbone(actor_module, other, name)

    def _engine_class(self) -> type[RolloutEngine]:
        engine = self.cluster_config.rollout_engine
        if self._engine_kind != "custom":
            return ENGINES[self._engine_kind]
        return engine.func if isinstance(engine, functools.partial) else engine

    def _as_module(self, model_or_path: Any, role: str) -> nnx.Module:
        if isinstance(model_or_path, nnx.Module):
            return model_or_path
        model = checkpoint.load(model_or_path)
        self.trace.record("P5", f"{role}: given as a path", {"path": str(model_or_path)}, "read from the checkpoint")
        return model

    def _load(self, model: nnx.Module, role: Role, dtype: Any = None) -> nnx.Module:
        return load_model(
            model,
            self.role_to_mesh[role],
            role=role.value,
            rules=self._rules(role),
            dtype=dtype,
            offload_to_cpu=self.cluster_config.offload_to_cpu,
            trace=self.trace,
        )

    def _rules(self, role: Role) -> Any:
        """The role's logical axis rules, or the model family's defaults."""
        rules = self.cluster_config.logical_axis_rules(role)
        return rules if rules is not None else DEFAULT_LOGICAL_AXIS_RULES

    def _init_engine(self, rollout_actor: nnx.Module, rollout_cfg: RolloutConfig) -> None:
        cfg = self.cluster_config
        mesh = self.role_to_mesh[Role.ROLLOUT]
        train_cfg = dataclasses.replace(rollout_cfg, kv_cache_size=max_kv_cache_size(cfg))
        kind = self._engine_kind
        # A model that sits in pinned host memory is brought to device before the
        # engine sees it, so that its programs are built for the device.
        self._maybe_load_from_cpu(rollout_actor, Role.ROLLOUT)
        engine_cls = self._engine_class()
        own_copy = kind != "custom" and issubclass(engine_cls, OwnCopyEngine)
        extra = {"logical_axis_rules": self._rules(Role.ROLLOUT)} if own_copy else {}
        factory = cfg.rollout_engine if kind == "custom" else engine_cls
        with self._role_context(Role.ROLLOUT):
            engine: RolloutEngine = factory(
                rollout_actor=rollout_actor, tokenizer=self.tokenizer, mesh=mesh, rollout_config=train_cfg, **extra
            )
        self._rollout = engine
        self._maybe_offload_to_cpu(engine.model(), Role.ROLLOUT)
        if cfg.offload_to_cpu and engine.owns_weights and shares(self.sharing_map, Role.ACTOR, Role.ROLLOUT):
            self.trace.record(
                "P14",
                "offload with a linked rollout whose engine owns its weights",
                {"engine": cfg.engine_name(), "owns_weights": True},
                "the engine's copy is offloaded on its own; it is not updated together with the actor",
            )

        # P7: an engine that exposes a mesh replaces the rollout mesh; the sharing
        # map, built from the config's meshes, is deliberately not rebuilt.
        engine_mesh = getattr(engine, "mesh", None)
        if engine_mesh is not None:
            self.mesh_overridden_by_engine = engine_mesh != mesh
            self.role_to_mesh[Role.ROLLOUT] = engine_mesh
        self.trace.record(
            "P7",
            "the engine exposes a non-None mesh",
            {
                "engine": cfg.engine_name(),
                "exposes_mesh": engine_mesh is not None,
                "config_rollout_mesh": describe_mesh(mesh),
                "engine_mesh": describe_mesh(engine_mesh) if engine_mesh is not None else None,
                "sharing_map_rebuilt": False,
                "still_registered_as_sharing": shares(self.sharing_map, Role.ACTOR, Role.ROLLOUT),
            },
            "role_to_mesh[ROLLOUT] replaced by the engine's mesh" if engine_mesh is not None else "rollout mesh kept",
        )

    def _init_trainer(self) -> None:
        assert self._actor is not None
        self._maybe_load_from_cpu(self._actor, Role.ACTOR)
        self._tx = self.cluster_config.training_config.actor_optimizer()
        self._trainable_filter = nnx.LoRAParam if is_lora(self._actor) else nnx.Param
        with self._role_context(Role.ACTOR):
            self._opt_state = init_optimizer_state(
                self._tx, nnx.state(self._actor, self._trainable_filter), self.role_to_mesh[Role.ACTOR]
            )
        self.trace.record(
            "P12",
            "actor trainable parameters",
            {"lora": is_lora(self._actor)},
            "optimizer over LoRA parameters only" if is_lora(self._actor) else "optimizer over all parameters",
        )
        self._maybe_offload_to_cpu(self._actor, Role.ACTOR)
        if self.cluster_config.offload_to_cpu:
            self._opt_state = put_on_memory_kind(self._opt_state, "pinned_host")

    def _pin_anchor(self) -> None:
        assert self._actor is not None
        # P8 / P13: the anchor is the actor's full state, pinned on the host;
        # with anchor="trainable" only what training changes (beyond the reference).
        self._anchor_policy_state = put_on_memory_kind(self._anchor_source(), "pinned_host")
        self.trace.record(
            "P8",
            "snapshot the actor's state to pinned host"
            + (" (trainable part only: anchor='trainable')" if self._anchor_is_partial else ""),
            {
                "global_steps": self.global_steps,
                "anchor": self.cluster_config.anchor,
                "bytes": state_bytes(self._anchor_policy_state),
            },
            "anchor holds the LoRA adapters; the frozen backbone is read from the actor"
            if self._anchor_is_partial
            else "anchor policy state pinned",
        )

    @property
    def _anchor_is_partial(self) -> bool:
        """anchor='trainable' with a LoRA actor: only adapters are pinned."""
        return self.cluster_config.anchor == "trainable" and self._actor is not None and is_lora(self._actor)

    def _anchor_source(self) -> Any:
        assert self._actor is not None
        if self._anchor_is_partial:
            return nnx.state(self._actor, nnx.LoRAParam)
        return nnx.state(self._actor)

    def _release_new_buffers(self, before: set[int], keep: Sequence[Any]) -> None:
        """After a failed construction, free the device buffers it allocated.

        An array is freed only if none of its buffers is also held by an array
        that existed before construction or by the caller's models: a reshard
        may reuse a source buffer inside a new array object.
        """
        self._actor = self._reference = self._reward = self._critic = None
        self._rollout = None
        self._anchor_policy_state = None
        self._opt_state = None
        gc.collect()
        live = jax.live_arrays()
        protected = buffer_keys([x for x in live if id(x) in before])
        for model in keep:
            if isinstance(model, nnx.Module):
                protected |= buffer_keys(nnx.state(model))
        for x in live:
            if id(x) in before or x.is_deleted():
                continue
            if buffer_keys([x]) & protected:
                continue
            x.delete()
        gc.collect()

    # ------------------------------------------------------------------ models

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

    def models(self) -> dict[Role, nnx.Module]:
        """The module each present role computes with (the rollout: the engine's model)."""
        out: dict[Role, nnx.Module] = {}
        if self._actor is not None:
            out[Role.ACTOR] = self._actor
        if self._rollout is not None:
            out[Role.ROLLOUT] = self._rollout.model()
        for role, model in ((Role.REFERENCE, self._reference), (Role.REWARD, self._reward), (Role.CRITIC, self._critic)):
            if model is not None:
                out[role] = model
        return out

    def get_rollout_config(self, mode: Mode = Mode.TRAIN) -> RolloutConfig:
        return self.cluster_config.rollout_config_for(mode)

    # ------------------------------------------------------------------ mesh and offload

    def _device_kind(self, role: Role) -> str:
        """The default memory kind of the devices the role's mesh uses (where it computes)."""
        return default_memory_kind(self.role_to_mesh[role])

    @property
    def platform(self) -> str:
        """The platform of the devices the cluster's meshes use (one platform per cluster)."""
        return next(iter(self.role_to_mesh[Role.ACTOR].devices.flat)).platform

    def devices(self) -> list[Any]:
        """Every device some role's mesh uses, in id order."""
        found = {d for mesh in self.role_to_mesh.values() for d in mesh.devices.flat}
        return sorted(found, key=lambda d: d.id)

    @contextlib.contextmanager
    def _role_context(self, role: Role) -> Iterator[Mesh]:
        """Enter the role's mesh, its devices as the default ones (arrays made without a
        placement land there, not on JAX's default backend), the configured matmul
        precision and, when configured, its logical axis rules."""
        mesh = self.role_to_mesh[role]
        rules = self.cluster_config.logical_axis_rules(role)
        with contextlib.ExitStack() as stack:
            stack.enter_context(jax.set_mesh(mesh))
            stack.enter_context(jax.default_device(next(iter(mesh.devices.flat))))
            if self.cluster_config.matmul_precision is not None:
                stack.enter_context(jax.default_matmul_precision(self.cluster_config.matmul_precision))
            stack.enter_context(reshard_strategy(self.cluster_config.reshard))
            if rules:
                stack.enter_context(nnx.logical_axis_rules(list(rules)))
            yield mesh

    def _update_models_sharing_weights(self, model: nnx.Module, role: Role) -> None:
        """P14: roles that share weights with ``role`` take its new arrays too.

        An engine that owns its weights (the vllm- and sglang_jax-style ones)
        shares none, even when the map links it: its copy is never written
        into the actor, nor the actor into it, outside a sync. (The reference
        has no offload support for those engines; mixing the two would move
        the actor onto the engine's mesh.)
        """
        own_copy = self._rollout is not None and self._rollout.owns_weights
        if own_copy and role == Role.ROLLOUT:
            return
        for other in self.sharing_map.get(role, ()):
            if own_copy and other == Role.ROLLOUT:
                continue
            if other == Role.ROLLOUT and self._rollout is not None:
                if self._rollout.model() is not model:
                    self._rollout.update_params(nnx.state(model))
            elif other == Role.REFERENCE and self._reference is not None:
                nnx.update(self._reference, nnx.state(model, nnx.Not(nnx.LoRAParam)))
            elif other == Role.ACTOR and self._actor is not None and self._actor is not model:
                nnx.update(self._actor, nnx.state(model))

    def _maybe_load_from_cpu(self, model: nnx.Module, role: Role) -> None:
        if not self.cluster_config.offload_to_cpu:
            return
        move_model(model, self._device_kind(role))
        self._update_models_sharing_weights(model, role)

    def _maybe_offload_to_cpu(self, model: nnx.Module, role: Role) -> None:
        if not self.cluster_config.offload_to_cpu:
            return
        move_model(model, "pinned_host")
        self._update_models_sharing_weights(model, role)

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
        self._require_constructed()
        prompts = list(prompts)
        if not prompts:
            raise ValueError("Cannot generate from an empty list of prompts.")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        rollout_cfg = self.get_rollout_config(mode)
        if max_generation_steps is not None:
            rollout_cfg = dataclasses.replace(rollout_cfg, max_tokens_to_generate=max_generation_steps)
        engine = self.rollout
        with self._role_context(Role.ROLLOUT):
            model = engine.model()
            self._maybe_load_from_cpu(model, Role.ROLLOUT)
            outs = [engine.generate(prompts[rows], rollout_cfg) for rows in mini_batches(len(prompts), micro_batch_size)]
            self._maybe_offload_to_cpu(model, Role.ROLLOUT)
        return _concat_outputs(outs, engine.pad_id())

    def per_token_logps(
        self, role: Role, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None
    ) -> jax.Array:
        """Per-token log-probs under REFERENCE, ACTOR (the anchor, P10) or ROLLOUT."""
        role = Role.parse(role)
        if role == Role.REFERENCE:
            return self.get_ref_per_token_logps(prompt_tokens, completion_tokens, micro_batch_size)
        if role == Role.ACTOR:
            return self.get_actor_per_token_logps(prompt_tokens, completion_tokens, micro_batch_size)
        if role == Role.ROLLOUT:
            return self.get_old_per_token_logps(prompt_tokens, completion_tokens, micro_batch_size)
        raise ValueError(f"per-token log-probs come from actor, reference or rollout, not {role.value}")

    def get_ref_per_token_logps(self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None) -> jax.Array:
        self._require_constructed()
        if self._reference is None:
            raise ValueError("this cluster has no reference model; pass reference=... when building it")
        prompt_tokens, completion_tokens = _check_batch(prompt_tokens, completion_tokens, "reference")
        with self._role_context(Role.REFERENCE):
            self._maybe_load_from_cpu(self._reference, Role.REFERENCE)
            graphdef, state = nnx.split(self._reference)
            out = self._chunked(graphdef, state, prompt_tokens, completion_tokens, micro_batch_size)
            self._maybe_offload_to_cpu(self._reference, Role.REFERENCE)
        return out

    def get_old_per_token_logps(self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None) -> jax.Array:
        """Log-probs under the rollout engine's own weights."""
        self._require_constructed()
        prompt_tokens, completion_tokens = _check_batch(prompt_tokens, completion_tokens, "old")
        engine = self.rollout
        with self._role_context(Role.ROLLOUT):
            model = engine.model()
            self._maybe_load_from_cpu(model, Role.ROLLOUT)
            outs = [
                engine.get_per_token_logps(prompt_tokens[rows], completion_tokens[rows])
                for rows in mini_batches(len(prompt_tokens), micro_batch_size)
            ]
            self._maybe_offload_to_cpu(model, Role.ROLLOUT)
        return jnp.concatenate(outs, axis=0)

    def get_actor_per_token_logps(self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None) -> jax.Array:
        """P10: the live actor's graph run over the *anchor* state (P11 says why)."""
        self._require_constructed()
        prompt_tokens, completion_tokens = _check_batch(prompt_tokens, completion_tokens, "actor")
        if self._anchor_policy_state is None:
            raise ValueError("The anchor policy state is not set: call sync_weights() first.")
        actor = self.actor_model
        with self._role_context(Role.ACTOR):
            graphdef, _ = nnx.split(actor)
            # Brought to device leaf by leaf: with anchor='trainable' the backbone
            # part may already be there.
            anchor = put_on_memory_kind(self.anchor_policy_state, self._device_kind(Role.ACTOR))
            out = self._chunked(graphdef, anchor, prompt_tokens, completion_tokens, micro_batch_size)
            del anchor
        return out

    def get_live_actor_per_token_logps(self, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None = None) -> jax.Array:
        """The actor's log-probs with its *live* weights: what P11 warns against.

        Not used by training; the lab shows it beside the anchor's to make the
        difference visible.
        """
        self._require_constructed()
        prompt_tokens, completion_tokens = _check_batch(prompt_tokens, completion_tokens, "actor")
        actor = self.actor_model
        with self._role_context(Role.ACTOR):
            self._maybe_load_from_cpu(actor, Role.ACTOR)
            graphdef, state = nnx.split(actor)
            out = self._chunked(graphdef, state, prompt_tokens, completion_tokens, micro_batch_size)
            self._maybe_offload_to_cpu(actor, Role.ACTOR)
        return out

    def _live_logps(self, prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        prompt_tokens, completion_tokens = _check_batch(prompt_tokens, completion_tokens, "actor")
        graphdef, state = nnx.split(self.actor_model)
        return self._chunked(graphdef, state, prompt_tokens, completion_tokens, None)

    def _chunked(self, graphdef: Any, state: Any, prompt_tokens: np.ndarray, completion_tokens: np.ndarray, micro_batch_size: int | None) -> jax.Array:
        temperature = self.get_rollout_config(Mode.TRAIN).temperature
        pad = self.rollout.pad_id()
        outs = [
            logps_from_state(graphdef, state, prompt_tokens[rows], completion_tokens[rows], pad, temperature)
            for rows in mini_batches(len(prompt_tokens), micro_batch_size)
        ]
        return jnp.concatenate(outs, axis=0)

    def update_actor(self, batch: TrainBatch, on_step: Any = None) -> list[dict[str, float]]:
        """P12: optimizer steps on the actor, on its mesh, one per mini-batch per iteration.

        With offload the actor (and its optimizer state) come to device for the
        step and go back to pinned host after. Returns one metrics dict per step.

        ``on_step(iteration, rows, live_logps)``, when given, is called before
        each step; ``live_logps(prompt_tokens, completion_tokens)`` scores with
        the actor's weights as they are at that moment (P11 made visible).
        """
        self._require_constructed()
        if not isinstance(batch, TrainBatch):
            raise TypeError(f"update_actor takes a TrainBatch, got {type(batch).__name__}")
        tcfg = self.cluster_config.training_config
        actor = self.actor_model
        metrics: list[dict[str, float]] = []
        temperature = jnp.float32(self.get_rollout_config(Mode.TRAIN).temperature or 1.0)
        with self._role_context(Role.ACTOR):
            self._maybe_load_from_cpu(actor, Role.ACTOR)
            if self.cluster_config.offload_to_cpu:
                self._opt_state = put_on_memory_kind(self._opt_state, self._device_kind(Role.ACTOR))
            for iteration in range(tcfg.num_iterations):
                for rows in mini_batches(len(batch), tcfg.mini_batch_size):
                    if on_step is not None:
                        on_step(iteration, rows, self._live_logps)
                    graphdef, trainable, frozen = nnx.split(actor, self._trainable_filter, ...)
                    shardings = jax.tree.map(lambda x: x.sharding, trainable)
                    new_trainable, self._opt_state, m = train_step(
                        graphdef, self._tx, trainable, frozen, self._opt_state,
                        batch_arrays(batch.rows(rows)), temperature,
                        pad_id=self.rollout.pad_id(), beta=float(tcfg.beta), epsilon=float(tcfg.epsilon),
                    )
                    # Keep every leaf exactly where it was (no-op when jit kept the sharding).
                    nnx.update(actor, jax.device_put(new_trainable, shardings))
                    metrics.append({k: float(v) for k, v in m.items()})
            self._maybe_offload_to_cpu(actor, Role.ACTOR)
            if self.cluster_config.offload_to_cpu:
                self._opt_state = put_on_memory_kind(self._opt_state, "pinned_host")
        return metrics

    def sync_weights(self) -> SyncReport:
        """P13: hand the actor's trainable (LoRA) or full parameters to the rollout engine.

        The sharing map is not consulted: the engine reshards onto its own
        copy's shardings, which moves nothing when that copy is the actor
        itself. Then the anchor is re-pinned and the global step advances.
        Returns what the handover and the re-pin really moved (L3).
        """
        self._require_constructed()
        actor = self.actor_model
        lora = is_lora(actor)
        filter_types = (nnx.LoRAParam,) if lora else (nnx.Param,)
        with _sync_transfer_guard(self.platform), reshard_strategy(self.cluster_config.reshard):
            params = nnx.state(actor, *filter_types)
            source = {path: shard_facts(x) for path, x in flat_leaves(params).items()}
            with record_transfers() as log:
                # The handover alone is timed: the engine's update, until its arrays are ready.
                start = time.perf_counter()
                self.rollout.update_params(params, filter_types)
                jax.block_until_ready(self.rollout.held_values(filter_types))
                seconds = time.perf_counter() - start
            destination = flat_leaves(nnx.state(self.rollout.model(), *filter_types))
            del params
            anchor_source = self._anchor_source()
            start = time.perf_counter()
            self._anchor_policy_state = put_on_memory_kind(anchor_source, "pinned_host")
            jax.block_until_ready(self._anchor_policy_state)
            anchor_seconds = time.perf_counter() - start
            new_anchor = new_shards(self._anchor_policy_state, anchor_source)
            del anchor_source
        self.trace.record(
            "P13",
            "sync: filter to LoRA parameters if the actor has LoRA, else all parameters",
            {
                "lora": lora,
                "global_step": self.global_steps + 1,
                "transfer_guard": self.platform == "cpu",
                "sharing_map_consulted": False,
                "reshard": self.cluster_config.reshard,
            },
            "LoRA parameters handed to the engine" if lora else "all parameters handed to the engine",
        )
        self.global_steps += 1
        return sync_report(
            source,
            destination,
            log,
            lora=lora,
            seconds=seconds,
            new_anchor_shards=new_anchor,
            anchor_mode="trainable" if self._anchor_is_partial else "full",
            anchor_seconds=anchor_seconds,
            global_step=self.global_steps,
        )

    def rehearse_step(self, prompts: Sequence[str], reward_model: bool = False) -> bool:
        """Run every program one RL step uses, on these prompts' shapes, changing no state.

        Generate, the anchor's, the reference's and the live actor's
        log-probs, the optimizer step (its result thrown away) and the sync's
        reshard (into new buffers that are dropped): each is compiled, or read
        from the persistent cache, so the real step that follows compiles
        nothing. Weights, the optimizer state, the anchor, the step counter
        and the engine's sampling seed are left exactly as they were. With
        ``offload_to_cpu`` nothing is done (the operations would move roles
        between memory kinds); returns whether the rehearsal ran.
        """
        self._require_constructed()
        if self.cluster_config.offload_to_cpu:
            return False
        engine = self.rollout
        calls = getattr(engine, "_calls", None)
        try:
            out = self.generate(list(prompts))
        finally:
            if calls is not None:
                engine._calls = calls  # the sampling seed the real step will use
        p, c = out.left_padded_prompt_tokens, out.tokens
        anchor = np.asarray(self.get_actor_per_token_logps(p, c))
        ref = np.asarray(self.get_ref_per_token_logps(p, c)) if self._reference is not None else None
        if reward_model and self._reward is not None:
            self.get_rewards(p, c)
        batch = TrainBatch(p, c, np.zeros(len(p), np.float32), anchor, ref)
        tcfg = self.cluster_config.training_config
        temperature = jnp.float32(self.get_rollout_config(Mode.TRAIN).temperature or 1.0)
        actor = self.actor_model
        with self._role_context(Role.ACTOR):
            sizes = {}
            for rows in mini_batches(len(batch), tcfg.mini_batch_size):
                sizes.setdefault(rows.stop - rows.start, rows)
            for rows in sizes.values():
                self._live_logps(p[rows], c[rows])
                graphdef, trainable, frozen = nnx.split(actor, self._trainable_filter, ...)
                train_step(graphdef, self._tx, trainable, frozen, self._opt_state, batch_arrays(batch.rows(rows)),
                           temperature, pad_id=engine.pad_id(), beta=float(tcfg.beta), epsilon=float(tcfg.epsilon))
        lora = is_lora(actor)
        filter_types = (nnx.LoRAParam,) if lora else (nnx.Param,)
        with _sync_transfer_guard(self.platform), reshard_strategy(self.cluster_config.reshard):
            params = flat_values(nnx.state(actor, *filter_types))
            dst = flat_values(nnx.state(engine.model(), *filter_types))
            reshard_flat(params, dst, copy=engine.owns_weights)
        return True

    def get_rewards(self, prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        """Scores (B,) from the reward model, on the reward mesh."""
        return self._score(Role.REWARD, self._reward, prompt_tokens, completion_tokens, per_token=False)

    def get_values(self, prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        """Per-token values (B, C) from the critic, on the critic mesh."""
        return self._score(Role.CRITIC, self._critic, prompt_tokens, completion_tokens, per_token=True)

    def _score(self, role: Role, model: nnx.Module | None, prompt_tokens: Any, completion_tokens: Any, *, per_token: bool) -> jax.Array:
        from rlcluster_lab.scoring import scores_from_state

        self._require_constructed()
        if model is None:
            raise ValueError(f"this cluster has no {role.value} model; pass {role.value}=... when building it")
        prompt_tokens, completion_tokens = _check_batch(prompt_tokens, completion_tokens, role.value)
        with self._role_context(role):
            self._maybe_load_from_cpu(model, role)
            graphdef, state = nnx.split(model)
            out = scores_from_state(graphdef, state, prompt_tokens, completion_tokens, self.rollout.pad_id(), per_token=per_token)
            self._maybe_offload_to_cpu(model, role)
        return out


RLEngine = RLCluster  # P15: one class, two names


def _is_engine_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, RolloutEngine)


def _sync_transfer_guard(platform: str) -> contextlib.AbstractContextManager:
    """P13: on CPU devices, explicit host<->device transfers are disallowed during a sync.

    ``platform`` is the cluster's own (its meshes' devices), not JAX's default
    backend: a cluster on simulated CPU devices beside a GPU is guarded.
    """
    if platform != "cpu":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(jax.transfer_guard_device_to_host("disallow_explicit"))
    stack.enter_context(jax.transfer_guard_host_to_device("disallow_explicit"))
    return stack


def _check_batch(prompt_tokens: Any, completion_tokens: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    prompt_tokens = np.asarray(prompt_tokens)
    completion_tokens = np.asarray(completion_tokens)
    if prompt_tokens.ndim != 2 or prompt_tokens.shape[0] == 0:
        raise ValueError(f"Cannot compute {what} log probabilities from an empty batch (prompt_tokens shape {prompt_tokens.shape}).")
    if completion_tokens.ndim != 2 or completion_tokens.shape[0] != prompt_tokens.shape[0]:
        raise ValueError(
            f"completion_tokens must be (batch, length) with the same batch as prompt_tokens "
            f"{prompt_tokens.shape}; got {completion_tokens.shape}"
        )
    return prompt_tokens, completion_tokens


def _concat_outputs(outs: list[RolloutOutput], pad_id: int) -> RolloutOutput:
    width = max(o.left_padded_prompt_tokens.shape[1] for o in outs)
    prompts = [
        np.pad(o.left_padded_prompt_tokens, ((0, 0), (width - o.left_padded_prompt_tokens.shape[1], 0)), constant_values=pad_id)
        for o in outs
    ]
    return RolloutOutput(
        text=[t for o in outs for t in o.text],
        tokens=np.concatenate([o.tokens for o in outs], axis=0),
        logprobs=np.concatenate([o.logprobs for o in outs], axis=0),
        left_padded_prompt_tokens=np.concatenate(prompts, axis=0),
    )


def state_bytes(state: Any) -> int:
    """Physical bytes of a state: every addressable shard counted."""
    return int(sum(s.data.nbytes for x in array_leaves(state) for s in x.addressable_shards))


def buffer_keys(state: Any) -> set[tuple[int, int]]:
    """(device id, buffer pointer) of every addressable shard of ``state``."""
    return set().union(*(shard_keys(x) for x in array_leaves(state)))


def sharing_backbone(a: nnx.Module, b: nnx.Module) -> bool:
    """P4: every frozen (non-LoRA) buffer of ``a`` is one of ``b``'s."""
    ka = buffer_keys(nnx.state(a, nnx.Not(nnx.LoRAParam)))
    kb = buffer_keys(nnx.state(b, nnx.Not(nnx.LoRAParam)))
    return bool(ka) and ka <= kb


def check_same_backbone(actor: nnx.Module, other: nnx.Module, name: str) -> None:
    """A reference (or a critic's backbone) must have the actor's frozen parameter tree."""
    target = getattr(other, "backbone", other) if name == "critic" else other
    want = _shapes(nnx.state(actor, nnx.Not(nnx.LoRAParam)))
    got = _shapes(nnx.state(target, nnx.Not(nnx.LoRAParam)))
    if want != got:
        missing = sorted(set(want) - set(got))[:3]
        extra = sorted(set(got) - set(want))[:3]
        differ = sorted(k for k in set(want) & set(got) if want[k] != got[k])[:3]
        raise ConfigError(
            f"the {name} model's parameter tree does not match the actor's (missing: {missing}, "
            f"unexpected: {extra}, other shapes: {[(k, got[k], want[k]) for k in differ]}). "
            f"Build the {name} with the same model size as the actor."
        )


def _shapes(state: Any) -> dict[str, tuple[int, ...]]:
    flat = flatten_dict(nnx.to_pure_dict(state))
    return {"/".join(map(str, path)): tuple(getattr(v, "shape", ())) for path, v in flat.items()}
