"""One device holding the layouts that fit it (what a TPU runtime's single chip builds: colocated,
and reshaped as the same chip with another mesh), and every memory and sync figure naming the
devices it comes from. Built on single simulated CPU devices; the allocator's figures come from
stand-in devices (``test_platforms.Chip``)."""

from __future__ import annotations

import html
import re
import types
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from stored_reports import PLACEMENTS, elements, stored, svg_text
from test_platforms import Chip

from rlcluster_lab import Scenario, build_cluster, placement_report
from rlcluster_lab.cli.text import format_memory, format_report, format_sync
from rlcluster_lab.core.options import LAYOUTS
from rlcluster_lab.lab.figures.flow import SAME_LAYOUT_KEPT, measured_text
from rlcluster_lab.lab.figures.memory import memory_by_device, memory_by_role
from rlcluster_lab.lab.figures.placement import device_grid
from rlcluster_lab.lab.figures.shard import sync_summary
from rlcluster_lab.lab.figures.shard_data import sync_flows
from rlcluster_lab.lab.figures.sync import sync_bytes, sync_leaves, sync_peak
from rlcluster_lab.lab.notebook.setup import LayoutFamily
from rlcluster_lab.lab.widget import status as sentences
from rlcluster_lab.lab.widget.display import summary_html
from rlcluster_lab.lab.widget.placement_lab import PlacementLab
from rlcluster_lab.measure import memory_of
from rlcluster_lab.measure.memory import ALLOCATOR_DIFFERENCE, own_devices_words
from rlcluster_lab.model import init_model
from rlcluster_lab.multiprocess.report import merge_memory, merge_sync, merge_where

CPUS = jax.devices("cpu")


def _text(svg: str) -> str:
    return html.unescape(str(svg))


@pytest.mark.cluster
@pytest.mark.parametrize(
    "device,engine,lora,offload",
    [
        (0, "vanilla", False, False),
        (5, "vanilla", True, True),
        (3, "sglang_jax", True, False),
        (7, "sglang_jax", False, True),
    ],
)
def test_reshaped_on_one_device_gives_the_rollout_its_own_mesh_and_the_report_says_what_was_copied(
    device, engine, lora, offload
):
    """P1 sees two meshes over one device, so P3 gives the rollout its own copy. An engine that owns
    its weights (sglang_jax) holds a real copy, and its sync copies every byte on the device; the
    vanilla engine's copy is placed with the actor's layout on the same device, where JAX keeps the
    actor's buffers: the memory report measures them as shared, the per-role figure says why, and
    the sync reuses every byte; with offload (P14) each role is placed in pinned host on its own,
    so that copy is real too. Nothing crosses devices either way."""
    scenario = Scenario(layout="reshaped", engine=engine, lora=lora, offload=offload)
    cluster = build_cluster(scenario, devices=[CPUS[device]])
    cluster.sync_weights()
    report = placement_report(cluster, sync=cluster.sync_weights()).to_json()
    p1 = [d for d in report["decisions"] if d["rule"] == "P1"][-1]
    assert not p1["values"]["equal"] and p1["values"]["same_devices"]
    assert report["role_to_mesh"]["rollout"]["axis_names"] == ["tp", "fsdp"]
    assert report["role_to_mesh"]["actor"]["axis_names"] == ["fsdp", "tp"]
    assert report["rollout_branch"] == ("second_copy" if engine == "vanilla" else "engine_initial_value")
    memory, sync = report["memory"], report["sync"]
    assert memory["where"] == sync["where"] == "1 CPU device"
    assert set(memory["by_device"]) == {str(device)}
    shared = [g for g in memory["shared"] if {"actor", "rollout"} <= set(g["roles"])]
    assert sync["moved_cross_device_bytes"] == sync["minimum_cross_device_bytes"] == 0
    role_text = _text(memory_by_role(memory, report))
    if engine == "vanilla" and not offload:
        assert sum(g["bytes"] for g in shared) == memory["by_role"]["rollout"]["bytes"] > 0
        assert sync["reused_bytes"] == sync["synced_bytes"] > 0 and sync["copied_same_device_bytes"] == 0
        assert SAME_LAYOUT_KEPT in role_text and SAME_LAYOUT_KEPT in measured_text(report, "rollout")
    else:
        assert not shared and memory["by_role"]["rollout"]["bytes"] > 0
        assert sync["copied_same_device_bytes"] == sync["synced_bytes"] > 0 and sync["reused_bytes"] == 0
        assert SAME_LAYOUT_KEPT not in role_text
    if offload:
        assert report["anchor"]["memory_kind"] == "pinned_host"
    assert "1 CPU device, measured: " in role_text
    assert "1 CPU device, measured: per role: physical bytes" in _text(memory_by_device(memory))
    assert "on 1 CPU device:" in _text(sync_bytes(sync))
    assert "Weight sync per leaf on 1 CPU device" in _text(sync_leaves(sync))
    assert f"device {device} of 1 CPU device" in _text(sync_peak(sync))
    heading = sync_summary(sync_flows(sync))._suptitle.get_text()
    assert f"reshard on 1 CPU device, {sync['method'][:20]}" in heading.replace("\n", " ")
    assert format_sync(sync)[0].startswith("sync (L3 on 1 CPU device, measured")
    assert "synced on 1 CPU device came from other devices (measured)." in sentences.synced(sync, 0.1)
    assert " held on 1 CPU device (measured)" in sentences.constructed(report, 1.0)


@pytest.mark.parametrize("chips", [1, 2])
def test_the_allocator_figures_stand_beside_the_per_role_figure_with_why_they_differ(chips):
    """Where the devices report allocator figures (a chip's ``memory_stats()``), the memory view
    names them as the chip's allocator's, gives each device's bytes in use beside the per-role bytes
    in device memory, and says in one sentence why the two differ; where they report none (CPU),
    it says so and names no allocator figure."""
    model = init_model("tiny", seed=1, mesh=jax.sharding.Mesh(np.array(CPUS[:chips]).reshape(chips, 1), ("fsdp", "tp")))
    entries = {"actor": nnx.state(model)}
    per_role = memory_of(entries, devices=CPUS[:chips]).to_json()
    in_use = 3 * per_role["unique_bytes"] + 17
    stand_ins = [
        Chip(i, "tpu", {"bytes_in_use": in_use, "peak_bytes_in_use": in_use, "bytes_limit": 2**34})
        for i in range(chips)
    ]
    for chip in stand_ins:
        chip.device_kind = "TPU v5 lite"
    memory = memory_of(entries, devices=stand_ins).to_json()
    where = "TPU v5 lite chip 0" if chips == 1 else "2 TPU v5 lite chips"
    assert memory["where"] == where and memory["allocator"]["where"] == f"{where}, allocator"
    assert memory["allocator"]["difference"] == ALLOCATOR_DIFFERENCE
    text = _text(memory_by_device(memory))
    from rlcluster_lab.core.limits import fmt_bytes

    pairs = "; ".join(
        f"dev {d}: {fmt_bytes(in_use)} in use beside {fmt_bytes(kinds['device'])} per role"
        for d, kinds in memory["by_device"].items()
    )
    assert f"{where}, allocator (the black tick): {pairs}. {ALLOCATOR_DIFFERENCE}" in text
    assert f"{where}, measured: per role: physical bytes" in text
    said = "\n".join(format_memory(memory))  # the CLI's text report says the same
    assert f"memory (L2, measured on {where};" in said and ALLOCATOR_DIFFERENCE in said
    for d, kinds in memory["by_device"].items():
        assert f"{where}, allocator: device {d}: {in_use:,} bytes in use beside {kinds['device']:,} per role" in said
    assert "allocator: the cpu devices report no allocator figures" in "\n".join(format_memory(per_role))
    plain = _text(memory_by_device(per_role))
    assert "allocator (the black tick)" not in plain and ALLOCATOR_DIFFERENCE not in plain
    assert "report no allocator figures" in plain


def test_each_process_names_only_the_devices_it_measures():
    mine = [Chip(i, "tpu") for i in range(2)]
    theirs = [Chip(i, "tpu") for i in range(2, 6)]
    for chip in theirs:
        chip.process_index = 1
    assert own_devices_words(mine + theirs) == "2 Stand-in chips"
    assert own_devices_words(theirs) == ""


def test_processes_name_their_devices_in_the_merged_reports():
    assert merge_where([{"where": "4 simulated CPU devices"}] * 2) == "2 processes of 4 simulated CPU devices each"
    assert merge_where([{"where": "2 simulated CPU devices"}, {"where": "6 simulated CPU devices"}]) == (
        "process 0: 2 simulated CPU devices; process 1: 6 simulated CPU devices"
    )
    assert merge_where([{"where": "1 CPU device"}]) == "1 CPU device"
    assert merge_where([{}, {}]) == ""
    memory = {
        "units": "u",
        "source": "s",
        "where": "4 simulated CPU devices",
        "by_role": {},
        "by_device": {},
        "shared": [],
        "unique_bytes": 0,
        "naive_bytes": 0,
        "allocator": {"available": False, "note": "none", "by_device": {}},
    }
    assert merge_memory([memory, memory])["where"] == "2 processes of 4 simulated CPU devices each"
    sync = {
        "units": "u",
        "where": "4 simulated CPU devices",
        "method": "m",
        "lora": False,
        "global_step": 1,
        "reshard_strategy": "xla",
        "anchor_bytes": 0,
        "anchor_mode": "full",
        "seconds": 0.0,
        "anchor_seconds": 0.0,
        "includes_compilation": False,
        "includes_program_load": False,
        "arrived_by_device": {},
        "peak_extra_bytes": {},
        "leaves": [],
    }
    assert merge_sync([sync, sync])["where"] == "2 processes of 4 simulated CPU devices each"


def _one_chip_families(chip: int = 0):
    """What ``setup()`` gives on a single chip, with a CPU device standing in for the chip (a real
    JAX device, so clusters build on it): colocated and reshaped on it, split on the eight."""
    return (LayoutFamily((CPUS[chip],), ("colocated", "reshaped")), LayoutFamily(tuple(CPUS), ("split",)))


def test_the_layout_menu_names_where_each_layout_is_built():
    knobs = PlacementLab(devices=CPUS, families=_one_chip_families(2), rehearse=False).knobs
    assert list(knobs.layout.options) == [
        ("colocated on 1 CPU device", "colocated"),
        ("reshaped on 1 CPU device", "reshaped"),
        ("split on 8 simulated CPU devices", "split"),
        ("custom rollout mesh", "custom"),
    ]
    assert knobs.layout_devices() == [CPUS[2]]
    knobs.layout.value = "split"
    assert knobs.layout_devices() == list(CPUS)
    knobs.layout.value = "custom"  # the trainer roles of a custom rollout mesh: on the lab's devices
    assert knobs.layout_devices() == list(CPUS)
    plain = PlacementLab(devices=CPUS, rehearse=False).knobs
    assert [v for _, v in plain.layout.options] == ["colocated", "reshaped", "split", "custom"]
    assert [label for label, _ in plain.layout.options][:3] == ["colocated", "reshaped", "split"]
    with pytest.raises(TypeError, match="families must hold JAX devices"):
        PlacementLab(devices=CPUS, families=[LayoutFamily((Chip(0),), ("colocated",))], rehearse=False)


@pytest.mark.cluster
def test_the_lab_builds_each_layout_on_its_family_and_its_views_say_where():
    lab = PlacementLab(devices=CPUS, families=_one_chip_families(3), rehearse=False)
    lab.knobs.layout.value = "reshaped"
    lab.construct()
    assert lab.error is None and lab.cluster.devices() == [CPUS[3]]
    assert lab.report["memory"]["where"] == "1 CPU device" and " held on 1 CPU device (measured)" in lab.status.text
    lab.sync()
    assert lab.report["sync"]["where"] == "1 CPU device"
    assert "synced on 1 CPU device came from other devices" in lab.status.text
    lab.knobs.layout.value = "split"
    lab.construct()
    assert lab.error is None and lab.cluster.devices() == list(CPUS)
    assert "held on 8 simulated CPU devices" in lab.status.text


def test_experiments_build_each_layout_where_the_lab_puts_it(monkeypatch):
    """Given what ``setup()`` returned, the notebooks' experiments build each layout on
    ``devices_for(layout)``; given devices, on those; their tables name the devices when the rows
    come from different ones."""
    from rlcluster_lab.lab.experiments import runs as ex
    from rlcluster_lab.lab.notebook import setup as lab_setup

    lab = lab_setup.LabDevices(
        platform="cpu",
        devices=tuple(CPUS),
        simulated=True,
        accelerator="tpu",
        accelerator_devices=(CPUS[1],),
        colab=False,
        reachable=("colocated", "reshaped", "split"),
        families=_one_chip_families(1),
    )
    assert lab_setup.layout_devices(lab, "colocated") == [CPUS[1]]
    assert lab_setup.layout_devices(lab, "split") == list(CPUS)
    assert lab_setup.layout_devices(CPUS[:4], "reshaped") == list(CPUS[:4])
    assert lab_setup.layouts_held(lab) == ["colocated", "reshaped", "split"]
    assert ex.layout_rows(lab) == [
        {
            "layout": "colocated",
            "actor, reference, reward, critic": "fsdp=1xtp=1 on device 1",
            "rollout": "fsdp=1xtp=1 on device 1",
            "on": "1 CPU device",
        },
        {
            "layout": "reshaped",
            "actor, reference, reward, critic": "fsdp=1xtp=1 on device 1",
            "rollout": "tp=1xfsdp=1 on device 1",
            "on": "1 CPU device",
        },
        {
            "layout": "split",
            "actor, reference, reward, critic": "fsdp=2xtp=2 on devices 0-3",
            "rollout": "fsdp=2xtp=2 on devices 4-7",
            "on": "8 simulated CPU devices",
        },
    ]
    assert "on" not in ex.layout_rows(CPUS)[0]
    built = []
    monkeypatch.setattr(ex, "build_cluster", lambda scenario, devices: built.append((scenario.layout, devices)))
    monkeypatch.setattr(ex, "placement_report", lambda cluster: types.SimpleNamespace(to_json=dict))
    ex.reports_for({"a": Scenario(layout="reshaped"), "b": Scenario(layout="split")}, lab)
    assert built == [("reshaped", [CPUS[1]]), ("split", list(CPUS))]
    rows = [{"run": "a"}, {"run": "b"}]
    mixed = {"a": {"where": "TPU v5 lite chip 0"}, "b": {"where": "8 simulated CPU devices"}}
    assert ex.where_column(rows, mixed) == [
        {"run": "a", "on": "TPU v5 lite chip 0"},
        {"run": "b", "on": "8 simulated CPU devices"},
    ]
    same = {"a": {"where": "8 simulated CPU devices"}, "b": {"where": "8 simulated CPU devices"}}
    assert ex.where_column(rows, same) == rows


@pytest.mark.cluster
@pytest.mark.parametrize("device,lora", [(2, False), (6, True)])
def test_the_planner_plans_reshaped_on_one_device_as_it_is_measured(device, lora):
    """The what-if planner builds the same one-device layout on paper (the second mesh's axes named
    the other way round): its planned sync peak is the measured one, on every device. The vllm
    stand-in keeps weights of its own, so the handover makes new arrays there."""
    from rlcluster_lab.lab.experiments import sync_peaks

    one = CPUS[device : device + 1]
    scenario = Scenario(layout="reshaped", lora=lora, engine="vllm")
    cluster = build_cluster(scenario, devices=one)
    cluster.sync_weights()
    syncs = {"run": cluster.sync_weights().to_json()}
    rows = sync_peaks.planned_peak_rows(one, {"run": scenario}, syncs)
    assert [r["every device agrees"] for r in rows] == [True, True]
    assert all(r["planned"] == r["measured"] for r in rows) and any(r["measured"] for r in rows)


def _grid_columns(svg: str) -> set[int]:
    return {int(key.rsplit(":", 1)[1]) for key in elements(svg) if key.startswith("cell:")}


def _check_named_and_drawn_on(report: dict, where: str, ids: set[int]) -> None:
    """The device grid draws a column for each of the cluster's devices and no other, and it, the
    lab's summary and the CLI's report name the devices as the memory report does."""
    svg = device_grid(report)
    assert _grid_columns(svg) == ids
    assert svg_text(svg).startswith(f"Devices: {where}; each cell: mesh coordinate")
    assert f"on <b>{html.escape(where)}</b>; engine" in summary_html(report)
    assert format_report(report).startswith(f"on {where}; engine {report['engine']}")


@pytest.mark.parametrize("name", PLACEMENTS)
@pytest.mark.parametrize("chip_id", [0, 5])
def test_a_cluster_on_one_chip_is_drawn_on_that_chip_alone_and_named_as_its_memory_report_names_it(name, chip_id):
    """A stored report's cluster moved onto one stand-in chip (every mesh over that one device, the
    memory report's ``where`` the chip's words), the platform still counted as eight devices: the
    grid draws the chip's column only and every view names the chip, not "8 on tpu"."""
    report = stored(name)
    for meshes in (report["role_to_mesh"], report["config_role_to_mesh"]):
        for mesh in meshes.values():
            mesh.update(shape=dict.fromkeys(mesh["axis_names"], 1), device_ids=[chip_id])
    chip = Chip(chip_id, "tpu")
    chip.device_kind = "TPU v5 lite"
    report.update(platform="tpu", device_count=8)
    report["memory"]["where"] = own_devices_words([chip])
    _check_named_and_drawn_on(report, f"TPU v5 lite chip {chip_id}", {chip_id})


@pytest.mark.cluster
@pytest.mark.parametrize(
    "layout,ids,lora,engine",
    [
        ("colocated", [6], True, "vanilla"),
        ("reshaped", [1], False, "sglang_jax"),
        ("reshaped", [4, 5, 6, 7], True, "vanilla"),
        ("split", [2, 3, 4, 5], False, "vanilla"),
    ],
)
def test_a_cluster_on_some_of_the_devices_is_drawn_on_its_own_devices_and_named_by_them(layout, ids, lora, engine):
    """Built on a subset of the eight devices (one of them, as on a single chip, or four), the
    report counts the cluster's devices, and the grid, summary and CLI name and draw those alone."""
    scenario = Scenario(layout=layout, lora=lora, engine=engine)
    report = placement_report(build_cluster(scenario, devices=[CPUS[i] for i in ids])).to_json()
    assert report["device_count"] == len(ids)
    where = "1 CPU device" if len(ids) == 1 else f"{len(ids)} simulated CPU devices"
    assert report["memory"]["where"] == where
    _check_named_and_drawn_on(report, where, set(ids))


def _one_chip_lab(chip: int):
    """``setup()``'s answer on a single chip, the chip stood in for by CPU device ``chip``."""
    from rlcluster_lab.lab.notebook import setup as lab_setup

    return lab_setup.LabDevices(
        platform="cpu",
        devices=tuple(CPUS),
        simulated=True,
        accelerator="tpu",
        accelerator_devices=(CPUS[chip],),
        colab=False,
        reachable=("colocated", "reshaped", "split"),
        families=_one_chip_families(chip),
    )


def _on_the_chip(report: dict, chip: int, where: str) -> None:
    meshes = [*report["role_to_mesh"].values(), *report["config_role_to_mesh"].values()]
    assert {d for mesh in meshes for d in mesh["device_ids"]} == {chip}
    assert report["memory"]["where"] == where and report["device_count"] == 1
    assert svg_text(device_grid(report)).startswith(f"Devices: {where};")


@pytest.mark.cluster
# The built-in sampler (handed the actor's buffers) and an engine with a mesh and weights of its
# own (P7), on two chip ids.
@pytest.mark.parametrize("chip,engine", [(0, "vanilla"), (7, "vllm")])
def test_the_notebooks_experiments_build_the_layouts_that_fit_one_chip_on_it_and_say_so(chip, engine):
    """The experiments notebooks 02, 05 and 06 call, given what ``setup()`` returns on a single
    chip: colocated and reshaped, with and without LoRA and offload, are built on the chip (every
    mesh over it alone), and their memory and sync reports, tables and grid name it; split is
    built on the simulated devices beside it, and a table of both says which row is where."""
    from rlcluster_lab.lab.experiments import mechanism as mech
    from rlcluster_lab.lab.experiments import runs as ex
    from rlcluster_lab.lab.experiments import sync_peaks

    lab = _one_chip_lab(chip)
    where = lab.families[0].where
    scenarios = {
        f"{layout}, lora={lora}, offload={offload}": Scenario(layout=layout, lora=lora, offload=offload, engine=engine)
        for layout in ("colocated", "reshaped")
        for lora, offload in ((False, False), (True, False), (False, True), (True, True))
    }
    reports = ex.reports_for(scenarios, lab)  # notebook 02's reshaped cast, 06's offload on and off
    for label, report in reports.items():
        _on_the_chip(report, chip, where)
        assert report["lora"] == ("lora=True" in label) and report["offload_to_cpu"] == ("offload=True" in label)
    assert "on" not in ex.memory_rows(reports)[0]  # one place: the heading says it once
    compared = ex.memory_comparison("colocated", lab)  # notebook 02
    for report in compared.values():
        _on_the_chip(report, chip, where)
    growth = ex.copy_growth_line(compared, "LoRA over the reference", "LoRA over a copy")
    backbone = compared["LoRA over the reference"]["memory"]["by_role"]["reference"]["bytes"]
    assert growth.endswith(f"= {backbone:,} bytes: exactly the reference's backbone ({backbone:,} bytes), on {where}")
    syncs = ex.sync_matrix(lab, engine=engine)  # notebook 05
    assert list(syncs) == [f"{layout}, {lora}" for layout in LAYOUTS for lora in ("full", "LoRA")]
    for label, sync in syncs.items():
        on_chip = not label.startswith("split")
        assert sync["where"] == (where if on_chip else "8 simulated CPU devices")
        assert set(sync["arrived_by_device"]) <= ({str(chip)} if on_chip else {str(d.id) for d in CPUS})
    assert [r["on"] for r in ex.sync_rows(syncs)] == [where] * 4 + ["8 simulated CPU devices"] * 2
    if engine == "vanilla":  # what notebook 05 says of a single chip: every byte reused, nothing new
        for label in ("colocated, full", "colocated, LoRA", "reshaped, full", "reshaped, LoRA"):
            assert syncs[label]["reused_bytes"] == syncs[label]["synced_bytes"] > 0
            assert syncs[label]["moved_cross_device_bytes"] == 0
        peaks = {r["run"]: r for r in sync_peaks.peak_rows(syncs)}
        assert all(peaks[label]["device peak"] == 0 for label in list(syncs)[:4])
    six = {label: Scenario(layout=label.split(",")[0], lora=label.endswith("LoRA"), engine=engine) for label in syncs}
    rows = sync_peaks.planned_peak_rows(lab, six, syncs)  # notebook 05: planned on the chip as measured there
    assert all(r["every device agrees"] for r in rows)
    rows, p3_reports = mech.p3_branch_rows(lab, (("colocated", engine), ("reshaped", engine)))  # notebook 02
    for report in p3_reports.values():
        _on_the_chip(report, chip, where)


NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _paragraphs(name: str) -> list[str]:
    """The prose paragraphs of a notebook's paired Markdown (code cells left out)."""
    text = (NOTEBOOKS / f"{name}.md").read_text()
    prose = re.sub(r"```\{code-cell\}.*?```", "", text, flags=re.S)
    return [" ".join(p.split()) for p in prose.split("\n\n") if p.strip()]


@pytest.mark.parametrize("name", ["00_start_here", "02_placing_rollout_and_reference", "07_placement_lab"])
def test_notebooks_that_build_reshaped_where_the_lab_puts_it_say_its_mesh_on_a_single_chip_too(name):
    """These build reshaped on ``lab.devices_for``: on a single chip, one device and a second mesh. A
    paragraph naming the eight-device rollout mesh (8x1) says so of eight devices and names the chip's."""
    named = [p for p in _paragraphs(name) if "8x1" in p or "(8, 1)" in p]
    assert named
    for paragraph in named:
        assert "on eight" in paragraph and "single chip" in paragraph, paragraph


def test_notebook_05s_eight_device_walk_through_is_built_on_eight_devices_and_reads_its_own_syncs():
    """Notebook 05 explains the (2, 4) -> (8, 1) reshape device by device: its clusters are built on
    ``lab.devices`` (beside a single chip, the simulated CPU devices), and no figure of that story
    reads the six syncs' reshaped rows, which on a single chip are built on the chip."""
    text = (NOTEBOOKS / "05_sync_weights.md").read_text()
    assert 'syncs["reshaped' not in text
    for name in ("cluster", "full"):
        built = rf'^{name} = rl\.build_cluster\(rl\.Scenario\(layout="reshaped".*devices=lab\.devices\)$'
        assert re.search(built, text, re.M), name
    assert 'chunk_sweep(\n    lab.devices,\n    rl.Scenario(layout="reshaped")' in text
    assert "ex.sync_matrix(lab," in text  # the six syncs: each layout where the lab puts it
    chip = [p for p in _paragraphs("05_sync_weights") if "single chip" in p]
    assert any("every byte is reused" in p for p in chip)  # what the matrix measures there (vanilla)
