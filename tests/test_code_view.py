"""Code beside the decision: every decision a cluster records leads back to the one rule
function that wrote it, shown without its docstring, with the inputs it read."""

from __future__ import annotations

import pathlib
import re

import pytest

import rlcluster_lab as rl
from rlcluster_lab.lab.code_view import _test_patterns, rule_function, show_rule
from rlcluster_lab.rules import RULES, find_rule

pytestmark = pytest.mark.cluster  # each test reads the decisions of a live cluster


@pytest.fixture(scope="module")
def split_lora():
    cluster = rl.build_cluster(rl.Scenario(layout="split", lora=True, engine="vllm"))
    cluster.sync_weights()
    return cluster


def test_every_recorded_decision_finds_its_function(split_lora):
    by_rule = {e.rule: e.functions for e in RULES}
    seen = set()
    for decision in split_lora.trace:
        fn = rule_function(decision.rule, decision)
        assert fn in by_rule[decision.rule]
        # Exactly one function of the rule can write this test: the match is not a guess.
        matching = [
            f
            for f in by_rule[decision.rule]
            if any(re.fullmatch(p, decision.test, flags=re.DOTALL) for p in _test_patterns(f))
        ]
        assert matching == [fn], (decision.rule, decision.test)
        seen.add(decision.rule)
    assert {"P1", "P2", "P3", "P4", "P5", "P7", "P8", "P13"} <= seen


def test_shown_code_is_the_function_without_its_docstring(split_lora):
    code = show_rule(split_lora, "P3")
    assert code.function == "rlcluster_lab.rules.rollout.p3_rollout_model"
    assert code.source.startswith("def p3_rollout_model(")
    assert "Tests:" not in code.source and '"""' not in code.source
    assert code.decision is not None and code.decision["branch"] == "engine_initial_value"
    text = code.text()
    assert "read  engine = 'vllm'" in text and "branch  'engine_initial_value'" in text
    assert "<table" in code._repr_html_()


def test_shown_code_starts_at_its_def_line_under_the_rules_declared_title():
    code = show_rule(None, "P3")
    source = pathlib.Path(rl.__file__).parent.joinpath(code.path.removeprefix("rlcluster_lab/")).read_text()
    assert source.splitlines()[code.first_line - 1].startswith("def p3_rollout_model(")
    assert code.title == find_rule("P3").title
    assert code.text().startswith(f"# P3 ({find_rule('P3').title}): ")


def test_which_and_where_select_a_decision(split_lora):
    actor = show_rule(split_lora, "P5", where={"role": "actor"})
    assert actor.decision["values"]["role"] == "actor"
    assert show_rule(split_lora, "P13").function.endswith("p13_sync")


def test_bad_requests_say_what_to_do(split_lora):
    with pytest.raises(ValueError, match="unknown rule 'P99'"):
        show_rule(split_lora, "P99")
    with pytest.raises(ValueError, match="no function of its own"):
        show_rule(split_lora, "P15")
    with pytest.raises(ValueError, match="out of range"):
        show_rule(split_lora, "P1", which=5)
    assert show_rule(None, "P1").decision is None
