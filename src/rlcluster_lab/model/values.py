"""Initial parameter values, drawn on the host with NumPy (no XLA program is compiled)."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict


def initial_values(state: nnx.State, seed: int) -> dict[Any, Any]:
    """Initial values for an abstract state, drawn on the host with NumPy.

    Each leaf has its own generator, seeded by ``seed`` and the leaf's path,
    so a value never depends on which other leaves exist. Kernels and LoRA
    ``lora_a`` are normal with standard deviation 1/sqrt(fan-in); the
    embedding table 1/sqrt(embed); norm scales are ones; biases and LoRA
    ``lora_b`` zeros (so a fresh adapter changes nothing).
    """
    out = {}
    for path, value in flatten_dict(nnx.to_pure_dict(state)).items():
        out[path] = initial_value(path, tuple(value.shape), np.dtype(value.dtype), seed)
    return unflatten_dict(out)


def initial_value(path: tuple[Any, ...], shape: tuple[int, ...], dtype: np.dtype, seed: int) -> np.ndarray:
    name = str(path[-1])
    if name in ("scale",):
        return np.ones(shape, dtype)
    if name in ("bias", "lora_b") or len(shape) < 2:
        return np.zeros(shape, dtype)
    rng = np.random.default_rng([seed, zlib.crc32("/".join(map(str, path)).encode())])
    fan = shape[-1] if name == "embedding" else shape[0]
    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / math.sqrt(fan))
    return values.astype(dtype)
