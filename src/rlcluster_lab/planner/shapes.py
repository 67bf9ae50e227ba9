"""Shapes without arrays, for the what-if planner (L4): meshes on paper, shard boxes, and the
parameter trees of the lab's real models (``nnx.eval_shape`` over their constructors, specs
from the cluster's logical-axis rules). Nothing here allocates a device buffer.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict
from jax.sharding import PartitionSpec

from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES
from rlcluster_lab.core.shardings import resolve_specs
from rlcluster_lab.engines.base import leaf_path
from rlcluster_lab.model import ModelConfig, abstract_model
from rlcluster_lab.model.scoring import abstract_score_model

Path = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class AbstractLeaf:
    """One parameter of a model, as ``nnx.eval_shape`` sees it."""

    path: Path
    shape: tuple[int, ...]
    dtype: np.dtype
    spec: PartitionSpec
    lora: bool  # an nnx.LoRAParam (a trainable adapter)


@functools.lru_cache(maxsize=64)
def abstract_leaves(
    config: ModelConfig,
    lora_rank: int = 0,
    kind: str = "lm",
    rules: tuple[tuple[str, Any], ...] | None = DEFAULT_LOGICAL_AXIS_RULES,
) -> tuple[AbstractLeaf, ...]:
    """The parameter tree of ``init_model`` (``kind="lm"``, with ``with_lora`` when
    ``lora_rank``) or ``init_score_model`` (``kind="score"``), with partition specs.

    The layers are one stacked block (a leading layer axis, unsharded), so the tree has the
    same leaves at any depth and is traced in the same time.
    """
    if kind not in ("lm", "score"):
        raise ValueError(f"kind must be 'lm' or 'score', got {kind!r}")
    if lora_rank and kind == "score":
        raise ValueError("score models (reward, critic) carry no LoRA adapters here")
    # The same structures init_model / with_lora / init_score_model fill with values.
    module = abstract_score_model(config) if kind == "score" else abstract_model(config, lora_rank)
    state = nnx.state(module)
    lora_paths = set(flatten_dict(nnx.to_pure_dict(nnx.state(module, nnx.LoRAParam))))
    values = flatten_dict(nnx.to_pure_dict(state))
    specs = flatten_dict(
        nnx.to_pure_dict(resolve_specs(state, rules)), is_leaf=lambda _, x: x is None or isinstance(x, PartitionSpec)
    )
    out = []
    for path, value in values.items():
        spec = specs.get(path)
        spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec()
        out.append(AbstractLeaf(path, tuple(value.shape), np.dtype(value.dtype), spec, path in lora_paths))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class OptimizerSlot:
    """Leaves of an optimizer state: a copy per trainable parameter (``mirrors``) or one leaf."""

    path: str
    mirrors: bool  # one leaf per trainable parameter, with that parameter's shape and sharding
    shape: tuple[int, ...] = ()
    dtype: np.dtype | None = None  # None with ``mirrors``: the parameter's own dtype


def optimizer_slots(tx: optax.GradientTransformation, config: ModelConfig, lora_rank: int) -> tuple[OptimizerSlot, ...]:
    """The layout of ``tx.init(trainable params)`` from ``jax.eval_shape`` on a one-layer model:
    a leaf whose key path ends with a trainable parameter's path and shape mirrors it (adam's
    mu and nu, with its sharding); any other (the step count) is replicated on the mesh."""
    probe = dataclasses.replace(config, num_layers=1)
    trainable = [leaf for leaf in abstract_leaves(probe, lora_rank) if leaf.lora or not lora_rank]
    params: dict[Path, Any] = {leaf.path: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in trainable}
    state = jax.eval_shape(tx.init, unflatten_dict(params))
    slots: dict[str, OptimizerSlot] = {}
    for key_path, value in jax.tree_util.tree_flatten_with_path(state)[0]:
        keys = tuple(_key(k) for k in key_path)
        mirrored = next(
            (keys[:j] for j in range(len(keys)) if keys[j:] in params and params[keys[j:]].shape == tuple(value.shape)),
            None,
        )
        if mirrored is not None:
            name = leaf_path(mirrored)
            dtype = np.dtype(value.dtype)
            param_dtype = np.dtype(params[keys[len(mirrored) :]].dtype)
            slots[name] = OptimizerSlot(name, True, dtype=None if dtype == param_dtype else dtype)
        else:
            name = leaf_path(keys)
            slots[name] = OptimizerSlot(name, False, tuple(value.shape), np.dtype(value.dtype))
    return tuple(slots.values())


def _key(k: Any) -> Any:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return getattr(k, attr)
    return str(k)
