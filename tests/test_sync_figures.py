"""Figures of a weight sync (L3, P13), drawn from stored reports and from a hand-built one: every
segment's bytes are the report's, and every number is written out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from legibility import svg_problems
from stored_reports import PLACEMENTS, drawn_bytes, elements, stored, svg_text

from rlcluster_lab.app.scenario import Scenario
from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.lab.figures.sync import sync_bytes, sync_chunk_curve, sync_leaves, sync_peak, sync_plan
from rlcluster_lab.measure.sync_peak import chunk_words
from rlcluster_lab.planner.plan import plan_scenario


def _leaf(path: str, moved: int, copied: int, reused: int, minimum: int) -> dict:
    return {
        "path": path,
        "dtype": "float32",
        "dst_dtype": "float32",
        "shape": [4, 4],
        "src_sharding": "a",
        "dst_sharding": "b",
        "synced_bytes": moved + copied + reused,
        "moved_cross_device_bytes": moved,
        "arrived_cross_device_bytes": moved,
        "copied_same_device_bytes": copied,
        "reused_bytes": reused,
        "minimum_cross_device_bytes": minimum,
        "logical_bytes": 64,
    }


SYNC = {
    "units": "physical bytes",
    "method": "reshard",
    "lora": False,
    "synced_bytes": 1600,
    "moved_cross_device_bytes": 1000,
    "arrived_cross_device_bytes": 1000,
    "copied_same_device_bytes": 200,
    "reused_bytes": 400,
    "minimum_cross_device_bytes": 800,
    "synced_logical_bytes": 400,
    "anchor_bytes": 1600,
    "seconds": 0.0123,
    "anchor_seconds": 0.001,
    "arrived_by_device": {"0": 500, "1": 500},
    "peak_extra_bytes": {"0": {"device": 600}},
    "leaves": [_leaf("layers/0/w", 1000, 0, 0, 800), _leaf("embed", 0, 200, 400, 0)],
}


def _bytes_of(els: dict, key: str) -> int:
    return int(els[key].get("data-bytes"))


# ------------------------------------------------------------------ where the bytes went


def test_l3_sync_bytes_splits_the_synced_bytes_into_moved_copied_and_reused():
    els = elements(sync_bytes(SYNC))
    assert _bytes_of(els, "seg:sync:full sync:arrived") == 1000
    assert _bytes_of(els, "seg:sync:full sync:copied") == 200
    assert _bytes_of(els, "seg:sync:full sync:reused") == 400
    assert drawn_bytes(els, "seg:sync:full sync:") == SYNC["synced_bytes"]
    # Ticks: the least the placement allows to cross, and the same sync in logical bytes.
    assert _bytes_of(els, "min:full sync") == 800 and _bytes_of(els, "logical:full sync") == 400
    text = svg_text(sync_bytes(SYNC))
    assert "1.6 KiB synced (physical" in text and "400 B logical (each leaf once)" in text
    assert "excess 200 B" in text and "physical / logical = 4.0" in text


@pytest.mark.parametrize("name", ["colocated-lora", "reshaped-vllm", "split-offload"])
def test_p13_sync_bytes_of_a_stored_report_draws_and_writes_the_reports_numbers(name):
    sync = stored(name)["sync"]
    svg = sync_bytes(sync)
    els = elements(svg)
    label = ("LoRA" if sync["lora"] else "full") + " sync"
    assert drawn_bytes(els, f"seg:sync:{label}:") == sync["synced_bytes"]
    assert drawn_bytes(els, f"seg:cross:{label}:") == sync["moved_cross_device_bytes"]
    assert drawn_bytes(els, f"seg:cross:{label}:relayed") == sync["relayed_cross_device_bytes"]
    text = svg_text(svg)
    moved = sync["moved_cross_device_bytes"] - sync["relayed_cross_device_bytes"]
    for words in (
        f"{fmt_bytes(sync['synced_bytes'])} synced (physical",
        f"{fmt_bytes(sync['synced_logical_bytes'])} logical (each leaf once)",
        f"arrived from other devices {fmt_bytes(moved)}",
        f"copied within a device {fmt_bytes(sync['copied_same_device_bytes'])}",
        f"reused (no copy) {fmt_bytes(sync['reused_bytes'])}",
        f"{fmt_bytes(sync['moved_cross_device_bytes'])} crossed devices",
        f"the least this placement allows: {fmt_bytes(sync['minimum_cross_device_bytes'])}",
    ):
        assert words in text, words


def test_p7_sync_onto_an_engines_own_mesh_draws_the_relayed_bytes_apart():
    sync = stored("reshaped-vllm")["sync"]
    assert sync["relayed_cross_device_bytes"] > 0  # XLA's two hops onto the engine's own mesh
    els = elements(sync_bytes(sync))
    assert _bytes_of(els, "seg:cross:full sync:relayed") == sync["relayed_cross_device_bytes"]
    kept = sync["moved_cross_device_bytes"] - sync["relayed_cross_device_bytes"]
    assert _bytes_of(els, "seg:cross:full sync:kept") == _bytes_of(els, "seg:sync:full sync:arrived") == kept


def test_l3_sync_bytes_marks_logical_bytes_below_physical_where_leaves_are_replicated():
    sync = stored("reshaped-lora")["sync"]
    assert sync["synced_logical_bytes"] < sync["synced_bytes"]  # a replicated leaf counts once per device
    assert _bytes_of(elements(sync_bytes(sync)), "logical:LoRA sync") == sync["synced_logical_bytes"]


def test_l3_sync_bytes_compares_several_runs_on_one_scale():
    colocated = {
        **SYNC,
        "moved_cross_device_bytes": 0,
        "arrived_cross_device_bytes": 0,
        "copied_same_device_bytes": 0,
        "reused_bytes": 1600,
        "minimum_cross_device_bytes": 0,
    }
    svg = sync_bytes({"colocated": colocated, "split": SYNC})
    els = elements(svg)
    assert drawn_bytes(els, "seg:sync:colocated:arrived") == 0
    assert _bytes_of(els, "seg:sync:colocated:reused") == 1600
    assert _bytes_of(els, "seg:sync:split:arrived") == 1000
    # One byte scale: 1600 reused bytes are drawn 1.6 times as long as 1000 moved ones.
    reused, arrived = (float(els[k].get("width")) for k in ("seg:sync:colocated:reused", "seg:sync:split:arrived"))
    assert reused / arrived == pytest.approx(1.6, rel=1e-2)
    text = svg_text(svg)
    assert "colocated: 1.6 KiB synced" in text and "split: 1.6 KiB synced" in text and "excess 0 B" in text


# ------------------------------------------------------------------ per leaf


def test_l3_sync_leaves_draws_each_leafs_bytes_and_its_minimum():
    els = elements(sync_leaves(SYNC))
    assert _bytes_of(els, "seg:leaf:layers/0/w:arrived_cross_device_bytes") == 1000
    assert _bytes_of(els, "seg:leaf:embed:reused_bytes") == 400
    assert _bytes_of(els, "seg:leaf:embed:copied_same_device_bytes") == 200
    assert _bytes_of(els, "min:leaf:layers/0/w") == 800
    assert "2 leaves" in svg_text(sync_leaves(SYNC))


def test_l3_sync_leaves_keeps_the_leaves_with_the_most_synced_bytes():
    svg = sync_leaves(SYNC, top=1)
    assert {key.split(":")[2] for key in elements(svg) if key.startswith("seg:leaf:")} == {"layers/0/w"}
    assert "1 of 2 leaves" in svg_text(svg)
    stored_sync = stored("reshaped-lora")["sync"]
    top = sorted(stored_sync["leaves"], key=lambda lf: (-lf["synced_bytes"], lf["path"]))[:5]
    drawn = {key.split(":")[2] for key in elements(sync_leaves(stored_sync, top=5)) if key.startswith("min:leaf:")}
    assert drawn == {lf["path"] for lf in top}


# ------------------------------------------------------------------ legibility


@pytest.mark.parametrize("name", PLACEMENTS)
def test_sync_figures_of_every_stored_report_are_legible_at_their_width(name):
    sync = stored(name)["sync"]
    assert svg_problems(sync_bytes(sync)) == []
    assert svg_problems(sync_leaves(sync)) == []
    assert svg_problems(sync_leaves(sync, top=12)) == []


def test_sync_bytes_of_six_runs_with_long_labels_is_legible():
    runs = {f"{name}, LoRA, mini-batch 8": stored(name)["sync"] for name in PLACEMENTS[:6]}
    assert svg_problems(sync_bytes(runs)) == []
    assert svg_problems(sync_bytes(SYNC)) == [] and svg_problems(sync_leaves(SYNC)) == []


# ------------------------------------------------------------------ the sync's transient peak


def _planned_peak(**knobs) -> dict:
    from rlcluster_lab import Scenario
    from rlcluster_lab.planner.plan import plan_scenario

    return plan_scenario(Scenario(**knobs)).to_json()["sync"]


@pytest.mark.parametrize(
    "knobs",
    [
        {"layout": "reshaped"},
        {"layout": "reshaped", "sync_chunk_bytes": 48 << 10},
        {"layout": "split", "lora": True, "offload": True, "engine": "vllm", "sync_chunk_bytes": 12 << 10},
    ],
    ids=["one-piece", "chunks", "offload"],
)
def test_l3_sync_peak_draws_each_phases_level_and_the_devices_peak(knobs):
    sync = _planned_peak(**knobs)
    peak = sync["transient_peak"]
    device = peak["max_device"]
    svg = sync_peak(sync)
    els = elements(svg)
    assert _bytes_of(els, "peak-mark:device") == peak["by_device"][device]["device"]
    for i, phase in enumerate(peak["phases"]):
        level = phase["arrays"].get(device, {}).get("device", 0) + phase["temporaries"].get(device, 0)
        assert _bytes_of(els, f"level:device:{i}") == level
        # What is drawn adds up to the level: the stacked new bytes, minus what was released beyond them.
        assert drawn_bytes(els, f"peak:device:{i}:") == level
    assert fmt_bytes(peak["by_device"][device]["device"]) in svg_text(svg)
    assert svg_problems(svg) == []


def test_l3_sync_chunk_curve_draws_each_points_peak_and_plan():
    points = [
        {"label": "one piece", "peak": 104448, "planned": 104448, "seconds": 0.004},
        {"label": "64.0 KiB", "peak": 23296, "planned": 23296, "seconds": 0.011},
    ]
    svg = sync_chunk_curve(points)
    els = elements(svg)
    assert [_bytes_of(els, f"curve:peak:{i}") for i in range(2)] == [104448, 23296]
    assert [_bytes_of(els, f"curve:planned:{i}") for i in range(2)] == [104448, 23296]
    assert "11.0 ms" in svg_text(svg) and svg_problems(svg) == []


# ------------------------------------------------------------------ chunks in words


@settings(max_examples=16, deadline=None, derandomize=True)
@given(
    layout=st.sampled_from(["colocated", "reshaped", "split"]),
    lora=st.booleans(),
    offload=st.booleans(),
    engine=st.sampled_from(["vanilla", "vllm"]),
    chunk=st.sampled_from([1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]),
)
def test_the_chunk_words_say_a_leaf_larger_than_a_chunk_moves_whole(layout, lora, offload, engine, chunk):
    """The peak figure's subtitle says how the handover was cut in the report's own numbers:
    "at most N per chunk" only where every chunk is, and where a leaf is larger than N (it is
    never split) that it moved whole, with the largest chunk's bytes (P13)."""
    scenario = Scenario(layout=layout, lora=lora, offload=offload, engine=engine, sync_chunk_bytes=chunk)
    sync = plan_scenario(scenario).to_json()["sync"]
    peak = sync["transient_peak"]
    words = chunk_words(peak, fmt_bytes)
    assert words in svg_text(sync_peak(sync))
    sizes = [int(leaf["logical_bytes"]) for leaf in sorted(sync["leaves"], key=lambda lf: lf["path"])]
    larger = [n for n in sizes if n > chunk]
    if peak["chunks"] <= 1:
        # One chunk: the limit is above all the handover's bytes (the split full actor's 421.2 KiB
        # under 1 MiB once read "in one piece" beside an order "in chunks of at most 1,048,576 bytes").
        assert words == f"in one chunk: the limit, {fmt_bytes(chunk)}, is above the {fmt_bytes(sum(sizes))} handed over"
        return
    assert words.startswith(f"in {peak['chunks']} chunks of at most {fmt_bytes(chunk)}")
    assert ("moves whole" in words) == bool(larger), words
    if larger:
        assert f"the largest: {fmt_bytes(max(larger))}" in words and peak["largest_chunk_bytes"] == max(larger)


def test_a_sync_in_one_chunk_says_so_once_and_no_sentence_of_its_figure_says_otherwise():
    # Split layout, full parameters, 1 MiB chunks: the 431,360 bytes handed over go in one chunk.
    from rlcluster_lab.cli.plan import format_plan

    plan = plan_scenario(Scenario(layout="split", sync_chunk_bytes=1 << 20)).to_json()
    sync = plan["sync"]
    peak = sync["transient_peak"]
    assert (peak["chunks"], peak["chunk_bytes"], peak["largest_chunk_bytes"]) == (1, 1 << 20, 431_360)
    said = "in one chunk: the limit, 1.0 MiB, is above the 421.2 KiB handed over"
    # The figure, and the plan's line about the peak that the CLI prints, with the same words.
    line = next(line for line in format_plan(plan).splitlines() if "transient peak" in line)
    for text in (svg_text(sync_peak(sync)), line):
        assert said in text
        for otherwise in ("in one piece", "chunks of at most", "a larger leaf", "in a chunk of its own"):
            assert otherwise not in text, otherwise


def test_one_chunk_of_one_leaf_above_the_limit_says_the_leaf_moved_whole():
    peak = {"chunks": 1, "chunk_bytes": 16 << 10, "largest_chunk_bytes": 66 << 10}
    assert chunk_words(peak, fmt_bytes) == (
        "in one chunk: the one leaf handed over, 66.0 KiB, is above the limit, 16.0 KiB"
    )
    assert chunk_words({**peak, "chunk_bytes": None}, fmt_bytes) == "in one piece"


def test_the_stored_chunked_sync_says_its_66_kib_leaf_moved_whole():
    sync = stored("colocated-offload-chunked")["sync"]
    peak = sync["transient_peak"]
    assert peak["largest_chunk_bytes"] == 67_584 > peak["chunk_bytes"] == 16_384
    text = svg_text(sync_peak(sync))
    assert "chunks of at most 16.0 KiB, but a leaf larger than that moves whole" in text
    assert "(the largest: 66.0 KiB)" in text


@pytest.mark.parametrize("name", PLACEMENTS)
def test_each_leafs_drawn_parts_are_its_synced_bytes_and_the_relayed_ones_are_drawn_apart(name):
    sync = stored(name)["sync"]
    els = elements(sync_leaves(sync))
    parts = ("arrived_cross_device_bytes", "copied_same_device_bytes", "reused_bytes")
    for lf in sync["leaves"]:
        drawn = sum(drawn_bytes(els, f"seg:leaf:{lf['path']}:{key}") for key in parts)
        assert drawn == lf["synced_bytes"], lf["path"]
        relayed = drawn_bytes(els, f"seg:leaf:{lf['path']}:relayed_cross_device_bytes")
        assert relayed == lf["relayed_cross_device_bytes"], lf["path"]


@settings(deadline=None, max_examples=40, derandomize=True)
@given(
    st.lists(st.text(alphabet="abcdefghij ->0123456789(),=", min_size=1, max_size=150), max_size=8),
    st.floats(1e-5, 1.0),
    st.one_of(st.none(), st.floats(1e-5, 1.0)),
    st.integers(0, 10**6),
)
def test_the_plan_figure_writes_every_line_and_draws_the_handover_beside_one_device_put(lines, seconds, floor, moved):
    """``sync_plan``: each plan line written out (wrapped, never cut), and where one device_put was
    timed, its bar and the handover's in proportion, the ratio written; readable at its width."""
    lines = [" ".join(line.split()) for line in lines if line.split()]
    sync = {"plan": lines, "seconds": seconds, "device_put_seconds": floor, "moved_cross_device_bytes": moved}
    svg = sync_plan(sync)
    text = svg_text(svg)
    for line in lines or ["nothing was resharded"]:
        assert line in text.replace("\u2022 ", "")
    els = elements(svg)
    bars = {k: float(el.get("width")) for k, el in els.items() if k.startswith("time:")}
    if floor is None:
        assert not bars
    else:
        handover, put = bars["time:the sync's handover"], bars["time:one device_put, same tree"]
        assert handover / put == pytest.approx(seconds / floor, rel=1e-2, abs=0.2 / put)
        assert f"{seconds / floor:.1f}x one device_put" in text
        assert ("gathers through host memory" in text) == bool(moved)
    assert svg_problems(svg) == []
