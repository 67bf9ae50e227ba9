"""A model's dimensions and numerics (``ModelConfig``) and the lab's preset sizes, JAX-free.

The CLI and the planner read dimensions (parameter counts, the largest useful LoRA
rank) to refuse a configuration before JAX is imported; the model itself
(``model.transformer``) is built from the same config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Names taken as they are, without importing JAX; anything else is resolved through jnp.dtype.
_DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str) and dtype in _DTYPE_NAMES:
        return dtype
    import jax.numpy as jnp

    return jnp.dtype(dtype).name


# The projections ``with_lora`` adapts, by the part of a transformer block that holds them.
LORA_PROJECTIONS: dict[str, tuple[str, ...]] = {"attn": ("q", "k", "v", "o"), "mlp": ("gate", "up", "down")}

# The dimensions of a ModelConfig: positive ints (checked here, and in a checkpoint's config.json).
INT_FIELDS = (
    "vocab_size",
    "embed_dim",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "mlp_dim",
    "max_seq_len",
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
        for field in INT_FIELDS:
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
            name = _dtype_name(self.param_dtype)
        except TypeError as err:
            raise ValueError(
                f"unknown param_dtype {self.param_dtype!r}; give a name ('bfloat16') or a JAX/NumPy dtype "
                "(jnp.bfloat16)"
            ) from err
        # Held as its name: the config is written to a checkpoint's config.json.
        object.__setattr__(self, "param_dtype", name)

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

    @property
    def num_params(self) -> int:
        """Parameter count of the model without adapters."""
        e, m = self.embed_dim, self.mlp_dim
        per_layer = (
            2 * e  # two norm scales
            + e * self.q_dim
            + 2 * e * self.kv_dim
            + self.q_dim * e  # q, k, v, o
            + 3 * e * m  # gate, up, down
        )
        head = 0 if self.tie_embeddings else self.vocab_size * e
        return self.vocab_size * e + self.num_layers * per_layer + e + head

    def lora_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection ``with_lora`` adapts, in every layer."""
        e, m, q, kv = self.embed_dim, self.mlp_dim, self.q_dim, self.kv_dim
        return {"q": (e, q), "k": (e, kv), "v": (e, kv), "o": (q, e), "gate": (e, m), "up": (e, m), "down": (m, e)}

    @property
    def max_lora_rank(self) -> int:
        """The largest LoRA rank that still adds capacity to some adapter.

        An adapter's update on an (in, out) kernel has rank at most min(in, out);
        above the largest such bound every adapter is already full rank and a
        higher rank only costs memory.
        """
        return max(min(i, o) for i, o in self.lora_shapes().values())

    def lora_params(self, rank: int) -> int:
        """Parameter count of the rank-``rank`` adapters added by ``with_lora``."""
        if rank <= 0:
            raise ValueError(f"LoRA rank must be positive, got {rank}")
        # An adapter on an (in, out) kernel holds rank * (in + out) numbers.
        return self.num_layers * rank * sum(i + o for i, o in self.lora_shapes().values())


# Sharded dims are all multiples of 8 (264 = 8 * 33) so each shards over 8, 4 or 2.
_PRESETS: tuple[ModelConfig, ...] = (
    ModelConfig(
        "tiny",
        vocab_size=264,
        embed_dim=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=128,
        max_seq_len=128,
    ),
    ModelConfig(
        "small",
        vocab_size=264,
        embed_dim=128,
        num_layers=6,
        num_heads=8,
        num_kv_heads=4,
        head_dim=16,
        mlp_dim=512,
        max_seq_len=256,
    ),
    ModelConfig(
        "base",
        vocab_size=264,
        embed_dim=256,
        num_layers=10,
        num_heads=8,
        num_kv_heads=4,
        head_dim=32,
        mlp_dim=1024,
        max_seq_len=512,
    ),
    ModelConfig(
        "large",
        vocab_size=264,
        embed_dim=512,
        num_layers=12,
        num_heads=16,
        num_kv_heads=8,
        head_dim=32,
        mlp_dim=2048,
        max_seq_len=1024,
    ),
)

# The lab's preset sizes by name, smallest first: the one list of sizes (``core.options.MODEL_SIZES``
# is its names, for the CLI and the knobs).
MODEL_SIZES: dict[str, ModelConfig] = {config.name: config for config in _PRESETS}


def get_model_config(name: str) -> ModelConfig:
    """Look up a preset size by name."""
    try:
        return MODEL_SIZES[name]
    except KeyError:
        raise ValueError(f"Unknown model size {name!r}; known sizes: {', '.join(MODEL_SIZES)}") from None
