"""The rules layer: one home per rule, executed by both the cluster and the planner."""

from __future__ import annotations

import dataclasses
import fnmatch
import pathlib
import re

import jax
import pytest

from rlcluster_lab import Scenario, build_cluster
from rlcluster_lab.core.trace import Decision, jsonable, seen
from rlcluster_lab.lab.figures.flow import OPTION_LABELS, flow_rows
from rlcluster_lab.planner.plan import plan_scenario
from rlcluster_lab.planner.tables import local_topology
from rlcluster_lab.rules import LAB_RULES, RULES, find_rule, rule, rules_markdown, sharing
from rlcluster_lab.rules.sharing import LinkBranch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_docs_rules_md_is_what_the_code_says() -> None:
    """docs/rules.md is generated from the rule functions' docstrings; regenerate it with
    ``python -m rlcluster_lab.rules > docs/rules.md`` after changing a rule."""
    assert (ROOT / "docs" / "rules.md").read_text() == rules_markdown()


def test_every_rule_is_declared_once_with_functions_or_a_note() -> None:
    ids = [e.rule for e in RULES + LAB_RULES]
    assert ids == [f"P{i}" for i in range(1, 16)] + [f"L{i}" for i in range(1, 5)]
    for entry in RULES + LAB_RULES:
        assert entry.functions or entry.note, entry.rule
        for fn in entry.functions:
            assert fn.__doc__ and entry.rule in fn.__doc__.split(":")[0], (entry.rule, fn.__qualname__)


def _test_names(path: pathlib.Path) -> list[str]:
    return re.findall(r"^\s*(?:async\s+)?def (test_\w+)", path.read_text(), flags=re.MULTILINE)


@pytest.mark.parametrize("entry", RULES + LAB_RULES, ids=lambda e: e.rule)
def test_each_rules_declared_tests_exist(entry) -> None:
    """A declared ``file::pattern`` names at least one test of that file, so the list cannot
    drift from the tests (a renamed test fails here)."""
    for test in entry.tests:
        path, _, pattern = test.partition("::")
        assert (ROOT / path).is_file(), test
        if pattern:
            assert fnmatch.filter(_test_names(ROOT / path), pattern), f"{entry.rule}: no test matches {test}"


def test_a_rules_tests_are_declared_beside_it_not_in_docstrings() -> None:
    for entry in RULES:
        for fn in entry.functions:
            assert "Tests:" not in (fn.__doc__ or ""), (entry.rule, fn.__qualname__)


def test_a_rule_cannot_be_declared_twice() -> None:
    with pytest.raises(ValueError, match="P3 is declared twice"):
        rule("P3", "again", tests=("tests/test_cluster_rules.py",))


def test_a_rule_without_tests_is_refused() -> None:
    with pytest.raises(ValueError, match="names no tests"):
        rule("P99", "untested", tests=())


def test_find_rule_names_the_rules_there_are() -> None:
    assert find_rule("P3").title == "the rollout model"
    with pytest.raises(ValueError, match="unknown rule 'P99'"):
        find_rule("P99")


def test_flow_questions_and_labels_are_the_rules_declarations() -> None:
    """The flow figure asks each rule's declared question and draws its declared answers, in
    order; the labels the figures write are the declared ones."""
    report = {
        "decisions": [
            {"rule": "P3", "test": "", "values": {}, "outcome": "x", "branch": "second_copy"},
            {"rule": "P7", "test": "", "values": {"engine": "vanilla"}, "outcome": "x", "branch": "kept"},
        ]
    }
    rows = {row.key: row for row in flow_rows(report)}
    for key in ("P3", "P4", "P7", "P14"):
        declared = find_rule(key)
        assert (rows[key].question, rows[key].options) == (declared.question, declared.values())
    assert rows["P3"].fired == "second_copy"
    assert OPTION_LABELS["second_copy"] == find_rule("P3").labels()["second_copy"] == "second copy"
    assert OPTION_LABELS["kept"] == "rollout mesh kept"


@pytest.mark.cluster
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


@pytest.mark.cluster
@pytest.mark.parametrize(
    "scenario",
    [
        Scenario(layout="reshaped", lora=True, offload=True, with_critic=True),
        Scenario(layout="colocated", engine="vllm", lora=True, offload=True),
    ],
    ids=["reshaped-offload-critic", "colocated-vllm-offload"],
)
def test_l1_every_decision_records_its_rules_typed_values_and_reads_them_back(scenario) -> None:
    """Each rule function's decision carries a frozen dataclass of what it read (the engine's own
    P6 facts excepted: each engine names its own), its JSON is the fields in order, and a report's
    JSON reads back into the same record (``seen``), as the figures read it."""
    cluster = build_cluster(scenario, devices=jax.devices())
    cluster.sync_weights()
    kinds = set()
    for d in cluster.trace:
        if d.rule == "P6" and d.test.endswith("engine accepts the actor and rollout config"):
            assert isinstance(d.values, dict)
            continue
        kind = type(d.values)
        assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen, (d.rule, kind)
        reported = d.to_json()
        assert list(reported["values"]) == [f.name for f in dataclasses.fields(kind)]
        assert jsonable(seen(reported, kind)) == reported["values"]
        kinds.add(kind.__name__)
    assert {"P1Values", "P2LinkValues", "P2PropagationValues", "P5Values", "P7Values", "P13Values"} <= kinds


@pytest.mark.parametrize("layout, critic", [("colocated", False), ("reshaped", False), ("split", True)])
@pytest.mark.cluster
def test_cluster_and_plan_take_the_same_decisions_in_the_same_order(layout: str, critic: bool) -> None:
    scenario = Scenario(layout=layout, lora=True, with_critic=critic)
    cluster = build_cluster(scenario, devices=jax.devices())
    plan = plan_scenario(scenario, local_topology())
    live = [(d.rule, d.branch.value if d.branch else None) for d in cluster.trace if d.rule != "P6"]
    paper = [(d["rule"], d["branch"]) for d in plan.decisions]
    assert live == paper
    # With a critic both construct its optimizer (a second P12), after the actor's.
    assert [r for r, _ in live].count("P12") == (2 if critic else 1)
