"""The notebooks' experiment helpers: tables and summaries read what the runs recorded."""

from __future__ import annotations

import jax

from rlcluster_lab.lab.experiments import runs as ex


def test_format_table_groups_digits_and_says_yes_no():
    text = ex.format_table(
        [
            {"run": "a", "bytes": 1234567, "ok": True, "roles": ["x", "y"]},
            {"run": "bb", "bytes": 0, "ok": False, "roles": []},
        ]
    )
    assert text.splitlines() == [
        "run  bytes      ok   roles",
        "---  ---------  ---  -----",
        "a    1,234,567  yes  x, y",
        "bb   0          no   -",
    ]


def test_mesh_identity_only_the_same_build_is_the_same_mesh_P1():
    rows = ex.mesh_identity(jax.devices())
    assert [(r["same object"], r["== (P1)"]) for r in rows] == [
        (True, True),
        (False, False),
        (False, False),
        (False, False),
    ]


def test_sharing_maps_link_per_P1_P2_and_propagate():
    rows = {(r["layout"], r["LoRA"]): r for r in ex.sharing_maps(jax.devices())}
    assert rows[("colocated", False)]["actor"] == ["rollout"]
    assert rows[("colocated", True)]["rollout"] == ["actor", "reference"]  # propagation
    assert rows[("reshaped", True)]["actor"] == ["reference"] and rows[("reshaped", True)]["rollout"] == []
    assert rows[("split", False)]["actor"] == []


def _rec(iteration, start, before, live, sampler=1e-6):
    return {
        "step": 0,
        "iteration": iteration,
        "rows": [start, start + 8],
        "steps_taken_before": before,
        "live_vs_anchor": live,
        "anchor_vs_sampler": sampler,
    }


def test_p11_rows_mark_where_live_and_anchor_part_P11():
    result = {
        "p11": [_rec(0, 0, 0, 1e-6), _rec(0, 8, 1, 0.7), _rec(0, 0, 0, 2e-6), _rec(0, 8, 1, 0.3, 0.5)],
        "config": {"steps": 2},
    }
    rows = ex.p11_rows(result)
    assert [(r["rows"], r["live == anchor"], r["anchor == sampler"]) for r in rows] == [
        ("0-8", True, True),
        ("8-16", False, False),
    ]
    (setting,) = ex.p11_setting_rows({"s": result})
    assert setting["optimizer steps per global step"] == 2 and setting["live == anchor"] == "2 of 4"


def test_sync_rows_keep_bytes_and_leave_out_timings_L3():
    sync = {k: i for i, k in enumerate(ex.SYNC_COLUMNS)} | {"seconds": 0.5, "anchor_seconds": 0.1}
    (row,) = ex.sync_rows({"split, LoRA": sync})
    assert row == {
        "run": "split, LoRA",
        "synced": 0,
        "moved_cross_device": 1,
        "relayed_cross_device": 2,
        "copied_same_device": 3,
        "reused": 4,
        "minimum_cross_device": 5,
        "synced_logical": 6,
    }
