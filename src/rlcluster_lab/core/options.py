"""The lab's vocabulary: every knob, its allowed values, and the checks on knobs alone.

Nothing here imports JAX, so the CLI can parse its flags, and refuse a
combination that cannot work, before the JAX backend starts (its device
count must be set first) and before anything is allocated or compiled. The
``Scenario`` (what the CLI, the widgets, the notebooks and the tests build),
the rollout settings and the planner's request all take their choices from
the tuples below, so one knob is spelled one way everywhere.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any

from rlcluster_lab.core import model_config
from rlcluster_lab.core.errors import ConfigError

# Defined with the model's dimensions (JAX-free too); every knob's values are also read from here.
from rlcluster_lab.core.model_config import DTYPES as DTYPES
from rlcluster_lab.core.model_config import dtype_name

LAYOUTS: tuple[str, ...] = ("colocated", "reshaped", "split")
ENGINES: tuple[str, ...] = ("vanilla", "vllm", "sglang_jax")
# Every engine but the built-in sampler stands in for an external server's placement.
ENGINE_LABELS: dict[str, str] = {e: e if e == "vanilla" else f"{e} (JAX placement stand-in)" for e in ENGINES}
ANCHOR_MODES: tuple[str, ...] = ("full", "trainable")
RESHARD_STRATEGIES: tuple[str, ...] = ("xla", "minimal")
# The names of the lab's preset sizes and of the projections LoRA adapts, from the model's own
# tables (``core.model_config``: JAX-free too), so a size or a projection is spelled once.
MODEL_SIZES: tuple[str, ...] = tuple(model_config.MODEL_SIZES)
LORA_TARGETS: tuple[str, ...] = tuple(name for names in model_config.LORA_PROJECTIONS.values() for name in names)

# The smallest sampling temperature above 0 (greedy): log-probs come from logits / temperature
# in float32, and below this floor the quotient overflows (or, below float32's smallest normal
# number, the temperature itself flushes to 0): every log-prob is NaN. At the floor a logit
# would have to exceed 1e32 to overflow.
MIN_TEMPERATURE = 1e-6


def temperature_rule(allow_zero: bool = True) -> str:
    """What a temperature must be, as the refusals say it."""
    low = ">= 0 (0 = greedy)" if allow_zero else "> 0"
    return (
        f"must be {low}, at least {MIN_TEMPERATURE:g} when not 0 (below that, logits / temperature overflow "
        "float32 and every log-prob is NaN), and finite"
    )


def as_int(value: Any, name: str, *, low: int | None = None, knobs: Sequence[str] = ()) -> int:
    """``value`` as a plain ``int``: an int or a NumPy integer (converted, so a report of it is
    still JSON); a bool, a float or anything else is refused.

    Raises:
        ConfigError: not a whole number, or below ``low``; the message names ``name``.
    """
    bound = f" >= {low}" if low is not None else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an int{bound}, got {type(value).__name__} {value!r:.40}", knobs=knobs)
    if low is not None and value < low:
        raise ConfigError(f"{name} must be an int{bound}, got {value}", knobs=knobs)
    return int(value)


def as_float(value: Any, name: str, *, knobs: Sequence[str] = ()) -> float:
    """``value`` as a plain ``float``: any real number but a bool (NumPy's included).

    Raises:
        ConfigError: not a real number; the message names ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number, got {type(value).__name__} {value!r:.40}", knobs=knobs)
    return float(value)


def as_bool(value: Any, name: str, *, knobs: Sequence[str] = ()) -> bool:
    """``value`` as a plain ``bool``: True, False or a NumPy bool; ``"no"`` or 1 is refused, not read as true.

    Raises:
        ConfigError: anything else; the message names ``name``.
    """
    if isinstance(value, bool) or (getattr(getattr(value, "dtype", None), "kind", None) == "b" and not value.shape):
        return bool(value)
    raise ConfigError(f"{name} must be True or False, got {type(value).__name__} {value!r:.40}", knobs=knobs)


def check_tensor_parallel_size(size: Any) -> int | None:
    """The vllm engine's tensor-parallel size is None (all its devices) or an int >= 1; returns it
    as a plain int.

    Checked whichever engine is chosen, so a bad value is not silently ignored;
    whether it divides the rollout devices is checked where the mesh is known.

    Raises:
        ConfigError: a value below 1 or not an int.
    """
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        raise ConfigError(
            f"rollout_vllm_tensor_parallel_size (--vllm-tp) must be an int >= 1 that divides the rollout "
            f"devices, or None for all of them; got {size!r}"
        )
    return int(size)


def check_sync_chunk_bytes(value: Any) -> int | None:
    """``sync_chunk_bytes`` is None (a sync hands everything over in one piece) or an int >= 1;
    returns it as a plain int.

    Raises:
        ConfigError: a value below 1 or not an int.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(
            f"sync_chunk_bytes (--sync-chunk-bytes) must be a whole number of bytes >= 1 (a sync then hands "
            f"its leaves over in chunks of at most that many bytes), or None for one piece; got {value!r}",
            knobs=("sync_chunk_bytes",),
        )
    return int(value)


DEFAULT_SIMULATED_DEVICES = 8

# The most simulated CPU devices the lab asks for. Each one costs the CPU client about
# 100 KB and start-up time (2048 devices: ~12 s and ~380 MB before any array exists), and
# no layout the lab compares needs more; 200,000 would grow until the machine runs out.
MAX_SIMULATED_DEVICES = 4096


def check_device_count(count: object, name: str = "count") -> int:
    """Refuse a simulated device count that is not an int between 1 and ``MAX_SIMULATED_DEVICES``;
    returns it as a plain int (a NumPy integer is taken).

    Checked before ``jax_num_cpu_devices`` is set: a huge count would make the CPU
    client grow without bound, or fail inside jaxlib's bindings.

    Raises:
        TypeError: ``count`` is not an int.
        ConfigError: ``count`` is out of range; the message names ``name``.
    """
    if isinstance(count, bool) or not isinstance(count, numbers.Integral):
        raise TypeError(f"{name} must be an int (a number of simulated CPU devices), got {type(count).__name__}")
    if not 1 <= count <= MAX_SIMULATED_DEVICES:
        raise ConfigError(
            f"{name} must be between 1 and {MAX_SIMULATED_DEVICES} simulated CPU devices, got {int(count):,} "
            f"(the lab's layouts are drawn for {DEFAULT_SIMULATED_DEVICES})"
        )
    return int(count)


def default_shape(count: int) -> tuple[int, int]:
    """The lab's standard (fsdp, tp) shape for ``count`` devices: (2,4) for 8, (2,2) for 4."""
    for tp in (4, 2):
        if count % tp == 0 and count // tp >= 2:
            return (count // tp, tp)
    if count % 2 == 0:
        return (1, count) if count <= 2 else (count // 2, 2)
    return (count, 1)


def layout_problem(layout: str, count: int) -> str | None:
    """Why ``count`` devices cannot form ``layout`` (None when they can)."""
    if layout not in LAYOUTS:
        return f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}"
    if count < 1:
        return "a layout needs at least one device"
    if layout == "reshaped" and default_shape(count) == (count, 1):
        return (
            f"the reshaped layout needs a device count whose standard shape is not ({count}, 1); "
            f"with {count} device(s) there is no second arrangement. Use 'colocated', or run with more devices."
        )
    if layout == "split" and (count < 2 or count % 2):
        return (
            f"the split layout needs an even number of devices (at least 2); this process has {count}. "
            "Use 'colocated' here, or run with more devices."
        )
    return None


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How the rollout engine samples.

    ``data_type`` casts the vanilla engine's second copy (P3) when set: a name
    (``"bfloat16"``) or a JAX/NumPy dtype, kept as given, as in the reference
    (``dtype_name`` reads it where it is used). The ``rollout_vllm_*`` and
    ``rollout_sglang_jax_*`` fields are read only by the matching engine.
    """

    max_tokens_to_generate: int = 16
    temperature: float = 1.0
    kv_cache_size: int = 128
    data_type: Any = None
    seed: int = 0
    # vllm-style engine: a model version is required (P6); tp size picks its own mesh (P7).
    rollout_vllm_model_version: str | None = None
    rollout_vllm_tensor_parallel_size: int | None = None
    # sglang_jax-style engine: LoRA actors need static-LoRA settings (P6).
    rollout_sglang_jax_enable_static_lora: bool = False
    rollout_sglang_jax_lora_target_modules: tuple[str, ...] = ()
    rollout_sglang_jax_max_lora_rank: int | None = None
    rollout_sglang_jax_lora_scaling: float | None = None

    def __post_init__(self) -> None:
        # A float count fails deep inside the compiled sampler; a NaN or infinite temperature
        # samples garbage and turns the trained actor to NaN: refuse both here. NumPy numbers
        # become plain ones, so the config (and every report of it) stays JSON.
        for name in ("max_tokens_to_generate", "kv_cache_size", "seed"):
            object.__setattr__(self, name, as_int(getattr(self, name), name))
        if self.max_tokens_to_generate < 1:
            raise ConfigError(
                f"max_tokens_to_generate (Scenario.max_tokens, --max-tokens) must be >= 1, got "
                f"{self.max_tokens_to_generate}"
            )
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
            raise ConfigError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
        if not math.isfinite(temperature) or temperature < 0 or 0 < temperature < MIN_TEMPERATURE:
            raise ConfigError(f"temperature {temperature_rule()}, got {temperature}")
        object.__setattr__(self, "temperature", float(temperature))
        if self.kv_cache_size < 2:
            raise ConfigError(f"kv_cache_size must be >= 2, got {self.kv_cache_size}")
        tp = check_tensor_parallel_size(self.rollout_vllm_tensor_parallel_size)
        object.__setattr__(self, "rollout_vllm_tensor_parallel_size", tp)
        if self.rollout_vllm_model_version is not None and not isinstance(self.rollout_vllm_model_version, str):
            raise ConfigError(
                f"rollout_vllm_model_version must be a str or None, got {self.rollout_vllm_model_version!r:.40}"
            )
        # Read only by their engine, but checked (and NumPy numbers converted) whichever is chosen.
        for name, convert in (
            ("rollout_sglang_jax_enable_static_lora", as_bool),
            ("rollout_sglang_jax_max_lora_rank", as_int),
            ("rollout_sglang_jax_lora_scaling", as_float),
        ):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, convert(getattr(self, name), name))
        if self.data_type is not None:
            dtype_name(self.data_type, "data_type")  # refused here if unknown; kept as given


@dataclasses.dataclass(frozen=True)
class Scenario:
    """The knobs of one placement experiment.

    With ``lora`` the actor is a LoRA model built over the reference model's
    own frozen buffers (the usual way to share a base model, so P2's sharing
    is real); ``lora_separate_base`` builds it over a copy instead, which P4
    flags as an avoidable copy. Without LoRA the actor is a full copy of the
    reference, as it must be to train. ``reshard`` picks how layouts change
    (see ``ClusterConfig.reshard``); ``sync_chunk_bytes`` how a sync hands its
    weights over (see ``ClusterConfig.sync_chunk_bytes``).
    """

    layout: str = "colocated"
    lora: bool = False
    lora_rank: int = 4
    lora_separate_base: bool = False
    engine: str = "vanilla"
    offload: bool = False
    rollout_dtype: str | None = None
    model_size: str = "tiny"
    with_reward: bool = False
    with_critic: bool = False
    sglang_static_lora: bool = True
    anchor: str = "full"
    reshard: str = "xla"
    sync_chunk_bytes: int | None = None
    max_tokens: int = 16
    temperature: float = 1.0
    kv_cache_size: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        for knob, field, allowed in (
            ("layout", "layout", LAYOUTS),
            ("engine", "engine", ENGINES),
            ("model size", "model_size", MODEL_SIZES),
            ("anchor", "anchor", ANCHOR_MODES),
            ("reshard strategy", "reshard", RESHARD_STRATEGIES),
        ):
            value = getattr(self, field)
            if value not in allowed:
                raise ConfigError(f"unknown {knob} {value!r}; choose one of {', '.join(allowed)}", knobs=(field,))
        # NumPy numbers become plain ones (a report of the scenario stays JSON); anything else is
        # refused naming the knob, before the rollout config would name its own field instead.
        for name in ("lora", "lora_separate_base", "offload", "with_reward", "with_critic", "sglang_static_lora"):
            object.__setattr__(self, name, as_bool(getattr(self, name), name, knobs=(name,)))
        for name in ("lora_rank", "max_tokens", "kv_cache_size", "seed"):
            object.__setattr__(self, name, as_int(getattr(self, name), name, knobs=(name,)))
        object.__setattr__(self, "temperature", as_float(self.temperature, "temperature", knobs=("temperature",)))
        if self.rollout_dtype is not None:
            object.__setattr__(self, "rollout_dtype", dtype_name(self.rollout_dtype, "rollout_dtype"))
        object.__setattr__(self, "sync_chunk_bytes", check_sync_chunk_bytes(self.sync_chunk_bytes))
        if self.lora_separate_base and not self.lora:
            raise ConfigError(
                "lora_separate_base (--lora-separate-base) needs lora (--lora): the separate base is the LoRA "
                "actor's frozen part",
                knobs=("lora_separate_base", "lora"),
            )
        # The rank is checked with or without LoRA, so a forgotten --lora does not hide a bad value;
        # its upper bound comes from the model's dimensions (check()).
        if self.lora_rank < 1:
            raise ConfigError(f"lora_rank (--lora-rank) must be at least 1, got {self.lora_rank}", knobs=("lora_rank",))
        self.rollout_config()  # its own checks (token count, cache size, temperature), when the knobs are made
        # A prompt needs at least one cache slot beside the completion.
        if self.max_tokens >= self.kv_cache_size:
            raise ConfigError(
                f"max_tokens (--max-tokens) must be below kv_cache_size ({self.kv_cache_size}) so that a "
                f"prompt fits in the KV cache beside the completion, got {self.max_tokens}",
                knobs=("max_tokens",),
            )

    def rollout_config(self) -> RolloutConfig:
        static = self.lora and self.engine == "sglang_jax" and self.sglang_static_lora
        return RolloutConfig(
            max_tokens_to_generate=self.max_tokens,
            temperature=self.temperature,
            kv_cache_size=self.kv_cache_size,
            data_type=self.rollout_dtype,
            seed=self.seed,
            rollout_vllm_model_version=f"rlcluster-lab/{self.model_size}" if self.engine == "vllm" else None,
            rollout_sglang_jax_enable_static_lora=static,
            rollout_sglang_jax_lora_target_modules=LORA_TARGETS if static else (),
            rollout_sglang_jax_max_lora_rank=self.lora_rank if static else None,
            rollout_sglang_jax_lora_scaling=1.0 if static else None,
        )
