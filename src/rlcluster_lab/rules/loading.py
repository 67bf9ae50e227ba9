"""P5 and P14: loading a model onto a mesh, and offloading roles to pinned host memory."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.trace import Decision
from rlcluster_lab.rules.registry import Locator, rule


class LoadBranch(str, enum.Enum):
    KEPT = "kept as is"
    RESHARDED = "resharded"
    FROM_PATH = "read from the checkpoint"


class OffloadBranch(str, enum.Enum):
    OFFLOADED = "moved to pinned_host"
    OWN_COPY = "own copy offloaded on its own"


class OffloadAnswer(str, enum.Enum):
    """The flow figure's answers to "offload_to_cpu?": the flag itself, which every role obeys."""

    PINNED_HOST = "pinned host between uses"
    ON_DEVICE = "stays on device"


P5 = rule(
    "P5",
    "loading a model onto a mesh",
    question="load {role} onto its mesh",
    answers={LoadBranch.KEPT: "kept as is", LoadBranch.RESHARDED: "resharded"},
    tests=("tests/test_cluster_rules.py::test_p5_*", "tests/test_reshard.py"),
    reference=(Locator("RLCluster._load_model", what="the loader: kept, or resharded with the model's own specs"),),
)


@dataclasses.dataclass(frozen=True)
class P5Values:  # one role's model against the target mesh: its leaves, memory kind, dtype
    role: str
    model_meshes: Sequence[Mapping[str, Any]]
    target_mesh: Mapping[str, Any]
    leaves_on_target: int
    leaves: int
    memory_kind: str
    dtype: str | None
    requested_dtype: str | None


@dataclasses.dataclass(frozen=True)
class P5PathValues:  # the checkpoint a role given as a path is read from
    path: str


@P5.function
def p5_load(
    role: str,
    *,
    model_meshes: Sequence[Mapping[str, Any]],
    target_mesh: Mapping[str, Any],
    leaves_on_target: int,
    leaves: int,
    memory_kind: str,
    dtype: str | None,
    requested_dtype: str | None,
) -> Decision[P5Values]:
    """P5: a model already on the target mesh is kept as is; on another mesh it is resharded onto the
    target mesh using the model's own partition specs (missing spec = replicated), keeping its memory
    kind (device or pinned_host), cast to a dtype when one is asked for. "As is" means *every* leaf
    on the target mesh; leaves already in place are reused by the reshard."""
    kept = leaves > 0 and leaves_on_target == leaves
    outcome = "kept as is" if kept else f"resharded onto the target mesh in {memory_kind} memory"
    if not kept and requested_dtype is not None and leaves > 0 and requested_dtype != dtype:
        outcome += f", cast to {requested_dtype}"
    if not kept and leaves_on_target:
        outcome += f" ({leaves_on_target} of {leaves} leaves were already in place and are reused)"
    return Decision(
        "P5",
        f"{role}: every leaf already on the target mesh",
        P5Values(role, list(model_meshes), target_mesh, leaves_on_target, leaves, memory_kind, dtype, requested_dtype),
        outcome,
        LoadBranch.KEPT if kept else LoadBranch.RESHARDED,
    )


@P5.function
def p5_from_path(role: str, path: str) -> Decision[P5PathValues]:
    """P5 (paths): a role given as a checkpoint path is read before it is loaded; P2 is then skipped."""
    return Decision(
        "P5", f"{role}: given as a path", P5PathValues(path), "read from the checkpoint", LoadBranch.FROM_PATH
    )


P14 = rule(
    "P14",
    "offload",
    question="offload_to_cpu?",
    answers={OffloadAnswer.PINNED_HOST: "pinned host between uses", OffloadAnswer.ON_DEVICE: "stays on device"},
    tests=("tests/test_cluster_rules.py::test_p14_*", "tests/test_sync.py::test_p13_p14_*"),
    reference=(
        Locator(
            "RLCluster._load_model",
            "If",
            uses=("offload_to_cpu",),
            what="at load, a model on device goes to pinned host memory",
        ),
        Locator("RLCluster._update_models_sharing_weights", what="roles that share weights updated together"),
        Locator("RLCluster._maybe_load_model_from_cpu", what="to device for an operation"),
        Locator("RLCluster._maybe_offload_model_to_cpu", what="back to pinned host memory after it"),
    ),
)


@dataclasses.dataclass(frozen=True)
class P14Values:  # the role moved to pinned host under the offload flag
    role: str
    offload_to_cpu: bool


@dataclasses.dataclass(frozen=True)
class P14OwnCopyValues:  # the engine whose own copy is offloaded on its own
    engine: str
    owns_weights: bool


@P14.function
def p14_offload(role: str, offload_to_cpu: bool, on_device: bool) -> Decision[P14Values] | None:
    """P14: with ``offload_to_cpu``, every role lives in pinned host memory between uses and is brought
    to device for its operation; roles that share weights are updated together. Returns the decision
    to move a model on device to pinned host, or None when nothing moves."""
    if not (offload_to_cpu and on_device):
        return None
    return Decision(
        "P14",
        f"{role}: offload_to_cpu and the model is on device",
        P14Values(role, offload_to_cpu=True),
        "moved to pinned_host",
        OffloadBranch.OFFLOADED,
    )


@P14.function
def p14_own_copy_engine(engine_name: str) -> Decision[P14OwnCopyValues]:
    """P14 (engines with their own copy): with offload, a linked rollout whose engine owns its weights
    moves to and from host on its own, not with the actor (which would move onto the engine's mesh);
    the reference does not offload those engines."""
    return Decision(
        "P14",
        "offload with a linked rollout whose engine owns its weights",
        P14OwnCopyValues(engine_name, owns_weights=True),
        "the engine's copy is offloaded on its own; it is not updated together with the actor",
        OffloadBranch.OWN_COPY,
    )


@P14.function
def p14_updated_together(sharing: Mapping[Role, Sequence[Role]], role: Role, engine_owns_weights: bool) -> list[Role]:
    """P14: the roles that take ``role``'s new arrays when it moves between memory kinds: every role the
    map links to it, except a rollout whose engine keeps its own copy."""
    if engine_owns_weights and role is Role.ROLLOUT:
        return []
    return [other for other in sharing.get(role, ()) if not (engine_owns_weights and other is Role.ROLLOUT)]
