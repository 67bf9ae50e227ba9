"""Every rule, in order, as its module declared it (``rules.registry``), with the rules that have
no function of their own: P15, which names the cluster's class, and L1 to L4, what the lab adds.
``rules_markdown()`` renders it as ``docs/rules.md``, which a test holds to the code."""

from __future__ import annotations

import inspect

# Imported for their declarations: each module declares its rules as it is imported.
from rlcluster_lab.rules import anchor, loading, reference, rollout, sharing, steps, validation  # noqa: F401
from rlcluster_lab.rules.registry import REFERENCE, Locator, Rule, declared, rule

rule(
    "P15",
    "names",
    tests=("tests/test_cluster_rules.py::test_p15_*",),
    note="`RLCluster` and `RLEngine` name the same class (`rlcluster_lab.rl_cluster`).",
    reference=(Locator("RLCluster", what="the class's name (an alias of it, where the file has one)"),),
)
rule(
    "L1",
    "the decision trace",
    tests=("tests/test_cluster_rules.py", "tests/test_placement_figures.py::test_l1_*"),
    note="Every rule function above returns a `Decision` (rule id, typed branch, the values it read, "
    "a one-line outcome); the cluster and the planner append each one to their `Trace` "
    "(`core.trace`) in the order taken, and the figures draw the branch.",
)
rule(
    "L2",
    "memory per role",
    tests=("tests/test_measure.py::test_l2_*", "tests/test_plan.py"),
    note="`measure.memory` walks the live buffers: bytes per role, per device, per memory kind, a "
    "buffer several roles hold counted once with the roles that share it named, and the device "
    "allocator's own figures where the backend reports them.",
)
rule(
    "L3",
    "the measured sync",
    tests=("tests/test_sync.py", "tests/test_measure.py", "tests/test_reshard.py"),
    note="`measure.sync` observes a sync: per leaf and in total, bytes synced, bytes that crossed "
    "devices (read from the transfer log or the compiled program's collectives), bytes copied "
    "within a device, buffers reused, seconds, against the minimum this placement allows.",
)
rule(
    "L4",
    "what-if planning",
    tests=("tests/test_plan.py::test_l4_*",),
    note="`planner` runs the cluster's own construction (`cluster.construct`) on arrays that have a "
    "shape, a dtype and a sharding only, for any model size and topology; at the lab's sizes the "
    "tests compare every figure with a live cluster's.",
)


def _in_order(prefix: str) -> tuple[Rule, ...]:
    return tuple(sorted((r for r in declared() if r.rule.startswith(prefix)), key=lambda r: int(r.rule[1:])))


# The placement rules of the RL cluster, P1 to P15.
RULES: tuple[Rule, ...] = _in_order("P")

# What the lab adds to the cluster: records and measurements, not placement decisions.
LAB_RULES: tuple[Rule, ...] = _in_order("L")


def find_rule(rule_id: str) -> Rule:
    """The declaration of ``rule_id`` (``"P3"``, ``"L1"``); a ``ValueError`` names the rules there are."""
    for entry in RULES + LAB_RULES:
        if entry.rule == rule_id:
            return entry
    raise ValueError(f"unknown rule {rule_id!r}: the rules are {', '.join(e.rule for e in RULES + LAB_RULES)}")


def rules_markdown() -> str:
    """The rules as Markdown: each rule's title, its functions' docstrings, the flow figure's
    question and answers, and its tests."""
    lines = [
        "# The rules",
        "",
        "P1-P15 are the placement rules of the RL cluster; L1-L4 what the lab adds to see and measure them.",
        "",
        "Generated from `src/rlcluster_lab/rules/` by `python -m rlcluster_lab.rules > docs/rules.md`;",
        "a test checks this file is what the code says. Each rule is declared once, beside its functions",
        "(`rules.registry.rule`): one or more pure functions that return a typed decision; the cluster and",
        "the planner both call them. `rlcluster_lab.lab.show_rule(source, rule, reference=True)` shows a",
        "rule's code beside the reference's own lines, read from the installed Tunix.",
        "",
    ]
    for entry in RULES + LAB_RULES:
        lines += [f"## {entry.rule}: {entry.title}", ""]
        for fn in entry.functions:
            lines += [f"`{fn.__module__}.{fn.__qualname__}`", "", inspect.cleandoc(fn.__doc__ or ""), ""]
        if entry.note:
            lines += [entry.note, ""]
        if entry.question:
            answers = ", ".join(a.label if a.label == a.value else f"{a.label} (`{a.value}`)" for a in entry.answers)
            lines += [f"Drawn in the decision flow as *{entry.question.format(role='each role')}*: {answers}.", ""]
        if entry.reference:
            where = "; ".join(f"`{loc.function}`" + (f" ({loc.what})" if loc.what else "") for loc in entry.reference)
            source = f"{REFERENCE.distribution} {REFERENCE.version}, `{REFERENCE.path}`"
            lines += [f"In the reference ({source}): {where}.", ""]
        lines += ["Tests: " + ", ".join(f"`{t}`" for t in entry.tests), ""]
    return "\n".join(lines).rstrip() + "\n"
