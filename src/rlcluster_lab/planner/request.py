"""The knobs of one plan (``PlanRequest``): what ``plan.plan_cluster`` builds from its arguments,
and what the planned construction (``executor``) reads of them; it plans nothing itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optax

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import KNOBS, PLANNER_KNOBS, as_int, knob_dataclass
from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES
from rlcluster_lab.core.options import check_tensor_parallel_size
from rlcluster_lab.core.roles import Role
from rlcluster_lab.model import ModelConfig
from rlcluster_lab.placement.layout import PlannedMesh
from rlcluster_lab.planner.tables import Topology
from rlcluster_lab.planner.workload import Workload
from rlcluster_lab.rules.validation import check_lora_rank

Rules = tuple[tuple[str, Any], ...]


@knob_dataclass(PLANNER_KNOBS)
class PlanRequest:
    """The knobs of one plan: model, topology, what only a plan takes, and the knobs it shares
    with a ``Scenario`` (``core.knobs``: those marked ``planner``, checked as a Scenario's are),
    LoRA as a rank."""

    model: ModelConfig
    model_name: str
    topology: Topology
    lora_rank: int = 0  # a Scenario's lora and lora_rank in one (0: no LoRA)
    vllm_tensor_parallel_size: int | None = None
    role_to_mesh: Mapping[Role, PlannedMesh] | None = None  # overrides the layout's meshes
    logical_axis_rules: Mapping[Role, Rules] | None = None
    optimizer: optax.GradientTransformation | None = None  # default: adam, as TrainingConfig
    critic_optimizer: optax.GradientTransformation | None = None  # default: adam, as TrainingConfig
    workload: Workload = Workload()
    sync_programs: bool = False  # compile the sync's reshard programs for their temporaries

    def __post_init__(self) -> None:
        # Runs after the shared knobs' checks. NumPy numbers become plain ones (the plan's JSON keeps them).
        rank = as_int(self.lora_rank, "lora_rank", knobs=("lora_rank",))
        if rank:  # any rank but 0 (no LoRA) is checked as a Scenario's, then against the model
            rank = KNOBS["lora_rank"].check(rank)
            check_lora_rank(rank, self.model)
        object.__setattr__(self, "lora_rank", rank)
        if not isinstance(self.workload, Workload):
            raise TypeError(f"workload must be a Workload (or None), got {type(self.workload).__name__}")
        tp = check_tensor_parallel_size(self.vllm_tensor_parallel_size)
        object.__setattr__(self, "vllm_tensor_parallel_size", tp)
        if self.lora_separate_base and not rank:
            raise ConfigError("lora_separate_base needs LoRA: the separate base is the LoRA actor's frozen part")

    def rules(self, role: Role) -> Rules:
        rules = (self.logical_axis_rules or {}).get(role)
        return freeze_rules(rules if rules is not None else DEFAULT_LOGICAL_AXIS_RULES)


def freeze_rules(rules: Any) -> Rules:
    """Logical axis rules as the plan keeps them: tuples of (name, axes), a list of axes a tuple."""
    return tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in rules)
