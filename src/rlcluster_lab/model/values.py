"""Initial parameter values, drawn on the host with NumPy (no XLA program is compiled)."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict

from rlcluster_lab.core.model_config import layer_stack_at


def initial_values(state: nnx.State, seed: int) -> dict[Any, Any]:
    """Initial values for an abstract state, drawn on the host with NumPy. Each leaf has its own
    generator, seeded by ``seed`` and its path (a layer-stack leaf layer by layer, as
    ``blocks/<layer>/...``), so a value depends neither on other leaves nor on how the layers are
    held. Kernels and ``lora_a``: normal, std 1/sqrt(fan-in); the embedding 1/sqrt(embed); norm
    scales ones; biases and ``lora_b`` zeros (a fresh adapter changes nothing)."""
    leaves = flatten_dict(nnx.to_pure_dict(state))
    return unflatten_dict({p: initial_value(p, tuple(v.shape), np.dtype(v.dtype), seed) for p, v in leaves.items()})


def initial_value(path: tuple[Any, ...], shape: tuple[int, ...], dtype: np.dtype, seed: int) -> np.ndarray:
    """The initial value of one leaf (``initial_values``); a layer-stack leaf drawn layer by layer, stacked."""
    at = layer_stack_at(path)
    if at is None:
        return _one_value(path, shape, dtype, seed)
    head, tail = path[: at + 1], path[at + 1 :]
    stacked = np.empty(shape, dtype)  # each layer drawn into its place: no list of layers to stack
    for layer in range(shape[0]):
        stacked[layer] = _one_value((*head, layer, *tail), shape[1:], dtype, seed)
    return stacked


def _one_value(path: tuple[Any, ...], shape: tuple[int, ...], dtype: np.dtype, seed: int) -> np.ndarray:
    name = str(path[-1])
    if name in ("scale",):
        return np.ones(shape, dtype)
    if name in ("bias", "lora_b") or len(shape) < 2:
        return np.zeros(shape, dtype)
    rng = np.random.default_rng([seed, zlib.crc32("/".join(map(str, path)).encode())])
    fan = shape[-1] if name == "embedding" else shape[0]
    values = rng.standard_normal(shape, dtype=np.float32)
    values *= np.float32(1.0 / math.sqrt(fan))  # in place: the large presets' leaves are tens of MB
    return values.astype(dtype, copy=False)
