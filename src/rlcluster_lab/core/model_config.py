"""A model's dimensions and numerics (``ModelConfig``) and the lab's preset sizes, JAX-free.

The CLI and the planner read dimensions (parameter counts, the largest useful LoRA
rank) to refuse a configuration before JAX is imported; the model itself
(``model.transformer``) is built from the same config.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from rlcluster_lab.core.errors import ConfigError

# The parameter dtypes the lab documents (docs/guarantees.md), and the rollout's: the model's matmuls, its
# norms' float32 statistics and the checkpoint format are written for these three.
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


def dtype_name(value: Any, what: str = "dtype") -> str:
    """A dtype given as a name, a NumPy dtype or a JAX/NumPy scalar type, as its name; anything but
    one of ``DTYPES`` is a ``ConfigError`` naming ``what``."""
    if isinstance(value, str):
        name = value
    else:
        import numpy as np

        try:
            name = np.dtype(value).name
        except (TypeError, ValueError):
            name = str(getattr(value, "__name__", value))
    if name not in DTYPES:
        raise ConfigError(
            f"{what}: unsupported dtype {value!r}; use one of {', '.join(DTYPES)}, as a name or as a JAX/NumPy "
            f"dtype (e.g. 'bfloat16' or jnp.bfloat16)"
        )
    return name


# The projections ``with_lora`` adapts, by the part of a transformer block that holds them.
LORA_PROJECTIONS: dict[str, tuple[str, ...]] = {"attn": ("q", "k", "v", "o"), "mlp": ("gate", "up", "down")}

# The layer stack's key: every leaf under it has a leading layer axis (one scanned ``Block``).
LAYER_STACK = "blocks"


def layer_stack_at(path: tuple[Any, ...]) -> int | None:
    """Where ``LAYER_STACK`` stands in a leaf's path (a leaf under it is stacked by layer), or None."""
    return next((i for i, key in enumerate(path[:-1]) if str(key) == LAYER_STACK), None)


# Bounds checked before any structure is built: building, planning or reading a model grows with
# its layer count, and every dimension is an int32 array extent and a term of int64 byte sums.
MAX_LAYERS = 1024
MAX_DIM = 2**31 - 1
# A thousand times the largest published models, and far enough below 2^63 that the planner's
# byte sums (bytes x copies x devices) stay exact in int64.
MAX_PARAMS = 2**52

# Ranges that keep the float32 forward finite: rms_eps below float32's smallest normal flushes to
# 0 (an all-zero row divides by zero); a rope_base at or below 1, or beyond float32, gives
# frequencies of 1 and above or infinite ones.
NUMERIC_RANGES: dict[str, tuple[float, float]] = {"rms_eps": (1e-30, 1.0), "rope_base": (1.0, 1e30)}
# LoRA's scale (alpha / rank) multiplies every adapter's output: 1e4 is far above any use.
MAX_LORA_SCALE = 1e4


def numeric_problem(field: str, value: Any) -> str | None:
    """Why ``value`` cannot be ``ModelConfig.<field>`` (rms_eps, rope_base), or None when it can."""
    low, high = NUMERIC_RANGES[field]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"must be a number, got {type(value).__name__} {value!r:.40}"
    value = float(value)
    low_ok = value > low if field == "rope_base" else value >= low
    if not math.isfinite(value) or not low_ok or value > high:
        lower = f"above {low:g}" if field == "rope_base" else f"at least {low:g}"
        return f"must be finite, {lower} and at most {high:g} (so the forward stays finite), got {value!r}"
    return None


def check_lora_scale(scale: Any, name: str = "lora_scale") -> float:
    """A LoRA scale (alpha / rank) as a float, finite with ``|scale| <= MAX_LORA_SCALE``; anything else
    is a ``ValueError`` naming ``name`` and the range."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(float(scale)):
        raise ValueError(f"{name} must be a finite number, got {scale!r:.40}")
    if abs(float(scale)) > MAX_LORA_SCALE:
        raise ValueError(
            f"{name} is {float(scale):g}; at most {MAX_LORA_SCALE:g} in magnitude keeps the adapters' output "
            "finite (the scale is alpha / rank: lower alpha)"
        )
    return float(scale)


@dataclasses.dataclass(frozen=True)
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
        for field in INT_FIELDS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{field} must be a positive int, got {value!r:.40}")
            if value > MAX_DIM:
                raise ValueError(f"ModelConfig.{field} is {value:,}; a dimension is at most {MAX_DIM:,} (2**31 - 1)")
        if self.num_layers > MAX_LAYERS:
            raise ValueError(
                f"ModelConfig.num_layers is {self.num_layers:,}; at most {MAX_LAYERS:,} layers are supported "
                "(building, planning and loading a model take time in proportion to its layers)"
            )
        if self.num_params > MAX_PARAMS:
            raise ValueError(
                f"ModelConfig describes {self.num_params:,} parameters; at most {MAX_PARAMS:,} are supported: "
                "lower the dimensions"
            )
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        for field in NUMERIC_RANGES:
            problem = numeric_problem(field, getattr(self, field))
            if problem:
                raise ValueError(f"ModelConfig.{field} {problem}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"ModelConfig.tie_embeddings must be True or False, got {self.tie_embeddings!r:.40}")
        # Held as its name: the config is written to a checkpoint's config.json.
        object.__setattr__(self, "param_dtype", dtype_name(self.param_dtype, "ModelConfig.param_dtype"))

    @property
    def dtype(self) -> Any:
        """The parameters' dtype as a JAX dtype (imports JAX)."""
        import jax.numpy as jnp

        return jnp.dtype(self.param_dtype)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_cache_bytes(self, rows: int, slots: int, kv_heads: int | None = None) -> int:
        """Bytes of a KV cache of ``slots`` per row: keys and values of every layer in the parameters'
        dtype, over ``kv_heads`` heads (all of them by default)."""
        heads = self.num_kv_heads if kv_heads is None else int(kv_heads)
        return 2 * self.num_layers * int(rows) * int(slots) * heads * self.head_dim * self.dtype.itemsize

    @property
    def num_params(self) -> int:
        """Parameter count of the model without adapters."""
        e = self.embed_dim
        per_layer = 2 * e + sum(i * o for i, o in self.lora_shapes().values())  # two norm scales, every projection
        head = 0 if self.tie_embeddings else self.vocab_size * e
        return self.vocab_size * e + self.num_layers * per_layer + e + head

    def lora_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection ``with_lora`` adapts, in every layer."""
        e, m, q, kv = self.embed_dim, self.mlp_dim, self.q_dim, self.kv_dim
        return {"q": (e, q), "k": (e, kv), "v": (e, kv), "o": (q, e), "gate": (e, m), "up": (e, m), "down": (m, e)}

    @property
    def max_lora_rank(self) -> int:
        """The largest LoRA rank that still adds capacity to some adapter (an adapter on an (in, out)
        kernel has rank at most min(in, out))."""
        return max(min(i, o) for i, o in self.lora_shapes().values())

    def lora_params(self, rank: int) -> int:
        """Parameter count of the rank-``rank`` adapters added by ``with_lora``."""
        if rank <= 0:
            raise ValueError(f"LoRA rank must be positive, got {rank}")
        # An adapter on an (in, out) kernel holds rank * (in + out) numbers.
        return self.num_layers * rank * sum(i + o for i, o in self.lora_shapes().values())


# A ModelConfig's dimensions, its int fields in order: positive ints (in ``__post_init__`` and config.json).
INT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.type == "int")

# Sharded dims are all multiples of 8 (264 = 8 * 33) so each shards over 8, 4 or 2.
# name: (vocab_size, embed_dim, num_layers, num_heads, num_kv_heads, head_dim, mlp_dim, max_seq_len)
_PRESETS: dict[str, tuple[int, ...]] = {
    "tiny": (264, 64, 2, 4, 2, 16, 128, 128),
    "small": (264, 128, 6, 8, 4, 16, 512, 256),
    "base": (264, 256, 10, 8, 4, 32, 1024, 512),
    "large": (264, 512, 12, 16, 8, 32, 2048, 1024),
}

# The lab's preset sizes by name, smallest first (``core.options.MODEL_SIZES`` is their names).
MODEL_SIZES: dict[str, ModelConfig] = {name: ModelConfig(name, *dims) for name, dims in _PRESETS.items()}


def get_model_config(name: str) -> ModelConfig:
    """Look up a preset size by name."""
    try:
        return MODEL_SIZES[name]
    except KeyError:
        raise ValueError(f"Unknown model size {name!r}; known sizes: {', '.join(MODEL_SIZES)}") from None
