"""What the lab writes agrees with itself: a formula the notebooks state is the one the reports
compute, a figure's excess is named by the ledger's own figure, and (over drawn configurations,
``cluster``) every sentence about a figure agrees with the figure drawn beside it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from stored_reports import PLACEMENTS, stored

from rlcluster_lab.lab.what_if import agrees

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

# ------------------------------------------------------------------ the sync's ledger


def _formula(row: str) -> list[tuple[int, str]]:
    """The bold names of a table row's formula with their signs: ``**a** − **b** + **c**``."""
    terms = re.findall(r"([+−-])?\s*\*\*(\w+)\*\*", row.split("|")[2])
    return [(-1 if sign in ("−", "-") else 1, name) for sign, name in terms]


def test_l3_notebook_05s_formula_for_synced_is_the_one_every_sync_report_adds_up_to():
    text = (NOTEBOOKS / "05_sync_weights.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| **synced** |"))
    terms = _formula(row)
    named = {name for line in text.splitlines() for name in re.findall(r"^\| \*\*(\w+)\*\* \|", line)}
    assert {name for _, name in terms} <= named, f"a term of {row!r} has no row of its own in the table"
    keys = {
        "moved": "moved_cross_device_bytes",
        "relayed": "relayed_cross_device_bytes",
        "copied": "copied_same_device_bytes",
        "reused": "reused_bytes",
    }
    checked = 0
    for name in PLACEMENTS:
        sync = stored(name).get("sync")
        if not sync:
            continue
        for part in [sync, *sync["leaves"]]:
            said = sum(sign * int(part[keys[term]]) for sign, term in terms)
            assert said == part["synced_bytes"], (name, part.get("path", "total"), row)
            checked += 1
    assert checked


@pytest.mark.parametrize("name", ["colocated-vllm", "custom-lora-chunked"])
def test_l4_the_excess_over_the_plan_names_the_syncs_own_relayed_bytes(name):
    # The plan moves the least the placement forces; a measured sync above it says how much of
    # the excess it relayed, by the report's own figure, and the rest arrived beyond the least.
    sync = stored(name)["sync"]
    planned, measured = sync["minimum_cross_device_bytes"], sync["moved_cross_device_bytes"]
    relayed = sync["relayed_cross_device_bytes"]
    said = agrees(planned, measured, ">=", relayed)

    def figure(words: str) -> int:
        found = re.search(rf"(\d[\d,]*) {words}", said)
        return int(found.group(1).replace(",", "")) if found else 0

    assert said.startswith(f"yes, +{measured - planned:,}")
    assert figure("relayed") == relayed > 0, said
    assert figure("relayed") + figure("more arrived than the least") == measured - planned, said


# ------------------------------------------------------------------ the notebooks' prose


def test_notebook_04_explains_the_engines_context_entry_against_the_reference():
    # The construction table shows the rollout's context entered to build the (vanilla) engine;
    # the prose says whose entry that is: the reference builds the vanilla sampler outside any
    # role's context.
    text = (NOTEBOOKS / "04_anchor_policy_state.md").read_text()
    shown = (NOTEBOOKS / "04_anchor_policy_state.ipynb").read_text()
    assert "construct: engine" in shown
    paragraphs = [p for p in text.split("\n\n") if "`construct: engine`" in p]
    assert paragraphs, "the construction table's engine entry is not named in the prose"
    said = " ".join(" ".join(paragraphs).split())
    assert "vanilla" in said and "reference builds the vanilla sampler outside any role's context" in said
