"""Autoregressive sampling with a KV cache, on any (possibly sharded) state.

The whole generation (prefill plus decode loop) is one jitted function, so jit follows the
shardings of the state it is given and the sampler never needs to know the mesh. Compiled code
is reused across calls with the same graphdef and shapes.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlcluster_lab.core.compile_options import ProgramFamily
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.gathering import host_values
from rlcluster_lab.core.limits import check_fits
from rlcluster_lab.model.fits import SMALLER_BATCH, check_program, model_program, xla_refusal
from rlcluster_lab.model.logps import (
    check_temperature,
    check_token_id,
    check_token_ids,
    mask_pad_logits,
    model_compiler_options,
    model_config_of,
    model_vocab_size,
)
from rlcluster_lab.model.memory import generate_program
from rlcluster_lab.model.tokenizer import ByteTokenizer
from rlcluster_lab.model.transformer import ModelConfig, init_cache


@dataclass(frozen=True)
class SampleOutput:
    """Sampled completions and their log-probs.

    ``tokens`` and ``logprobs`` are (B, max_new_tokens); after EOS the tokens are ``pad_id`` and
    the log-probs 0. ``prompt_tokens`` are the left-padded prompts (B, P).
    """

    text: list[str]
    tokens: np.ndarray
    logprobs: np.ndarray
    prompt_tokens: np.ndarray


def _generate(
    graphdef,
    state,
    prompt_tokens,
    seed,
    temperature,
    *,
    max_new_tokens: int,
    cache_size: int,
    greedy: bool,
    eos_id: int,
    pad_id: int,
):
    model = nnx.merge(graphdef, state)
    key = jax.random.key(seed)  # made here, not beforehand: a key made outside is a program of its own
    b, p = prompt_tokens.shape
    slots = jnp.arange(cache_size)

    # Prefill: prompt occupies slots 0..P-1; pad slots are never attended to.
    prompt_valid = prompt_tokens != pad_id
    positions = jnp.maximum(jnp.cumsum(prompt_valid, axis=1) - 1, 0).astype(jnp.int32)
    slot_valid = jnp.zeros((b, cache_size), bool).at[:, :p].set(prompt_valid)
    mask = slot_valid[:, None, :] & (slots[None, None, :] <= jnp.arange(p)[None, :, None])
    cache = init_cache(model.config, b, cache_size)
    logits, cache = model(prompt_tokens, positions, mask, cache)
    next_pos = prompt_valid.sum(axis=1).astype(jnp.int32)  # position of the next token

    def body(i, carry):
        cache, slot_valid, last_logits, key, out_tok, out_logp, done, pos = carry
        key, sub = jax.random.split(key)
        scaled = mask_pad_logits(last_logits, pad_id) / temperature
        logp = jax.nn.log_softmax(scaled, axis=-1)
        tok = (jnp.argmax(scaled, axis=-1) if greedy else jax.random.categorical(sub, scaled, axis=-1)).astype(
            jnp.int32
        )
        tok_logp = jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]
        tok = jnp.where(done, pad_id, tok)
        tok_logp = jnp.where(done, 0.0, tok_logp)
        out_tok = out_tok.at[:, i].set(tok)
        out_logp = out_logp.at[:, i].set(tok_logp)
        # The new token sits in slot P + i; finished rows leave it masked.
        slot = p + i
        slot_valid = slot_valid.at[:, slot].set(~done)
        step_mask = slot_valid[:, None, :] & (slots <= slot)[None, None, :]
        step_logits, cache = model(tok[:, None], pos[:, None], step_mask, cache)
        done = done | (tok == eos_id)
        return cache, slot_valid, step_logits[:, 0], key, out_tok, out_logp, done, pos + 1

    carry = (
        cache,
        slot_valid,
        logits[:, -1],
        key,
        jnp.full((b, max_new_tokens), pad_id, jnp.int32),
        jnp.zeros((b, max_new_tokens), jnp.float32),
        jnp.zeros((b,), bool),
        next_pos,
    )
    carry = jax.lax.fori_loop(0, max_new_tokens, body, carry)
    return carry[4], carry[5]


_SAMPLER = ProgramFamily(
    _generate, "sampler", static_argnames=("graphdef", "max_new_tokens", "cache_size", "greedy", "eos_id", "pad_id")
)


def _run_generate(graphdef: nnx.GraphDef, state: nnx.State, *args: Any, **kwargs: Any) -> tuple[jax.Array, jax.Array]:
    """The compiled sampler for this model (compiler options from its platform and size), run."""
    return _SAMPLER.jitted(model_compiler_options(graphdef, state))(graphdef, state, *args, **kwargs)


def lowered_generate(
    graphdef: nnx.GraphDef, state: nnx.State, prompt_tokens: Any, *, max_new_tokens: int, cache_size: int, **ids: int
) -> Any:
    """``sample``'s program lowered for this state and prompt batch (arrays or
    ``jax.ShapeDtypeStruct``s with shardings; ``ids``: ``eos_id`` and ``pad_id``), sampling at a
    temperature: nothing is compiled, run or allocated."""
    program = _SAMPLER.jitted(model_compiler_options(graphdef, state))
    fixed = {"max_new_tokens": max_new_tokens, "cache_size": cache_size, "greedy": False}
    return program.lower(graphdef, state, prompt_tokens, np.int64(0), np.float32(1.0), **fixed, **ids)


PROMPT_BUCKET = 16


def check_prompts(prompts: Any, name: str = "prompts") -> list[str]:
    """``prompts`` as a list of strings; a bare string (``list("hello")`` is five prompts) is refused.

    Raises:
        TypeError: a bare string, a non-sequence, or an element that is not a string.
        ConfigError: no prompts at all.
    """
    if isinstance(prompts, (str, bytes)):
        raise TypeError(
            f"{name} must be a list of prompt strings, got a single {type(prompts).__name__} {prompts!r:.40}; "
            f"pass [{prompts!r:.40}] to generate from one prompt"
        )
    if not isinstance(prompts, Sequence) and not hasattr(prompts, "__iter__"):
        raise TypeError(f"{name} must be a list of prompt strings, got {type(prompts).__name__}")
    out = list(prompts)
    for i, p in enumerate(out):
        if not isinstance(p, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(p).__name__} {p!r:.40}")
    if not out:
        raise ConfigError(f"Cannot generate from an empty list of {name}; pass at least one.")
    return out


def check_max_new_tokens(max_new_tokens: Any, name: str = "max_new_tokens") -> int:
    """A positive int number of tokens to generate (a float is refused, not truncated).

    Raises:
        TypeError: not an integer.
        ConfigError: below 1.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise TypeError(f"{name} must be a positive int, got {type(max_new_tokens).__name__} {max_new_tokens!r:.40}")
    if max_new_tokens < 1:
        raise ConfigError(f"{name} must be at least 1, got {max_new_tokens}")
    return int(max_new_tokens)


def generate_bytes(config: ModelConfig, rows: int, prompt_length: int, cache_size: int, new_tokens: int) -> int:
    """Bytes one ``generate`` call holds at its peak beside the model, estimated from shapes.

    The KV cache (keys and values of every layer, ``cache_size`` slots per row, in the
    model's dtype) twice: a decode step writes a new cache while the old one is alive.
    The prefill's float32 logits (every prompt position, every vocabulary entry); one
    layer's float32 attention scores and probabilities and its widest activations; the
    masks; the sampled ids and log-probs.
    """
    b, p, s = int(rows), int(prompt_length), int(cache_size)
    itemsize = np.dtype(config.dtype).itemsize
    kv = config.kv_cache_bytes(b, s)
    logits = b * p * config.vocab_size * 4
    scores = 2 * b * config.num_heads * p * s * 4
    widest = max(2 * config.mlp_dim, config.q_dim + 2 * config.kv_dim, config.embed_dim)
    activations = 2 * b * p * widest * itemsize
    masks = 2 * b * p * s
    outputs = b * (int(new_tokens) * 8 + s)
    return 2 * kv + logits + scores + activations + masks + outputs


def prompt_width(tokenizer: ByteTokenizer, prompts: list[str], max_new_tokens: int, cache_size: int) -> int:
    """The width ``sample`` left-pads ``prompts`` to.

    A multiple of ``PROMPT_BUCKET`` when the cache has room for it and the completion, so a
    new batch of prompts of a similar length reuses the compiled sampler and scorers instead
    of compiling them again for one more width (pads are masked everywhere); else the longest
    prompt's length.
    """
    longest = max(len(tokenizer.encode(p)) for p in prompts)
    bucket = -(-longest // PROMPT_BUCKET) * PROMPT_BUCKET
    return bucket if bucket + max_new_tokens <= cache_size else longest


def sample(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    tokenizer: ByteTokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperature: float,
    cache_size: int,
    seed: int,
    eos_id: int | None = None,
    pad_id: int | None = None,
) -> SampleOutput:
    """Generate up to ``max_new_tokens`` per prompt; temperature 0 is greedy.

    Log-probs are those of the sampled tokens under ``logits / temperature`` (plain
    logits when greedy), as ``model.logps_from_state`` computes them. ``eos_id`` and
    ``pad_id`` default to the tokenizer's.

    Raises:
        TypeError: ``prompts`` is a bare string or holds a non-string; ``max_new_tokens``
            is not an int; ``temperature`` is not a number.
        ConfigError: no prompts; ``max_new_tokens`` < 1; ``temperature`` negative, NaN,
            infinite or below ``MIN_TEMPERATURE``; a prompt (or the pad id) encodes to an id
            outside the model's vocabulary; prompt plus completion longer than the cache.
        TooLargeError: the batch's KV cache and buffers (``generate_bytes``) would exceed
            what may be allocated (``core.limits``), or the sampler would not fit a device's
            free memory (``model.fits``); nothing was allocated.
    """
    prompts = check_prompts(prompts)
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    temperature = check_temperature(temperature)
    vocab = model_vocab_size(graphdef, state)
    # An EOS id outside the vocabulary only means "never stop early"; the pad id is written
    # into the output, so it must be one the model has.
    eos_id = tokenizer.eos_id if eos_id is None else eos_id
    if isinstance(eos_id, bool) or not isinstance(eos_id, numbers.Integral):
        raise TypeError(f"eos_id must be an int, got {type(eos_id).__name__} {eos_id!r:.40}")
    eos_id = int(eos_id)
    pad_id = check_token_id("pad_id", tokenizer.pad_id if pad_id is None else pad_id, vocab)
    prompt_tokens = tokenizer.encode_batch_left_padded(
        prompts, length=prompt_width(tokenizer, prompts, max_new_tokens, cache_size)
    )
    if pad_id != tokenizer.pad_id:
        prompt_tokens = np.where(prompt_tokens == tokenizer.pad_id, pad_id, prompt_tokens)
    # A tokenizer with a larger vocabulary than the model's would feed ids past the embedding table.
    check_token_ids("prompts (encoded by the tokenizer)", prompt_tokens, vocab)
    prompt_len = prompt_tokens.shape[1]
    if prompt_len + max_new_tokens > cache_size:
        raise ValueError(
            f"The longest prompt ({prompt_len} tokens) plus max_new_tokens ({max_new_tokens}) "
            f"needs {prompt_len + max_new_tokens} cache slots but cache_size is {cache_size}: "
            "raise cache_size or lower max_new_tokens / shorten the prompts."
        )
    config = model_config_of(graphdef, state)
    what = (
        f"generating for {len(prompts):,} prompts ({prompt_len} prompt tokens + {max_new_tokens} new, a KV cache of "
        f"{cache_size:,} slots each) with the {getattr(config, 'name', '')} model"
    )
    fix = "pass fewer prompts per generate call, or a smaller kv_cache_size"
    planned = None
    if isinstance(config, ModelConfig):
        # Validate, then allocate: the batch's cache and buffers are refused before XLA is asked.
        check_fits(generate_bytes(config, len(prompts), prompt_len, cache_size, max_new_tokens), what, fix)
        figure = model_program(generate_program, config, state, len(prompts), prompt_len, max_new_tokens, cache_size)
        planned = check_program(figure, (state, prompt_tokens), what, SMALLER_BATCH, fix)
    greedy = temperature == 0
    # The inputs go in as NumPy values: the call hands them to the devices with the state, where
    # a device array made first (``jnp.asarray``, ``jax.random.key``) compiles a program of its own.
    with xla_refusal(planned, what, SMALLER_BATCH, fix):
        tokens, logprobs = _run_generate(
            graphdef,
            state,
            prompt_tokens,
            np.int64(seed),  # as jax.random.key reads a Python int
            np.float32(1.0 if greedy else temperature),
            max_new_tokens=max_new_tokens,
            cache_size=cache_size,
            greedy=greedy,
            eos_id=eos_id,
            pad_id=pad_id,
        )
    # multi-process: the sampler's devices may belong to another process (a split rollout).
    tokens, logprobs = host_values([tokens, logprobs])
    logprobs = logprobs.astype(np.float32, copy=False)
    text = [tokenizer.decode(row) for row in tokens]
    return SampleOutput(text=text, tokens=tokens, logprobs=logprobs, prompt_tokens=prompt_tokens)
