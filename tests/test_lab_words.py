"""The lab's words agree with its figures and with each other: every view is rendered through the
functions the widget calls (``Display.draw``, the status sentences) from a report, and each
sentence is checked against the report's own numbers, worked out here from its raw JSON (the
shared buffer groups, the decisions), not with the lab's helpers.

- Memory: each sum a heading names is the sum of the drawn bars it names (solid: device memory;
  dotted: pinned host), and none is named where no such bar is drawn; every legend swatch is
  distinct and drawn as its bars are.
- "no copy" (and "= actor", "all = the actor's buffers") only where every byte a role holds is
  one of the actor's buffers, and said wherever that is so.
- P4's avoidable-copy warning and P14's join of the two host copies both said, in the flow, the
  Devices and Memory views, the summary and the status, wherever both happened.
- The engine's copy of the actor object P3 handed it (``flow.engine_copied``) said in the same
  five places, wherever it happened, and nowhere else.
- Every text of the figures drawn whole (none cut short by an ellipsis).

On the stored reports (tests/data/reports, the fast tier), and on clusters built pairwise over
layout (colocated, reshaped, split, a custom rollout mesh), LoRA, engine, offload and the sync's
chunk size (one test, ``cluster``).
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from pairwise import pairwise
from stored_reports import NS, PLACEMENTS, elements, is_hatched, stored, svg_text

from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.lab.widget import status as sentences
from rlcluster_lab.lab.widget.display import Display

# ------------------------------------------------------------------ the report's numbers


def _held(report: dict, role: str, dev: str | None = None) -> int:
    row = report["memory"]["by_role"].get(role, {})
    if dev is None:
        return int(row.get("bytes", 0))
    return sum(int(v) for v in row.get("by_device", {}).get(dev, {}).values())


def _actors_in(report: dict, role: str, dev: str | None = None) -> int:
    """Bytes ``role`` holds that are buffers the actor holds too (on ``dev``, or everywhere)."""
    total = 0
    for group in report["memory"]["shared"]:
        if {"actor", role} <= set(group["roles"]):
            if dev is None:
                total += int(group["bytes"])
            else:
                total += sum(int(v) for v in group["by_device"].get(dev, {}).values())
    return total


def _all_actors(report: dict, role: str) -> bool:
    return role != "actor" and 0 < _held(report, role) <= _actors_in(report, role)


def _branch(report: dict, rule: str) -> str | None:
    return next((d["branch"] for d in report["decisions"] if d["rule"] == rule), None)


def _p4_warned_with_offload(report: dict) -> bool:
    p4 = [d for d in report["decisions"] if d["rule"] == "P4"]
    return bool(p4) and p4[0]["branch"] == "avoidable copy" and bool(p4[0]["values"].get("offload_to_cpu"))


# ------------------------------------------------------------------ the lab's words


def _figures(display: Display, panel: str) -> list[str]:
    out = []
    for item in display.outputs[panel].outputs:
        assert "image/svg+xml" in item["data"], f"{panel}: {item['data'].get('text/plain')}"
        out.append(item["data"]["image/svg+xml"])
    return out


def _plain(markup: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


def render(report: dict) -> dict[str, Any]:
    """Every view of the lab for ``report``, as the widget draws it after a Construct (and a Sync,
    when the report has one), and the status sentences."""
    display = Display()
    display.draw(report, [], [])
    flow, grid, (by_device, by_role) = _figures(display, "flow"), _figures(display, "grid"), _figures(display, "memory")
    words = {
        "flow": flow[0],
        "grid": grid[0],
        "by_device": by_device,
        "by_role": by_role,
        "summary": _plain(display.summary.value),
        "status": sentences.constructed(report, 1.0),
    }
    if report.get("sync"):
        words["synced"] = sentences.synced(report["sync"], 1.0)
    return words


def _visible(el: ET.Element) -> str:
    title = el.find(NS + "title")
    return (el.text or "") if title is None else (title.tail or "")


def _rows(svg: str, starts) -> dict[str, str]:
    """The figure's text cut into rows, in document order: a row begins at each element for which
    ``starts(element)`` gives a key, and holds the text drawn after it."""
    rows: dict[str, list[str]] = {}
    key = None
    for el in ET.fromstring(svg).iter():
        if (new := starts(el)) is not None:
            key = new
            rows[key] = []
        if key is not None and el.tag == NS + "text":
            rows[key].append(_visible(el))
    return {k: " ".join(" ".join(v).split()) for k, v in rows.items()}


def flow_rows(svg: str) -> dict[str, str]:
    """Per row of the decision flow (``P4``, ``P5:actor``): its question, answers and detail."""
    return _rows(svg, lambda el: el.get("id", "").removeprefix("key:") if el.get("id", "").startswith("key:") else None)


def role_rows(svg: str) -> dict[str, str]:
    """Per row of the memory-by-role figure: the role's name and the words beside its bar."""
    return _rows(svg, lambda el: el.text if el.tag == NS + "text" and el.get("font-size") == "13" else None)


def _legend(svg: str) -> dict[str, str]:
    return {
        key.removeprefix("legend:"): el.get("fill") for key, el in elements(svg).items() if key.startswith("legend:")
    }


def check_memory_by_role(report: dict, svg: str) -> None:
    els = elements(svg)
    solid = sum(
        int(el.get("data-bytes"))
        for key, el in els.items()
        if key.startswith("seg:role:") and key.endswith(":held:device")
    )
    dotted = sum(
        int(el.get("data-bytes"))
        for key, el in els.items()
        if key.startswith("seg:role:") and key.endswith(":held:pinned_host")
    )
    text = svg_text(svg)
    assert f"{fmt_bytes(solid + dotted)} held" in text
    assert solid + dotted == report["memory"]["unique_bytes"]
    note = els["sums"].find(NS + "title").text
    named = re.findall(r"(solid|dotted) bars(?: \([^)]*\))? add up to (\d+(?:\.\d)? [KMG]?i?B)", note)
    drawn = {"solid": solid, "dotted": dotted}
    assert named, note
    for kind, said in named:
        assert drawn[kind] > 0 and said == fmt_bytes(drawn[kind]), (kind, said, note)
    assert {kind for kind, _ in named} == {kind for kind, v in drawn.items() if v > 0}, note
    if not solid:
        assert "no bar is solid" in note
    legend = _legend(svg)
    assert len(set(legend.values())) == len(legend), legend
    assert ("solid: device memory, counted in this bar" in legend) == (solid > 0)
    assert ("dotted: pinned host, counted in this bar" in legend) == (dotted > 0)
    # "all = the actor's buffers" exactly where every byte of the role is the actor's.
    for role, row in role_rows(svg).items():
        assert ("all = the actor's buffers" in row) == _all_actors(report, role), (role, row)


def check_memory_by_device(report: dict, svg: str) -> None:
    els = elements(svg)
    held = sum(int(el.get("data-bytes")) for key, el in els.items() if key.startswith("seg:"))
    dashed = sum(int(el.get("data-bytes")) for key, el in els.items() if key.startswith("naive:"))
    text = svg_text(svg)
    assert held == report["memory"]["unique_bytes"] and held + dashed == report["memory"]["naive_bytes"]
    assert f"{fmt_bytes(held)} held, {fmt_bytes(held + dashed)} if every role had its own copy" in text
    legend = _legend(svg)
    assert len(set(legend.values())) == len(legend), legend
    # Each swatch is drawn as the bars it names: one of the fills of its segments.
    for label, fill in legend.items():
        entry = label.removesuffix(" (held once)").replace(" = ", "+")
        fills = {el.get("fill") for key, el in els.items() if key.startswith("seg:") and key.split(":")[3] == entry}
        assert fill in fills, (label, fill, fills)


def check_devices(report: dict, svg: str) -> None:
    els = elements(svg)
    for key, el in els.items():
        if key.startswith("cell:") and "(config)" not in key and is_hatched(el):
            _, role, dev = key.split(":")
            assert 0 < _held(report, role, dev) <= _actors_in(report, role, dev), key
    notes = {key.removeprefix("note:"): el.text for key, el in els.items() if key.startswith("note:")}
    text = svg_text(svg)
    for role in notes:
        said = re.search(
            rf"\b{role}: sharing map .*?(?=\b(?:actor|rollout|reference|reward|critic): sharing map|$)", text
        )
        assert said, role
        assert ("no copy" in said.group(0)) == _all_actors(report, role), (role, said.group(0))
    legend = _legend(svg)
    assert len(set(legend.values())) == len(legend), legend


def check_flow(report: dict, svg: str) -> None:
    text = svg_text(svg)
    warnings = len(report["warnings"])
    assert (f"{warnings} warning(s)" in text) == (warnings > 0)
    # A row that says the rollout or the reference holds no copy: only where the bytes say so.
    if "no second copy" in text:
        assert _all_actors(report, "rollout"), text
    if _branch(report, "P4") == "one backbone":
        assert _all_actors(report, "reference")


def _says_p4_then_p14(text: str) -> bool:
    return "P4" in text and "P14" in text and "joined" in text and ("copy" in text or "warn" in text)


def check_p4_then_p14(report: dict, words: dict[str, Any]) -> None:
    """P4 warned of the copy at construction and P14 joined it since: every view says both, and
    none says P14 joined it where it did not."""
    joined = _p4_warned_with_offload(report) and _all_actors(report, "reference")
    flow, grid = flow_rows(words["flow"]), svg_text(words["grid"])
    present = "reference" in report["memory"]["by_role"]
    said = {
        "flow P4": flow["P4"],
        "flow P14": flow["P14"],
        "devices": re.search(r"reference: sharing map .*?(?=\b\w+: sharing map|$)", grid).group(0) if present else "",
        "memory": role_rows(words["by_role"]).get("reference", ""),
        "summary": words["summary"],
        "status": words["status"],
    }
    for where, text in said.items():
        assert _says_p4_then_p14(text) == joined, (where, text)
    if joined:
        assert "avoidable copy" in said["flow P4"] and "joined" in said["flow P14"]
    elif _branch(report, "P4") == "avoidable copy":
        # Warned and not joined: no view says the reference holds no copy.
        assert "no copy" not in said["devices"] and "all = the actor's buffers" not in said["memory"]


def check_engine_copy(report: dict, words: dict[str, Any]) -> None:
    """P3 handed the rollout the actor object, but the engine copied it (the rollout holds bytes that
    are not the actor's): every view says the engine copied it, and none says so elsewhere."""
    copied = (
        report["rollout_branch"] == "shared" and _held(report, "rollout") > 0 and not _all_actors(report, "rollout")
    )
    engine = report["engine"]
    grid = svg_text(words["grid"])
    said = {
        "flow P3": flow_rows(words["flow"])["P3"],
        "devices": re.search(r"rollout: sharing map .*?(?=\b\w+: sharing map|$)", grid).group(0),
        "memory": role_rows(words["by_role"]).get("rollout", ""),
        "summary": words["summary"],
        "status": words["status"],
    }
    for where, text in said.items():
        assert (f"the {engine} engine copied" in text or f"copied by the {engine} engine" in text) == copied, (
            where,
            text,
        )
    if copied:
        assert "no copy" not in said["devices"] and "all = the actor's buffers" not in said["memory"]


def check_status(report: dict, words: dict[str, Any]) -> None:
    held = fmt_bytes(report["memory"]["unique_bytes"])
    where = report["memory"]["where"]
    assert f"{held} held on {where} (measured)" in words["status"]
    assert f"{held} held" in svg_text(words["by_device"]) and f"{held} held" in svg_text(words["by_role"])
    assert f"{where}, measured: per role: physical bytes" in svg_text(words["by_device"])
    assert f"{where}, measured: " in svg_text(words["by_role"])
    for w in report["warnings"]:
        assert w.split(":")[0] in words["status"], w
    if "synced" in words:
        sync = report["sync"]
        arrived, whole = fmt_bytes(sync["arrived_cross_device_bytes"]), fmt_bytes(sync["synced_bytes"])
        said = f"{arrived} of the {whole} synced on {sync['where']} came from other devices"
        assert said in words["synced"]


def check_words(report: dict) -> None:
    words = render(report)
    for view in ("flow", "grid", "by_device", "by_role"):
        cut = [_visible(el) for el in ET.fromstring(words[view]).iter(NS + "text") if _visible(el).endswith("\u2026")]
        assert not cut, f"{view}: drawn cut short: {cut}"
    check_memory_by_role(report, words["by_role"])
    check_memory_by_device(report, words["by_device"])
    check_devices(report, words["grid"])
    check_flow(report, words["flow"])
    check_p4_then_p14(report, words)
    check_engine_copy(report, words)
    check_status(report, words)


@pytest.mark.parametrize("name", PLACEMENTS)
def test_the_labs_words_agree_with_the_stored_reports_numbers(name):
    check_words(stored(name))


def test_p4_p14_a_copy_warned_of_then_joined_is_said_both_ways_in_every_view():
    # The case seen in the lab: colocated, LoRA, offload. P4 warned (the reference loaded as host
    # copies of its own); P14 joined the two copies since; the memory walk finds no copy.
    report = stored("colocated-lora-offload")
    assert _p4_warned_with_offload(report) and _all_actors(report, "reference")
    words = render(report)
    flow = " ".join(flow_rows(words["flow"]).values())
    assert "avoidable copy of the backbone at construction; P14 has since joined the two host copies" in flow
    assert "then joined the reference's backbone copy to the actor's (P4's avoidable copy)" in flow
    assert "all 430.0 KiB are the actor's buffers (P4 warned of a copy, P14 joined it), no copy" in svg_text(
        words["grid"]
    )
    assert "all = the actor's buffers (P4 warned of a copy, P14 joined it)" in role_rows(words["by_role"])["reference"]
    assert "since joined by P14" in words["status"]


def test_memory_sums_name_only_what_is_drawn():
    # Nothing in device memory (offload): no solid sum is named; the dotted bars' sum is.
    offload = render(stored("colocated-lora-offload"))["by_role"]
    note = elements(offload)["sums"].find(NS + "title").text
    assert note.startswith(
        "8 simulated CPU devices, measured: no bar is solid (nothing in device memory); "
        "dotted bars (pinned host) add up to 706.0 KiB"
    )
    # The anchor in pinned host is not part of the solid sum.
    lora = render(stored("colocated-lora"))["by_role"]
    note = elements(lora)["sums"].find(NS + "title").text
    assert note.startswith(
        "8 simulated CPU devices, measured: solid bars (device memory) add up to 1.1 MiB; "
        "dotted bars (pinned host) add up to 522.0 KiB"
    )


def test_two_sets_of_shared_buffers_with_the_same_first_holders_get_distinct_swatches():
    svg = render(stored("colocated-lora-offload"))["by_device"]
    legend = _legend(svg)
    assert legend["actor = rollout = reference = anchor (held once)"] != legend["actor = rollout = anchor (held once)"]
    assert legend["optimizer"].startswith("url(#dots-")  # drawn dotted: all in pinned host


# ------------------------------------------------------------------ clusters built pairwise

CHUNK = 16 << 10
FACTORS = {
    "layout": ("colocated", "reshaped", "split", "custom"),
    "lora": (False, True),
    "engine": ("vanilla", "vllm", "sglang_jax"),
    "offload": (False, True),
    "chunk": (None, CHUNK),
}
CASES = pairwise(
    FACTORS,
    [
        ("colocated", True, "vanilla", True, None),
        ("colocated", False, "vllm", False, CHUNK),
        ("colocated", True, "sglang_jax", False, None),
        ("reshaped", False, "vanilla", False, CHUNK),
        ("reshaped", True, "vllm", True, None),
        ("reshaped", False, "sglang_jax", True, CHUNK),
        ("split", True, "vanilla", False, CHUNK),
        ("split", False, "vllm", True, None),
        ("split", True, "sglang_jax", True, CHUNK),
        ("custom", False, "vanilla", True, None),
        ("custom", True, "vllm", False, CHUNK),
        ("custom", False, "sglang_jax", False, None),
    ],
)


@pytest.mark.cluster
def test_the_labs_words_agree_with_the_numbers_of_clusters_built_pairwise():
    import jax

    from rlcluster_lab.app.report import placement_report
    from rlcluster_lab.app.scenario import Scenario, build_cluster
    from rlcluster_lab.core.meshes import layout_meshes, make_mesh
    from rlcluster_lab.core.roles import Role

    devices = jax.devices()[:8]
    for layout, lora, engine, offload, chunk in CASES:
        role_to_mesh = None
        if layout == "custom":  # the lab's custom layout: the rollout on devices 4-7 as 2 x 2
            role_to_mesh = layout_meshes("colocated", devices)
            role_to_mesh[Role.ROLLOUT] = make_mesh(devices[4:], (2, 2))
        scenario = Scenario(
            layout="colocated" if layout == "custom" else layout,
            lora=lora,
            engine=engine,
            offload=offload,
            sync_chunk_bytes=chunk,
        )
        cluster = build_cluster(scenario, devices=devices, role_to_mesh=role_to_mesh)
        try:
            report = placement_report(cluster, sync=cluster.sync_weights()).to_json()
            check_words(report)
        except AssertionError as exc:
            raise AssertionError(f"{(layout, lora, engine, offload, chunk)}: {exc}") from exc
        finally:
            del cluster
