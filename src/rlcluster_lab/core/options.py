"""The ``Scenario``, the rollout's settings, and the checks on knobs alone: JAX-free, so the CLI
refuses a combination that cannot work before the JAX backend starts."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from rlcluster_lab.core.errors import ConfigError

# The knobs' vocabulary and checks (``core.knobs``), named here too, where the rest of the lab reads them.
from rlcluster_lab.core.knobs import ENGINES as ENGINES
from rlcluster_lab.core.knobs import KNOBS, LAYOUTS, SCENARIO_KNOBS, as_bool, as_float, as_int, knob_dataclass
from rlcluster_lab.core.knobs import MODEL_SIZES as MODEL_SIZES
from rlcluster_lab.core.knobs import RESHARD_STRATEGIES as RESHARD_STRATEGIES
from rlcluster_lab.core.model_config import DTYPES as DTYPES
from rlcluster_lab.core.model_config import LORA_PROJECTIONS, dtype_name

# The projections LoRA adapts, from the model's own table (``core.model_config``: JAX-free too).
LORA_TARGETS: tuple[str, ...] = tuple(name for names in LORA_PROJECTIONS.values() for name in names)

# The smallest sampling temperature above 0 (greedy): below it logits / temperature overflows in
# float32 (or the temperature flushes to 0) and every log-prob is NaN.
MIN_TEMPERATURE = 1e-6


def temperature_rule(allow_zero: bool = True) -> str:
    """What a temperature must be, as the refusals say it."""
    low = ">= 0 (0 = greedy)" if allow_zero else "> 0"
    return (
        f"must be {low}, at least {MIN_TEMPERATURE:g} when not 0 (below that, logits / temperature overflow "
        "float32 and every log-prob is NaN), and finite"
    )


def check_tensor_parallel_size(size: Any) -> int | None:
    """The vllm engine's tensor-parallel size, None (all its devices) or an int >= 1 (else a
    ``ConfigError``), whichever engine is chosen; whether it divides the rollout devices is checked
    where the mesh is known."""
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        raise ConfigError(
            f"rollout_vllm_tensor_parallel_size (--vllm-tp) must be an int >= 1 that divides the rollout "
            f"devices, or None for all of them; got {size!r}",
            knobs=("rollout_vllm_tensor_parallel_size",),
        )
    return int(size)


DEFAULT_SIMULATED_DEVICES: int = KNOBS["devices"].default

# The most simulated CPU devices the lab asks for (each costs memory and start-up): more than any layout needs.
MAX_SIMULATED_DEVICES = 4096


def check_device_count(count: object, name: str = "count") -> int:
    """A simulated device count as a plain int between 1 and ``MAX_SIMULATED_DEVICES`` (a ``TypeError``
    for a non-int, a ``ConfigError`` naming ``name`` out of range), checked before
    ``jax_num_cpu_devices`` is set: a huge count grows the CPU client without bound."""
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
    if layout == "reshaped" and count > 1 and default_shape(count) == (count, 1):
        # One device is the exception: its second mesh names the axes the other way round.
        return (
            f"the reshaped layout needs one device or a device count whose standard shape is not ({count}, 1); "
            f"with {count} devices there is no second arrangement. Use 'colocated', or run with more devices."
        )
    if layout == "split" and (count < 2 or count % 2):
        return (
            f"the split layout needs an even number of devices (at least 2), not {count}. "
            "Use 'colocated' here, or run with more devices."
        )
    return None


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How the rollout engine samples. ``data_type`` casts the vanilla engine's second copy (P3), kept
    as given (a name or a dtype); the ``rollout_vllm_*`` and ``rollout_sglang_jax_*`` fields are read
    only by the matching engine."""

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
        # A float count fails deep in the compiled sampler, a NaN temperature turns the actor to
        # NaN: refused here. NumPy numbers become plain ones, so every report stays JSON.
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


@knob_dataclass(SCENARIO_KNOBS)
class Scenario:
    """The knobs of one placement experiment: a frozen dataclass whose fields, defaults and checks are
    the knobs' table's (``core.knobs.SCENARIO_KNOBS``).

    With ``lora`` the actor is a LoRA model over the reference's own frozen buffers (P2's sharing is
    real); ``lora_separate_base`` builds it over a copy, which P4 flags. Without LoRA the actor is a
    full copy of the reference. The rank's upper bound comes from the model's dimensions
    (``rules.validation.check_scenario``).
    """

    def __post_init__(self) -> None:
        # Runs after each knob's own check.
        if self.lora_separate_base and not self.lora:
            raise ConfigError(
                "lora_separate_base (--lora-separate-base) needs lora (--lora): the separate base is the LoRA "
                "actor's frozen part",
                knobs=("lora_separate_base", "lora"),
            )
        self.rollout_config()  # its own checks (token count, cache size, temperature), when the knobs are made
        # A prompt needs at least one cache slot beside the completion.
        if self.max_tokens >= self.kv_cache_size:
            raise ConfigError(
                f"max_tokens (--max-tokens) must be below kv_cache_size (--kv-cache-size), {self.kv_cache_size}, so "
                f"that a prompt fits in the KV cache beside the completion, got {self.max_tokens}",
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
