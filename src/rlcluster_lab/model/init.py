"""Initialising a model without compiling: the structure traced once, values drawn on the host."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES
from rlcluster_lab.core.options import as_int
from rlcluster_lab.core.shardings import default_memory_kind, target_shardings
from rlcluster_lab.model.lora import _wrap_lora
from rlcluster_lab.model.transformer import ModelConfig, TransformerLM, get_model_config
from rlcluster_lab.model.values import initial_values


@functools.lru_cache(maxsize=48)
def abstract_split(build: Callable[..., nnx.Module], config: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """The structure of ``build(config, rngs=...)``, made once per model class and config: every
    Variable with its logical names, as shapes only; the layers are one stacked ``Block`` traced
    once, so this takes the same time for any layer count."""
    return nnx.split(nnx.eval_shape(lambda: build(config, rngs=nnx.Rngs(0))))


def abstract_of(build: Callable[..., nnx.Module], config: ModelConfig | str) -> Any:
    """The model ``build`` makes for a config or a preset name, its values shapes only (Variables of its own)."""
    graphdef, state = abstract_split(build, get_model_config(config) if isinstance(config, str) else config)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x, state))


def abstract_model(config: ModelConfig | str, lora_rank: int = 0, lora_scale: float = 1.0) -> TransformerLM:
    """A ``TransformerLM`` (with rank-``lora_rank`` adapters) whose values are shapes only: what the
    planner and the checks before allocation read."""
    model = abstract_of(TransformerLM, config)
    if lora_rank:
        model, _ = _wrap_lora(model, lora_rank, lora_scale, adapters=lambda path, a, b: (a, b))
    return model


def materialize(graphdef: nnx.GraphDef, abstract: nnx.State, values: Any, shardings: Any = None) -> nnx.Module:
    """A live module from an abstract state and host values, placed in one transfer (``shardings``: a
    matching tree, or None for the default device)."""
    state = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(state, jax.device_put(values, shardings))
    return nnx.merge(graphdef, state)


def init_model(
    config: ModelConfig | str, *, seed: int = 0, mesh: Any = None, rules: Any = None, memory_kind: str | None = None
) -> TransformerLM:
    """A freshly initialised model from a config or a preset name, without compiling anything: values
    drawn on the host (``model.values``) and put straight where they belong.

    Args:
        config: a ``ModelConfig`` or a preset name (``tiny``, ``small``, ``base``, ``large``).
        seed: the seed of every leaf's generator.
        mesh: where to place the model, with its own partition specs; None for the default device.
        rules: logical axis rules for ``mesh`` (None: the model's defaults).
        memory_kind: ``device`` or ``pinned_host`` (None: the devices' default).
    """
    return init_from(TransformerLM, config, seed, mesh, rules, memory_kind)


def init_from(
    build: Callable[..., nnx.Module], config: ModelConfig | str, seed: int, mesh: Any, rules: Any, memory_kind: Any
) -> nnx.Module:
    """``init_model`` for the model ``build(config, rngs=...)`` makes."""
    if not isinstance(config, (str, ModelConfig)):
        raise TypeError(f"config must be a ModelConfig or a preset name ('tiny', ...), got {type(config).__name__}")
    seed = as_int(seed, "seed")
    graphdef, abstract = abstract_split(build, get_model_config(config) if isinstance(config, str) else config)
    shardings = None
    if mesh is not None:
        rules = rules if rules is not None else DEFAULT_LOGICAL_AXIS_RULES
        shardings = target_shardings(abstract, mesh, rules, memory_kind or default_memory_kind(mesh), role="model")
    return materialize(graphdef, abstract, initial_values(abstract, seed), shardings)
