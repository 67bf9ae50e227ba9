"""What the lab writes agrees with itself: a formula the notebooks state is the one the reports
compute, a figure's excess is named by the ledger's own figure, and (over drawn configurations,
``cluster``) every sentence about a figure agrees with the figure drawn beside it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from stored_reports import PLACEMENTS, stored
from test_lab import _change

from rlcluster_lab.core.knobs import KNOBS
from rlcluster_lab.lab.experiments.what_if import agrees
from rlcluster_lab.lab.widget.controls import CUSTOM

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
        "arrived": "arrived_cross_device_bytes",
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


# ------------------------------------------------------------------ texts that run together


@pytest.mark.parametrize("name", PLACEMENTS)
def test_no_two_texts_of_a_figure_run_together_in_any_view_of_a_stored_report(name):
    from rlcluster_lab.lab.widget.display import Display

    display = Display()
    display.draw(stored(name), [], [])
    figures = {
        panel: [o["data"]["image/svg+xml"] for o in out.outputs if "image/svg+xml" in o.get("data", {})]
        for panel, out in display.outputs.items()
    }
    assert sum(map(len, figures.values())) >= 4
    check_no_text_runs_together(figures)


@pytest.mark.parametrize("notebook", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_no_two_texts_of_a_figure_run_together_in_the_notebooks_stored_figures(notebook):
    import json

    cells = json.loads((NOTEBOOKS / notebook).read_text())["cells"]
    svgs = [
        "".join(o["data"]["image/svg+xml"])
        for c in cells
        for o in c.get("outputs", [])
        if "image/svg+xml" in o.get("data", {})
    ]
    check_no_text_runs_together({notebook: svgs})


def test_the_overlap_check_finds_two_labels_that_run_together():
    from legibility import svg_overlaps

    svg = '<svg xmlns="http://www.w3.org/2000/svg" width="200" height="40" viewBox="0 0 200 40">'
    svg += '<text x="5" y="20" font-size="12">first label</text><text x="40" y="24" font-size="12">second</text>'
    svg += '<text x="5" y="38" font-size="12">below</text><text x="150" y="20" font-size="12">apart</text></svg>'
    assert svg_overlaps(svg) == ["'first label' runs into 'second'"]


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


# ------------------------------------------------------------------ over drawn configurations
#
# The lab driven as a user drives it (knob changes, the custom mesh's device buttons, Construct,
# Sync, a refusal followed by other knob changes), and clusters built directly on custom meshes
# over drawn devices in drawn orders: after each answer, every sentence the lab writes about a
# figure is checked against the figure and the report it was drawn from. Each check is a
# function of its own (``check_*``); the tests group them:
#
# - ``test_the_labs_sentences_agree_with_its_figures_over_drawn_clicks``: "same/different"
#   against the device grid, the ledger's parts against their total, the memory and the copies
#   (tests/test_lab_words.py's checks), after every answer;
# - ``test_every_x_of_y_the_lab_writes_has_x_at_most_y_over_drawn_clicks``: every "X of Y";
# - ``test_no_refusal_note_outlives_a_change_of_its_cause_over_drawn_clicks``: a refusal's note
#   and outline are gone once a knob changes.

CHUNK = 16 << 10

_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "layout": st.sampled_from(["colocated", "reshaped", "split", CUSTOM]),
        "lora": st.booleans(),
        "engine": st.sampled_from(["vanilla", "vllm", "sglang_jax"]),
        "offload": st.booleans(),
        "reshard": st.sampled_from(["xla", "minimal"]),
        "sync_chunk_bytes": st.sampled_from([0, CHUNK]),
        "flip_devices": st.lists(st.integers(0, 7), max_size=4),
        "shape": st.integers(0, 3),
    },
)
_CLICKS = st.lists(
    st.one_of(st.tuples(st.just("construct"), _CHANGES), st.tuples(st.just("sync"), st.none())),
    min_size=2,
    max_size=4,
)
# A refusal (a custom rollout mesh of three devices: no shape fits), a knob changed after it,
# then an answer: the case where a refusal's words outlived their cause.
_REFUSAL_THEN_CHANGE = [
    ("construct", {"layout": CUSTOM, "flip_devices": [0, 1, 2]}),
    ("change", {"flip_devices": [3]}),
    ("construct", {"lora": True}),
    ("sync", None),
]
# A LoRA actor on a custom rollout mesh, chunked: a sync whose moved bytes exceed its synced ones.
_CUSTOM_LORA_CHUNKED = [
    ("construct", {"layout": CUSTOM, "lora": True, "sync_chunk_bytes": CHUNK, "flip_devices": [0, 1, 2, 3]}),
    ("sync", None),
]
# The vllm-style engine with offload: the engine's copy and P4/P14 in every view.
_VLLM_OFFLOAD = [("construct", {"lora": True, "engine": "vllm", "offload": True}), ("sync", None)]


def _knob_state(lab) -> tuple:
    knobs = lab.knobs
    return (
        tuple((field, w.value) for field, w in knobs.by_field().items()),
        tuple(t.value for t in knobs.device_toggles),
    )


def _drive(actions, after_each) -> None:
    """Run ``actions`` on a fresh lab: ("construct", changes), ("change", changes) or ("sync",
    None); after each, ``after_each(lab, name, refused_before)``, where ``refused_before`` says
    that a refusal's note was shown before this action and this action changed a knob."""
    from rlcluster_lab.lab.widget.placement_lab import PlacementLab

    lab = PlacementLab(rehearse=False)
    try:
        for name, changes in actions:
            refused_before = lab.error is not None and lab.notes.shown is not None
            if name in ("construct", "change"):
                before = _knob_state(lab)
                _change(lab, changes or {})
                refused_before = refused_before and _knob_state(lab) != before
            if name != "change":
                button = lab.construct_button if name == "construct" else lab.sync_button
                if button.disabled:
                    continue
                button.click()
            after_each(lab, name, refused_before)
    finally:
        lab.release()


def _figures(lab) -> dict[str, list[str]]:
    out = {}
    for panel, output in lab.display.outputs.items():
        out[panel] = [o["data"]["image/svg+xml"] for o in output.outputs if "image/svg+xml" in o.get("data", {})]
    return out


def _plain(markup: str) -> str:
    import html

    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


def _written(lab) -> list[str]:
    """Every text the lab shows: the status and its details, the summary, the changes, the
    notes, and every text and hover title of every figure."""
    import xml.etree.ElementTree as ET

    texts = [lab.status.text, _plain(lab.status.details.value), _plain(lab.display.summary.value)]
    texts += [_plain(lab.display.changes.value)]
    texts += [_plain(note.value) for note in lab.notes._notes.values() if note.layout.display != "none"]
    for svgs in _figures(lab).values():
        for svg in svgs:
            for el in ET.fromstring(svg).iter():
                if el.tag.endswith("text") or el.tag.endswith("title"):
                    texts.append(" ".join("".join(el.itertext()).split()))
    return [t for t in texts if t]


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_QUANTITY = r"(\d[\d,]*(?:\.\d+)?)(?:\s*(B|KiB|MiB|GiB)\b)?"
_X_OF_Y = re.compile(rf"(?<![\w.]){_QUANTITY}\s+of\s+(?:its\s+|the\s+|all\s+)?{_QUANTITY}(?![\w.])")


def _value(number: str, unit: str | None) -> float:
    return float(number.replace(",", "")) * _UNITS.get(unit or "", 1)


def check_x_of_y(texts: list[str]) -> None:
    """Every "X of Y" the lab writes (bytes of bytes, or a count of a count) has X <= Y."""
    for text in texts:
        for m in _X_OF_Y.finditer(text):
            (x, xu), (y, yu) = m.group(1, 2), m.group(3, 4)
            if bool(xu) != bool(yu):
                continue  # "3 of 4.0 KiB": not a part of a whole of the same kind
            assert _value(x, xu) <= _value(y, yu), f"{m.group(0)!r} in {text!r}"


def check_same_devices(report: dict, grid: str) -> None:
    """The flow's "same devices: yes/no" (P1) agrees with the device grid: the devices drawn
    for the actor and for the rollout the config asked for (its dashed row when P7 replaced it)."""
    from stored_reports import elements

    from rlcluster_lab.lab.figures.flow import flow_rows

    p1 = next((r for r in flow_rows(report) if r.key == "P1"), None)
    if p1 is None or "same devices" not in p1.detail:
        return
    drawn: dict[str, set[str]] = {}
    for key, el in elements(grid).items():
        if key.startswith("cell:") and el.get("stroke") != "#dddddd":
            _, row, dev = key.split(":")
            drawn.setdefault(row, set()).add(dev)
    rollout = drawn.get("rollout (config)", drawn.get("rollout", set()))
    same = drawn.get("actor", set()) == rollout
    assert f"same devices: {'yes' if same else 'no'}" in p1.detail, (p1.detail, drawn)


def _drawn_kind(fill: str) -> str:
    """The memory kind a fill draws, in the figures' one vocabulary: dotted (the dots alone, or
    under a hatch) is pinned host memory, anything else device memory."""
    return "pinned_host" if "dots" in fill else "device"


def grid_kinds(grid: str) -> dict[tuple[str, str], set[str]]:
    """Per (role, device) of a role's mesh, the memory kinds the Devices view draws its bytes in:
    the fill of the cell (``cell:<role>:<device>``; a white one is off the mesh, a dashed one
    the mesh asked for, one of no bytes holds nothing) and of any part of it in another kind
    (``part:<role>:<device>:<kind>``)."""
    from stored_reports import elements

    kinds: dict[tuple[str, str], set[str]] = {}
    for key, el in elements(grid).items():
        if key.startswith("cell:") and el.get("fill") != "white" and not el.get("stroke-dasharray"):
            if el.get("data-bytes") == "0":
                continue
            _, role, dev = key.split(":")
            kinds.setdefault((role, dev), set()).add(_drawn_kind(el.get("fill", "")))
        elif key.startswith("part:"):
            _, role, dev, kind = key.split(":")
            assert _drawn_kind(el.get("fill", "")) == kind, (key, el.get("fill"))
            kinds.setdefault((role, dev), set()).add(kind)
    return kinds


def memory_kinds(by_device: str) -> dict[tuple[str, str], set[str]]:
    """Per (role or entry, device), the memory kinds the Memory view's per-device figure draws its
    bytes in: the bar each segment stands in (``seg:<device>:<kind>:<entry or a+b>``)."""
    from stored_reports import elements

    kinds: dict[tuple[str, str], set[str]] = {}
    for key in elements(by_device):
        if key.startswith("seg:"):
            _, dev, kind, holders = key.split(":", 3)
            for entry in holders.split("+"):
                kinds.setdefault((entry, dev), set()).add(kind)
    return kinds


def check_memory_kinds(grid: str, by_device: str) -> None:
    """The Devices view and the Memory view put each role's bytes on each device in the same
    memory kinds (solid: device memory; dotted: pinned host), before and after a sync."""
    drawn = grid_kinds(grid)
    roles = {role for role, _ in drawn}
    memory = {at: kinds for at, kinds in memory_kinds(by_device).items() if at[0] in roles}
    assert drawn == memory, {at: (drawn.get(at), memory.get(at)) for at in drawn.keys() | memory.keys()}


def check_chunk_words(report: dict, figures: dict[str, list[str]]) -> None:
    """The Weight sync view says how the handover was cut in the report's own count of chunks
    (``chunk_words``), and no other sentence of it says otherwise: a count of chunks, one piece
    or a limit, or a chunk size the handover did not reach."""
    from stored_reports import svg_text

    from rlcluster_lab.core.limits import fmt_bytes
    from rlcluster_lab.measure.sync_peak import chunk_words

    peak = (report.get("sync") or {}).get("transient_peak")
    if not peak:
        return
    text = " ".join(svg_text(svg) for svg in figures.get("sync", []))
    assert chunk_words(peak, fmt_bytes) in text, text
    assert all(int(n) == peak["chunks"] for n in re.findall(r"\bin (\d+) chunks\b", text)), text
    assert ("in one piece" in text) == (peak["chunk_bytes"] is None), text
    if peak["chunks"] <= 1:
        assert "chunks of at most" not in text and "in a chunk of its own" not in text, text


def check_ledger(report: dict) -> None:
    """A sync's parts fit its total, leaf by leaf and in all: synced = moved - relayed + copied +
    reused (the formula notebook 05 states), the relayed bytes part of the moved ones."""
    sync = report.get("sync")
    if not sync:
        return
    for part in [sync, *sync["leaves"]]:
        moved, relayed = part["moved_cross_device_bytes"], part["relayed_cross_device_bytes"]
        assert 0 <= relayed <= moved, part.get("path", "total")
        parts = moved - relayed + part["copied_same_device_bytes"] + part["reused_bytes"]
        assert parts == part["synced_bytes"], (part.get("path", "total"), parts, part["synced_bytes"])


def check_sentences(lab, name: str) -> None:
    """After an answer: every view's words against its figures and the report (test_lab_words)."""
    from test_lab_words import check_words

    if lab.error is not None or lab.report is None:
        return
    report = lab.report
    check_words(report)
    figures = _figures(lab)
    check_same_devices(report, figures["grid"][0])
    check_memory_kinds(figures["grid"][0], figures["memory"][0])
    check_chunk_words(report, figures)
    check_ledger(report)
    check_no_text_runs_together(figures)


def check_no_text_runs_together(figures: dict[str, list[str]]) -> None:
    """No two texts of a figure overlap (``legibility.svg_overlaps``)."""
    from legibility import svg_overlaps

    for panel, svgs in figures.items():
        for svg in svgs:
            assert svg_overlaps(svg) == [], panel


@pytest.mark.cluster
@settings(max_examples=4)  # each example builds a few clusters: seconds each
@given(_CLICKS)
@example(_REFUSAL_THEN_CHANGE)
@example(_VLLM_OFFLOAD)
def test_the_labs_sentences_agree_with_its_figures_over_drawn_clicks(actions):
    _drive(actions, lambda lab, name, _: check_sentences(lab, name))


@pytest.mark.cluster
@settings(max_examples=4)  # each example builds a cluster and syncs it
@given(
    order=st.permutations(range(8)),
    size=st.sampled_from([2, 4, 8]),
    tall=st.booleans(),
    actor_reversed=st.booleans(),
    lora=st.booleans(),
    engine=st.sampled_from(["vanilla", "vllm", "sglang_jax"]),
    offload=st.booleans(),
    chunk=st.sampled_from([None, CHUNK]),
    reshard=st.sampled_from(["xla", "minimal"]),
)
@example(list(range(8))[::-1], 8, False, False, True, "vanilla", False, None, "xla")  # the actor's devices, reversed
def test_the_labs_words_agree_over_drawn_custom_meshes_and_device_orders(
    order, size, tall, actor_reversed, lora, engine, offload, chunk, reshard
):
    # Built as a user of the library builds one: the rollout on drawn devices in a drawn order
    # and shape, the actor over all eight (in reverse order, drawn), the other knobs drawn.
    import jax
    from test_lab_words import check_words, render

    from rlcluster_lab.app.report import placement_report
    from rlcluster_lab.app.scenario import Scenario, build_cluster
    from rlcluster_lab.core.meshes import layout_meshes, make_mesh
    from rlcluster_lab.core.roles import Role

    devices = jax.devices()[:8]
    role_to_mesh = layout_meshes("colocated", devices[::-1] if actor_reversed else devices)
    picked = [devices[i] for i in order[:size]]
    role_to_mesh[Role.ROLLOUT] = make_mesh(picked, (size, 1) if tall else (size // 2, 2))
    scenario = Scenario(lora=lora, engine=engine, offload=offload, sync_chunk_bytes=chunk, reshard=reshard)
    cluster = build_cluster(scenario, devices=devices, role_to_mesh=role_to_mesh)
    try:
        report = placement_report(cluster, sync=cluster.sync_weights()).to_json()
    finally:
        del cluster
    check_words(report)
    words = render(report)
    check_same_devices(report, words["grid"])
    check_memory_kinds(words["grid"], words["by_device"])
    check_ledger(report)
    check_no_text_runs_together(
        {view: [words[view]] for view in ("flow", "grid")} | {"memory": [words["by_device"], words["by_role"]]}
    )


@pytest.mark.parametrize("name", PLACEMENTS)
def test_the_devices_and_memory_views_draw_a_stored_reports_bytes_in_the_same_memory_kinds(name):
    from test_lab_words import render

    words = render(stored(name))
    check_memory_kinds(words["grid"], words["by_device"])


def test_the_devices_view_draws_the_offloaded_actor_dotted_as_the_memory_view_does():
    # Colocated with offload: the Devices view once drew the actor's 53.8 KiB per device solid
    # (device memory) beside the Memory view's dotted bar (pinned host).
    from test_lab_words import render

    words = render(stored("colocated-offload-chunked"))
    drawn, memory = grid_kinds(words["grid"]), memory_kinds(words["by_device"])
    assert drawn[("actor", "0")] == memory[("actor", "0")] == {"pinned_host"}


def test_a_roles_bytes_in_two_memory_kinds_on_one_device_are_drawn_in_both_by_either_view():
    # As a partial anchor holds them (the backbone in device memory, the adapters in pinned host),
    # here the actor's on device 0: its cell split between the two kinds, in their bytes.
    from stored_reports import elements

    from rlcluster_lab.lab.figures.memory import memory_by_device
    from rlcluster_lab.lab.figures.placement import device_grid

    on = {"device": 100, "pinned_host": 300}
    memory = {
        "by_role": {"actor": {"bytes": 400, "by_kind": on, "by_device": {"0": on}}},
        "by_device": {"0": on},
        "shared": [],
    }
    mesh = {"axis_names": ["fsdp"], "shape": {"fsdp": 1}, "device_ids": [0]}
    grid = device_grid({"role_to_mesh": {"actor": mesh}, "device_count": 1, "memory": memory})
    check_memory_kinds(grid, memory_by_device(memory))
    assert grid_kinds(grid) == {("actor", "0"): {"device", "pinned_host"}}
    assert elements(grid)["part:actor:0:pinned_host"].get("data-bytes") == "300"


# Configurations the lab builds, drawn: a layout, LoRA or full parameters, offload on or off,
# each chunk size the lab offers (one piece among them), an engine; constructed, then synced, and
# after each the Devices and Memory views' memory kinds compared, and the Weight sync view's
# words about its chunks held to the report's count.
_CONFIGURATIONS = st.fixed_dictionaries(
    {
        "layout": st.sampled_from(["colocated", "reshaped", "split", CUSTOM]),
        "lora": st.booleans(),
        "offload": st.booleans(),
        "sync_chunk_bytes": st.sampled_from([value for _, value in KNOBS["sync_chunk_bytes"].options]),
        "engine": st.sampled_from(["vanilla", "vllm", "sglang_jax"]),
    }
)


@pytest.mark.cluster
@settings(max_examples=4)  # each example builds a cluster and syncs it
@given(_CONFIGURATIONS)
# Colocated with offload: the actor's bytes once drawn in device memory beside pinned host.
@example({"layout": "colocated", "lora": False, "offload": True, "sync_chunk_bytes": 0, "engine": "vanilla"})
# Split, full, 1 MiB chunks: one chunk, once said to be "in one piece" beside "chunks of at most".
@example({"layout": "split", "lora": False, "offload": False, "sync_chunk_bytes": 1 << 20, "engine": "vanilla"})
def test_the_views_agree_on_memory_kinds_and_sync_chunks_over_drawn_configurations(knobs):
    def check(lab, name, _):
        if lab.error is None and lab.report is not None:
            figures = _figures(lab)
            check_memory_kinds(figures["grid"][0], figures["memory"][0])
            check_chunk_words(lab.report, figures)

    _drive([("construct", knobs), ("sync", None)], check)


# The sync's "X of Y" (the status once said the moved bytes, relayed ones included, "of" the
# synced ones: 77.0 KiB of 64.0 KiB) and a refusal's note (once kept after a knob changed), over
# drawn clicks, with the examples that failed pinned.


@pytest.mark.cluster
@settings(max_examples=4)
@given(_CLICKS)
@example(_CUSTOM_LORA_CHUNKED)
@example(_REFUSAL_THEN_CHANGE)
def test_every_x_of_y_the_lab_writes_has_x_at_most_y_over_drawn_clicks(actions):
    _drive(actions, lambda lab, name, _: check_x_of_y(_written(lab)))


def check_no_stale_note(lab, name: str, refused_before: bool, said: dict) -> None:
    """A refusal's note, its outlines and its status are gone once a knob changed since."""
    if name == "change" and refused_before:
        at_fault = [n for n, w in lab.knobs.outlined().items() if "rl-at-fault" in getattr(w, "_dom_classes", ())]
        assert lab.notes.shown is None, f"the note beside {lab.notes.shown} outlived the change of its cause"
        assert not at_fault, f"still outlined after the change: {at_fault}"
        assert lab.status.text != said.get("refusal"), lab.status.text
    elif lab.error is not None and lab.notes.shown is not None:
        said["refusal"] = lab.status.text


@pytest.mark.cluster
@settings(max_examples=4)
@given(st.lists(_CHANGES, min_size=1, max_size=3))
@example([{"flip_devices": [3]}])
def test_no_refusal_note_outlives_a_change_of_its_cause_over_drawn_clicks(changes):
    said: dict = {}
    actions = [("construct", {"layout": CUSTOM, "flip_devices": [0, 1, 2]})]
    actions += [("change", c) for c in changes if c] or [("change", {"lora": True})]
    _drive(actions, lambda lab, name, before: check_no_stale_note(lab, name, before, said))
