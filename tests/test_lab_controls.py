"""The lab's knobs name their rules and say when they do not apply; a construction says what changed."""

from __future__ import annotations

import re

import jax
import pytest

from rlcluster_lab.core.knobs import KNOBS
from rlcluster_lab.lab.controls import TOOLTIPS, Knobs
from rlcluster_lab.lab.display import changes_html, changes_since


@pytest.fixture
def knobs() -> Knobs:
    return Knobs(jax.devices()[:8])


def test_every_knob_has_a_tooltip_and_rule_knobs_name_their_rule(knobs):
    named = knobs.named()
    assert set(TOOLTIPS) == set(named)
    for name, knob in named.items():
        assert re.search(r"\b[PL]\d+\b", knob.tooltip), name


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
    assert knobs.static_lora.disabled and "sglang_jax" in knobs.static_lora.tooltip
    knobs.lora.value = True
    assert not knobs.lora_rank.disabled and not knobs.anchor.disabled
    assert knobs.static_lora.disabled  # still vanilla
    knobs.engine.value = "sglang_jax"
    assert not knobs.static_lora.disabled and "not used now" not in knobs.static_lora.tooltip
    knobs.lora.value = False
    assert knobs.static_lora.disabled and knobs.lora_rank.disabled


def report(branch: str, unique: int, rollout: int, extra: bool = False) -> dict:
    decisions = [
        {"rule": "P1", "test": "actor == rollout", "outcome": "linked", "branch": "linked"},
        {"rule": "P3", "test": "rollout model", "outcome": "x", "branch": branch},
    ]
    if extra:
        decisions.append({"rule": "P4", "test": "reference backbone", "outcome": "shared", "branch": "shared"})
    return {"decisions": decisions, "memory": {"unique_bytes": unique, "by_role": {"rollout": {"bytes": rollout}}}}


def test_changes_since_the_last_construction():
    assert changes_since(None, report("shared", 10, 5)) == []
    assert changes_since(report("shared", 10, 5), report("shared", 10, 5)) == []
    lines = changes_since(report("shared", 1000, 5), report("second_copy", 2000, 5, extra=True))
    assert lines == [
        "P3 rollout model: shared -> second_copy",
        "P4 now: reference backbone",
        "bytes held (each buffer once): 1,000 -> 2,000",
    ]
    assert "changed since the last construction" in changes_html(lines)
    assert changes_html([]) == ""
