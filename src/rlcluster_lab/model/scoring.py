"""Reward and value models: our language model's backbone (the actor's tree) with a scalar head. A
reward is the head's output at the last real completion token; a critic's values are its outputs
at every completion position."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rlcluster_lab.core.compile_options import ProgramFamily
from rlcluster_lab.model.init import abstract_of, init_from
from rlcluster_lab.model.logps import checked_batch, model_compiler_options, packed_sequence
from rlcluster_lab.model.transformer import ModelConfig, TransformerLM


class ScoreModel(nnx.Module):
    """A TransformerLM backbone plus a linear scalar head (reward model or critic)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs) -> None:
        self.config = config
        self.backbone = TransformerLM(config, rngs=rngs)
        with nnx.use_eager_sharding(False):
            self.score_head = nnx.Linear(
                config.embed_dim,
                1,
                use_bias=True,
                dtype=config.dtype,
                param_dtype=config.dtype,
                kernel_metadata={"out_sharding": ("embed", None)},
                rngs=rngs,
            )

    def __call__(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        x, _ = self.backbone.features(tokens, positions, attention_mask)
        return self.score_head(x)[..., 0].astype(jnp.float32)


def abstract_score_model(config: ModelConfig | str) -> ScoreModel:
    """A ``ScoreModel`` whose values are shapes only (for planning and checks before allocation)."""
    return abstract_of(ScoreModel, config)


def init_score_model(
    config: ModelConfig | str, *, seed: int = 0, mesh: Any = None, rules: Any = None, memory_kind: str | None = None
) -> ScoreModel:
    """A fresh reward or value model; the arguments are ``init_model``'s."""
    return init_from(ScoreModel, config, seed, mesh, rules, memory_kind)


def completion_scores(
    model: ScoreModel, prompt_tokens: jax.Array, completion_tokens: jax.Array, pad_id: int
) -> jax.Array:
    """Head outputs (B, C) at the completion positions; 0 at padding."""
    out = model(*packed_sequence(prompt_tokens, completion_tokens, pad_id))
    return jnp.where(completion_tokens != pad_id, out[:, prompt_tokens.shape[1] :], 0.0)


def _scores(
    graphdef: Any, state: Any, prompt_tokens: jax.Array, completion_tokens: jax.Array, pad_id: int, per_token: bool
) -> jax.Array:
    model = nnx.merge(graphdef, state)
    values = completion_scores(model, prompt_tokens, completion_tokens, pad_id)
    if per_token:
        return values
    # The score of a sequence is the head's output at its last real token.
    real = completion_tokens != pad_id
    last = jnp.maximum(real.sum(axis=1) - 1, 0)
    return jnp.take_along_axis(values, last[:, None], axis=1)[:, 0]


_SCORES = ProgramFamily(_scores, "scores", static_argnames=("graphdef", "pad_id", "per_token"))


def scores_from_state(
    graphdef: Any, state: Any, prompt_tokens: Any, completion_tokens: Any, pad_id: int, *, per_token: bool
) -> jax.Array:
    """Values (B, C) when ``per_token``, else one score per sequence (B,). Ids are checked on the host
    first (an id outside the vocabulary would score NaN): ``TypeError`` for non-integers,
    ``ConfigError`` for a wrong shape or an id out of range."""
    prompt, completion = checked_batch(graphdef, state, prompt_tokens, completion_tokens, pad_id)
    program = _SCORES.jitted(model_compiler_options(graphdef, state))
    return program(graphdef, state, prompt, completion, int(pad_id), bool(per_token))
