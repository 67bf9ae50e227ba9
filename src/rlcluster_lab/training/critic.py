"""The critic's training: a PPO-style clipped value loss and its optimizer step (P12).

As the reference's PPO value loss: 0.5 times the larger squared error of the prediction and of
the prediction clipped to within ``clip_range_value`` of the rollout-time values, averaged over
real completion tokens. Values are read where ``RLCluster.get_values`` reads them (each
completion token's own position; the reference reads one earlier). The step is the actor step's
program (``training.step.jitted_update``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.model.scoring import completion_scores
from rlcluster_lab.training.batch import TokenBatch
from rlcluster_lab.training.step import run_update


@dataclasses.dataclass(frozen=True)
class ValueBatch(TokenBatch):
    """What the critic learns from: completions, their returns and the rollout-time values, checked at
    construction as ``TrainBatch`` is."""

    prompt_tokens: np.ndarray  # (B, P) left-padded
    completion_tokens: np.ndarray  # (B, C) right-padded
    returns: np.ndarray  # (B, C) float targets per completion token (e.g. advantages + values)
    # (B, C) the critic's values at sampling (RLCluster.get_values): the clipped branch stays within clip_range_value.
    old_values: np.ndarray

    def __post_init__(self) -> None:
        shape = self._check_ids("critic")
        per_token = "one value per completion token, like completion_tokens"
        self._set_floats("returns", shape, per_token, copy=True)
        self._set_floats("old_values", shape, per_token, copy=True)


def ppo_value_sums(
    model: nnx.Module, batch: dict[str, jax.Array], *, pad_id: int, clip_range_value: float
) -> tuple[dict[str, jax.Array], jax.Array]:
    """``0.5 * max((v - R)^2, (clip(v, v_old ± c) - R)^2)`` and its metrics (``vpred_mean``,
    ``vf_clipfrac``, ``return_mean``) summed over real completion tokens, with their count."""
    completion = batch["completion_tokens"]
    mask = (completion != pad_id).astype(jnp.float32)
    vpred = completion_scores(model, batch["prompt_tokens"], completion, pad_id)
    old, returns = batch["old_values"], batch["returns"]
    clipped = jnp.clip(vpred, old - clip_range_value, old + clip_range_value)
    unclipped_err = jnp.square(vpred - returns)
    clipped_err = jnp.square(clipped - returns)
    sums = {
        "loss": 0.5 * (jnp.maximum(unclipped_err, clipped_err) * mask).sum(),
        "vpred_mean": (vpred * mask).sum(),
        "vf_clipfrac": ((clipped_err > unclipped_err) * mask).sum(),
        "return_mean": (returns * mask).sum(),
    }
    return sums, mask.sum()


def value_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    trainable: Any,
    frozen: Any,
    opt_state: Any,
    batch: dict[str, Any],
    *,
    pad_id: int,
    clip_range_value: float,
    micro_batch_size: int | None = None,
) -> tuple[Any, Any, dict[str, jax.Array]]:
    """One critic optimizer step on the clipped value loss, outputs on the inputs' shardings; a
    ``ConfigError`` for a non-finite or non-positive ``clip_range_value`` or a batch that is not a
    whole number of micro-batches."""
    if not math.isfinite(float(clip_range_value)) or float(clip_range_value) <= 0:
        raise ConfigError(f"clip_range_value must be a finite number > 0, got {clip_range_value}")
    pad_id, clip = int(pad_id), float(clip_range_value)

    def sums_fn(model: nnx.Module, b: dict[str, jax.Array], _extra: Any) -> Any:
        return ppo_value_sums(model, b, pad_id=pad_id, clip_range_value=clip)

    args = (trainable, frozen, opt_state, batch, None)
    return run_update(tx, graphdef, args, micro_batch_size, ("value", pad_id, clip), sums_fn, "value_train_step")
