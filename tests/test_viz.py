"""Figures show what the reports say: highlighted branches, cells, and bar sizes equal to report bytes."""

from __future__ import annotations

import copy

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (only to check that no pyplot figure is left open)
import pytest  # noqa: E402
from legibility import mpl_problems  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from rlcluster_lab.app.report import placement_report
from rlcluster_lab.app.scenario import Scenario, build_cluster
from rlcluster_lab.lab import figures as viz  # noqa: E402
from rlcluster_lab.lab.mpl import MIN_PT, new_figure  # noqa: E402


def _patches(fig, prefix: str) -> dict[str, object]:
    return {p.get_gid(): p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith(prefix)}


def _highlighted(fig) -> set[str]:
    """Gids of decision boxes drawn in the highlight colour."""
    return {gid for gid, p in _patches(fig, "P").items() if to_hex(p.get_facecolor()) == viz.HIGHLIGHT}


def _texts(fig) -> str:
    parts = []
    for ax in fig.axes:
        parts += [t.get_text() for t in ax.texts]
        parts += [ax.get_title(loc="left"), ax.get_xlabel(), ax.get_ylabel()]
        parts += [t.get_text() for t in ax.get_yticklabels()]
    if fig._suptitle is not None:
        parts.append(fig._suptitle.get_text())
    return "\n".join(parts)


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    scenarios = {
        "colocated_lora": Scenario(layout="colocated", lora=True),
        "reshaped_separate_base": Scenario(layout="reshaped", lora=True, lora_separate_base=True),
        "split": Scenario(layout="split"),
        "colocated_vllm": Scenario(layout="colocated", engine="vllm"),
    }
    out = {}
    for name, s in scenarios.items():
        cluster = build_cluster(s)
        out[name] = placement_report(
            cluster, sync=cluster.sync_weights() if name == "colocated_vllm" else None
        ).to_json()
    return out


# ------------------------------------------------------------------ decision flow (L1)


def test_decision_flow_highlights_P1_P2_P3_P4_branches_of_colocated_lora(reports):
    fig = viz.decision_flow(reports["colocated_lora"])
    lit = _highlighted(fig)
    assert {"P1:linked", "P2:linked", "P3:shared", "P4:one backbone", "P7:kept", "P8:full"} <= lit
    assert not lit & {"P1:not linked", "P3:second_copy", "P4:avoidable copy"}


def test_decision_flow_reshaped_shows_second_copy_and_avoidable_copy_P1_P3_P4(reports):
    lit = _highlighted(viz.decision_flow(reports["reshaped_separate_base"]))
    assert {"P1:not linked", "P3:second_copy", "P4:avoidable copy", "P5:rollout:resharded"} <= lit
    assert "P1:linked" not in lit and "P3:shared" not in lit


def test_decision_flow_vllm_engine_replaces_rollout_mesh_P7(reports):
    fig = viz.decision_flow(reports["colocated_vllm"])
    # Linked by the map, so P3 hands the actor object over; the engine keeps its own copy.
    assert {"P1:linked", "P3:shared", "P7:replaced"} <= _highlighted(fig)
    assert "still registered as sharing: yes" in _texts(fig)
    # Why "shared" does not mean the actor's buffers: what P7 recorded, said on P3's row.
    assert "but the vllm engine copied it onto its own (1,8) mesh (P7: not the (2,4) asked for)" in _texts(fig)


def _row_ys(fig) -> dict[str, float]:
    """Rule -> the y of its first row's first answer box (rows go down the figure)."""
    ys: dict[str, float] = {}
    for gid, p in sorted(_patches(fig, "P").items(), key=lambda kv: kv[1].get_y()):
        ys.setdefault(gid.split(":")[0], p.get_y())
    return ys


def test_decision_flow_rows_follow_the_trace_with_P12_and_arrows(reports):
    report = reports["colocated_vllm"]
    fig = viz.decision_flow(report)
    ys = _row_ys(fig)
    traced = []
    for d in report["decisions"]:
        if d["rule"] in ys and d["rule"] not in traced:
            traced.append(d["rule"])
    # Construction order, not rule order: P5 (actor) and P3 come before P4, P7 after them, P12 before P8.
    assert sorted(traced, key=ys.__getitem__) == traced
    assert ys["P3"] < ys["P4"] < ys["P7"] < ys["P12"] < ys["P8"] < ys["P13"]
    assert "P12:LoRA params" not in _highlighted(fig) and "P12:all params" in _highlighted(fig)
    links = {line.get_gid() for ax in fig.axes for line in ax.lines if (line.get_gid() or "").startswith("link:")}
    # P1 -> P7 only because the engine replaced the mesh P1's map was built from.
    assert links == {"link:P1:P3", "link:P2:P4", "link:P1:P7", "link:P3:P7", "link:P12:P13"}
    assert "P1 -> P7 (still registered as sharing: yes)" in _texts(fig)
    lora = {line.get_gid() for ax in viz.decision_flow(reports["colocated_lora"]).axes for line in ax.lines}
    assert {"link:P1:P3", "link:P2:P4", "link:P3:P7"} <= lora and "link:P1:P7" not in lora


def test_decision_flow_lights_exactly_one_answer_per_row(reports):
    for report in reports.values():
        fig = viz.decision_flow(report)
        rows = viz.flow_rows(report)
        lit = _highlighted(fig)
        for row in rows:
            assert [o for o in row.options if f"{row.key}:{o}" in lit] == [row.fired]


def test_decision_flow_reads_P2_skip_from_the_trace():
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
    lit = _highlighted(viz.decision_flow(report))
    assert {"P2:skipped", "P3:second_copy", "P4:no reference", "P14:pinned host between uses"} <= lit


# ------------------------------------------------------------------ device grid


def _filled(fig, row: str) -> set[int]:
    cells = _patches(fig, f"cell:{row}:")
    return {int(gid.rsplit(":", 1)[1]) for gid, p in cells.items() if to_hex(p.get_facecolor()) != "#ffffff"}


def test_device_grid_split_puts_actor_and_rollout_on_disjoint_halves(reports):
    fig = viz.device_grid(reports["split"])
    assert _filled(fig, "actor") == {0, 1, 2, 3}
    assert _filled(fig, "rollout") == {4, 5, 6, 7}
    assert _filled(fig, "reference") == {0, 1, 2, 3}


def _hatched(fig, row: str) -> set[int]:
    return {int(gid.rsplit(":", 1)[1]) for gid, p in _patches(fig, f"cell:{row}:").items() if p.get_hatch()}


def test_device_grid_hatches_the_actors_buffers_and_says_why_a_copy_is_a_copy(reports):
    shared = viz.device_grid(reports["colocated_lora"])
    # P3 shared: the rollout computes with the actor's buffers; P4: so does the LoRA reference.
    assert _hatched(shared, "rollout") == _hatched(shared, "reference") == set(range(8))
    assert not _hatched(shared, "actor")
    assert "= actor" in _texts(shared)
    copied = viz.device_grid(reports["reshaped_separate_base"])
    assert not _hatched(copied, "rollout") and not _hatched(copied, "reference")
    # Colocated vllm: linked and "shared", yet a copy, and the figure says why (P7).
    vllm = viz.device_grid(reports["colocated_vllm"])
    assert not _hatched(vllm, "rollout")
    text = " ".join(_texts(vllm).split())  # notes wrap over lines
    assert "rollout: sharing map (P1, P2): linked to actor" in text
    assert "the vllm engine copied it onto its own (1,8) mesh" in text


def test_device_grid_reshaped_same_devices_other_coordinates_P1(reports):
    fig = viz.device_grid(reports["reshaped_separate_base"])
    assert _filled(fig, "actor") == _filled(fig, "rollout") == set(range(8))
    text = _texts(fig)
    assert "7,0" in text  # device 7 is row 7 of the (8, 1) rollout mesh
    assert "1,3" in text  # and row 1, column 3 of the (2, 4) actor mesh


def test_device_grid_draws_the_configured_rollout_mesh_when_the_engine_replaced_it_P7():
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
    fig = viz.device_grid(report)
    assert _filled(fig, "rollout") == {2, 3}
    assert len(_patches(fig, "cell:rollout (config):")) == 4
    assert "replaced by the engine (P7)" in _texts(fig)


# ------------------------------------------------------------------ memory (L2), hand-built per the report contract

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


def test_memory_by_device_draws_every_buffer_once_L2():
    fig = viz.memory_by_device(MEMORY)
    stacks: dict[str, float] = {}
    for gid, p in {**_patches(fig, "bar:own:"), **_patches(fig, "bar:group:")}.items():
        _, _, dev, kind, _who = gid.split(":")
        stacks[f"{dev}:{kind}"] = stacks.get(f"{dev}:{kind}", 0) + p.get_height()
    # Each stack is what the device holds, each buffer once: the report's by_device.
    assert stacks == {f"{d}:{k}": v for d, kinds in MEMORY["by_device"].items() for k, v in kinds.items()}
    # The actor = reference buffers are one hatched segment, not one per role.
    group = _patches(fig, "bar:group:0:device:")
    assert (
        list(group) == ["bar:group:0:device:actor+reference"]
        and group["bar:group:0:device:actor+reference"].get_hatch()
    )
    # The dashed box is what separate copies would add: naive - held.
    naive = _patches(fig, "bar:naive:")
    assert {gid: p.get_height() for gid, p in naive.items()} == {
        "bar:naive:0:device": 500 + 600 - 700,
        "bar:naive:1:device": 400 + 400 - 450,
    }
    text = _texts(fig)
    assert "physical bytes" in text and "no allocator statistics" in text


def test_memory_by_device_draws_allocator_figures_when_present():
    memory = copy.deepcopy(MEMORY)
    memory["allocator"] = {
        "available": True,
        "note": "",
        "by_device": {"0": {"bytes_in_use": 2000}, "1": {"bytes_in_use": 1500}},
    }
    fig = viz.memory_by_device(memory)
    (points,) = [c for c in fig.axes[0].collections if c.get_gid() == "points:allocator"]
    assert [tuple(map(float, o)) for o in points.get_offsets()] == [(0.0, 2000.0), (1.0, 1500.0)]


def test_memory_by_role_draws_a_shared_buffer_once_L2():
    fig = viz.memory_by_role(MEMORY)
    bars = {gid: p.get_width() for gid, p in _patches(fig, "bar:role:").items()}
    # The actor holds the shared 750 B first: solid in its bar; in the reference's bar the same
    # 750 B are hatched as the actor's buffers, after the 150 B only the reference holds.
    assert bars == {
        "bar:role:actor:held:device": 1000,
        "bar:role:reference:held:device": 150,
        "bar:role:reference:same:actor": 750,
        "bar:role:anchor:held:pinned_host": 1000,
    }
    patches = _patches(fig, "bar:role:")
    assert (
        patches["bar:role:reference:same:actor"].get_hatch() and patches["bar:role:reference:same:actor"].get_x() == 150
    )
    solid = sum(w for gid, w in bars.items() if ":held:" in gid)
    assert solid == MEMORY["unique_bytes"]  # the solid parts are what is held, each buffer once
    assert sum(bars.values()) == MEMORY["naive_bytes"]
    text = _texts(fig)
    assert "750 B = the actor's buffers" in text and "also held by reference (750 B)" in text
    assert "physical bytes" in text and "add up to 2.1 KiB" in text


def test_memory_by_role_of_a_live_cluster_adds_up_to_the_unique_bytes(reports):
    for report in reports.values():
        memory = report["memory"]
        fig = viz.memory_by_role(memory)
        bars = {gid: p.get_width() for gid, p in _patches(fig, "bar:role:").items()}
        assert sum(w for gid, w in bars.items() if ":held:" in gid) == memory["unique_bytes"]
        assert sum(bars.values()) == memory["naive_bytes"]


def test_memory_timeline_sums_each_kind_over_devices_P14():
    on_host = copy.deepcopy(MEMORY)
    on_host["by_device"] = {"0": {"pinned_host": 1300}, "1": {"pinned_host": 850}}
    fig = viz.memory_timeline([("between ops", on_host), ("during update", MEMORY)])
    heights = {gid: p.get_height() for gid, p in _patches(fig, "bar:phase:").items()}
    assert heights == {
        "bar:phase:between ops:device": 0,
        "bar:phase:between ops:pinned_host": 2150,
        "bar:phase:during update:device": 1150,
        "bar:phase:during update:pinned_host": 1000,
    }


# ------------------------------------------------------------------ sync (L3)


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


def _table(fig) -> dict[tuple[str, str], str]:
    """(row label, column heading) -> cell text of the figure's table."""
    (table,) = [t for ax in fig.axes for t in ax.tables]
    cells = table.get_celld()
    heads = {c: cell.get_text().get_text() for (r, c), cell in cells.items() if r == 0}
    rows = {r: cell.get_text().get_text() for (r, c), cell in cells.items() if c == -1}
    return {(rows[r], heads[c]): cell.get_text().get_text() for (r, c), cell in cells.items() if r > 0 and c >= 0}


def test_sync_bytes_segments_are_moved_copied_reused_and_minimum_line_L3():
    fig = viz.sync_bytes(SYNC)
    bars = {gid.rsplit(":", 1)[1]: p for gid, p in _patches(fig, "bar:sync:").items()}
    assert bars["moved_cross_device_bytes"].get_height() == 1000
    assert bars["copied_same_device_bytes"].get_height() == 200
    assert bars["copied_same_device_bytes"].get_y() == 1000
    assert bars["reused_bytes"].get_height() == 400
    assert bars["reused_bytes"].get_y() + 400 == SYNC["synced_bytes"]
    (line,) = [c for ax in fig.axes for c in ax.collections if c.get_gid() == "line:minimum:full sync"]
    assert line.get_segments()[0][0][1] == 800
    assert "physical bytes" in _texts(fig)
    # Every number, physical and logical, in the table.
    table = _table(fig)
    assert table[("full sync", "synced\n(physical)")] == "1.6 KiB"
    assert table[("full sync", "synced\n(logical)")] == "400 B"
    assert table[("full sync", "moved between\ndevices")] == "1000 B"
    assert table[("full sync", "copied within\na device")] == "200 B"
    assert table[("full sync", "reused\n(no copy)")] == "400 B"
    assert table[("full sync", "minimum\nto cross")] == "800 B"
    assert table[("full sync", "excess")] == "200 B"


def test_sync_bytes_draws_relayed_bytes_apart_from_what_synced(reports):
    sync = reports["colocated_vllm"]["sync"]
    assert sync["relayed_cross_device_bytes"] > 0  # XLA's two hops onto the engine's own mesh
    fig = viz.sync_bytes(sync)
    label = "full sync"
    synced = sum(p.get_height() for p in _patches(fig, f"bar:sync:{label}:").values())
    crossed = sum(p.get_height() for p in _patches(fig, f"bar:cross:{label}:").values())
    assert synced == sync["synced_bytes"] and crossed == sync["moved_cross_device_bytes"]
    assert (
        _patches(fig, f"bar:cross:{label}:relayed")[f"bar:cross:{label}:relayed"].get_height()
        == (sync["relayed_cross_device_bytes"])
    )


def test_sync_bytes_compares_several_runs():
    colocated = {
        **SYNC,
        "moved_cross_device_bytes": 0,
        "copied_same_device_bytes": 0,
        "reused_bytes": 1600,
        "minimum_cross_device_bytes": 0,
    }
    fig = viz.sync_bytes({"colocated": colocated, "split": SYNC})
    bars = _patches(fig, "bar:sync:")
    assert bars["bar:sync:colocated:moved_cross_device_bytes"].get_height() == 0
    assert bars["bar:sync:colocated:reused_bytes"].get_height() == 1600
    assert bars["bar:sync:split:moved_cross_device_bytes"].get_height() == 1000
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["colocated", "split"]
    assert _table(fig)[("colocated", "excess")] == "0 B"


def test_sync_leaves_bar_lengths_per_leaf_and_top_filter_L3():
    fig = viz.sync_leaves(SYNC)
    bars = {gid: p.get_width() for gid, p in _patches(fig, "bar:leaf:").items()}
    assert bars["bar:leaf:layers/0/w:moved_cross_device_bytes"] == 1000
    assert bars["bar:leaf:embed:reused_bytes"] == 400
    assert bars["bar:leaf:embed:copied_same_device_bytes"] == 200
    fig = viz.sync_leaves(SYNC, top=1)
    assert {gid.split(":")[2] for gid in _patches(fig, "bar:leaf:")} == {"layers/0/w"}
    assert "1 of 2 leaves" in _texts(fig)


# ------------------------------------------------------------------ learner (P11) and plan (L4)


def test_p11_gap_splits_first_and_later_optimizer_steps():
    result = {
        "p11": [
            {
                "step": 0,
                "iteration": 0,
                "rows": [0, 8],
                "steps_taken_before": 0,
                "live_vs_anchor": 1e-6,
                "anchor_vs_sampler": 2e-6,
            },
            {
                "step": 0,
                "iteration": 0,
                "rows": [8, 16],
                "steps_taken_before": 1,
                "live_vs_anchor": 0.5,
                "anchor_vs_sampler": 1e-6,
            },
            {
                "step": 1,
                "iteration": 0,
                "rows": [0, 8],
                "steps_taken_before": 0,
                "live_vs_anchor": 0.0,
                "anchor_vs_sampler": 1e-6,
            },
        ]
    }
    fig = viz.p11_gap(result)
    by_gid = {c.get_gid(): c for c in fig.axes[0].collections}
    first = [tuple(map(float, o)) for o in by_gid["points:live:first"].get_offsets()]
    later = [tuple(map(float, o)) for o in by_gid["points:live:later"].get_offsets()]
    assert first == [(0.0, 1e-6), (2.0, 1e-9)]  # an exact 0 is drawn at the floor of the log axis
    assert later == [(1.0, 0.5)]


PLAN = {
    "source": "computed from shapes (no allocation)",
    "model": {"name": "big"},
    "topology": {"name": "v5e-8"},
    "layout": "colocated",
    "memory": {
        "by_role": {
            "actor": {"bytes": 3000, "by_kind": {"device": 3000}, "by_device": {}},
            "anchor": {"bytes": 3000, "by_kind": {"pinned_host": 3000}, "by_device": {}},
        },
        "by_device": {"0": {"device": 1500, "pinned_host": 1500}, "1": {"device": 2500}},
        "shared": [],
        "unique_bytes": 6000,
        "naive_bytes": 6000,
    },
    "fits": {
        "memory_per_device": 2000,
        "by_role": {
            "actor": {"max_device_bytes": 3000, "fits": False},
            "anchor": {"max_device_bytes": 1500, "fits": True},
        },
    },
}


def test_plan_memory_bars_and_capacity_line_L4():
    fig = viz.plan_memory(PLAN)
    bars = _patches(fig, "bar:")
    assert bars["bar:role:actor:device"].get_width() == 3000
    assert bars["bar:role:anchor:pinned_host"].get_width() == 3000
    assert bars["bar:device:0:device"].get_height() == 1500
    assert to_hex(bars["bar:device:1:device"].get_facecolor()) == "#c44e52"  # over capacity
    assert to_hex(bars["bar:device:0:device"].get_facecolor()) != "#c44e52"
    (cap,) = [ln for ln in fig.axes[1].lines if ln.get_gid() == "line:capacity"]
    assert cap.get_ydata()[0] == 2000
    text = _texts(fig)
    assert "computed from shapes" in text
    assert "2.9 KiB  too big for one device" in text and "2.9 KiB  fits per device" in text


# ------------------------------------------------------------------ purity


def test_figures_leave_no_pyplot_figure_open(reports):
    plt.close("all")
    viz.decision_flow(reports["split"])
    viz.device_grid(reports["split"])
    viz.memory_by_device(MEMORY)
    viz.memory_by_role(MEMORY)
    viz.sync_bytes(SYNC)
    viz.sync_leaves(SYNC)
    viz.plan_memory(PLAN)
    assert plt.get_fignums() == []
    assert viz.to_png(viz.sync_bytes(SYNC)).startswith(b"\x89PNG")


# ------------------------------------------------------------------ legibility


def _every_figure(reports):
    for name in ("colocated_lora", "colocated_vllm"):
        report = reports[name]
        yield f"decision_flow {name}", lambda r=report: viz.decision_flow(r)
        yield f"device_grid {name}", lambda r=report: viz.device_grid(r)
        yield f"memory_by_device {name}", lambda r=report: viz.memory_by_device(r["memory"])
        yield f"memory_by_role {name}", lambda r=report: viz.memory_by_role(r["memory"])
    sync = reports["colocated_vllm"]["sync"]
    yield "sync_bytes live", lambda: viz.sync_bytes(sync)
    yield "sync_bytes six runs", lambda: viz.sync_bytes({f"layout {i}, LoRA": sync for i in range(6)})
    yield "sync_leaves", lambda: viz.sync_leaves(sync, top=12)
    yield "memory_by_device", lambda: viz.memory_by_device(MEMORY)
    yield "memory_by_role", lambda: viz.memory_by_role(MEMORY)
    yield "sync_bytes", lambda: viz.sync_bytes(SYNC)
    yield "memory_timeline", lambda: viz.memory_timeline([("between ops", MEMORY), ("during update", MEMORY)])
    yield "plan_memory", lambda: viz.plan_memory(PLAN)


def test_every_figure_is_legible_at_the_size_a_notebook_shows_it(reports):
    """Text at least 9 pt at the figure's own size, inside the figure, no legend over the data,
    no tick labels running together, no figure wider than a notebook shows unshrunk."""
    for name, draw in _every_figure(reports):
        assert mpl_problems(draw()) == [], name


def test_the_legibility_check_finds_small_text_clipped_labels_and_a_legend_over_bars():
    fig = new_figure(12.0, 3.0, layout=None)  # capped at the widest a notebook shows unshrunk
    assert fig.get_figwidth() == 10.0
    ax = fig.add_subplot()
    ax.bar([0, 1], [5, 5], gid="bar:x")
    ax.text(0.5, 2, "tiny", fontsize=MIN_PT - 1)
    ax.text(0.9, 2, "a label that runs far beyond the right-hand edge of the figure", fontsize=MIN_PT)
    ax.legend(handles=[ax.patches[0]], labels=["over the bars"], loc="center")
    found = " | ".join(mpl_problems(fig))
    assert "'tiny' at 8.0 pt" in found
    assert "runs past the figure's edge" in found
    assert "legend over bar:x" in found


def test_fmt_bytes():
    assert viz.fmt_bytes(0) == "0 B"
    assert viz.fmt_bytes(1023) == "1023 B"
    assert viz.fmt_bytes(534528) == "522.0 KiB"
    assert viz.fmt_bytes(3 * 1024**3) == "3.0 GiB"
