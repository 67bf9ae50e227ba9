"""P6: the checks that refuse a configuration that cannot work, before anything is allocated;
JAX-free, so the CLI runs the knob-level ones before the JAX backend starts."""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Mapping
from typing import Any

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.model_config import get_model_config
from rlcluster_lab.core.options import ENGINES as KNOWN_ENGINES
from rlcluster_lab.core.options import RolloutConfig, Scenario, layout_problem
from rlcluster_lab.core.roles import Mode
from rlcluster_lab.core.trace import Decision
from rlcluster_lab.rules.registry import Locator, rule


class CheckBranch(str, enum.Enum):
    PASS = "pass"
    ERROR = "error"


P6 = rule(
    "P6",
    "validation",
    question="config checks pass?",
    answers={CheckBranch.PASS: "pass", CheckBranch.ERROR: "error"},
    tests=(
        "tests/test_config.py::test_p6_*",
        "tests/test_cluster_rules.py::test_p6_*",
        "tests/test_cli.py",
        "tests/test_knobs.py",
        "tests/test_cli_safety.py::test_*lora_rank*",
    ),
    reference=(
        Locator("RLCluster.__init__", "Raise", every=True, what="the rollout config's checks"),
        Locator("RLCluster._init_cluster", "Raise", every=True, what="the engine's checks"),
    ),
)


@dataclasses.dataclass(frozen=True)
class P6ConfigValues:  # a per-mode rollout config or one
    per_mode: bool


@dataclasses.dataclass(frozen=True)
class P6EngineValues:  # the rollout engine accepted, by name
    engine: str


@P6.function
def p6_rollout_config(rollout_config: Any) -> tuple[Any, Decision[P6ConfigValues]]:
    """P6: a rollout config must be given, and a per-mode dict must have a TRAIN entry; returns the
    TRAIN config and the decision.

    Raises:
        ConfigError: no rollout config, one that is not a ``RolloutConfig``, or a per-mode dict without TRAIN.
    """
    if rollout_config is None:
        raise ConfigError(
            "cluster_config.rollout_config is None: the rollout engine needs one. "
            "Pass rollout_config=RolloutConfig(...) (or a dict with a Mode.TRAIN entry)."
        )
    per_mode = isinstance(rollout_config, Mapping)
    if not all(isinstance(c, RolloutConfig) for c in (rollout_config.values() if per_mode else [rollout_config])):
        raise ConfigError(
            f"rollout_config must be a RolloutConfig or a dict from Mode to RolloutConfig, got "
            f"{type(rollout_config).__name__} {rollout_config!r:.60}"
        )
    if per_mode and not rollout_config.get(Mode.TRAIN):
        raise ConfigError(
            "rollout_config is a per-mode dict without a Mode.TRAIN entry "
            f"(it has: {sorted(m.value for m in rollout_config)}); add {{Mode.TRAIN: RolloutConfig(...)}}"
        )
    train = rollout_config[Mode.TRAIN] if per_mode else rollout_config
    return train, Decision(
        "P6",
        "rollout_config is set, and a per-mode dict has a TRAIN entry",
        P6ConfigValues(per_mode),
        "ok",
        CheckBranch.PASS,
    )


@P6.function
def p6_engine_choice(
    engine: Any, is_engine_class: Callable[[Any], bool], engine_name: str
) -> tuple[str, Decision[P6EngineValues]]:
    """P6: the rollout engine is a known name (vanilla, vllm, sglang_jax), a rollout-engine subclass,
    or a ``functools.partial`` of one; returns the kind (the name, or ``custom``). An unknown name is
    a ``ConfigError``; any other value a ``NotImplementedError`` (the reference's "... not supported")."""
    if isinstance(engine, str):
        if engine not in KNOWN_ENGINES:
            raise ConfigError(
                f"unknown rollout_engine {engine!r}; use one of {', '.join(map(repr, KNOWN_ENGINES))}, "
                "or a RolloutEngine subclass (or a functools.partial of one)"
            )
        kind = engine
    elif is_engine_class(engine) or (isinstance(engine, functools.partial) and is_engine_class(engine.func)):
        kind = "custom"
    else:
        raise NotImplementedError(
            f"rollout_engine {engine!r} is not supported: use one of {', '.join(map(repr, KNOWN_ENGINES))}, "
            "a subclass of rlcluster_lab.RolloutEngine, or a functools.partial of such a class"
        )
    return kind, Decision(
        "P6",
        "rollout_engine is vanilla, vllm, sglang_jax, or a RolloutEngine subclass / partial of one",
        P6EngineValues(engine_name),
        f"ok: {kind}",
        CheckBranch.PASS,
    )


@P6.function
def p6_engine_accepts(engine_name: str, facts: Mapping[str, Any] | None) -> Decision[dict[str, Any]]:
    """P6: the engine's own checks on the actor and the rollout config (``facts`` is None when
    they refused: the error is raised by the engine's check)."""
    # Each engine says what it looked at (``RolloutEngine.check``): its own keys, a mapping.
    return Decision(
        "P6",
        f"{engine_name} engine accepts the actor and rollout config",
        dict(facts or {}),
        "ok" if facts is not None else "error",
        CheckBranch.PASS if facts is not None else CheckBranch.ERROR,
    )


@P6.function
def check_vanilla_model(has_config: bool) -> None:
    """P6: the vanilla engine needs a model with a ``config`` attribute."""
    if not has_config:
        raise ConfigError(
            "the vanilla engine needs a model with a `config` attribute (num_layers, num_kv_heads, head_dim) to "
            "size its KV cache; use rlcluster_lab.TransformerLM or give your module a config"
        )


@P6.function
def check_vllm_version(model_version: str | None) -> None:
    """P6: the vllm engine needs the model version it serves."""
    if model_version is None:
        raise ConfigError(
            "the vllm engine needs rollout_config.rollout_vllm_model_version (the model version or path it "
            "serves); set it in RolloutConfig"
        )


@P6.function
def check_sglang_lora(actor_has_lora: bool, static_lora: bool) -> None:
    """P6: the sglang_jax engine refuses a LoRA actor without static-LoRA settings."""
    if actor_has_lora and not static_lora:
        # The lab and the CLI name their own knobs (core.knobs) instead of RolloutConfig's fields.
        raise ConfigError(
            "the sglang_jax engine was given a LoRA actor but no static-LoRA settings: set "
            "rollout_sglang_jax_enable_static_lora=True and rollout_sglang_jax_lora_target_modules, "
            "rollout_sglang_jax_max_lora_rank, rollout_sglang_jax_lora_scaling in RolloutConfig",
            knobs=("sglang_static_lora", "lora", "engine"),
            problem="the sglang_jax engine was given a LoRA actor but no static-LoRA settings (P6)",
        )


def check_lora_rank(rank: Any, model: Any) -> None:
    """A LoRA rank is an int (else a ``TypeError``) between 1 and the ``max_lora_rank`` of ``model``
    (else a ``ConfigError`` with the bound): above it a rank adds only memory, so it is refused from
    the model's dimensions before any adapter is drawn."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"lora_rank (--lora-rank) must be an int, got {type(rank).__name__} {rank!r}")
    bound = model.max_lora_rank
    if not 1 <= rank <= bound:
        widest = ", ".join(n for n, (i, o) in model.lora_shapes().items() if min(i, o) == bound)
        raise ConfigError(
            f"lora_rank (--lora-rank) must be between 1 and {bound} for the {model.name} model, got {rank}: an "
            f"adapter on an (in, out) projection has rank at most min(in, out), at most {bound} here ({widest}), "
            "so a higher rank adds no capacity, only memory",
            knobs=("lora_rank", "model_size"),
        )


@P6.function
def check_scenario(scenario: Scenario, device_count: int | None = None, *, model: Any = None) -> None:
    """P6 on a scenario's knobs: every refusal that needs several knobs, or the model, together (the
    engine's LoRA settings, the LoRA rank ``model`` allows, default the ``model_size``'s, the layout
    on ``device_count`` devices if given), before anything is allocated and without JAX. Raises a
    ``ConfigError`` with the reason and the fix, or a ``TypeError`` for anything but a ``Scenario``."""
    if not isinstance(scenario, Scenario):
        raise TypeError(
            f"scenario must be a Scenario (e.g. Scenario(layout='colocated')), got {type(scenario).__name__} "
            f"{scenario!r:.40}"
        )
    check_lora_rank(scenario.lora_rank, model if model is not None else get_model_config(scenario.model_size))
    if scenario.engine == "sglang_jax":
        check_sglang_lora(scenario.lora, scenario.sglang_static_lora)
    if device_count is not None:
        problem = layout_problem(scenario.layout, device_count)
        if problem:
            raise ConfigError(problem, knobs=("layout", "devices"))
