"""Figures of a placement (L1, P1-P7), drawn from stored placement reports: the branch each rule
took highlighted, rows in the trace's order, the cells each role's mesh covers, hatched where a
role computes with the actor's buffers."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from legibility import svg_problems
from stored_reports import PLACEMENTS, elements, is_hatched, stored, svg_text

from rlcluster_lab.lab.figures.flow import flow_rows
from rlcluster_lab.lab.figures.placement import decision_flow, device_grid
from rlcluster_lab.lab.figures.style import HIGHLIGHT


def _lit(svg: str) -> set[str]:
    """Ids of the decision answers drawn in the highlight colour."""
    return {key for key, el in elements(svg).items() if el.get("fill") == HIGHLIGHT}


def _row_ys(svg: str) -> dict[str, float]:
    """Rule -> the y of its first row (rows go down the figure)."""
    ys: dict[str, float] = {}
    for key, el in sorted(elements(svg).items(), key=lambda kv: float(kv[1].get("y") or 0)):
        if key.startswith("key:"):
            ys.setdefault(key.split(":")[1], float(el.get("y")))
    return ys


def _trace_order(report: dict, ys: dict[str, float]) -> list[str]:
    order: list[str] = []
    for d in report["decisions"]:
        if d["rule"] in ys and d["rule"] not in order:
            order.append(d["rule"])
    return order


# ------------------------------------------------------------------ decision flow (L1)


def test_p1_p2_p3_p4_flow_of_a_colocated_lora_cluster_highlights_the_shared_branches():
    lit = _lit(decision_flow(stored("colocated-lora")))
    assert {"P1:linked", "P2:linked", "P3:shared", "P4:one backbone", "P7:kept", "P8:full", "P12:LoRA params"} <= lit
    assert not lit & {"P1:not linked", "P3:second_copy", "P4:avoidable copy"}


def test_p1_p3_p4_flow_of_a_reshaped_separate_base_shows_the_second_and_avoidable_copies():
    lit = _lit(decision_flow(stored("reshaped-separate-base")))
    assert {"P1:not linked", "P3:second_copy", "P4:avoidable copy", "P5:rollout:resharded"} <= lit
    assert "P1:linked" not in lit and "P3:shared" not in lit


def test_p7_flow_of_a_vllm_engine_that_replaced_the_mesh_says_why_shared_is_a_copy():
    svg = decision_flow(stored("colocated-vllm"))
    # Linked by the map, so P3 hands the actor object over; the engine keeps its own copy.
    assert {"P1:linked", "P3:shared", "P7:replaced"} <= _lit(svg)
    text = svg_text(svg)
    assert "still registered as sharing: yes" in text
    # Why "shared" does not mean the actor's buffers: what P7 recorded, said on P3's row.
    assert "but the vllm engine copied it onto its own (1,8) mesh (P7: not the (2,4) asked for)" in text
    reshaped = decision_flow(stored("reshaped-vllm"))
    assert {"P3:engine_initial_value", "P7:replaced"} <= _lit(reshaped)


def test_l1_flow_rows_follow_the_trace_not_the_rule_numbers():
    for name in ("colocated-lora", "colocated-vllm"):
        report = stored(name)
        ys = _row_ys(decision_flow(report))
        order = _trace_order(report, ys)
        assert sorted(order, key=ys.__getitem__) == order, name
    # Construction order: P3 before P4, P7 after them, P12 before P8, the sync's P13 last.
    ys = _row_ys(decision_flow(stored("colocated-vllm")))
    assert ys["P1"] < ys["P3"] < ys["P4"] < ys["P7"] < ys["P12"] < ys["P8"] < ys["P13"]


def test_l1_flow_draws_an_arrow_from_each_decision_to_the_ones_that_read_it():
    els = elements(decision_flow(stored("colocated-vllm")))
    arrows = {key for key in els if key.startswith("link:")}
    # P1 -> P7 only because the engine replaced the mesh P1's map was built from.
    assert arrows == {"link:P1:P3", "link:P2:P4", "link:P1:P7", "link:P3:P7", "link:P12:P13"}
    assert "still registered as sharing" in els["link:P1:P7"].find("{http://www.w3.org/2000/svg}title").text
    assert "P1 -> P7 (still registered as sharing: yes)" in svg_text(decision_flow(stored("colocated-vllm")))
    kept = {key for key in elements(decision_flow(stored("colocated-lora"))) if key.startswith("link:")}
    assert {"link:P1:P3", "link:P2:P4", "link:P3:P7", "link:P12:P13"} <= kept and "link:P1:P7" not in kept


@pytest.mark.parametrize("name", PLACEMENTS)
def test_l1_flow_lights_exactly_the_answer_each_row_fired(name):
    report = stored(name)
    lit = _lit(decision_flow(report))
    for row in flow_rows(report):
        assert [o for o in row.options if f"{row.key}:{o}" in lit] == [row.fired], row.key


def test_p2_skip_and_p14_offload_are_read_from_the_trace():
    """The figure reads each decision's typed branch, as the rule functions return it."""
    from rlcluster_lab.rules.rollout import p3_rollout_model
    from rlcluster_lab.rules.sharing import p2_link_reference

    p2 = p2_link_reference(
        actor_is_module=False,
        reference_is_module=True,
        actor_has_lora=False,
        has_reference=True,
        actor_mesh=None,
        reference_mesh=None,
    )
    report = {
        "decisions": [p2.to_json(), p3_rollout_model(False, "vanilla", "vanilla", None).to_json()],
        "sharing_map": {"actor": []},
        "rollout_branch": "second_copy",
        "offload_to_cpu": True,
    }
    lit = _lit(decision_flow(report))
    assert {"P2:skipped", "P3:second_copy", "P4:no reference", "P14:pinned host between uses"} <= lit


# ------------------------------------------------------------------ device grid


def _filled(svg: str, row: str) -> set[int]:
    """Devices whose cell in ``row`` is drawn (a device of the role's mesh)."""
    return {
        int(key.rsplit(":", 1)[1])
        for key, el in elements(svg).items()
        if key.startswith(f"cell:{row}:") and el.get("fill") != "white"
    }


def _hatched(svg: str, row: str) -> set[int]:
    return {
        int(key.rsplit(":", 1)[1])
        for key, el in elements(svg).items()
        if key.startswith(f"cell:{row}:") and is_hatched(el)
    }


def test_p1_split_grid_puts_actor_and_rollout_on_disjoint_halves():
    svg = device_grid(stored("split"))
    assert _filled(svg, "actor") == _filled(svg, "reference") == {0, 1, 2, 3}
    assert _filled(svg, "rollout") == {4, 5, 6, 7}


def test_p3_p4_grid_hatches_a_role_that_computes_with_the_actors_buffers():
    shared = device_grid(stored("colocated-lora"))
    # P3 shared: the rollout computes with the actor's buffers; P4: so does the LoRA reference.
    assert _hatched(shared, "rollout") == _hatched(shared, "reference") == set(range(8))
    assert not _hatched(shared, "actor") and not _hatched(shared, "reward")
    assert "= actor" in svg_text(shared)
    copied = device_grid(stored("reshaped-separate-base"))
    assert not _hatched(copied, "rollout") and not _hatched(copied, "reference")


def test_p1_reshaped_grid_shows_the_same_devices_at_other_coordinates():
    svg = device_grid(stored("reshaped-separate-base"))
    assert _filled(svg, "actor") == _filled(svg, "rollout") == set(range(8))
    text = svg_text(svg)
    assert "7,0" in text  # device 7 is row 7 of the (8, 1) rollout mesh
    assert "1,3" in text  # and row 1, column 3 of the (2, 4) actor mesh


def test_p7_grid_draws_the_configured_rollout_mesh_dashed_when_the_engine_replaced_it():
    copied = elements(device_grid(stored("reshaped-vllm")))
    assert not is_hatched(copied["cell:rollout:0"])
    assert copied["cell:rollout (config):0"].get("stroke-dasharray")
    report = {
        "role_to_mesh": {
            "actor": {"axis_names": ["fsdp", "tp"], "shape": {"fsdp": 2, "tp": 2}, "device_ids": [0, 1, 2, 3]},
            "rollout": {"axis_names": ["tp"], "shape": {"tp": 2}, "device_ids": [2, 3]},
        },
        "config_role_to_mesh": {
            "rollout": {"axis_names": ["fsdp", "tp"], "shape": {"fsdp": 2, "tp": 2}, "device_ids": [0, 1, 2, 3]}
        },
        "mesh_overridden_by_engine": True,
        "device_count": 4,
        "sharing_map": {"actor": ["rollout"]},
    }
    svg = device_grid(report)
    assert _filled(svg, "rollout") == {2, 3}
    assert sum(key.startswith("cell:rollout (config):") for key in elements(svg)) == 4
    assert "replaced by the engine (P7)" in svg_text(svg)


def test_p3_p7_grid_says_why_a_linked_rollout_holds_a_copy_and_why_an_unlinked_one_shares():
    # Colocated vllm: the map links the rollout (P1), P3 hands it the actor, the engine copies it (P7).
    vllm = stored("colocated-vllm-lora")
    assert vllm["rollout_branch"] == "shared" and not vllm["rollout_shares_actor_weights"]
    svg = device_grid(vllm)
    assert not is_hatched(elements(svg)["cell:rollout:0"])
    text = svg_text(svg)
    assert "rollout: sharing map (P1, P2): linked to actor" in text
    assert "the vllm engine copied it onto its own (1,8) mesh (P7: not the (2,4) asked for)" in text
    # Reshaped LoRA: no link in the map, yet replicated leaves are the actor's buffers; both said, and why.
    reshaped = stored("reshaped-lora")
    assert reshaped["sharing_map"]["rollout"] == []
    assert any("rollout" in g["roles"] and "actor" in g["roles"] for g in reshaped["memory"]["shared"])
    text = svg_text(device_grid(reshaped))
    assert "rollout: sharing map (P1, P2): no link; measured: 10.0 KiB of its" in text
    assert "left in place because they are the same on both meshes (replicated leaves), not a link in the map" in text


# ------------------------------------------------------------------ legibility


@pytest.mark.parametrize("name", PLACEMENTS)
def test_every_placement_figure_is_legible_at_the_width_it_is_shown(name):
    """Text at least 9 pt (12 px) on screen when a figure is shown at its own width, nothing past
    its edges, every label inside its box."""
    report = stored(name)
    for draw in (decision_flow, device_grid):
        assert svg_problems(draw(report)) == [], draw.__name__
    # Shown narrower than drawn, the same figure's text falls under 9 pt.
    assert "pt on screen" in " ".join(svg_problems(decision_flow(report), 600))


def test_an_svg_figure_displays_itself_in_a_notebook_with_a_one_line_text_form():
    from IPython.core.formatters import DisplayFormatter

    svg = decision_flow(stored("split"))
    data, _ = DisplayFormatter().format(svg)
    assert data["image/svg+xml"] == str(svg) and str(svg).startswith("<svg")
    assert data["text/plain"] == f"<SVG figure, 760 x {elements_height(svg)} px>"


def elements_height(svg: str) -> str:
    return ET.fromstring(svg).get("height")
