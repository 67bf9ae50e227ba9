"""P9, P12, P13: generating, the optimizer step, and the weight sync."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

from rlcluster_lab.core.options import as_int
from rlcluster_lab.core.trace import Decision
from rlcluster_lab.rules.registry import Locator, rule


class ParamsBranch(str, enum.Enum):
    LORA = "LoRA params"
    ALL = "all params"


P9 = rule(
    "P9",
    "generate",
    tests=("tests/test_cluster_rules.py::test_p9_*",),
    reference=(Locator("RLCluster.generate", what="sampling on the rollout mesh, in micro-batches"),),
)


@P9.function
def p9_check_prompts(prompts: Sequence[str], micro_batch_size: int | None) -> None:
    """P9: sampling runs on the rollout mesh, in micro-batches if asked; an empty prompt list is an error.

    Raises:
        ValueError: no prompts, or a micro-batch size that is not an int >= 1 (a ConfigError).
    """
    if not prompts:
        raise ValueError("Cannot generate from an empty list of prompts.")
    if micro_batch_size is not None:
        as_int(micro_batch_size, "micro_batch_size", low=1)


P12 = rule(
    "P12",
    "the actor's and the critic's optimizer steps",
    question="the optimizer trains",
    answers={ParamsBranch.LORA: "LoRA params", ParamsBranch.ALL: "all params"},
    tests=("tests/test_cluster_rules.py::test_p12_*", "tests/test_learner.py", "tests/test_critic.py"),
    reference=(
        Locator("RLCluster.update_actor", what="the actor's training on its mesh"),
        Locator("RLCluster.update_critic", what="the critic's"),
    ),
)


@dataclasses.dataclass(frozen=True)
class P12Values:  # the optimizer over LoRA parameters only, or all
    lora: bool


@P12.function
def p12_trainable(actor_has_lora: bool) -> Decision[P12Values]:
    """P12: a real optimizer step (optax) on the actor, on its mesh: over the LoRA parameters of a LoRA
    actor, else over all parameters; with offload the model comes to device for the step and goes back."""
    return Decision(
        "P12",
        "actor trainable parameters",
        P12Values(actor_has_lora),
        "optimizer over LoRA parameters only" if actor_has_lora else "optimizer over all parameters",
        ParamsBranch.LORA if actor_has_lora else ParamsBranch.ALL,
    )


@P12.function
def p12_critic_trainable() -> Decision[P12Values]:
    """P12 for the critic: its own optimizer (``TrainingConfig.critic_tx()``) over all its parameters,
    its state on the critic's mesh and, with offload, in pinned host memory between updates."""
    return Decision(
        "P12",
        "critic trainable parameters",
        P12Values(lora=False),
        "critic optimizer over all parameters, on the critic mesh",
        ParamsBranch.ALL,
    )


P13 = rule(
    "P13",
    "the weight sync",
    question="sync hands the engine",
    answers={ParamsBranch.LORA: "LoRA params", ParamsBranch.ALL: "all params"},
    tests=("tests/test_sync.py", "tests/test_cluster_rules.py::test_p13_*"),
    reference=(Locator("RLCluster.sync_weights", what="the sync"),),
)


@dataclasses.dataclass(frozen=True)
class P13Values:  # what a sync handed over, and how; never the map
    lora: bool
    global_step: int
    transfer_guard: bool
    sharing_map_consulted: bool
    reshard: str
    sync_chunk_bytes: int | None


@P13.function
def p13_sync(
    actor_has_lora: bool, global_step: int, platform: str, reshard: str, chunk_bytes: int | None = None
) -> Decision[P13Values]:
    """P13: the sharing map is not consulted. The actor state is filtered to LoRA parameters (LoRA
    actor) or all parameters and handed, with its filter, to the rollout engine, which reshards it
    onto its own copy's shardings: the same object on the same mesh moves nothing; a mesh over other
    devices moves every synced byte; the same devices in another shape move only what a device does
    not already hold. Then the anchor is re-pinned and the global step counter goes up by one. On
    CPU devices, explicit host<->device transfers are disallowed during the sync."""
    return Decision(
        "P13",
        "sync: filter to LoRA parameters if the actor has LoRA, else all parameters",
        P13Values(actor_has_lora, global_step, p13_sync_guarded(platform), False, reshard, chunk_bytes),
        "LoRA parameters handed to the engine" if actor_has_lora else "all parameters handed to the engine",
        ParamsBranch.LORA if actor_has_lora else ParamsBranch.ALL,
    )


@dataclasses.dataclass(frozen=True)
class SyncOrder:
    """How ``cluster.sync`` runs a sync (P13, P14): in chunks of at most ``chunk_bytes`` (None: one
    piece); a failure restored from the anchor or from the old arrays kept to the end; under
    ``offload`` each piece staged to device and written back to pinned host. ``text``: the report's
    words for the order."""

    chunk_bytes: int | None
    restore_from_anchor: bool
    offload: bool

    @property
    def text(self) -> str:
        if self.chunk_bytes is None:
            said = "the handover in one piece (the old arrays kept until the end for a rollback)"
        else:
            # How many chunks, and how large, the report says from its own count: a limit above
            # every byte handed over makes one chunk, a leaf above it one of its own.
            said = "the handover, each chunk committed and its old arrays " + (
                "dropped" if self.restore_from_anchor else "kept to the end for a rollback"
            )
        if self.offload:
            said += ", each piece staged to device memory and written back to pinned host before the next"
        return said + ", then the anchor re-pin" + (" (the actor's own pinned buffers)" if self.offload else "")


@P13.function
def p13_sync_order(chunk_bytes: int | None, offload: bool, anchor_covers: bool = True) -> SyncOrder:
    """P13, P14: the order of a sync's steps, the one with the lowest transient peak.

    The handover first, then the anchor re-pin, written over the old anchor's buffers (P8): re-pinned
    first, it would need buffers of its own beside the handover's peak, since the old anchor stays
    until the handover is done. With chunks, each chunk is resharded, committed and its old arrays
    dropped before the next when the anchor holds every leaf a rollback restores (``anchor_covers``;
    else the old arrays are kept). With offload each chunk of the actor is staged to device,
    resharded and written to the rollout in pinned host before the next. The planner
    (``planner.sync_peak``) computes the other orders' peaks; a test holds this one to the lowest.
    """
    return SyncOrder(chunk_bytes, chunk_bytes is not None and anchor_covers, offload)


@P13.function
def p13_sync_guarded(platform: str) -> bool:
    """P13: on CPU devices, explicit host<->device transfers are disallowed during a sync."""
    return platform == "cpu"
