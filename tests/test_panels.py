"""The lab's SVG figures: pure functions of a report, every number drawn is the report's."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from rlcluster_lab import Scenario, build_cluster, placement_report
from rlcluster_lab.lab import panels
from rlcluster_lab.lab.figures import HIGHLIGHT

NS = "{http://www.w3.org/2000/svg}"


def _elements(svg: str) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    assert root.tag == NS + "svg"
    return {el.get("id"): el for el in root.iter() if el.get("id")}


def _bytes(els: dict[str, ET.Element], prefix: str) -> int:
    return sum(int(el.get("data-bytes", 0)) for key, el in els.items() if key.startswith(prefix))


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    out = {}
    for name, scenario in {
        "colocated-lora": Scenario(lora=True, with_reward=True),
        "reshaped-vllm": Scenario(layout="reshaped", engine="vllm"),
        "split-offload": Scenario(layout="split", lora=True, offload=True),
    }.items():
        cluster = build_cluster(scenario)
        out[name] = placement_report(cluster, sync=cluster.sync_weights()).to_json()
    return out


def test_l1_flow_highlights_the_branch_each_rule_took_in_trace_order(reports):
    report = reports["colocated-lora"]
    els = _elements(panels.decision_flow(report))
    assert els["P3:shared"].get("fill") == HIGHLIGHT and els["P3:second_copy"].get("fill") != HIGHLIGHT
    assert els["P2:linked"].get("fill") == HIGHLIGHT and els["P12:LoRA params"].get("fill") == HIGHLIGHT
    # Arrows from a decision to the ones that read it.
    assert {"link:P1:P3", "link:P2:P4", "link:P12:P13"} <= set(els)
    # Rows in the trace's order: P1 is decided before P3, P3 before P7.
    ys = {
        rule: float(els[f"{rule}:{opt}"].get("y"))
        for rule, opt in (("P1", "linked"), ("P3", "shared"), ("P7", "kept"), ("P13", "LoRA params"))
    }
    assert ys["P1"] < ys["P3"] < ys["P7"] < ys["P13"]
    other = _elements(panels.decision_flow(reports["reshaped-vllm"]))
    assert other["P3:engine_initial_value"].get("fill") == HIGHLIGHT
    assert other["P7:replaced"].get("fill") == HIGHLIGHT


def test_grid_hatches_a_role_that_computes_with_the_actors_buffers(reports):
    shared = _elements(panels.device_grid(reports["colocated-lora"]))
    assert shared["cell:rollout:0"].get("fill").startswith("url(#hatch")
    assert shared["cell:reference:0"].get("fill").startswith("url(#hatch")
    assert not shared["cell:reward:0"].get("fill").startswith("url(")
    copied = _elements(panels.device_grid(reports["reshaped-vllm"]))
    assert not copied["cell:rollout:0"].get("fill").startswith("url(")
    # P7: the mesh the config asked for, dashed on its own row.
    assert copied["cell:rollout (config):0"].get("stroke-dasharray")


@pytest.mark.parametrize("name", ["colocated-lora", "reshaped-vllm", "split-offload"])
def test_l2_memory_by_device_draws_every_buffer_once(reports, name):
    memory = reports[name]["memory"]
    els = _elements(panels.memory_by_device(memory))
    for dev, kinds in memory["by_device"].items():
        for kind, held in kinds.items():
            assert _bytes(els, f"seg:{dev}:{kind}:") == held, (dev, kind)
            naive = sum(r["by_device"].get(dev, {}).get(kind, 0) for r in memory["by_role"].values())
            assert int(els.get(f"naive:{dev}:{kind}", ET.Element("x")).get("data-bytes", 0)) == naive - held


@pytest.mark.parametrize("name", ["colocated-lora", "split-offload"])
def test_l2_memory_by_role_splits_own_and_shared(reports, name):
    memory = reports[name]["memory"]
    els = _elements(panels.memory_by_role(memory))
    for role, entry in memory["by_role"].items():
        assert _bytes(els, f"seg:role:{role}:") == entry["bytes"], role
    # A LoRA reference's backbone is the actor's buffers in both cases.
    shared = sum(g["bytes"] for g in memory["shared"] if "reference" in g["roles"])
    assert int(els["seg:role:reference:shared"].get("data-bytes")) == shared > 0


@pytest.mark.parametrize("name", ["colocated-lora", "reshaped-vllm", "split-offload"])
def test_l3_sync_panel_numbers_are_the_reports(reports, name):
    sync = reports[name]["sync"]
    els = _elements(panels.sync_bytes(sync))
    label = ("LoRA" if sync["lora"] else "full") + " sync"
    assert _bytes(els, f"seg:sync:{label}:") == sync["synced_bytes"]
    assert _bytes(els, f"seg:cross:{label}:") == sync["moved_cross_device_bytes"]
    assert _bytes(els, f"seg:cross:{label}:relayed") == sync["relayed_cross_device_bytes"]
    if name == "reshaped-vllm":
        assert sync["relayed_cross_device_bytes"] > 0  # XLA's two hops onto the engine's mesh


def test_svg_displays_in_a_notebook():
    svg = panels.sync_bytes({"synced_bytes": 0, "lora": False})
    assert svg._repr_svg_().startswith("<svg")
