"""P4: the reference model, and the avoidable copy of a backbone it could share."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from rlcluster_lab.core.trace import Decision
from rlcluster_lab.rules.registry import Locator, rule


class ReferenceBranch(str, enum.Enum):
    ONE_BACKBONE = "one backbone"
    AVOIDABLE_COPY = "avoidable copy"
    OWN_WEIGHTS = "own weights"


# The flow figure's answer when there is no reference at all (P4 takes no decision then).
NO_REFERENCE = "no reference"

AVOIDABLE_COPY_ADVICE = (
    "The reference and the actor are on one mesh and may share the frozen "
    "backbone, but they hold two copies of it: an avoidable copy that costs "
    "device memory. Build the LoRA actor over the reference model's own "
    "weights (rlcluster_lab.with_lora(reference, rank, ...)) to share it."
)


P4 = rule(
    "P4",
    "the reference model and the avoidable copy",
    question="reference backbone",
    answers={
        ReferenceBranch.ONE_BACKBONE: "one backbone",
        ReferenceBranch.AVOIDABLE_COPY: "avoidable copy",
        ReferenceBranch.OWN_WEIGHTS: "own weights",
        NO_REFERENCE: "no reference",
    },
    tests=("tests/test_cluster_rules.py::test_p4_*", "tests/test_cli.py::test_p4_*"),
    reference=(
        Locator(
            "RLCluster.__init__",
            "If",
            uses=("reference",),
            what="the reference loaded onto its mesh, and the warning when linked but not sharing",
        ),
    ),
)


@dataclasses.dataclass(frozen=True)
class P4UnlinkedValues:  # a reference P2 did not link: only that
    linked: bool


@dataclasses.dataclass(frozen=True)
class P4Values:  # a linked reference: its frozen buffers the actor's or not, offload
    linked: bool
    shares_buffers: bool
    offload_to_cpu: bool


@P4.function
def p4_reference_backbone(
    linked: bool, shares_buffers: bool, offload_to_cpu: bool
) -> Decision[P4UnlinkedValues] | Decision[P4Values]:
    """P4: the reference is loaded onto its own mesh; when it is linked to the actor but its frozen
    (non-LoRA) buffers are not the actor's, a warning says that an avoidable copy costs device memory."""
    if not linked:
        return Decision(
            "P4",
            "reference linked to actor",
            P4UnlinkedValues(linked=False),
            "reference holds its own weights on its mesh",
            ReferenceBranch.OWN_WEIGHTS,
        )
    note = (
        "; with offload_to_cpu these are the two host copies made during construction, "
        "which P14 joins again when a shared role is next loaded"
        if offload_to_cpu
        else ""
    )
    return Decision(
        "P4",
        "reference linked to actor: its frozen buffers are the actor's",
        P4Values(linked=True, shares_buffers=shares_buffers, offload_to_cpu=offload_to_cpu),
        "one backbone in memory" if shares_buffers else "warning: avoidable copy of the backbone" + note,
        ReferenceBranch.ONE_BACKBONE if shares_buffers else ReferenceBranch.AVOIDABLE_COPY,
    )


def p4_warning(decision: Decision[Any]) -> str | None:
    """The line a P4 decision adds to the cluster's warnings (None when there is nothing to warn)."""
    if decision.branch is not ReferenceBranch.AVOIDABLE_COPY:
        return None
    note = decision.outcome.split("backbone", 1)[1]
    return "P4: avoidable copy of the backbone (reference and actor hold two copies)" + note
