"""Initialising a model without compiling: the structure traced once, values drawn on the host."""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict

from rlcluster_lab.model.transformer import DEFAULT_LOGICAL_AXIS_RULES, ModelConfig, TransformerLM, get_model_config


@functools.lru_cache(maxsize=32)
def _abstract_lm(config: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """The model's structure: every Variable with its logical names, values as shapes only.

    Made once per config (``abstract_structure``: nothing is computed or compiled).
    """
    return nnx.split(abstract_structure(TransformerLM, config))


def abstract_structure(build: Callable[..., nnx.Module], config: ModelConfig) -> Any:
    """``build(config, rngs=...)`` as shapes only, in time linear in the layer count.

    Tracing a whole model (``nnx.eval_shape``) costs time that grows faster than
    its layer count (every parameter's random draw inspects the trace so far:
    a 300-layer model took minutes). Every block is built by the same
    constructor from the same config, so one block is traced, in a one-layer
    model, and repeated: each copy has Variables of its own and the same
    shapes, dtypes and sharding names. The config the one-layer model holds is
    replaced by ``config`` wherever it appears, so the result is the model
    ``build(config)`` traces (the tests compare the two).
    """
    one = dataclasses.replace(config, num_layers=1)
    model = nnx.eval_shape(lambda: build(one, rngs=nnx.Rngs(0)))
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and getattr(node, "config", None) == one:
            node.config = config
    lm = model if isinstance(model, TransformerLM) else model.backbone
    block_def, block_state = nnx.split(lm.blocks[0])
    lm.blocks = nnx.List(
        [nnx.merge(block_def, jax.tree.map(lambda x: x, block_state)) for _ in range(config.num_layers)]
    )
    return model


def abstract_model(config: ModelConfig | str, lora_rank: int = 0, lora_scale: float = 1.0) -> TransformerLM:
    """A ``TransformerLM`` (with rank-``lora_rank`` adapters) whose values are shapes only.

    What the planner and the checks before allocation read: the tree, the
    shapes, dtypes and logical axis names, with no array behind them.
    """
    config = get_model_config(config) if isinstance(config, str) else config
    graphdef, state = _abstract_lm(config)
    model = nnx.merge(graphdef, jax.tree.map(lambda x: x, state))
    if lora_rank:
        from rlcluster_lab.model.lora import _wrap_lora  # LoRA builds on this module's values

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


def init_model(
    config: ModelConfig | str, *, seed: int = 0, mesh: Any = None, rules: Any = None, memory_kind: str | None = None
) -> TransformerLM:
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
    return materialize(graphdef, abstract, host_values(abstract, seed), _shardings(abstract, mesh, rules, memory_kind))


def _shardings(abstract: Any, mesh: Any, rules: Any, memory_kind: str | None) -> Any:
    if mesh is None:
        return None
    from rlcluster_lab.placement.place import default_memory_kind, target_shardings

    return target_shardings(
        abstract,
        mesh,
        rules if rules is not None else DEFAULT_LOGICAL_AXIS_RULES,
        memory_kind or default_memory_kind(mesh),
        role="model",
    )
