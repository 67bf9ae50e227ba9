"""Configuration of a cluster: meshes per role, the rollout engine and its settings,
training settings. Validation of the rollout settings (P6) lives here too."""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import ANCHOR_MODES, KNOBS, RESHARD_STRATEGIES, as_bool, as_int
from rlcluster_lab.core.options import RolloutConfig
from rlcluster_lab.core.roles import Mode, Role

LogicalAxisRules = tuple[tuple[str, str | tuple[str, ...] | None], ...]


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """How the actor (GRPO-style clipped objective with a KL term) and the critic (PPO-style clipped
    value loss) learn. With ``train_micro_batch_size`` each mini-batch step sums the gradients of
    ``gradient_accumulation_steps`` micro-batches before one update, as in the reference."""

    learning_rate: float = 3e-3
    optimizer: optax.GradientTransformation | None = None  # default: adam(learning_rate)
    critic_optimizer: optax.GradientTransformation | None = None  # default: adam(critic_learning_rate)
    critic_learning_rate: float = 1e-3
    clip_range_value: float = 0.2  # the value loss's clip range around the rollout-time values
    mini_batch_size: int | None = None  # None: the whole batch in one step
    train_micro_batch_size: int | None = None  # None: the mini-batch in one piece (no accumulation)
    num_iterations: int = 1  # passes over the same batch per global step
    beta: float = 0.04  # KL weight
    epsilon: float = 0.2  # clip range
    role_to_logical_axis_rule: Mapping[Role, LogicalAxisRules] | None = None

    def __post_init__(self) -> None:
        # A NaN or infinite rate trains to NaN without an error; zero or a negative rate does not
        # descend. Only the default optimizers read the rates, but the fields are checked always.
        for field, label, example, zero_ok in (
            ("learning_rate", "learning_rate (--learning-rate)", " (e.g. 3e-3)", False),
            ("beta", "beta (the KL weight)", "", True),
            ("epsilon", "epsilon (the clip range)", "", False),
            ("critic_learning_rate", "critic_learning_rate", " (e.g. 1e-3)", False),
            ("clip_range_value", "clip_range_value (the value loss's clip range)", "", False),
        ):
            value = getattr(self, field)
            real = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
            if not real or value < 0 or (value == 0 and not zero_ok):
                raise ConfigError(
                    f"{label} must be a finite number {'>=' if zero_ok else '>'} 0{example}, got {value!r}",
                    knobs=(field,) if field == "learning_rate" else (),
                )
            object.__setattr__(self, field, float(value))  # a NumPy number becomes a plain one
        for name in ("mini_batch_size", "num_iterations"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, as_int(getattr(self, name), name, knobs=(name,)))
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise ConfigError(
                f"mini_batch_size (--mini-batch-size) must be >= 1 or None, got {self.mini_batch_size}",
                knobs=("mini_batch_size",),
            )
        if self.num_iterations < 1:
            raise ConfigError(
                f"num_iterations (--iterations) must be >= 1, got {self.num_iterations}", knobs=("num_iterations",)
            )
        micro = self.train_micro_batch_size
        if micro is not None:
            if isinstance(micro, bool) or not isinstance(micro, numbers.Integral) or micro < 1:
                raise ConfigError(
                    f"train_micro_batch_size (--micro-batch-size) must be a positive integer (unset: no "
                    f"accumulation), got {micro!r}",
                    knobs=("train_micro_batch_size",),
                )
            object.__setattr__(self, "train_micro_batch_size", int(micro))
            if self.mini_batch_size is None:
                raise ConfigError(
                    f"mini_batch_size (--mini-batch-size) must be set when train_micro_batch_size "
                    f"(--micro-batch-size) is set (got {micro} and none): each mini-batch step accumulates "
                    "mini-batch // micro-batch micro-batches; set the mini-batch to a multiple of the micro-batch",
                    knobs=("mini_batch_size", "train_micro_batch_size"),
                )
            if self.mini_batch_size % micro:
                raise ConfigError(
                    f"mini_batch_size (--mini-batch-size) = {self.mini_batch_size} must be a multiple of "
                    f"train_micro_batch_size (--micro-batch-size) = {micro}: each optimizer update accumulates a "
                    "whole number of micro-batches",
                    knobs=("mini_batch_size", "train_micro_batch_size"),
                )
        if self.role_to_logical_axis_rule is not None:
            rules = {Role.parse(r): tuple(tuple(x) for x in v) for r, v in self.role_to_logical_axis_rule.items()}
            object.__setattr__(self, "role_to_logical_axis_rule", types.MappingProxyType(rules))

    def actor_optimizer(self) -> optax.GradientTransformation:
        return self.optimizer if self.optimizer is not None else default_optimizer(self.learning_rate)

    def critic_tx(self) -> optax.GradientTransformation:
        """The critic's optimizer: ``critic_optimizer``, else ``adam(critic_learning_rate)``."""
        critic = self.critic_optimizer
        return critic if critic is not None else default_optimizer(self.critic_learning_rate)

    @property
    def gradient_accumulation_steps(self) -> int | None:
        """Micro-batches per optimizer update, ``mini_batch_size // train_micro_batch_size``,
        derived as in the reference (None: no accumulation, one piece per update)."""
        if self.train_micro_batch_size is None or self.mini_batch_size is None:
            return None
        return self.mini_batch_size // self.train_micro_batch_size


MATMUL_PRECISIONS = (None, "default", "high", "highest", "bfloat16", "tensorfloat32", "float32")


@functools.lru_cache(maxsize=64)
def default_optimizer(learning_rate: float) -> optax.GradientTransformation:
    """``optax.adam(learning_rate)``, one object per rate: the optimizer is a static argument of the
    jitted training step, so a rebuilt cluster reuses the compiled step."""
    return optax.adam(learning_rate)


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Which mesh each role lives on, which rollout engine samples, and offload.

    ``role_to_mesh`` needs ACTOR and ROLLOUT; the other roles default to the actor's mesh.
    ``reshard`` (P5, P13): ``"xla"`` compiles one program per set of shardings and reads the bytes
    its collectives move; ``"minimal"`` assembles every destination shard from exactly the pieces it
    lacks. ``matmul_precision``: of the programs P11 compares (the sampler, the log-probs; None: the
    platform's default); ``"highest"`` keeps their float32 matmuls float32 on GPUs and TPUs, so the
    log-probs agree to float32 rounding (``core.precision.PROGRAMS``). ``sync_chunk_bytes`` (None:
    one piece): a sync hands the weights over in chunks of at most that many bytes, each committed
    before the next (P13). ``anchor`` (P8): ``"full"`` the actor's whole state, ``"trainable"`` only
    the LoRA adapters, the backbone read from the actor.
    """

    role_to_mesh: Mapping[Role, Mesh]
    rollout_config: RolloutConfig | Mapping[Mode, RolloutConfig] | None = dataclasses.field(
        default_factory=RolloutConfig
    )
    rollout_engine: str | type | functools.partial | Callable[..., Any] = "vanilla"
    offload_to_cpu: bool = False
    training_config: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    anchor: str = "full"
    reshard: str = "xla"
    matmul_precision: str | None = "highest"
    sync_chunk_bytes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sync_chunk_bytes", KNOBS["sync_chunk_bytes"].check(self.sync_chunk_bytes))
        if self.reshard not in RESHARD_STRATEGIES:
            raise ConfigError(
                f"reshard must be one of {', '.join(RESHARD_STRATEGIES)}, got {self.reshard!r}: 'xla' compiles "
                "one program per set of shardings, 'minimal' moves exactly what each device lacks"
            )
        if self.anchor not in ANCHOR_MODES:
            raise ConfigError(
                f"anchor must be one of {', '.join(ANCHOR_MODES)}, got {self.anchor!r}: 'full' pins the "
                "actor's whole state (the reference), 'trainable' only the LoRA adapters"
            )
        if not isinstance(self.role_to_mesh, Mapping):
            raise ConfigError(
                f"role_to_mesh must be a dict from Role to jax.sharding.Mesh, got {type(self.role_to_mesh).__name__} "
                "(for example {Role.ACTOR: mesh, Role.ROLLOUT: mesh}, or rlcluster_lab.layout_meshes('colocated'))"
            )
        object.__setattr__(self, "offload_to_cpu", as_bool(self.offload_to_cpu, "offload_to_cpu"))
        if not isinstance(self.training_config, TrainingConfig):
            raise ConfigError(f"training_config must be a TrainingConfig, got {type(self.training_config).__name__}")
        try:
            r2m = {Role.parse(r): m for r, m in self.role_to_mesh.items()}
        except ValueError as exc:
            raise ConfigError(f"role_to_mesh: {exc}") from None
        for role in (Role.ACTOR, Role.ROLLOUT):
            if role not in r2m:
                raise ConfigError(
                    f"role_to_mesh has no mesh for {role.value}; every cluster needs meshes for "
                    "actor and rollout (use rlcluster_lab.layout_meshes('colocated') for a start)"
                )
        for role in (Role.REFERENCE, Role.REWARD, Role.CRITIC):
            r2m.setdefault(role, r2m[Role.ACTOR])
        platforms: dict[str, list[str]] = {}
        for role, mesh in r2m.items():
            if not isinstance(mesh, Mesh):
                raise ConfigError(f"role_to_mesh[{role.value}] is {type(mesh).__name__}, expected a jax.sharding.Mesh")
            devices = list(np.asarray(mesh.devices).flatten())
            platform = devices[0].platform
            platforms.setdefault(platform, []).append(role.value)
            # Devices are looked up on their own platform: a CPU device and a chip can share an id.
            try:
                known = set(jax.devices(platform))
            except RuntimeError:  # no backend for that platform in this process
                known = set()
            gone = [d.id for d in devices if d not in known]
            if gone:
                raise ConfigError(
                    f"role_to_mesh[{role.value}] uses {platform} device id(s) {gone} that do not exist in this "
                    f"process (its {platform} devices: {sorted(d.id for d in known)}); build the mesh from "
                    f"jax.devices({platform!r})"
                )
        if len(platforms) > 1:
            where = "; ".join(f"{p}: {', '.join(roles)}" for p, roles in platforms.items())
            raise ConfigError(
                f"role_to_mesh mixes platforms ({where}); one cluster runs on one platform: build every "
                "role's mesh from the same kind of device"
            )
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ConfigError(
                f"matmul_precision must be one of {', '.join(map(repr, MATMUL_PRECISIONS))}, got "
                f"{self.matmul_precision!r}"
            )
        object.__setattr__(self, "role_to_mesh", types.MappingProxyType(r2m))
        if isinstance(self.rollout_config, Mapping):
            per_mode = {_parse_mode(k): v for k, v in self.rollout_config.items()}
            object.__setattr__(self, "rollout_config", types.MappingProxyType(per_mode))

    def logical_axis_rules(self, role: Role) -> LogicalAxisRules | None:
        return (self.training_config.role_to_logical_axis_rule or {}).get(role)

    def rollout_config_for(self, mode: Mode = Mode.TRAIN) -> RolloutConfig:
        mode = _parse_mode(mode)  # an unknown mode is refused, whatever the config holds
        cfg = self.rollout_config
        if isinstance(cfg, Mapping):
            if mode not in cfg:
                raise ConfigError(f"rollout_config has no entry for mode {mode.value}")
            return cfg[mode]
        if cfg is None:
            raise ConfigError("cluster_config.rollout_config is None; pass a RolloutConfig")
        return cfg

    def engine_name(self) -> str:
        eng = self.rollout_engine
        if isinstance(eng, str):
            return eng
        if isinstance(eng, functools.partial):
            return f"partial({getattr(eng.func, '__name__', repr(eng.func))})"
        return getattr(eng, "__name__", repr(eng))


def _parse_mode(mode: Mode | str) -> Mode:
    if isinstance(mode, Mode):
        return mode
    try:
        return Mode(str(mode).lower())
    except ValueError:
        raise ConfigError(f"unknown rollout mode {mode!r}; use Mode.TRAIN or Mode.EVAL") from None


def max_kv_cache_size(config: ClusterConfig) -> int:
    cfg = config.rollout_config
    configs = cfg.values() if isinstance(cfg, Mapping) else [config.rollout_config_for(Mode.TRAIN)]
    return max(c.kv_cache_size for c in configs)
