"""Per-token log-probabilities of completions, the quantity P10 and P11 compare."""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlcluster_lab.core.compile_options import ProgramFamily, options_for, run
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.options import MIN_TEMPERATURE, temperature_rule
from rlcluster_lab.model.fits import SMALLER_BATCH, check_program, model_program, xla_refusal
from rlcluster_lab.model.memory import logps_program
from rlcluster_lab.model.transformer import ModelConfig, TransformerLM

# Input contracts, checked on the host before any device work: an id outside the vocabulary makes
# the embedding gather read past its table (NaN on CPU, wrapped or clamped ids elsewhere).


def check_token_ids(name: str, tokens: Any, vocab_size: int | None) -> np.ndarray:
    """``tokens`` (named ``name`` in the message; a device array is read back) as a host integer array
    whose ids all lie in ``[0, vocab_size)`` (None: only not negative); a ``TypeError`` for ids that
    are not integers, a ``ConfigError`` for one out of range."""
    if isinstance(tokens, (str, bytes)):
        raise TypeError(f"{name} must be an array of integer token ids, got {type(tokens).__name__} {tokens!r:.40}")
    arr = np.asarray(tokens)
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"{name} must hold integer token ids, got dtype {arr.dtype}; pass np.asarray(ids, np.int32) "
            "(ids are never rounded or truncated silently)"
        )
    if arr.size == 0:
        return arr
    low, high = arr.min(), arr.max()
    bad = low if low < 0 else high if vocab_size is not None and high >= vocab_size else None
    if bad is not None:
        where = tuple(int(i) for i in np.argwhere(arr == bad)[0])
        limit = f"[0, {vocab_size})" if vocab_size is not None else "[0, vocab_size)"
        raise ConfigError(
            f"{name} holds token id {int(bad)} at index {where}, outside the model's vocabulary {limit}: "
            "token ids must be integers in [0, vocab_size); encode text with the cluster's tokenizer"
        )
    return arr


def check_token_id(name: str, value: Any, vocab_size: int | None) -> int:
    """One token id (a pad or EOS id) as an int in ``[0, vocab_size)``, else a ``TypeError`` or ``ConfigError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer token id, got {type(value).__name__} {value!r:.40}")
    if value < 0 or (vocab_size is not None and value >= vocab_size):
        limit = f"[0, {vocab_size})" if vocab_size is not None else "[0, vocab_size)"
        raise ConfigError(f"{name} is {int(value)}, outside the model's vocabulary {limit}; use an id the model has")
    return int(value)


def check_token_batch(
    prompt_tokens: Any, completion_tokens: Any, vocab_size: int | None, *, names: tuple[str, str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A (B, P) prompt batch and a (B, C) completion batch of in-vocabulary ids, B, P, C >= 1 (the first
    completion token is predicted from the last prompt position; an all-pad prompt row is masked). A
    ``TypeError`` for non-integer ids, a ``ConfigError`` naming the shape expected or the id out of range."""
    p_name, c_name = names or ("prompt_tokens", "completion_tokens")
    prompt = check_token_ids(p_name, prompt_tokens, vocab_size)
    completion = check_token_ids(c_name, completion_tokens, vocab_size)
    if prompt.ndim != 2 or prompt.shape[0] == 0 or prompt.shape[1] == 0:
        raise ConfigError(
            f"{p_name} has shape {prompt.shape}; expected (batch, prompt_length) with batch >= 1 and "
            "prompt_length >= 1 (left-padded ids, as generate returns them); an empty batch cannot be scored"
        )
    b = prompt.shape[0]
    if completion.ndim != 2 or completion.shape[0] != b or completion.shape[1] == 0:
        raise ConfigError(
            f"{c_name} has shape {completion.shape}; expected ({b}, completion_length) with completion_length "
            f">= 1: one row per row of {p_name} {prompt.shape}"
        )
    return prompt, completion


def check_temperature(temperature: Any, *, allow_zero: bool = True, name: str = "temperature") -> float:
    """``temperature`` as a finite float: 0 (greedy, when ``allow_zero``) or at least ``MIN_TEMPERATURE``
    (below it ``logits / temperature`` overflows float32 and every log-prob is NaN); a ``TypeError``
    for a non-number, a ``ConfigError`` for NaN, infinite or out of range."""
    if isinstance(temperature, bool) or not isinstance(temperature, (numbers.Real, np.ndarray, jax.Array)):
        raise TypeError(f"{name} must be a real number, got {type(temperature).__name__} {temperature!r:.40}")
    if np.ndim(temperature) != 0:
        raise ConfigError(f"{name} must be a scalar, got shape {np.shape(temperature)}")
    value = float(temperature)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero) or 0 < value < MIN_TEMPERATURE:
        raise ConfigError(f"{name} {temperature_rule(allow_zero)}, got {value}")
    return value


_CONFIG_BY_GRAPHDEF: dict[Any, Any] = {}
# graphdef's id -> (the graphdef, its config): the graphdef held, so its id is its own while here.
_CONFIG_BY_ID: dict[int, tuple[Any, Any]] = {}


def model_config_of(graphdef: nnx.GraphDef, *states: Any) -> Any:
    """The ``config`` of the model ``graphdef`` describes (a ``ModelConfig`` for the lab's models),
    or None for a model without one. Found once per graphdef (merging builds Python objects only),
    and once per graphdef object by identity: hashing a graphdef walks the whole module graph, and
    a cluster passes the same graphdef object at every call (``core.states.model_split``)."""
    hit = _CONFIG_BY_ID.get(id(graphdef))
    if hit is not None and hit[0] is graphdef:
        return hit[1]
    try:
        config = _CONFIG_BY_GRAPHDEF[graphdef]
    except KeyError:
        config = getattr(nnx.merge(graphdef, *states), "config", None)
        if len(_CONFIG_BY_GRAPHDEF) >= 64:  # bounded: one entry per model architecture seen
            _CONFIG_BY_GRAPHDEF.clear()
        _CONFIG_BY_GRAPHDEF[graphdef] = config
    if len(_CONFIG_BY_ID) >= 64:  # bounded: one entry per graphdef object in use
        _CONFIG_BY_ID.clear()
    _CONFIG_BY_ID[id(graphdef)] = (graphdef, config)
    return config


def model_vocab_size(graphdef: nnx.GraphDef, *states: Any) -> int | None:
    """The vocabulary size of the model ``graphdef`` describes (its ``config.vocab_size``), or None
    for a model without one."""
    vocab = getattr(model_config_of(graphdef, *states), "vocab_size", None)
    return int(vocab) if isinstance(vocab, numbers.Integral) else None


def mask_pad_logits(logits: jax.Array, pad_id: int) -> jax.Array:
    """The pad id is never generated: its logit is -inf for sampling and scoring alike (a sampled pad
    would be indistinguishable from padding, and the two log-probs would disagree)."""
    return jnp.where(jnp.arange(logits.shape[-1]) == pad_id, -jnp.inf, logits)


def packed_sequence(prompt_tokens: jax.Array, completion_tokens: jax.Array, pad_id: int) -> tuple[jax.Array, ...]:
    """A model's inputs for prompt + completion: the tokens, positions that skip pads, and
    the pad mask over keys (B, 1, P + C; causality is added by the model)."""
    tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
    valid = tokens != pad_id
    return tokens, jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0).astype(jnp.int32), valid[:, None, :]


def checked_batch(
    graphdef: nnx.GraphDef, state: Any, prompt_tokens: Any, completion_tokens: Any, pad_id: Any
) -> tuple[jax.Array, jax.Array]:
    """The ids and ``pad_id`` checked on the host against the model's vocabulary (as ``check_token_batch``
    refuses them); the ids as int32 arrays."""
    vocab = model_vocab_size(graphdef, state)
    prompt, completion = check_token_batch(prompt_tokens, completion_tokens, vocab)
    check_token_id("pad_id", pad_id, vocab)
    return jnp.asarray(prompt, jnp.int32), jnp.asarray(completion, jnp.int32)


def forward_logps(
    model: TransformerLM,
    prompt_tokens: jax.Array,
    completion_tokens: jax.Array,
    pad_id: int,
    temperature: float | jax.Array = 1.0,
) -> jax.Array:
    """Per-token log-probs (B, C) of the completion given the left-padded prompt: pads are masked out of
    attention and skipped by positions, pad completion tokens get 0; temperature 0 is treated as 1."""
    prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
    completion_tokens = jnp.asarray(completion_tokens, jnp.int32)
    p, c = prompt_tokens.shape[1], completion_tokens.shape[1]
    logits, _ = model(*packed_sequence(prompt_tokens, completion_tokens, pad_id))
    # Logits at position i predict token i + 1. Temperature 0 (greedy) reports log-probs at 1.
    t = jnp.asarray(temperature, jnp.float32)
    logits = mask_pad_logits(logits[:, p - 1 : p + c - 1], pad_id) / jnp.where(t == 0, jnp.float32(1.0), t)
    logps = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logps, completion_tokens[..., None], axis=-1)[..., 0]
    return jnp.where(completion_tokens != pad_id, picked, 0.0)


def _logps(graphdef, state, prompt_tokens, completion_tokens, pad_id, temperature):
    return forward_logps(nnx.merge(graphdef, state), prompt_tokens, completion_tokens, pad_id, temperature)


# One program per model graph, shapes, shardings, compiler options and precision (core.precision):
# every role whose model has the same graph (reference, anchor, live actor) runs the same program.
LOGPS = ProgramFamily(_logps, "log-probs", static_argnames=("graphdef", "pad_id"))


def model_compiler_options(graphdef: nnx.GraphDef, *states: Any) -> dict[str, Any] | None:
    """The compiler options for a program over this model (``core.compile_options``): chosen
    from the platform its state lives on and its parameter count."""
    config = model_config_of(graphdef, *states)
    size = getattr(config, "num_params", None)
    return options_for(states, size if isinstance(size, int) else None)


def logps_from_state(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_tokens: jax.Array,
    completion_tokens: jax.Array,
    pad_id: int,
    temperature: float = 1.0,
) -> jax.Array:
    """Jitted ``forward_logps`` on a split model; follows the state's sharding.

    The ids, ``pad_id`` and ``temperature`` are checked on the host first.

    Raises:
        TypeError: token ids that are not integers, or a temperature that is not a number.
        ConfigError: a batch of the wrong shape (or empty), an id outside the model's
            vocabulary, or a temperature that is negative, NaN or infinite.
        TooLargeError: the program would not fit a device's free memory (``model.fits``).
    """
    prompt, completion = checked_batch(graphdef, state, prompt_tokens, completion_tokens, pad_id)
    # A NumPy scalar goes in with the call; a device scalar made first is a program of its own.
    temperature = np.float32(check_temperature(temperature))
    config = model_config_of(graphdef, state)
    (rows, width), length = prompt.shape, completion.shape[1]
    what = f"scoring {rows:,} completions of {width} + {length} tokens with the {getattr(config, 'name', '')} model"
    planned = None
    if isinstance(config, ModelConfig):  # checked before anything is compiled
        figure = model_program(logps_program, config, state, rows, width, length)
        planned = check_program(figure, (state, prompt, completion), what, SMALLER_BATCH, "score fewer rows at once")
    program = LOGPS.jitted(model_compiler_options(graphdef, state))
    with xla_refusal(planned, what, SMALLER_BATCH, "score fewer rows at once"):
        return run(program, graphdef, state, prompt, completion, int(pad_id), temperature)
