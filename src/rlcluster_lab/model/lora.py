"""LoRA: rank-r adapters beside the kernels they adapt."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rlcluster_lab.core.model_config import LAYER_STACK, LORA_PROJECTIONS, check_lora_scale
from rlcluster_lab.core.options import as_int
from rlcluster_lab.core.states import model_state
from rlcluster_lab.model.transformer import TransformerLM
from rlcluster_lab.model.values import initial_value


class LoRALinear(nnx.Module):
    """A bias-free linear layer with a rank-``r`` adapter beside its kernel: ``x @ kernel + (x @ a @ b)
    * scale``. The kernel keeps the plain model's path, with ``lora_a``/``lora_b`` beside it, so the
    frozen part of a LoRA model has its base model's tree, compared and updated leaf by leaf (P2,
    P4, P14). In the layer stack every array has a leading, unsharded layer axis."""

    def __init__(self, base: nnx.Linear, a: Any, b: Any, *, scale: float) -> None:
        self.kernel = base.kernel
        *lead, in_axis, out_axis = base.kernel.get_metadata()["out_sharding"]
        self.lora_a = nnx.LoRAParam(a, out_sharding=(*lead, in_axis, None), eager_sharding=False)
        self.lora_b = nnx.LoRAParam(b, out_sharding=(*lead, None, out_axis), eager_sharding=False)
        # A scale out of range turns trained adapters into inf (core.model_config.MAX_LORA_SCALE).
        self.scale = check_lora_scale(scale, "the LoRA scale (alpha / rank)")

    def __call__(self, x: jax.Array) -> jax.Array:
        k, a, b = self.kernel[...], self.lora_a[...], self.lora_b[...]
        return x @ k + ((x @ a) @ b) * jnp.asarray(self.scale, x.dtype)


def with_lora(
    base: TransformerLM, rank: int, *, seed: int = 1, alpha: float | None = None, copy_base: bool = False
) -> TransformerLM:
    """A new model whose 7 projections per layer are wrapped in rank-``rank`` LoRA; ``lora_b`` starts
    at zero, so it computes exactly what ``base`` does. The adapters are drawn on the host and put
    where the kernel they adapt lives (``lora_a`` split like its rows, ``lora_b`` like its columns).

    Args:
        base: a ``TransformerLM`` without adapters.
        rank: the adapters' rank.
        seed: the seed of the adapters' generators.
        alpha: the adapter term is scaled by ``alpha / rank`` (default ``rank``: a scale of 1).
        copy_base: give the result base weights of its own (else ``base``'s arrays).

    Raises:
        TypeError: ``base`` is not a ``TransformerLM``.
        ValueError: a rank that is not an int >= 1, a base that already has adapters, or a scale
            that is not finite or above ``MAX_LORA_SCALE`` in magnitude.
    """
    if not isinstance(base, TransformerLM):
        raise TypeError(f"base must be a TransformerLM (init_model(...)), got {type(base).__name__}")
    rank = as_int(rank, "rank (the LoRA rank)", low=1)
    if is_lora(base):
        raise ValueError("model already has LoRA adapters")
    scale = check_lora_scale((rank if alpha is None else alpha) / rank, f"alpha / rank ({alpha!r} / {rank})")
    graphdef, state = nnx.split(base)
    # Mapping over the state rebuilds every Variable (merge alone would reuse base's); the
    # leaves stay the same arrays unless a copy was asked for.
    state = jax.tree.map(lambda x: x, state)
    if copy_base:
        leaves = jax.tree.leaves(state)
        copies = jax.device_put(leaves, [x.sharding for x in leaves], may_alias=False)
        state = jax.tree.unflatten(jax.tree.structure(state), copies)
    model = nnx.merge(graphdef, state)
    made: list[tuple[Any, Any]] = []  # (host value, sharding) of every adapter, in order

    def adapters(path: str, a: jax.ShapeDtypeStruct, b: jax.ShapeDtypeStruct) -> tuple[Any, Any]:
        host_a = initial_value(tuple(path.split("/")) + ("lora_a",), a.shape, np.dtype(a.dtype), seed)
        made.extend([(host_a, a.sharding), (np.zeros(b.shape, b.dtype), b.sharding)])
        return a, b

    wrapped, layers = _wrap_lora(model, rank, scale, adapters)
    # Every adapter crosses from the host in one call, onto its kernel's devices.
    arrays = iter(jax.device_put([h for h, _ in made], [sh for _, sh in made]))
    for layer in layers:
        layer.lora_a.set_value(next(arrays))
        layer.lora_b.set_value(next(arrays))
    return wrapped


def _wrap_lora(model: TransformerLM, rank: int, scale: float, adapters: Any) -> tuple[TransformerLM, list[LoRALinear]]:
    """Wrap every target projection in a ``LoRALinear`` with the values ``adapters(path, a, b)`` draws
    for their abstract shapes; returns the model and its new layers in the order drawn."""
    layers: list[LoRALinear] = []
    block = model.blocks  # every layer at once: kernels (num_layers, in, out), adapters stacked alike
    with nnx.use_eager_sharding(False):
        for part, names in LORA_PROJECTIONS.items():
            sub = getattr(block, part)
            for name in names:
                lin: nnx.Linear = getattr(sub, name)
                kernel = lin.kernel.get_value()
                *lead, _, _ = kernel.shape
                a_sh, b_sh = _adapter_shardings(kernel)
                a = jax.ShapeDtypeStruct((*lead, lin.in_features, rank), kernel.dtype, sharding=a_sh)
                b = jax.ShapeDtypeStruct((*lead, rank, lin.out_features), kernel.dtype, sharding=b_sh)
                va, vb = adapters(f"{LAYER_STACK}/{part}/{name}", a, b)
                layers.append(LoRALinear(lin, va, vb, scale=scale))
                setattr(sub, name, layers[-1])
    return model, layers


def _adapter_shardings(kernel: Any) -> tuple[Any, Any]:
    """Where the adapters of ``kernel`` go: lora_a split like its rows, lora_b like its columns."""
    sharding = getattr(kernel, "sharding", None)
    if not isinstance(sharding, NamedSharding):  # None (not placed yet), or no mesh to split over
        return sharding, sharding
    *lead, rows, cols = tuple(sharding.spec) + (None,) * (kernel.ndim - len(sharding.spec))
    return (
        NamedSharding(sharding.mesh, PartitionSpec(*lead, rows, None), memory_kind=sharding.memory_kind),
        NamedSharding(sharding.mesh, PartitionSpec(*lead, None, cols), memory_kind=sharding.memory_kind),
    )


def trained_params(lora: bool) -> type[nnx.Variable]:
    """The Variables an actor's optimizer steps over (P12) and a sync hands over (P13): the LoRA
    adapters of a LoRA actor, else every parameter."""
    return nnx.LoRAParam if lora else nnx.Param


def is_lora(model: nnx.Module) -> bool:
    """True iff ``model`` holds any ``nnx.LoRAParam`` (read from its state: a construction asks
    several times, and ``model_state`` walks the graph once)."""
    return any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(model_state(model)))
