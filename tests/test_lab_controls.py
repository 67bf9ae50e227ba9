"""The lab's knobs name their rules and say when they do not apply; a construction says what changed."""

from __future__ import annotations

import re

import jax
import pytest
from stored_reports import stored

from rlcluster_lab.core.knobs import KNOBS
from rlcluster_lab.lab.figures.flow import changes_html, changes_since, decision_changes, flow_rows
from rlcluster_lab.lab.widget.controls import Knobs
from rlcluster_lab.rules.catalogue import RULES


@pytest.fixture
def knobs() -> Knobs:
    return Knobs(jax.devices()[:8])


def test_every_knob_has_a_tooltip_and_rule_knobs_name_their_rule(knobs):
    for field, widget in knobs.by_field().items():
        assert widget.tooltip.startswith(KNOBS[field].tooltip), field  # the schema's, maybe with why it is off
        assert re.search(r"\b[PL]\d+\b", widget.tooltip), field


def test_each_label_is_the_one_refusals_name(knobs):
    # core.knobs is the one table: an error names a widget by the label it has on screen.
    for field, widget in knobs.by_field().items():
        assert widget.description == KNOBS[field].label, field
        assert f"rl-{KNOBS[field].name}" in widget._dom_classes


def test_a_refusal_outlines_its_knobs_and_only_them(knobs):
    assert knobs.mark_at_fault(["lora", "engine", "devices"]) == ["lora", "engine"]  # no device-count knob here
    assert "rl-at-fault" in knobs.lora._dom_classes and "rl-at-fault" in knobs.engine._dom_classes
    assert knobs.mark_at_fault([]) == []
    assert not any("rl-at-fault" in w._dom_classes for w in knobs.named().values())


def test_a_disabled_knob_is_not_used(knobs):
    knobs.lora.value = True
    knobs.lora_separate_base.value = True
    assert knobs.scenario().lora_separate_base
    knobs.lora.value = False  # the separate-base box is disabled, its tick kept for later ...
    assert knobs.lora_separate_base.disabled and knobs.lora_separate_base.value
    assert not knobs.scenario().lora_separate_base  # ... and not read: no "needs --lora" refusal


def test_knobs_that_do_not_apply_are_disabled_with_the_reason(knobs):
    assert knobs.lora_rank.disabled and knobs.lora_separate_base.disabled and knobs.anchor.disabled
    assert "only with a LoRA actor" in knobs.lora_rank.tooltip
    assert knobs.sglang_static_lora.disabled and "sglang_jax" in knobs.sglang_static_lora.tooltip
    knobs.lora.value = True
    assert not knobs.lora_rank.disabled and not knobs.anchor.disabled
    assert knobs.sglang_static_lora.disabled  # still vanilla
    knobs.engine.value = "sglang_jax"
    assert not knobs.sglang_static_lora.disabled and "not used now" not in knobs.sglang_static_lora.tooltip
    knobs.lora.value = False
    assert knobs.sglang_static_lora.disabled and knobs.lora_rank.disabled


# Pairs of stored reports (tests/data/reports): one construction, then the next.
PAIRS = [
    ("split", "reshaped-lora"),
    ("split", "split-offload"),
    ("colocated-vllm", "split"),
    ("split", "colocated-vllm"),
    ("colocated-lora", "colocated-vllm-lora"),
    ("reshaped-lora", "reshaped-separate-base"),
]
DECLARED = {entry.rule: entry for entry in RULES}


def _label(rule: str, value: str) -> str:
    return DECLARED[rule].labels().get(value, value)


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=lambda p: p)
def test_l1_each_changed_line_says_the_decision_it_describes(first, second):
    before, after = stored(first), stored(second)
    old = {r.key: r for r in flow_rows(before)}
    new = {r.key: r for r in flow_rows(after)}
    changes = decision_changes(before, after)
    lines = changes_since(before, after)
    # One line per decision whose answer changed, and only those (the sync's P13 is not construction).
    differing = {
        k
        for k in old.keys() | new.keys()
        if not k.startswith("P13") and getattr(old.get(k), "fired", None) != getattr(new.get(k), "fired", None)
    }
    assert {c.key for c in changes} == differing and len(changes) == len(differing)
    expressions = {d["test"] for d in before["decisions"] + after["decisions"]}
    for change, line in zip(changes, lines):
        assert line == change.text()
        row = new.get(change.key) or old[change.key]
        # The figure's question and the rule's declared answer labels, never the rule's test expression.
        assert line.startswith(f"{row.question} ({change.rule}): ")
        assert not any(expr in line for expr in expressions), line
        if change.before is not None:
            assert old[change.key].fired == change.before
            assert _label(change.rule, change.before) in line
        if change.after is not None:
            assert new[change.key].fired == change.after
            assert f"\u2192 {_label(change.rule, change.after)}" in line or "now asked" in line
            assert new[change.key].detail in line
    assert "changed since the last construction" in changes_html(lines)


def test_l1_a_decision_that_kept_its_answer_gets_no_line():
    # split -> reshaped + LoRA: the rollout is resharded on both sides (P5), so no P5 line; P4
    # changed once, so one P4 line (the old list said "P4 now ... / P4 no longer ...").
    lines = changes_since(stored("split"), stored("reshaped-lora"))
    assert not any("(P5)" in line for line in lines)
    assert [line for line in lines if "(P4)" in line] == [
        "reference backbone (P4): own weights \u2192 one backbone (one backbone in memory), "
        "because reference linked: yes (P2)"
    ]


def test_p14_offload_change_reads_as_the_flow_figure_says_it():
    lines = changes_since(stored("split"), stored("split-offload"))
    assert "offload_to_cpu? (P14): stays on device \u2192 pinned host between uses" in "\n".join(lines)


def test_p3_change_names_its_reason_from_p1():
    lines = changes_since(stored("colocated-vllm"), stored("split"))
    p3 = next(line for line in lines if "(P3)" in line)
    assert "same object \u2192 second copy" in p3 and p3.endswith("because rollout linked: no (P1)")


def test_no_changes_for_the_first_construction_or_the_same_one():
    report = stored("split")
    assert changes_since(None, report) == []
    assert changes_since(report, stored("split")) == []
    assert changes_html([]) == ""
