"""Figures of measured memory (L2), drawn from stored reports and from a hand-built one: every
buffer drawn once, each bar's bytes the report's."""

from __future__ import annotations

import copy
import math

import pytest
from legibility import svg_problems
from stored_reports import PLACEMENTS, drawn_bytes, elements, is_hatched, stored, svg_text

from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.lab.figures.memory import memory_by_device, memory_by_role
from rlcluster_lab.lab.figures.style import byte_ticks

# Per the report contract: an actor and a reference sharing 750 B, an anchor in pinned host memory.
MEMORY = {
    "units": "physical bytes",
    "source": "measured: walk of live buffers",
    "by_role": {
        "actor": {
            "bytes": 1000,
            "by_kind": {"device": 1000},
            "by_device": {"0": {"device": 600}, "1": {"device": 400}},
        },
        "reference": {
            "bytes": 900,
            "by_kind": {"device": 900},
            "by_device": {"0": {"device": 500}, "1": {"device": 400}},
        },
        "anchor": {
            "bytes": 1000,
            "by_kind": {"pinned_host": 1000},
            "by_device": {"0": {"pinned_host": 600}, "1": {"pinned_host": 400}},
        },
    },
    "by_device": {"0": {"device": 700, "pinned_host": 600}, "1": {"device": 450, "pinned_host": 400}},
    "shared": [
        {
            "roles": ["actor", "reference"],
            "bytes": 750,
            "buffers": 6,
            "by_device": {"0": {"device": 400}, "1": {"device": 350}},
        }
    ],
    "unique_bytes": 2150,
    "naive_bytes": 2900,
    "allocator": {"available": False, "note": "the CPU backend has no allocator statistics", "by_device": {}},
}


def _with_allocator() -> dict:
    memory = copy.deepcopy(MEMORY)
    memory["allocator"] = {
        "available": True,
        "note": "",
        "by_device": {"0": {"bytes_in_use": 2000}, "1": {"bytes_in_use": 1500}},
    }
    return memory


# ------------------------------------------------------------------ per device


@pytest.mark.parametrize("name", ["colocated-lora", "reshaped-vllm", "split-offload"])
def test_l2_memory_by_device_stacks_are_the_reports_bytes_per_device(name):
    memory = stored(name)["memory"]
    els = elements(memory_by_device(memory))
    for dev, kinds in memory["by_device"].items():
        for kind, held in kinds.items():
            assert drawn_bytes(els, f"seg:{dev}:{kind}:") == held, (dev, kind)
            naive = sum(r["by_device"].get(dev, {}).get(kind, 0) for r in memory["by_role"].values())
            assert drawn_bytes(els, f"naive:{dev}:{kind}") == naive - held, (dev, kind)


def test_l2_memory_by_device_draws_buffers_two_roles_share_as_one_hatched_segment():
    els = elements(memory_by_device(MEMORY))
    groups = [key for key in els if key.startswith("seg:0:device:") and "+" in key]
    assert groups == ["seg:0:device:actor+reference"] and is_hatched(els[groups[0]])
    assert int(els[groups[0]].get("data-bytes")) == 400
    # The actor's own part is what only it holds: 600 on device 0, less the 400 it shares.
    assert int(els["seg:0:device:actor"].get("data-bytes")) == 200
    # The dashed box is what separate copies would add: naive - held.
    assert {key: int(el.get("data-bytes")) for key, el in els.items() if key.startswith("naive:")} == {
        "naive:0:device": 500 + 600 - 700,
        "naive:1:device": 400 + 400 - 450,
    }
    text = svg_text(memory_by_device(MEMORY))
    assert "physical bytes" in text and "no allocator statistics" in text


def test_l2_memory_by_device_marks_the_allocators_bytes_in_use_where_the_backend_has_them():
    assert not any(key.startswith("alloc:") for key in elements(memory_by_device(MEMORY)))
    els = elements(memory_by_device(_with_allocator()))
    assert {key: int(el.get("data-bytes")) for key, el in els.items() if key.startswith("alloc:")} == {
        "alloc:0": 2000,
        "alloc:1": 1500,
    }
    said = svg_text(memory_by_device(_with_allocator()))
    assert "allocator (the black tick): dev 0: 2.0 KiB in use beside 700 B per role; dev 1: 1.5 KiB in use" in said


def _tick_labels(svg: str) -> list[str]:
    """The axis' tick labels, bottom to top."""
    ticks = {float(key[5:]): el.text for key, el in elements(svg).items() if key.startswith("tick:")}
    return [ticks[v] for v in sorted(ticks)]


@pytest.mark.parametrize("name", PLACEMENTS)
def test_l2_memory_by_device_ticks_are_round_values_in_one_unit(name):
    memory = stored(name)["memory"]
    labels = _tick_labels(memory_by_device(memory))
    assert labels[0] == "0" and 3 <= len(labels) <= 5, labels
    values = [float(label.split()[0]) for label in labels[1:]]
    units = {label.split()[1] for label in labels[1:]}
    assert len(units) == 1, labels
    step = values[0]
    # Steps of 1, 2, 2.5 or 5 times a power of ten, evenly spaced.
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5)), labels
    assert all(math.isclose(v, step * (k + 1)) for k, v in enumerate(values)), labels


def test_byte_ticks_of_the_offload_chart_the_issue_shows():
    # The axis the issue saw at 130.3 / 260.5 KiB.
    assert [label for _, label in byte_ticks(266_752)] == ["0", "100 KiB", "200 KiB", "300 KiB"]
    assert byte_ticks(266_752)[-1][0] >= 266_752


def test_l2_memory_by_device_legend_says_one_dotted_bar_per_device_when_all_is_pinned_host():
    # With offload every role waits in pinned host memory: one bar per device, all dotted.
    memory = stored("split-offload")["memory"]
    assert {k for kinds in memory["by_device"].values() for k in kinds} == {"pinned_host"}
    text = svg_text(memory_by_device(memory))
    assert "dotted: pinned host memory (every bar)" in text
    assert "right" not in text and "bars per device" not in text


def test_l2_memory_by_device_legend_names_both_bars_when_two_kinds_are_drawn():
    text = svg_text(memory_by_device(MEMORY))
    assert "2 bars per device: device memory (solid, left), pinned host (dotted, right)" in text


def test_l2_memory_by_device_legend_has_no_dashed_entry_without_a_dashed_box():
    memory = copy.deepcopy(MEMORY)
    memory["shared"] = []  # nothing shared: separate copies would add nothing, no dashed box
    memory["by_device"] = {"0": {"device": 1100, "pinned_host": 600}, "1": {"device": 800, "pinned_host": 400}}
    svg = memory_by_device(memory)
    assert not any(key.startswith("naive:") for key in elements(svg))
    assert "dashed" not in svg_text(svg)
    assert "dashed: what separate copies would add" in svg_text(memory_by_device(MEMORY))


# ------------------------------------------------------------------ per role


def test_l2_memory_by_role_draws_a_shared_buffer_once_in_its_first_holders_bar():
    els = elements(memory_by_role(MEMORY))
    bars = {key: int(el.get("data-bytes")) for key, el in els.items() if key.startswith("seg:role:")}
    # The actor holds the shared 750 B first: solid in its bar; in the reference's bar the same
    # 750 B are hatched as the actor's buffers, after the 150 B only the reference holds.
    assert bars == {
        "seg:role:actor:held:device": 1000,
        "seg:role:reference:held:device": 150,
        "seg:role:reference:same:actor": 750,
        "seg:role:anchor:held:pinned_host": 1000,
    }
    own, same = els["seg:role:reference:held:device"], els["seg:role:reference:same:actor"]
    assert is_hatched(same) and not is_hatched(own)
    assert float(same.get("x")) == pytest.approx(float(own.get("x")) + float(own.get("width")), abs=0.1)
    assert sum(v for key, v in bars.items() if ":held:" in key) == MEMORY["unique_bytes"]
    assert sum(bars.values()) == MEMORY["naive_bytes"]
    text = svg_text(memory_by_role(MEMORY))
    assert "750 B = the actor's buffers" in text and "also held by reference (750 B)" in text
    # The heading's sums are the counted parts as drawn: solid (device) 1000 + 150, dotted (pinned) 1000.
    assert "physical bytes" in text and "2.1 KiB held" in text
    assert "solid bars (device memory) add up to 1.1 KiB; dotted bars (pinned host) add up to 1000 B" in text


@pytest.mark.parametrize("name", ["colocated-lora", "reshaped-lora", "split-offload"])
def test_p4_memory_by_role_hatches_a_lora_references_backbone_as_the_actors(name):
    memory = stored(name)["memory"]
    els = elements(memory_by_role(memory))
    for role, entry in memory["by_role"].items():
        assert drawn_bytes(els, f"seg:role:{role}:") == entry["bytes"], role
    # Solid: counted once, in the first holder's bar; the solid segments add up to what is held.
    assert sum(int(el.get("data-bytes")) for key, el in els.items() if ":held:" in key) == memory["unique_bytes"]
    shared = sum(g["bytes"] for g in memory["shared"] if "reference" in g["roles"] and g["roles"][0] == "actor")
    same = els["seg:role:reference:same:actor"]
    assert int(same.get("data-bytes")) == shared > 0 and is_hatched(same)


# ------------------------------------------------------------------ legibility


@pytest.mark.parametrize("name", PLACEMENTS)
def test_memory_figures_of_every_stored_report_are_legible_at_their_width(name):
    memory = stored(name)["memory"]
    assert svg_problems(memory_by_device(memory)) == []
    assert svg_problems(memory_by_role(memory)) == []


def test_memory_figures_of_a_hand_built_report_are_legible_at_their_width():
    for memory in (MEMORY, _with_allocator()):
        assert svg_problems(memory_by_device(memory)) == []
        assert svg_problems(memory_by_role(memory)) == []


def test_fmt_bytes_writes_binary_units():
    assert fmt_bytes(0) == "0 B"
    assert fmt_bytes(1023) == "1023 B"
    assert fmt_bytes(534528) == "522.0 KiB"
    assert fmt_bytes(3 * 1024**3) == "3.0 GiB"
