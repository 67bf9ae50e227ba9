"""Per-token log-probabilities of completions, the quantity P10 and P11 compare."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from rlcluster_lab.model.transformer import TransformerLM

# ---------------------------------------------------------------------------
# Log-probabilities


def _effective_temperature(temperature: float | jax.Array) -> jax.Array:
    # Temperature 0 means greedy decoding; its log-probs are reported at 1.
    t = jnp.asarray(temperature, jnp.float32)
    return jnp.where(t == 0, jnp.float32(1.0), t)


def mask_pad_logits(logits: jax.Array, pad_id: int) -> jax.Array:
    """The pad id is never generated: its logit is -inf for sampling and scoring alike.

    Without this a sampled pad token would be indistinguishable from padding,
    and the sampler's log-probs would disagree with the scorer's.
    """
    return jnp.where(jnp.arange(logits.shape[-1]) == pad_id, -jnp.inf, logits)


def forward_logps(
    model: TransformerLM,
    prompt_tokens: jax.Array,
    completion_tokens: jax.Array,
    pad_id: int,
    temperature: float | jax.Array = 1.0,
) -> jax.Array:
    """Per-token log-probs (B, C) of the completion given the left-padded prompt.

    Pad tokens are masked out of attention and skipped by positions; pad
    completion tokens get log-prob 0. Temperature 0 is treated as 1.
    """
    prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
    completion_tokens = jnp.asarray(completion_tokens, jnp.int32)
    p = prompt_tokens.shape[1]
    c = completion_tokens.shape[1]
    tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
    valid = tokens != pad_id
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0).astype(jnp.int32)
    mask = valid[:, None, :]  # keys; causality is added by the model
    logits, _ = model(tokens, positions, mask)
    # Logits at position i predict token i + 1.
    logits = mask_pad_logits(logits[:, p - 1 : p + c - 1], pad_id) / _effective_temperature(temperature)
    logps = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logps, completion_tokens[..., None], axis=-1)[..., 0]
    return jnp.where(completion_tokens != pad_id, picked, 0.0)


@partial(jax.jit, static_argnames=("graphdef", "pad_id"))
def _logps_jit(graphdef, state, prompt_tokens, completion_tokens, pad_id, temperature):
    return forward_logps(nnx.merge(graphdef, state), prompt_tokens, completion_tokens, pad_id, temperature)


def logps_from_state(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_tokens: jax.Array,
    completion_tokens: jax.Array,
    pad_id: int,
    temperature: float = 1.0,
) -> jax.Array:
    """Jitted ``forward_logps`` on a split model; follows the state's sharding."""
    return _logps_jit(
        graphdef,
        state,
        jnp.asarray(prompt_tokens, jnp.int32),
        jnp.asarray(completion_tokens, jnp.int32),
        int(pad_id),
        jnp.asarray(temperature, jnp.float32),
    )
