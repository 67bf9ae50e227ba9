"""P8, P10, P11: the anchor policy state, and why the actor's log-probs come from it."""

from __future__ import annotations

import dataclasses
import enum

from rlcluster_lab.core.trace import Decision
from rlcluster_lab.rules.registry import Locator, rule


class AnchorBranch(str, enum.Enum):
    FULL = "full"
    TRAINABLE = "trainable"


def anchor_is_partial(mode: str, actor_has_lora: bool) -> bool:
    """With ``anchor="trainable"`` and a LoRA actor, only the adapters are pinned."""
    return mode == "trainable" and actor_has_lora


P8 = rule(
    "P8",
    "the anchor snapshot",
    question="anchor policy state holds",
    answers={AnchorBranch.FULL: "full state", AnchorBranch.TRAINABLE: "trainable only"},
    tests=("tests/test_cluster_rules.py::test_p8_*", "tests/test_sync.py::test_*anchor*"),
    reference=(
        Locator(
            "RLCluster._init_cluster",
            "Assign",
            uses=("_anchor_policy_state", "pinned_host"),
            what="the actor's full state pinned to host memory, last in construction",
        ),
    ),
)


@dataclasses.dataclass(frozen=True)
class P8Values:  # what P8 pinned: at which global step, in which mode, how many bytes
    global_steps: int
    anchor: str
    bytes: int


@P8.function
def p8_anchor(mode: str, actor_has_lora: bool, global_steps: int, nbytes: int) -> Decision[P8Values]:
    """P8: at the end of construction (and at every sync, P13) the actor's full state is copied to
    pinned host memory: the anchor policy state. The lab adds ``anchor="trainable"``: for a LoRA
    actor only the adapters are pinned, the frozen backbone read from the actor (the same log-probs
    for less pinned memory)."""
    partial = anchor_is_partial(mode, actor_has_lora)
    return Decision(
        "P8",
        "snapshot the actor's state to pinned host" + (" (trainable part only: anchor='trainable')" if partial else ""),
        P8Values(global_steps, mode, nbytes),
        "anchor holds the LoRA adapters; the frozen backbone is read from the actor"
        if partial
        else "anchor policy state pinned",
        AnchorBranch.TRAINABLE if partial else AnchorBranch.FULL,
    )


@P8.function
def p8_repin_in_place(already_pinned: bool, same_layout: bool, held_elsewhere: bool) -> bool:
    """P8 at every sync (P13): whether the anchor's copy of one leaf is written over the old anchor's
    buffer of that leaf rather than into a new pinned-host buffer.

    A leaf already in pinned host memory (offload: the actor's own buffer) is kept. Otherwise the
    copy goes over the old buffer when it has the leaf's layout and nothing but the anchor holds it:
    the old snapshot goes at the end of the sync anyway, and new pinned buffers are what a re-pin
    costs on an accelerator. A buffer something else holds (a snapshot kept through
    ``pinned_anchor_state``, the rehearsal's twin) is never overwritten.
    """
    return not already_pinned and same_layout and not held_elsewhere


ANCHOR_MISSING = "The anchor policy state is not set: call sync_weights() first."

P10 = rule(
    "P10",
    "per-token log-probs from the anchor",
    tests=("tests/test_cluster_rules.py::test_p10_*", "tests/test_learner.py"),
    reference=(
        Locator(
            "RLCluster.get_actor_per_token_logps",
            "Raise",
            every=True,
            what="an empty batch, and no anchor: errors",
        ),
        Locator(
            "RLCluster.get_actor_per_token_logps",
            "If",
            uses=("anchor_on_device",),
            what="the anchor brought to device when it is pinned on the host",
        ),
        Locator(
            "RLCluster.get_actor_per_token_logps",
            "Expr",
            uses=("compute_per_token_logps", "anchor_policy_state"),
            what="the live model's graph over the anchor state",
        ),
    ),
)

P11 = rule(
    "P11",
    "why the anchor",
    tests=("tests/test_cluster_rules.py::test_p11_*", "tests/test_learner.py::test_p11_*"),
    note="Stated in P10's function: the learner's probe measures it (live vs anchor vs sampler).",
)


@P10.function
def p10_require_anchor(anchor_present: bool) -> None:
    """P10: actor log-probs run the live model's graph over the *anchor* state (moved to device first
    when it is pinned on the host); an empty batch is an error. With no anchor the call fails with a
    message to sync first, as the reference's does. In the lab that guard
    cannot fire through the public API: construction pins the anchor (P8), a sync only replaces it.

    P11 says why: when the mini-batch is smaller than the batch, or the learner makes more than one
    pass over the same data, the actor has already stepped before old log-probs are needed; scoring
    with live weights would compare the policy with itself.

    Raises:
        ValueError: there is no anchor.
    """
    # Unreachable through the public API: construction pins the anchor (P8), a sync replaces it.
    if not anchor_present:
        raise ValueError(ANCHOR_MISSING)
