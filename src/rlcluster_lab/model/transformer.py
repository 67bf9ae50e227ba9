"""A small decoder-only transformer with logical sharding names: every parameter carries logical
axis names, mapped onto the mesh axes by ``DEFAULT_LOGICAL_AXIS_RULES`` only when a placement
is chosen, so one model definition serves every placement the lab compares."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from rlcluster_lab.core.model_config import INT_FIELDS, MODEL_SIZES, ModelConfig, get_model_config

__all__ = ["INT_FIELDS", "MODEL_SIZES", "ModelConfig", "get_model_config"]


class KVCache(NamedTuple):
    """Keys and values of every layer, (num_layers, B, S, kv_heads, head_dim); ``index``: the next slot."""

    k: jax.Array
    v: jax.Array
    index: jax.Array


def init_cache(config: ModelConfig, batch_size: int, cache_size: int) -> KVCache:
    """An empty cache of ``cache_size`` slots, in the model's dtype."""
    shape = (config.num_layers, batch_size, cache_size, config.num_kv_heads, config.head_dim)
    return KVCache(jnp.zeros(shape, config.dtype), jnp.zeros(shape, config.dtype), jnp.zeros((), jnp.int32))


class RMSNorm(nnx.Module):
    """RMS normalisation with a learned, replicated scale."""

    def __init__(self, dim: int, eps: float, dtype: jnp.dtype):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), dtype), out_sharding=(None,))

    def __call__(self, x: jax.Array) -> jax.Array:
        # Statistics in float32: bfloat16 variance loses too many bits.
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def _linear(in_dim: int, out_dim: int, axes: tuple[str, str], dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        in_dim,
        out_dim,
        use_bias=False,
        dtype=dtype,
        param_dtype=dtype,
        kernel_metadata={"out_sharding": axes},
        rngs=rngs,
    )


def apply_rope(x: jax.Array, positions: jax.Array, base: float) -> jax.Array:
    """Rotate (B, T, heads, D) by angles set by integer ``positions`` (B, T)."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[..., None] * freqs  # (B, T, half)
    sin = jnp.sin(angles)[:, :, None, :]
    cos = jnp.cos(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary positions."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c, dt = config, config.dtype
        self.config = config
        self.q = _linear(c.embed_dim, c.q_dim, ("embed", "q_heads"), dt, rngs)
        self.k = _linear(c.embed_dim, c.kv_dim, ("embed", "kv_heads"), dt, rngs)
        self.v = _linear(c.embed_dim, c.kv_dim, ("embed", "kv_heads"), dt, rngs)
        self.o = _linear(c.q_dim, c.embed_dim, ("q_heads", "embed"), dt, rngs)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        bias: jax.Array,
        layer_kv: tuple[jax.Array, jax.Array] | None,
        index: jax.Array | None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        c = self.config
        b, t, _ = x.shape
        # Each projection behind an optimization barrier (an identity): XLA:TPU at `highest` otherwise
        # fuses the float32 product with the rotary arithmetic, a fusion slow to compile. Same values.
        q, k, v = (jax.lax.optimization_barrier(proj(x)) for proj in (self.q, self.k, self.v))
        q = q.reshape(b, t, c.num_heads, c.head_dim)
        k = k.reshape(b, t, c.num_kv_heads, c.head_dim)
        v = v.reshape(b, t, c.num_kv_heads, c.head_dim)
        q = apply_rope(q, positions, c.rope_base)
        k = apply_rope(k, positions, c.rope_base)
        new_kv = None
        if layer_kv is not None:
            ck, cv = layer_kv
            zero = jnp.zeros((), jnp.int32)
            ck = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (zero, index, zero, zero))
            cv = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (zero, index, zero, zero))
            new_kv = (ck, cv)
            k, v = ck.astype(x.dtype), cv.astype(x.dtype)
        groups = c.num_heads // c.num_kv_heads
        q = q.reshape(b, t, c.num_kv_heads, groups, c.head_dim)
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k).astype(jnp.float32)
        scores = scores / math.sqrt(c.head_dim)
        # The mask as an additive bias (``mask_bias``): fully masked rows (padding queries) stay free of NaN.
        scores = scores + bias[:, None, None, :, :]
        probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, c.q_dim)
        return self.o(out), new_kv


class MLP(nnx.Module):
    """Gated SiLU feed-forward block."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c, dt = config, config.dtype
        self.gate = _linear(c.embed_dim, c.mlp_dim, ("embed", "mlp"), dt, rngs)
        self.up = _linear(c.embed_dim, c.mlp_dim, ("embed", "mlp"), dt, rngs)
        self.down = _linear(c.mlp_dim, c.embed_dim, ("mlp", "embed"), dt, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(config.embed_dim, config.rms_eps, config.dtype)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.embed_dim, config.rms_eps, config.dtype)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x, positions, bias, layer_kv, index):
        h, new_kv = self.attn(self.attn_norm(x), positions, bias, layer_kv, index)
        x = x + h
        x = x + self.mlp(self.mlp_norm(x))
        return x, new_kv


def mask_bias(mask: jax.Array) -> jax.Array:
    """A boolean attention mask as the float32 bias added to the scores: 0 where a key is seen, the
    most negative finite float32 where not. The same scores bit for bit as selecting the fill, and
    no program holds the boolean mask as an array (XLA:CPU compiles such a kernel slowly)."""
    return jnp.where(mask, jnp.float32(0.0), jnp.finfo(jnp.float32).min)


def stacked_blocks(config: ModelConfig, rngs: nnx.Rngs) -> Block:
    """Every layer as one ``Block`` whose Variables have a leading, unsharded ``num_layers`` axis
    (``nnx.vmap``, each layer its own draw), so a program over the stack is scanned, not
    unrolled: its size and compile time do not grow with depth."""

    @nnx.split_rngs(splits=config.num_layers)
    @nnx.vmap(in_axes=0, out_axes=0, axis_size=config.num_layers, transform_metadata={nnx.PARTITION_NAME: None})
    def make(rngs: nnx.Rngs) -> Block:
        return Block(config, rngs=rngs)

    return make(rngs)


def run_blocks(
    blocks: Block,
    x: jax.Array,
    positions: jax.Array,
    bias: jax.Array,
    cache: tuple[jax.Array, jax.Array] | None,
    index: jax.Array | None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """``x`` through every layer of a stacked ``blocks`` in one ``lax.scan``: one layer's program,
    run ``num_layers`` times. ``cache``: every layer's (keys, values), stacked alike."""
    graphdef, state = nnx.split(blocks)

    def layer(h: jax.Array, xs: Any) -> tuple[jax.Array, Any]:
        params, kv = xs
        return nnx.merge(graphdef, params)(h, positions, bias, kv, index)

    return jax.lax.scan(layer, x, (state, cache))


class TransformerLM(nnx.Module):
    """Decoder-only language model returning float32 logits; its layers are one stacked ``Block``
    applied with a scan (``run_blocks``)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        dt = config.dtype
        # Logical names only: placement happens later, so eager sharding (which needs a mesh) stays off.
        with nnx.use_eager_sharding(False):
            self.embed = nnx.Embed(
                config.vocab_size,
                config.embed_dim,
                dtype=dt,
                param_dtype=dt,
                embedding_metadata={"out_sharding": ("vocab", "embed")},
                rngs=rngs,
            )
            self.blocks = stacked_blocks(config, rngs)
            self.final_norm = RMSNorm(config.embed_dim, config.rms_eps, dt)
            self.head = (
                None
                if config.tie_embeddings
                else _linear(config.embed_dim, config.vocab_size, ("embed", "vocab"), dt, rngs)
            )

    def layers(
        self,
        x: jax.Array,
        positions: jax.Array,
        bias: jax.Array,
        cache: tuple[jax.Array, jax.Array] | None,
        index: jax.Array | None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """``x`` through every layer: the stack in one scan (``run_blocks``)."""
        return run_blocks(self.blocks, x, positions, bias, cache, index)

    def features(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        attention_mask: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Final normalised hidden states (B, T, embed) and the updated cache. The mask is causal, AND-ed
        with ``attention_mask`` (B, T, T); with a cache the new keys go to ``cache.index`` and the mask
        (B, T, S) covers its slots (default: every slot up to each token's own)."""
        b, t = tokens.shape
        s = t if cache is None else cache.k.shape[2]
        if cache is None:
            mask = jnp.tril(jnp.ones((t, t), bool))[None]
            mask = mask if attention_mask is None else mask & attention_mask
        elif attention_mask is not None:
            mask = attention_mask  # the caller knows which slots hold real tokens: its mask wins
        else:
            mask = (jnp.arange(s)[None, :] <= (cache.index + jnp.arange(t))[:, None])[None]
        x = self.embed(tokens)
        bias = mask_bias(jnp.broadcast_to(mask, (b, t, s)))
        if cache is None:
            x, _ = self.layers(x, positions, bias, None, None)
            return self.final_norm(x), None
        x, (k, v) = self.layers(x, positions, bias, (cache.k, cache.v), cache.index)
        return self.final_norm(x), KVCache(k, v, cache.index + t)

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        attention_mask: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Logits (B, T, vocab) and the updated cache (None without a cache); masking as in ``features``."""
        x, new_cache = self.features(tokens, positions, attention_mask, cache)
        logits = self.embed.attend(x) if self.head is None else self.head(x)
        return logits.astype(jnp.float32), new_cache
