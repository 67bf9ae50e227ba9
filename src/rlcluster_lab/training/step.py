"""The actor's optimizer step: a GRPO-style clipped objective with a KL term (P12).

The step is a pure jitted function of (trainable state, frozen state,
optimizer state, batch); the cluster feeds it the live actor and writes the
new trainable state back.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rlcluster_lab.model import forward_logps


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """One batch of sampled completions with what the loss needs.

    ``old_logps`` are the log-probs of the policy that sampled the tokens
    (the anchor, P11); ``ref_logps`` those of the frozen reference.
    """

    prompt_tokens: np.ndarray  # (B, P) left-padded
    completion_tokens: np.ndarray  # (B, C) right-padded
    advantages: np.ndarray  # (B,)
    old_logps: np.ndarray  # (B, C)
    ref_logps: np.ndarray | None = None  # (B, C); None: no KL term

    def __post_init__(self) -> None:
        b = len(self.prompt_tokens)
        if b == 0:
            raise ValueError("Cannot update the actor from an empty batch.")
        for name in ("completion_tokens", "advantages", "old_logps", "ref_logps"):
            value = getattr(self, name)
            if value is not None and len(value) != b:
                raise ValueError(f"TrainBatch.{name} has {len(value)} rows, expected {b}")

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def rows(self, index: slice | np.ndarray) -> TrainBatch:
        pick = lambda x: None if x is None else np.asarray(x)[index]  # noqa: E731
        return TrainBatch(
            prompt_tokens=pick(self.prompt_tokens),
            completion_tokens=pick(self.completion_tokens),
            advantages=pick(self.advantages),
            old_logps=pick(self.old_logps),
            ref_logps=pick(self.ref_logps),
        )


def grpo_loss(
    model: nnx.Module,
    batch: dict[str, jax.Array],
    *,
    pad_id: int,
    temperature: jax.Array,
    beta: float,
    epsilon: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped policy-gradient loss plus ``beta`` times a k3 KL estimate, over real tokens."""
    completion = batch["completion_tokens"]
    mask = (completion != pad_id).astype(jnp.float32)
    logps = forward_logps(model, batch["prompt_tokens"], completion, pad_id, temperature)
    ratio = jnp.exp(logps - batch["old_logps"])
    adv = batch["advantages"][:, None]
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * adv)
    per_token = -surrogate
    kl = jnp.zeros_like(logps)
    if "ref_logps" in batch:
        delta = batch["ref_logps"] - logps
        kl = jnp.exp(delta) - delta - 1.0
        per_token = per_token + beta * kl
    denom = jnp.maximum(mask.sum(), 1.0)
    loss = (per_token * mask).sum() / denom
    metrics = {
        "loss": loss,
        "kl": (kl * mask).sum() / denom,
        "clip_fraction": ((jnp.abs(ratio - 1.0) > epsilon) * mask).sum() / denom,
    }
    return loss, metrics


def train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    trainable: Any,
    frozen: Any,
    opt_state: Any,
    batch: dict[str, jax.Array],
    temperature: jax.Array,
    *,
    pad_id: int,
    beta: float,
    epsilon: float,
) -> tuple[Any, Any, dict[str, jax.Array]]:
    """One optimizer step (P12); the new parameters and optimizer state keep the old ones' shardings.

    Left to itself XLA may hand back a leaf in another layout (a replicated
    norm scale's Adam moment split over a mesh axis), which changes what a
    role holds and makes the next step compile again for the new layout; so
    the outputs are pinned to the inputs' shardings, and the compiled step is
    shared by every call with the same layouts.
    """
    keep = (_sharding_key(trainable), _sharding_key(opt_state))
    step = _jitted_step(graphdef, tx, pad_id, float(beta), float(epsilon), keep)
    return step(trainable, frozen, opt_state, batch, temperature)


def _sharding_key(tree: Any) -> tuple[Any, tuple[Any, ...]]:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(x.sharding for x in leaves)


@functools.lru_cache(maxsize=16)
def _jitted_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    pad_id: int,
    beta: float,
    epsilon: float,
    keep: tuple[Any, Any],
) -> Any:
    (p_def, p_shardings), (o_def, o_shardings) = keep
    mesh = next((s.mesh for s in p_shardings if isinstance(s, NamedSharding)), None)
    metrics = NamedSharding(mesh, PartitionSpec()) if mesh is not None else None

    def step(
        trainable: Any, frozen: Any, opt_state: Any, batch: dict[str, jax.Array], temperature: jax.Array
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        def loss_fn(params: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
            model = nnx.merge(graphdef, params, frozen)
            return grpo_loss(model, batch, pad_id=pad_id, temperature=temperature, beta=beta, epsilon=epsilon)

        grads, m = jax.grad(loss_fn, has_aux=True)(trainable)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        trainable = optax.apply_updates(trainable, updates)
        m["grad_norm"] = optax.tree.norm(grads)
        return trainable, opt_state, m

    out = (jax.tree.unflatten(p_def, p_shardings), jax.tree.unflatten(o_def, o_shardings), metrics)
    return jax.jit(step, out_shardings=out)


def init_optimizer_state(tx: optax.GradientTransformation, params: Any, mesh: Any) -> Any:
    """``tx.init(params)`` in one compiled program, each leaf placed where it belongs.

    A leaf of the optimizer state that mirrors a parameter (Adam's moments)
    takes that parameter's sharding; any other leaf (a step count) is
    replicated on ``mesh``. Eager ``tx.init`` would compile a program per
    parameter shape instead.
    """
    abstract = jax.eval_shape(tx.init, params)
    by_path = {_path_key(kp): x for kp, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    replicated = NamedSharding(mesh, PartitionSpec())

    def pick(kp: Any, leaf: Any) -> Any:
        key = _path_key(kp)
        for start in range(len(key)):
            hit = by_path.get(key[start:])
            if hit is not None and hit.shape == leaf.shape:
                return hit.sharding
        return replicated

    shardings = jax.tree_util.tree_map_with_path(pick, abstract)
    return jax.jit(tx.init, out_shardings=shardings)(params)


def _path_key(path: Any) -> tuple[str, ...]:
    return tuple(str(k) for k in path)


def batch_arrays(batch: TrainBatch) -> dict[str, jax.Array]:
    out = {
        "prompt_tokens": jnp.asarray(batch.prompt_tokens, jnp.int32),
        "completion_tokens": jnp.asarray(batch.completion_tokens, jnp.int32),
        "advantages": jnp.asarray(batch.advantages, jnp.float32),
        "old_logps": jnp.asarray(batch.old_logps, jnp.float32),
    }
    if batch.ref_logps is not None:
        out["ref_logps"] = jnp.asarray(batch.ref_logps, jnp.float32)
    return out


def mini_batches(size: int, mini_batch_size: int | None) -> list[slice]:
    step = size if not mini_batch_size else min(mini_batch_size, size)
    return [slice(i, min(i + step, size)) for i in range(0, size, step)]
