"""Every rule with its statement, the functions that take it and the tests that hold it.

``rules_markdown()`` renders this catalogue (and each function's docstring)
as ``docs/rules.md``; a test checks that the committed file is what the code
says, so the statement of the rules cannot drift from their implementation.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

from rlcluster_lab.rules import anchor, loading, reference, rollout, sharing, steps, validation


@dataclasses.dataclass(frozen=True)
class RuleEntry:
    """One rule: its id, a title, the functions that implement it, and where it is tested."""

    rule: str
    title: str
    functions: tuple[Callable[..., object], ...]
    tests: tuple[str, ...]
    note: str = ""  # a rule with no function of its own says here what holds it


RULES: tuple[RuleEntry, ...] = (
    RuleEntry(
        "P1",
        "actor/rollout link",
        (sharing.p1_link_actor_rollout,),
        ("tests/test_sharing.py", "tests/test_cluster_rules.py", "tests/test_cluster_matrix.py"),
    ),
    RuleEntry(
        "P2",
        "LoRA reference link and propagation",
        (sharing.p2_link_reference, sharing.p2_propagate),
        ("tests/test_sharing.py", "tests/test_cluster_rules.py"),
    ),
    RuleEntry(
        "P3",
        "the rollout model",
        (rollout.p3_rollout_model,),
        ("tests/test_cluster_rules.py", "tests/test_cluster_matrix.py"),
    ),
    RuleEntry(
        "P4",
        "the reference model and the avoidable copy",
        (reference.p4_reference_backbone,),
        ("tests/test_cluster_rules.py",),
    ),
    RuleEntry(
        "P5",
        "loading a model onto a mesh",
        (loading.p5_load, loading.p5_from_path),
        ("tests/test_cluster_rules.py", "tests/test_reshard.py"),
    ),
    RuleEntry(
        "P6",
        "validation",
        (
            validation.p6_rollout_config,
            validation.p6_engine_choice,
            validation.p6_engine_accepts,
            validation.check_vanilla_model,
            validation.check_vllm_version,
            validation.check_sglang_lora,
        ),
        ("tests/test_config.py", "tests/test_cluster_rules.py", "tests/test_cli.py"),
    ),
    RuleEntry(
        "P7",
        "an engine's mesh replaces the rollout mesh",
        (rollout.p7_engine_mesh,),
        ("tests/test_cluster_rules.py", "tests/test_cluster_matrix.py"),
    ),
    RuleEntry("P8", "the anchor snapshot", (anchor.p8_anchor,), ("tests/test_cluster_rules.py", "tests/test_sync.py")),
    RuleEntry("P9", "generate", (steps.p9_check_prompts,), ("tests/test_cluster_rules.py",)),
    RuleEntry(
        "P10",
        "per-token log-probs from the anchor",
        (anchor.p10_require_anchor,),
        ("tests/test_cluster_rules.py", "tests/test_learner.py"),
    ),
    RuleEntry(
        "P11",
        "why the anchor",
        (),
        ("tests/test_learner.py",),
        note="Stated in P10's function: the learner's probe measures it (live vs anchor vs sampler).",
    ),
    RuleEntry(
        "P12",
        "the actor's and the critic's optimizer steps",
        (steps.p12_trainable, steps.p12_critic_trainable),
        ("tests/test_cluster_rules.py", "tests/test_learner.py", "tests/test_critic.py"),
    ),
    RuleEntry(
        "P13",
        "the weight sync",
        (steps.p13_sync, steps.p13_sync_guarded),
        ("tests/test_sync.py", "tests/test_cluster_rules.py"),
    ),
    RuleEntry(
        "P14",
        "offload",
        (loading.p14_offload, loading.p14_own_copy_engine, loading.p14_updated_together),
        ("tests/test_cluster_rules.py", "tests/test_sync.py"),
    ),
    RuleEntry(
        "P15",
        "names",
        (),
        ("tests/test_cluster_rules.py",),
        note="`RLCluster` and `RLEngine` name the same class (`rlcluster_lab.cluster.cluster`).",
    ),
)

# What the lab adds to the cluster: records and measurements, not placement decisions.
LAB_RULES: tuple[RuleEntry, ...] = (
    RuleEntry(
        "L1",
        "the decision trace",
        (),
        ("tests/test_cluster_rules.py", "tests/test_viz.py", "tests/test_panels.py"),
        note="Every rule function above returns a `Decision` (rule id, typed branch, the values it read, "
        "a one-line outcome); the cluster and the planner append each one to their `Trace` "
        "(`core.trace`) in the order taken, and the figures draw the branch.",
    ),
    RuleEntry(
        "L2",
        "memory per role",
        (),
        ("tests/test_measure.py", "tests/test_plan.py"),
        note="`measure.memory` walks the live buffers: bytes per role, per device, per memory kind, a "
        "buffer several roles hold counted once with the roles that share it named, and the device "
        "allocator's own figures where the backend reports them.",
    ),
    RuleEntry(
        "L3",
        "the measured sync",
        (),
        ("tests/test_sync.py", "tests/test_measure.py", "tests/test_reshard.py"),
        note="`measure.sync` observes a sync: per leaf and in total, bytes synced, bytes that crossed "
        "devices (read from the transfer log or the compiled program's collectives), bytes copied "
        "within a device, buffers reused, seconds, against the minimum this placement allows.",
    ),
    RuleEntry(
        "L4",
        "what-if planning",
        (),
        ("tests/test_plan.py",),
        note="`planner` runs the cluster's own construction (`cluster.construct`) on arrays that have a "
        "shape, a dtype and a sharding only, for any model size and topology; at the lab's sizes the "
        "tests compare every figure with a live cluster's.",
    ),
)


def rules_markdown() -> str:
    """The rules as Markdown: each rule's statement, its functions' docstrings and its tests."""
    lines = [
        "# The rules",
        "",
        "P1-P15 are the placement rules of the RL cluster; L1-L4 what the lab adds to see and measure them.",
        "",
        "Generated from `src/rlcluster_lab/rules/` by `python -m rlcluster_lab.rules > docs/rules.md`;",
        "a test checks this file is what the code says. Each rule is one or more pure functions that",
        "return a typed decision; the cluster and the planner both call them.",
        "",
    ]
    for entry in RULES + LAB_RULES:
        lines += [f"## {entry.rule}: {entry.title}", ""]
        for fn in entry.functions:
            doc = inspect.cleandoc(fn.__doc__ or "")
            body = "\n".join(line for line in doc.splitlines() if not line.startswith("Tests:")).strip()
            lines += [f"`{fn.__module__}.{fn.__qualname__}`", "", body, ""]
        if entry.note:
            lines += [entry.note, ""]
        lines += ["Tests: " + ", ".join(f"`{t}`" for t in entry.tests), ""]
    return "\n".join(lines).rstrip() + "\n"
