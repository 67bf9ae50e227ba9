"""The rules layer: one home per rule, executed by both the cluster and the planner."""

from __future__ import annotations

import pathlib

import jax
import pytest

from rlcluster_lab import Scenario, build_cluster
from rlcluster_lab.core.trace import Decision
from rlcluster_lab.planner.plan import plan_scenario
from rlcluster_lab.planner.tables import local_topology
from rlcluster_lab.rules import LAB_RULES, RULES, rules_markdown, sharing
from rlcluster_lab.rules.sharing import LinkBranch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_docs_rules_md_is_what_the_code_says() -> None:
    """docs/rules.md is generated from the rule functions' docstrings; regenerate it with
    ``python -m rlcluster_lab.rules > docs/rules.md`` after changing a rule."""
    assert (ROOT / "docs" / "rules.md").read_text() == rules_markdown()


def test_every_rule_has_one_entry_and_its_tests_exist() -> None:
    ids = [e.rule for e in RULES + LAB_RULES]
    assert ids == [f"P{i}" for i in range(1, 16)] + [f"L{i}" for i in range(1, 5)]
    for entry in RULES + LAB_RULES:
        assert entry.functions or entry.note, entry.rule
        for fn in entry.functions:
            assert fn.__doc__ and entry.rule in fn.__doc__.split(":")[0], (entry.rule, fn.__qualname__)
        for test in entry.tests:
            assert (ROOT / test).exists(), test


def test_changing_a_rule_function_changes_the_cluster_and_the_planner(monkeypatch) -> None:
    """Both execute the same P1 function: make it refuse every link, and the colocated layout
    (one mesh, normally shared) becomes a second copy in the live cluster and in the plan."""
    scenario = Scenario(layout="colocated")
    devices = jax.devices()
    topology = local_topology()
    before_plan = plan_scenario(scenario, topology)
    assert before_plan.rollout_branch == "shared"

    def never_linked(actor_mesh, rollout_mesh) -> Decision:
        return Decision("P1", "patched: never link", {}, "not linked", LinkBranch.NOT_LINKED)

    monkeypatch.setattr(sharing, "p1_link_actor_rollout", never_linked)
    cluster = build_cluster(scenario, devices=devices)
    plan = plan_scenario(scenario, topology)
    assert cluster.rollout_branch == plan.rollout_branch == "second_copy"
    assert [d.branch for d in cluster.trace.by_rule("P1")] == [LinkBranch.NOT_LINKED]
    assert [d["branch"] for d in plan.decisions if d["rule"] == "P1"] == ["not linked"]
    # The plan's second copy costs what the live one does.
    assert plan.memory["by_role"]["rollout"]["bytes"] == plan.memory["by_role"]["actor"]["bytes"]


@pytest.mark.parametrize("layout, critic", [("colocated", False), ("reshaped", False), ("split", True)])
def test_cluster_and_plan_take_the_same_decisions_in_the_same_order(layout: str, critic: bool) -> None:
    scenario = Scenario(layout=layout, lora=True, with_critic=critic)
    cluster = build_cluster(scenario, devices=jax.devices())
    plan = plan_scenario(scenario, local_topology())
    live = [(d.rule, d.branch.value if d.branch else None) for d in cluster.trace if d.rule != "P6"]
    paper = [(d["rule"], d["branch"]) for d in plan.decisions]
    assert live == paper
    # With a critic both construct its optimizer (a second P12), after the actor's.
    assert [r for r, _ in live].count("P12") == (2 if critic else 1)
