"""A small decoder-only transformer with logical sharding names and LoRA.

Every parameter carries an ``out_sharding`` tuple of *logical* axis names
("vocab", "embed", "q_heads", "kv_heads", "mlp", or None). The names are
mapped onto the mesh axes ("fsdp", "tp") by ``DEFAULT_LOGICAL_AXIS_RULES``
only when a placement is chosen, so one model definition serves every
placement the lab compares.
"""
from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict
from jax.sharding import NamedSharding, PartitionSpec

MESH_AXES: tuple[str, str] = ("fsdp", "tp")

# Logical name -> mesh axis. Norm scales use None and stay replicated.
DEFAULT_LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    ("embed", "fsdp"),
    ("vocab", "tp"),
    ("q_heads", "tp"),
    ("kv_heads", "tp"),
    ("mlp", "tp"),
)


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a ``TransformerLM``."""

    name: str
    vocab_size: int
    embed_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    max_seq_len: int
    tie_embeddings: bool = False
    param_dtype: str = "float32"
    rms_eps: float = 1e-6
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        for field in ("vocab_size", "embed_dim", "num_layers", "num_heads",
                      "num_kv_heads", "head_dim", "mlp_dim", "max_seq_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{field} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rms_eps <= 0 or self.rope_base <= 0:
            raise ValueError("rms_eps and rope_base must be positive")
        try:
            jnp.dtype(self.param_dtype)
        except TypeError as err:
            raise ValueError(f"unknown param_dtype {self.param_dtype!r}") from err

    @property
    def dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_params(self) -> int:
        """Parameter count of the model without adapters."""
        e, m = self.embed_dim, self.mlp_dim
        per_layer = (
            2 * e  # two norm scales
            + e * self.q_dim + 2 * e * self.kv_dim + self.q_dim * e  # q, k, v, o
            + 3 * e * m  # gate, up, down
        )
        head = 0 if self.tie_embeddings else self.vocab_size * e
        return self.vocab_size * e + self.num_layers * per_layer + e + head

    def lora_params(self, rank: int) -> int:
        """Parameter count of the rank-``rank`` adapters added by ``with_lora``."""
        if rank <= 0:
            raise ValueError(f"LoRA rank must be positive, got {rank}")
        e, m = self.embed_dim, self.mlp_dim
        # An adapter on an (in, out) kernel holds rank * (in + out) numbers.
        per_layer = rank * (
            (e + self.q_dim) + 2 * (e + self.kv_dim) + (self.q_dim + e)
            + 2 * (e + m) + (m + e)
        )
        return self.num_layers * per_layer


# Sharded dims are all multiples of 8 (264 = 8 * 33) so each shards over 8, 4 or 2.
MODEL_SIZES: dict[str, ModelConfig] = {
    "tiny": ModelConfig("tiny", vocab_size=264, embed_dim=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, mlp_dim=128, max_seq_len=128),
    "small": ModelConfig("small", vocab_size=264, embed_dim=128, num_layers=6, num_heads=8,
                         num_kv_heads=4, head_dim=16, mlp_dim=512, max_seq_len=256),
    "base": ModelConfig("base", vocab_size=264, embed_dim=256, num_layers=10, num_heads=8,
                        num_kv_heads=4, head_dim=32, mlp_dim=1024, max_seq_len=512),
    "large": ModelConfig("large", vocab_size=264, embed_dim=512, num_layers=12, num_heads=16,
                         num_kv_heads=8, head_dim=32, mlp_dim=2048, max_seq_len=1024),
}


def get_model_config(name: str) -> ModelConfig:
    """Look up a preset size by name."""
    try:
        return MODEL_SIZES[name]
    except KeyError:
        raise ValueError(
            f"Unknown model size {name!r}; known sizes: {', '.join(MODEL_SIZES)}"
        ) from None


class KVCache(NamedTuple):
    """Keys and values of every layer: (num_layers, B, S, num_kv_heads, head_dim).

    ``index`` is the next cache slot to write (int32 scalar).
    """

    k: jax.Array
    v: jax.Array
    index: jax.Array


def init_cache(config: ModelConfig, batch_size: int, cache_size: int,
               dtype: Any = None) -> KVCache:
    """An empty cache of ``cache_size`` slots."""
    dtype = config.dtype if dtype is None else dtype
    shape = (config.num_layers, batch_size, cache_size, config.num_kv_heads, config.head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((), jnp.int32))


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


def _linear(in_dim: int, out_dim: int, axes: tuple[str, str], dtype: jnp.dtype,
            rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(in_dim, out_dim, use_bias=False, dtype=dtype, param_dtype=dtype,
                      kernel_metadata={"out_sharding": axes}, rngs=rngs)


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

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array,
                 layer_kv: tuple[jax.Array, jax.Array] | None, index: jax.Array | None
                 ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        c = self.config
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, c.num_heads, c.head_dim)
        k = self.k(x).reshape(b, t, c.num_kv_heads, c.head_dim)
        v = self.v(x).reshape(b, t, c.num_kv_heads, c.head_dim)
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
        # A finite fill keeps fully masked rows (padding queries) free of NaN.
        scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
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

    def __call__(self, x, positions, mask, layer_kv, index):
        h, new_kv = self.attn(self.attn_norm(x), positions, mask, layer_kv, index)
        x = x + h
        x = x + self.mlp(self.mlp_norm(x))
        return x, new_kv


class TransformerLM(nnx.Module):
    """Decoder-only language model returning float32 logits."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        dt = config.dtype
        # Sharding metadata holds logical names only; placement happens later,
        # so eager sharding (which needs a mesh) stays off.
        with nnx.use_eager_sharding(False):
            self.embed = nnx.Embed(config.vocab_size, config.embed_dim, dtype=dt, param_dtype=dt,
                                   embedding_metadata={"out_sharding": ("vocab", "embed")},
                                   rngs=rngs)
            self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.num_layers)])
            self.final_norm = RMSNorm(config.embed_dim, config.rms_eps, dt)
            self.head = (None if config.tie_embeddings
                         else _linear(config.embed_dim, config.vocab_size, ("embed", "vocab"),
                                      dt, rngs))

    def features(self, tokens: jax.Array, positions: jax.Array,
                 attention_mask: jax.Array | None = None, cache: KVCache | None = None
                 ) -> tuple[jax.Array, KVCache | None]:
        """Final normalised hidden states (B, T, embed) and the updated cache.

        Without a cache the mask is causal over the T tokens, AND-ed with
        ``attention_mask`` (B, T, T). With a cache the new keys are written at
        ``cache.index`` and ``attention_mask`` (B, T, S) covers cache slots; when
        omitted, each token sees every slot up to its own.
        """
        b, t = tokens.shape
        if cache is None:
            mask = jnp.tril(jnp.ones((t, t), bool))[None]
            if attention_mask is not None:
                mask = mask & attention_mask
            mask = jnp.broadcast_to(mask, (b, t, t))
        else:
            s = cache.k.shape[2]
            slot = cache.index + jnp.arange(t)
            mask = (jnp.arange(s)[None, :] <= slot[:, None])[None]
            if attention_mask is not None:
                # The caller knows which slots hold real tokens: its mask wins.
                mask = attention_mask
            mask = jnp.broadcast_to(mask, (b, t, s))
        x = self.embed(tokens)
        new_k, new_v = [], []
        for i, block in enumerate(self.blocks):
            layer_kv = None if cache is None else (cache.k[i], cache.v[i])
            x, kv = block(x, positions, mask, layer_kv, None if cache is None else cache.index)
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        x = self.final_norm(x)
        new_cache = None
        if cache is not None:
            new_cache = KVCache(jnp.stack(new_k), jnp.stack(new_v), cache.index + t)
        return x, new_cache

    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 attention_mask: jax.Array | None = None, cache: KVCache | None = None
                 ) -> tuple[jax.Array, KVCache | None]:
        """Logits (B, T, vocab) and the updated cache (None without a cache).

        See ``features`` for the masking rules.
        """
        x, new_cache = self.features(tokens, positions, attention_mask, cache)
        logits = self.embed.attend(x) if self.head is None else self.head(x)
        return logits.astype(jnp.float32), new_cache


@functools.lru_cache(maxsize=32)
def _abstract_lm(config: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """The model's structure: every Variable with its logical names, values as shapes only.

    Traced once per config (``nnx.eval_shape``: nothing is computed or compiled).
    """
    return nnx.split(nnx.eval_shape(lambda: TransformerLM(config, rngs=nnx.Rngs(0))))


def abstract_model(config: ModelConfig | str, lora_rank: int = 0, lora_scale: float = 1.0) -> TransformerLM:
    """A ``TransformerLM`` (with rank-``lora_rank`` adapters) whose values are shapes only.

    What the planner and the checks before allocation read: the tree, the
    shapes, dtypes and logical axis names, with no array behind them.
    """
    config = get_model_config(config) if isinstance(config, str) else config
    graphdef, state = _abstract_lm(config)
    model = nnx.merge(graphdef, jax.tree.map(lambda x: x, state))
    if lora_rank:
        model, _ = _wrap_lora(model, lora_rank, lora_scale, adapters=lambda path, a, b: (a, b))
    return model


def host_values(state: nnx.State, seed: int) -> dict[Any, Any]:
    """Initial values for an abstract state, drawn on the host with NumPy.

    Each leaf has its own generator, seeded by ``seed`` and the leaf's path,
    so a value never depends on which other leaves exist. Kernels and LoRA
    ``lora_a`` are normal with standard deviation 1/sqrt(fan-in); the
    embedding table 1/sqrt(embed); norm scales are ones; biases and LoRA
    ``lora_b`` zeros (so a fresh adapter changes nothing).
    """
    out = {}
    for path, value in flatten_dict(nnx.to_pure_dict(state)).items():
        out[path] = _initial(path, tuple(value.shape), np.dtype(value.dtype), seed)
    return unflatten_dict(out)


def _initial(path: tuple[Any, ...], shape: tuple[int, ...], dtype: np.dtype, seed: int) -> np.ndarray:
    name = str(path[-1])
    if name in ("scale",):
        return np.ones(shape, dtype)
    if name in ("bias", "lora_b") or len(shape) < 2:
        return np.zeros(shape, dtype)
    rng = np.random.default_rng([seed, zlib.crc32("/".join(map(str, path)).encode())])
    fan = shape[-1] if name == "embedding" else shape[0]
    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / math.sqrt(fan))
    return values.astype(dtype)


def materialize(graphdef: nnx.GraphDef, abstract: nnx.State, values: Any, shardings: Any = None) -> nnx.Module:
    """A live module from an abstract state and host values, placed in one transfer.

    ``shardings``: a matching tree of shardings, or None for the default device.
    """
    arrays = jax.device_put(values, shardings) if shardings is not None else jax.device_put(values)
    state = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(state, arrays)
    return nnx.merge(graphdef, state)


def init_model(config: ModelConfig | str, *, seed: int = 0, mesh: Any = None, rules: Any = None,
               memory_kind: str | None = None) -> TransformerLM:
    """A freshly initialised model from a config or a preset name.

    Values are drawn on the host (``host_values``) and put straight onto
    ``mesh`` with the model's own partition specs (mapped by ``rules``, the
    model's defaults when None), in ``memory_kind`` (the device's default when
    None); without a mesh they go to the default device. No XLA program is
    compiled: a jitted initialiser of even the tiny model takes seconds to
    compile on a CPU, and an eager one compiles a program per parameter shape.

    Args:
        config: a ``ModelConfig`` or a preset name (``tiny``, ``small``, ``base``, ``large``).
        seed: the seed of every leaf's generator.
        mesh: where to place the model; None for the default device.
        rules: logical axis rules for ``mesh``.
        memory_kind: ``device`` or ``pinned_host``.

    Returns:
        The model, every leaf on its target sharding.
    """
    if isinstance(config, str):
        config = get_model_config(config)
    graphdef, abstract = _abstract_lm(config)
    return materialize(graphdef, abstract, host_values(abstract, seed),
                       _shardings(abstract, mesh, rules, memory_kind))


def _shardings(abstract: Any, mesh: Any, rules: Any, memory_kind: str | None) -> Any:
    if mesh is None:
        return None
    from rlcluster_lab.placement import default_memory_kind, target_shardings

    return target_shardings(abstract, mesh, rules if rules is not None else DEFAULT_LOGICAL_AXIS_RULES,
                            memory_kind or default_memory_kind(mesh), role="model")


# ---------------------------------------------------------------------------
# LoRA

class LoRALinear(nnx.Module):
    """A bias-free linear layer with a rank-``r`` adapter beside its kernel.

    The kernel stays at the same path as in the plain model (``.../q/kernel``),
    with ``lora_a``/``lora_b`` next to it, so the frozen part of a LoRA model
    has exactly the tree of its base model: a reference model and a LoRA
    actor can then be compared and updated leaf by leaf (P2, P4, P14).
    Output: ``x @ kernel + (x @ a @ b) * scale``.
    """

    def __init__(self, base: nnx.Linear, a: Any, b: Any, *, scale: float) -> None:
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.dtype = base.dtype
        self.kernel = base.kernel
        in_axis, out_axis = base.kernel.get_metadata()["out_sharding"]
        self.lora_a = nnx.LoRAParam(a, out_sharding=(in_axis, None), eager_sharding=False)
        self.lora_b = nnx.LoRAParam(b, out_sharding=(None, out_axis), eager_sharding=False)
        self.scale = float(scale)

    def __call__(self, x: jax.Array) -> jax.Array:
        k, a, b = self.kernel[...], self.lora_a[...], self.lora_b[...]
        return x @ k + ((x @ a) @ b) * jnp.asarray(self.scale, x.dtype)


_LORA_TARGETS: dict[str, tuple[str, ...]] = {"attn": ("q", "k", "v", "o"),
                                             "mlp": ("gate", "up", "down")}


def with_lora(base: TransformerLM, rank: int, *, seed: int = 1, alpha: float | None = None,
              copy_base: bool = False) -> TransformerLM:
    """A new model whose 7 projections per layer are wrapped in rank-``rank`` LoRA.

    The base weights are the same arrays as ``base``'s (``copy_base=False``) or
    fresh copies (``copy_base=True``); Variable objects are never shared.
    ``lora_b`` starts at zero so the result computes exactly what ``base`` does.
    The adapter term is scaled by ``alpha / rank``; ``alpha`` defaults to
    ``rank``, i.e. a scale of 1. The adapters are drawn on the host and put
    where the kernel they adapt lives: its mesh, with the kernel's input axis
    sharding ``lora_a`` and its output axis ``lora_b``, in its memory kind.

    Args:
        base: a ``TransformerLM`` without adapters.
        rank: the adapters' rank.
        seed: the seed of the adapters' generators.
        alpha: the adapter scale numerator.
        copy_base: give the result base weights of its own.

    Returns:
        The LoRA model.

    Raises:
        ValueError: for a rank below 1 or a base that already has adapters.
    """
    if rank <= 0:
        raise ValueError(f"LoRA rank must be positive, got {rank}")
    if is_lora(base):
        raise ValueError("model already has LoRA adapters")
    scale = (rank if alpha is None else alpha) / rank
    graphdef, state = nnx.split(base)
    # Mapping over the state rebuilds every Variable (merge alone would reuse
    # base's Variable objects); the leaves stay the same arrays unless a copy
    # was asked for (a copy in place, on each leaf's own sharding).
    if copy_base:
        state = jax.tree.map(lambda x: x, state)
        leaves = jax.tree.leaves(state)
        copies = jax.device_put(leaves, [x.sharding for x in leaves], may_alias=False)
        state = jax.tree.unflatten(jax.tree.structure(state), copies)
    else:
        state = jax.tree.map(lambda x: x, state)
    model = nnx.merge(graphdef, state)
    made: list[tuple[Any, Any]] = []  # (host value, sharding) of every adapter, in order

    def adapters(path: str, a: jax.ShapeDtypeStruct, b: jax.ShapeDtypeStruct) -> tuple[Any, Any]:
        host_a = _initial(tuple(path.split("/")) + ("lora_a",), a.shape, np.dtype(a.dtype), seed)
        host_b = np.zeros(b.shape, b.dtype)
        made.append((host_a, a.sharding))
        made.append((host_b, b.sharding))
        return a, b

    wrapped, layers = _wrap_lora(model, rank, scale, adapters)
    # Every adapter crosses from the host in one call, onto its kernel's devices.
    arrays = iter(jax.device_put([h for h, _ in made], [sh for _, sh in made]))
    for layer in layers:
        layer.lora_a.set_value(next(arrays))
        layer.lora_b.set_value(next(arrays))
    return wrapped


def _wrap_lora(model: TransformerLM, rank: int, scale: float, adapters: Any
               ) -> tuple[TransformerLM, list[LoRALinear]]:
    """Wrap every target projection in a ``LoRALinear``; ``adapters(path, a, b)`` gives the
    adapter values from their abstract shapes (sharding attached where the kernel has one).
    Returns the model and its new layers in the order ``adapters`` was called."""
    layers: list[LoRALinear] = []
    with nnx.use_eager_sharding(False):
        for i, block in enumerate(model.blocks):
            for part, names in _LORA_TARGETS.items():
                sub = getattr(block, part)
                for name in names:
                    lin: nnx.Linear = getattr(sub, name)
                    kernel = lin.kernel.get_value()
                    a_sh, b_sh = _adapter_shardings(kernel)
                    a = jax.ShapeDtypeStruct((lin.in_features, rank), kernel.dtype, sharding=a_sh)
                    b = jax.ShapeDtypeStruct((rank, lin.out_features), kernel.dtype, sharding=b_sh)
                    va, vb = adapters(f"blocks/{i}/{part}/{name}", a, b)
                    layers.append(LoRALinear(lin, va, vb, scale=scale))
                    setattr(sub, name, layers[-1])
    return model, layers


def _adapter_shardings(kernel: Any) -> tuple[Any, Any]:
    """Where the adapters of ``kernel`` go: lora_a split like its rows, lora_b like its columns."""
    sharding = getattr(kernel, "sharding", None)
    if sharding is None:
        return None, None
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
        return (NamedSharding(sharding.mesh, PartitionSpec(spec[0], None), memory_kind=sharding.memory_kind),
                NamedSharding(sharding.mesh, PartitionSpec(None, spec[1]), memory_kind=sharding.memory_kind))
    return sharding, sharding


def is_lora(model: nnx.Module) -> bool:
    """True iff ``model`` holds any ``nnx.LoRAParam``."""
    return any(isinstance(v, nnx.LoRAParam) for _, v in nnx.iter_graph(model))


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


def forward_logps(model: TransformerLM, prompt_tokens: jax.Array, completion_tokens: jax.Array,
                  pad_id: int, temperature: float | jax.Array = 1.0) -> jax.Array:
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
    logits = mask_pad_logits(logits[:, p - 1: p + c - 1], pad_id) / _effective_temperature(temperature)
    logps = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logps, completion_tokens[..., None], axis=-1)[..., 0]
    return jnp.where(completion_tokens != pad_id, picked, 0.0)


@partial(jax.jit, static_argnames=("graphdef", "pad_id"))
def _logps_jit(graphdef, state, prompt_tokens, completion_tokens, pad_id, temperature):
    return forward_logps(nnx.merge(graphdef, state), prompt_tokens, completion_tokens,
                         pad_id, temperature)


def logps_from_state(graphdef: nnx.GraphDef, state: nnx.State, prompt_tokens: jax.Array,
                     completion_tokens: jax.Array, pad_id: int,
                     temperature: float = 1.0) -> jax.Array:
    """Jitted ``forward_logps`` on a split model; follows the state's sharding."""
    return _logps_jit(graphdef, state, jnp.asarray(prompt_tokens, jnp.int32),
                      jnp.asarray(completion_tokens, jnp.int32), int(pad_id),
                      jnp.asarray(temperature, jnp.float32))


__all__ = [
    "MESH_AXES", "DEFAULT_LOGICAL_AXIS_RULES", "ModelConfig", "MODEL_SIZES", "get_model_config",
    "KVCache", "init_cache", "TransformerLM", "LoRALinear", "init_model", "with_lora", "is_lora",
    "abstract_model", "host_values", "materialize",
    "forward_logps", "logps_from_state", "mask_pad_logits", "apply_rope",
]
