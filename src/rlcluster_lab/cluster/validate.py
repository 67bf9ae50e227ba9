"""The checks a cluster runs on its inputs before anything is allocated (P6 and input checks)."""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.traverse_util import flatten_dict

from rlcluster_lab.core.config import ClusterConfig, max_kv_cache_size
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.limits import check_fits
from rlcluster_lab.core.model_config import ModelConfig
from rlcluster_lab.core.states import model_state
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.engines import ENGINES, RolloutEngine
from rlcluster_lab.model.checkpoint import abstract_checkpoint, read_config
from rlcluster_lab.model.sampling import generate_bytes
from rlcluster_lab.model.scoring import ScoreModel
from rlcluster_lab.rules.validation import p6_engine_accepts, p6_engine_choice, p6_rollout_config
from rlcluster_lab.training.step import finite_flags


def is_engine_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, RolloutEngine)


def engine_class(config: ClusterConfig, kind: str) -> type[RolloutEngine]:
    """The engine class a config names (a built-in one, or the user's class behind a partial)."""
    engine = config.rollout_engine
    if kind != "custom":
        return ENGINES[kind]
    return engine.func if isinstance(engine, functools.partial) else engine


def require_config(config: Any) -> None:
    """The cluster's config must be a ``ClusterConfig`` (checked before anything reads it)."""
    if not isinstance(config, ClusterConfig):
        raise ConfigError(
            f"cluster_config must be a ClusterConfig, got {type(config).__name__}; build one with "
            "ClusterConfig(role_to_mesh=rlcluster_lab.layout_meshes('colocated'))"
        )


def check_inputs(
    config: ClusterConfig, actor: Any, reference: Any, reward: Any, critic: Any, trace: Trace
) -> tuple[Any, str]:
    """Every P6 check and input check, before anything is allocated; returns the TRAIN rollout config
    and the engine kind (a name, or ``custom``). Raises ``ConfigError`` (with the fix), or
    ``NotImplementedError`` for an engine value that is not supported (P6)."""
    if actor is None:
        raise ConfigError("actor is required: pass the policy to train (an nnx.Module or a checkpoint folder)")
    train, decision = p6_rollout_config(config.rollout_config)
    trace.add(decision)
    kind, decision = p6_engine_choice(config.rollout_engine, is_engine_class, config.engine_name())
    trace.add(decision)
    for name, model in (("actor", actor), ("reference", reference), ("reward", reward), ("critic", critic)):
        if model is not None and not isinstance(model, (nnx.Module, str, os.PathLike)):
            raise ConfigError(f"{name} must be an nnx.Module or a checkpoint path, got {type(model).__name__}")
    if isinstance(actor, ScoreModel) or (_is_path(actor) and read_config(actor).kind == "score"):
        where = f"the checkpoint {actor} holds" if _is_path(actor) else "got"
        raise ConfigError(
            f"actor must be a language model (a TransformerLM, from rlcluster_lab.init_model, or a checkpoint of "
            f"one), {where} a ScoreModel (a reward or value model, which scores text but cannot generate it); "
            "pass it as reward= or critic= instead"
        )
    for name, model in (("reward", reward), ("critic", critic)):
        if isinstance(model, nnx.Module) and not isinstance(model, ScoreModel):
            raise ConfigError(
                f"{name} must be a score model (a ScoreModel: a backbone with a scalar head, from "
                f"rlcluster_lab.init_score_model), got {type(model).__name__}; a language model cannot score"
            )
    if isinstance(actor, nnx.Module):
        # P6: the engine's own checks (its constructor runs them again, for a model read from a path).
        try:
            seen = engine_class(config, kind).check(actor, train)
        except ConfigError:
            trace.add(p6_engine_accepts(config.engine_name(), None))
            raise
        trace.add(p6_engine_accepts(config.engine_name(), seen))
    # A path is compared on its config.json alone: a model of another size is refused before weights are read.
    actor_structure = None
    for name, other in (("reference", reference), ("critic", critic)):
        if other is None:
            continue
        actor_structure = _structure(actor) if actor_structure is None else actor_structure
        try:
            check_same_backbone(actor_structure, _structure(other), name)
        except ConfigError as err:
            paths = [f"the {n} is the checkpoint {m}" for n, m in (("actor", actor), (name, other)) if _is_path(m)]
            if not paths:
                raise
            raise ConfigError(f"{err} ({'; '.join(paths)}, compared by its config.json)") from None
    check_cache_fits(actor, max_kv_cache_size(config))
    return train, kind


def check_cache_fits(actor: Any, cache_size: int) -> None:
    """Refuse (``TooLargeError``) a KV cache size whose cache for one prompt cannot fit
    (``model.sampling.generate_bytes`` against ``core.limits.limit_bytes()``), before anything is built."""
    config = getattr(actor, "config", None) if isinstance(actor, nnx.Module) else read_config(actor).config
    if not isinstance(config, ModelConfig):
        return  # a user's own module: its engine sizes its own cache
    check_fits(
        generate_bytes(config, 1, 1, cache_size, 1),
        f"a KV cache of kv_cache_size={cache_size:,} slots for one prompt with the {config.name} model",
        "lower kv_cache_size in the RolloutConfig (Scenario.kv_cache_size)",
    )


def check_finite_leaves(state: nnx.State, role: str) -> None:
    """Refuse a model's state holding a NaN or an infinite value before a sync copies it: a
    ``ValueError`` naming the first few such leaves (``finite_flags`` reads them)."""
    flat = [(path, var.get_value()) for path, var in nnx.to_flat_state(state)]
    leaves = [(path, x) for path, x in flat if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.inexact)]
    if not leaves:
        return
    flags = finite_flags([x for _, x in leaves])
    bad = ["/".join(map(str, path)) for (path, _), ok in zip(leaves, flags) if not ok]
    if bad:
        raise ValueError(
            f"the {role} holds NaN or infinite values in {len(bad)} leaf(s) (e.g. {bad[:3]}); nothing was synced: "
            f"the rollout and the anchor keep their weights. Restore the {role} from a finite state (a checkpoint, "
            "or the anchor) before syncing"
        )


def _is_path(model: Any) -> bool:
    return isinstance(model, (str, os.PathLike))


def _structure(model: Any) -> nnx.Module:
    """The model itself, or the one a checkpoint path holds, as shapes only."""
    return model if isinstance(model, nnx.Module) else abstract_checkpoint(model)


def check_same_backbone(actor: nnx.Module, other: nnx.Module, name: str) -> None:
    """A reference (or a critic's backbone) must have the actor's frozen parameter tree."""
    target = getattr(other, "backbone", other) if name == "critic" else other
    want = _shapes(model_state(actor, nnx.Not(nnx.LoRAParam)))
    got = _shapes(model_state(target, nnx.Not(nnx.LoRAParam)))
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
