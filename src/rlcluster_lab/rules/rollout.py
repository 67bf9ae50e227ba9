"""P3 and P7: what the rollout samples with, and which mesh it is recorded on."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from rlcluster_lab.core.meshes import describe_mesh
from rlcluster_lab.core.trace import Decision
from rlcluster_lab.rules.registry import Locator, rule


class RolloutBranch(str, enum.Enum):
    SHARED = "shared"
    SECOND_COPY = "second_copy"
    ENGINE_INITIAL_VALUE = "engine_initial_value"


class MeshBranch(str, enum.Enum):
    KEPT = "kept"
    REPLACED = "replaced"


P3 = rule(
    "P3",
    "the rollout model",
    question="what does the rollout sample with?",
    answers={
        RolloutBranch.SHARED: "same object",
        RolloutBranch.SECOND_COPY: "second copy",
        RolloutBranch.ENGINE_INITIAL_VALUE: "engine's initial value",
    },
    tests=("tests/test_cluster_rules.py::test_p3_*", "tests/test_cluster_matrix.py"),
    reference=(
        Locator(
            "RLCluster.__init__",
            "If",
            uses=("_backbone_sharing_map", "ROLLOUT"),
            what="the three branches: linked, the vanilla engine, any other engine",
        ),
    ),
)


@dataclasses.dataclass(frozen=True)
class P3Values:  # P1's link, the engine, the dtype of a second copy
    rollout_linked_to_actor: bool
    engine: str
    rollout_dtype: str | None


@P3.function
def p3_rollout_model(linked: bool, engine_kind: str, engine_name: str, rollout_dtype: str | None) -> Decision[P3Values]:
    """P3: if ROLLOUT is linked to ACTOR, the rollout model *is* the actor model.

    One Python object, one set of buffers, zero extra bytes. Else, with the built-in vanilla sampler,
    the actor is loaded a second time onto the rollout mesh, cast to the rollout config's dtype when
    one is set. Else (any other engine) the engine is handed the trainer's model as its initial
    weights and owns its copy from then on.
    """
    if linked:
        branch, outcome = RolloutBranch.SHARED, "rollout model is the actor model: one object, no second copy"
    elif engine_kind == "vanilla":
        branch = RolloutBranch.SECOND_COPY
        outcome = "actor loaded a second time onto the rollout mesh" + (
            f", cast to {rollout_dtype}" if rollout_dtype else ""
        )
    else:
        branch = RolloutBranch.ENGINE_INITIAL_VALUE
        outcome = f"the {engine_name} engine gets the trainer's model as its initial weights"
    return Decision(
        "P3",
        "ROLLOUT in sharing_map[ACTOR]; else engine == 'vanilla'",
        P3Values(linked, engine_name, rollout_dtype),
        outcome,
        branch,
    )


P7 = rule(
    "P7",
    "an engine's mesh replaces the rollout mesh",
    question="engine exposes a mesh?",
    answers={MeshBranch.KEPT: "rollout mesh kept", MeshBranch.REPLACED: "engine's mesh"},
    tests=("tests/test_cluster_rules.py::test_p7_*", "tests/test_cluster_matrix.py"),
    reference=(
        Locator(
            "RLCluster._init_cluster",
            "If",
            uses=("_rollout", "mesh"),
            what="after the engine is built, a mesh it exposes replaces the rollout mesh",
        ),
    ),
)


@dataclasses.dataclass(frozen=True)
class P7Values:  # the engine's mesh, if any, against the config's; P1's map kept
    engine: str
    exposes_mesh: bool
    config_rollout_mesh: Mapping[str, Any]
    engine_mesh: Mapping[str, Any] | None
    sharing_map_rebuilt: bool
    still_registered_as_sharing: bool


@P7.function
def p7_engine_mesh(engine_name: str, config_mesh: Any, engine_mesh: Any, still_sharing: bool) -> Decision[P7Values]:
    """P7: an engine that exposes a non-None ``mesh`` replaces the rollout mesh.

    The sharing map, built first from the config's meshes, is not rebuilt: a colocated run can stay
    registered as sharing while the recorded rollout mesh is the engine's. In the reference only the
    vllm engine exposes a mesh; sglang_jax is handed one but does not expose it; vanilla has none.
    """
    exposes = engine_mesh is not None
    own_mesh = describe_mesh(engine_mesh) if exposes else None
    return Decision(
        "P7",
        "the engine exposes a non-None mesh",
        P7Values(engine_name, exposes, describe_mesh(config_mesh), own_mesh, False, still_sharing),
        "role_to_mesh[ROLLOUT] replaced by the engine's mesh" if exposes else "rollout mesh kept",
        MeshBranch.REPLACED if exposes else MeshBranch.KEPT,
    )
