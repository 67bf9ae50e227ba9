"""The lab's SVG figures: pure functions of a report, every number drawn is the report's."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from legibility import svg_problems

from rlcluster_lab import Scenario, build_cluster, placement_report
from rlcluster_lab.lab import panels
from rlcluster_lab.lab.figures import HIGHLIGHT
from rlcluster_lab.lab.style import fmt_bytes

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
        "colocated-vllm": Scenario(lora=True, engine="vllm"),
        "reshaped-lora": Scenario(layout="reshaped", lora=True),
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
    # Arrows from a decision to the ones that read it; P1 -> P7 only where the engine replaced the mesh.
    assert {"link:P1:P3", "link:P2:P4", "link:P3:P7", "link:P12:P13"} <= set(els) and "link:P1:P7" not in els
    # Rows in the trace's order (the y of each rule's first row).
    ys: dict[str, float] = {}
    for key, el in sorted(els.items(), key=lambda kv: float(kv[1].get("y") or 0)):
        if key.startswith("key:"):
            ys.setdefault(key.split(":")[1], float(el.get("y")))
    order = []
    for d in report["decisions"]:
        if d["rule"] in ys and d["rule"] not in order:
            order.append(d["rule"])
    assert sorted(order, key=ys.__getitem__) == order
    assert ys["P1"] < ys["P3"] < ys["P4"] < ys["P7"] < ys["P12"] < ys["P13"]
    other = _elements(panels.decision_flow(reports["reshaped-vllm"]))
    assert other["P3:engine_initial_value"].get("fill") == HIGHLIGHT
    assert other["P7:replaced"].get("fill") == HIGHLIGHT
    assert "link:P1:P7" in other and "still registered as sharing" in other["link:P1:P7"].find(NS + "title").text


def _svg_text(svg: str) -> str:
    root = ET.fromstring(svg)
    return " ".join(" ".join(el.itertext()) for el in root.iter(NS + "text"))


def test_grid_hatches_a_role_that_computes_with_the_actors_buffers(reports):
    shared = _elements(panels.device_grid(reports["colocated-lora"]))
    assert shared["cell:rollout:0"].get("fill").startswith("url(#hatch")
    assert shared["cell:reference:0"].get("fill").startswith("url(#hatch")
    assert not shared["cell:reward:0"].get("fill").startswith("url(")
    copied = _elements(panels.device_grid(reports["reshaped-vllm"]))
    assert not copied["cell:rollout:0"].get("fill").startswith("url(")
    # P7: the mesh the config asked for, dashed on its own row.
    assert copied["cell:rollout (config):0"].get("stroke-dasharray")


def test_grid_says_why_a_linked_rollout_holds_a_copy_and_why_an_unlinked_one_shares(reports):
    # Colocated vllm: the map links the rollout (P1), P3 hands it the actor, the engine copies it (P7).
    vllm = reports["colocated-vllm"]
    assert vllm["rollout_branch"] == "shared" and not vllm["rollout_shares_actor_weights"]
    svg = panels.device_grid(vllm)
    assert not _elements(svg)["cell:rollout:0"].get("fill").startswith("url(")
    text = " ".join(_svg_text(svg).split())
    assert "rollout: sharing map (P1, P2): linked to actor" in text
    assert "the vllm engine copied it onto its own (1,8) mesh (P7: not the (2,4) asked for)" in text
    # Reshaped LoRA: no link in the map, yet replicated leaves are the actor's buffers; both said, and why.
    reshaped = reports["reshaped-lora"]
    assert reshaped["sharing_map"]["rollout"] == []
    assert any("rollout" in g["roles"] and "actor" in g["roles"] for g in reshaped["memory"]["shared"])
    text = " ".join(_svg_text(panels.device_grid(reshaped)).split())
    assert "rollout: sharing map (P1, P2): no link; measured: 10.0 KiB of its" in text
    assert "left in place because they are the same on both meshes (replicated leaves), not a link in the map" in text


def test_sharing_map_panel_separates_the_map_from_the_measured_buffers(reports):
    reshaped = reports["reshaped-lora"]
    els = _elements(panels.sharing_map(reshaped))
    # One cell per fact, each its own element: "reference" and "actor" cannot run together.
    assert els["map:reference:links"].text == "actor" and els["map:rollout:links"].text == "no link"
    rollout_shared = sum(g["bytes"] for g in reshaped["memory"]["shared"] if {"actor", "rollout"} <= set(g["roles"]))
    held = reshaped["memory"]["by_role"]["rollout"]["bytes"]
    assert els["map:rollout:measured"].text == f"{fmt_bytes(rollout_shared)} of {fmt_bytes(held)}"
    assert els["map:reference:measured"].text.startswith("all ")
    assert "map:reward" not in els  # no reward model in this cluster
    vllm = _elements(panels.sharing_map(reports["colocated-vllm"]))
    assert vllm["map:rollout:links"].text == "actor, reference" and vllm["map:rollout:measured"].text == "none"


@pytest.mark.parametrize("name", ["colocated-lora", "reshaped-vllm", "split-offload"])
def test_l2_memory_by_device_draws_every_buffer_once(reports, name):
    memory = reports[name]["memory"]
    els = _elements(panels.memory_by_device(memory))
    for dev, kinds in memory["by_device"].items():
        for kind, held in kinds.items():
            assert _bytes(els, f"seg:{dev}:{kind}:") == held, (dev, kind)
            naive = sum(r["by_device"].get(dev, {}).get(kind, 0) for r in memory["by_role"].values())
            assert int(els.get(f"naive:{dev}:{kind}", ET.Element("x")).get("data-bytes", 0)) == naive - held


@pytest.mark.parametrize("name", ["colocated-lora", "reshaped-lora", "split-offload"])
def test_l2_memory_by_role_draws_a_shared_buffer_once(reports, name):
    memory = reports[name]["memory"]
    els = _elements(panels.memory_by_role(memory))
    for role, entry in memory["by_role"].items():
        assert _bytes(els, f"seg:role:{role}:") == entry["bytes"], role
    # Solid: counted once, in the first holder's bar; the solid segments add up to what is held.
    held = sum(int(el.get("data-bytes")) for key, el in els.items() if ":held:" in key)
    assert held == memory["unique_bytes"]
    # A LoRA reference's backbone is the actor's buffers: hatched in the reference's bar as the actor's.
    shared = sum(g["bytes"] for g in memory["shared"] if "reference" in g["roles"] and g["roles"][0] == "actor")
    same = els["seg:role:reference:same:actor"]
    assert int(same.get("data-bytes")) == shared > 0 and same.get("fill").startswith("url(#hatch")


@pytest.mark.parametrize("name", ["colocated-lora", "reshaped-vllm", "split-offload"])
def test_l3_sync_panel_numbers_are_the_reports(reports, name):
    sync = reports[name]["sync"]
    svg = panels.sync_bytes(sync)
    els = _elements(svg)
    label = ("LoRA" if sync["lora"] else "full") + " sync"
    assert _bytes(els, f"seg:sync:{label}:") == sync["synced_bytes"]
    assert _bytes(els, f"seg:cross:{label}:") == sync["moved_cross_device_bytes"]
    assert _bytes(els, f"seg:cross:{label}:relayed") == sync["relayed_cross_device_bytes"]
    if name == "reshaped-vllm":
        assert sync["relayed_cross_device_bytes"] > 0  # XLA's two hops onto the engine's mesh
    # The numbers are written out: moved, copied, reused, crossed, the minimum; physical and logical.
    text = " ".join(_svg_text(svg).split())
    moved = sync["moved_cross_device_bytes"] - sync["relayed_cross_device_bytes"]
    for words in (
        f"{fmt_bytes(sync['synced_bytes'])} synced (physical",
        f"{fmt_bytes(sync['synced_logical_bytes'])} logical (each leaf once)",
        f"moved between devices {fmt_bytes(moved)}",
        f"copied within a device {fmt_bytes(sync['copied_same_device_bytes'])}",
        f"reused (no copy) {fmt_bytes(sync['reused_bytes'])}",
        f"{fmt_bytes(sync['moved_cross_device_bytes'])} crossed devices",
        f"the least this placement allows: {fmt_bytes(sync['minimum_cross_device_bytes'])}",
    ):
        assert words in text, words


def test_every_panel_is_legible_at_the_width_it_is_shown(reports):
    """Text at least 9 pt (12 px) on screen when a panel is shown at its own width, nothing past
    its edges, every label inside its box; the check itself finds the old 11 px text."""
    for name, report in reports.items():
        for draw, data in (
            (panels.decision_flow, report),
            (panels.device_grid, report),
            (panels.sharing_map, report),
            (panels.memory_by_device, report["memory"]),
            (panels.memory_by_role, report["memory"]),
            (panels.sync_bytes, report["sync"]),
        ):
            assert svg_problems(draw(data)) == [], (name, draw.__name__)
    # Shown narrower than drawn, the same panel's text falls under 9 pt.
    assert "pt on screen" in " ".join(svg_problems(panels.decision_flow(reports["colocated-lora"]), 600))
    small = '<svg xmlns="http://www.w3.org/2000/svg" width="100" height="40" viewBox="0 0 100 40">'
    small += '<rect id="box" x="0" y="0" width="30" height="30" fill="red"/>'
    small += '<text x="15" y="20" font-size="11" text-anchor="middle">far too long a label</text></svg>'
    assert svg_problems(small) == [
        "'far too long a label' at 8.2 pt on screen",
        "'far too long a label' runs past the panel's edge",
        "'far too long a label' is wider than its box box",
    ]


def test_svg_displays_in_a_notebook():
    svg = panels.sync_bytes({"synced_bytes": 0, "lora": False})
    assert svg._repr_svg_().startswith("<svg")
