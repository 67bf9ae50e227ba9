"""Which buffers a state holds: identity, bytes, and whether two models share a backbone."""

from __future__ import annotations

from typing import Any

from flax import nnx

from rlcluster_lab.core.gathering import held_within
from rlcluster_lab.core.shardings import array_leaves
from rlcluster_lab.core.states import model_state
from rlcluster_lab.placement.transfers import Key, shard_buffers, shard_keys


def state_bytes(state: Any) -> int:
    """Physical bytes of a state: every addressable shard counted."""
    return int(sum(n for x in array_leaves(state) for _, n in shard_buffers(x)))


def buffer_keys(state: Any) -> set[Key]:
    """(platform, device id, buffer pointer) of every addressable shard of ``state``."""
    return set().union(*(shard_keys(x) for x in array_leaves(state)))


def sharing_backbone(a: nnx.Module, b: nnx.Module) -> bool:
    """P4: every frozen (non-LoRA) buffer of ``a`` is one of ``b``'s."""
    ka = buffer_keys(model_state(a, nnx.Not(nnx.LoRAParam)))
    kb = buffer_keys(model_state(b, nnx.Not(nnx.LoRAParam)))
    # multi-process: every process holding some of a's buffers must agree (held_within).
    return held_within(ka, kb, "backbone buffers shared")
