"""Figures of training steps: one RL step's memory phase by phase (P14), drawn from a stored
step, and the P11 gap per optimizer step, drawn from a hand-built learner result."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (only to check that no pyplot figure is left open)
import pytest  # noqa: E402
from legibility import mpl_problems  # noqa: E402
from stored_reports import STEP, stored  # noqa: E402

from rlcluster_lab.lab.figures.step import p11_gap, phase_memory, segments  # noqa: E402


def _rec(step: int, rows: list[int], before: int, live: float, sampler: float) -> dict:
    return {
        "step": step,
        "iteration": 0,
        "rows": rows,
        "steps_taken_before": before,
        "live_vs_anchor": live,
        "anchor_vs_sampler": sampler,
    }


RESULT = {
    "p11": [
        _rec(0, [0, 8], 0, 1e-6, 2e-6),
        _rec(0, [8, 16], 1, 0.5, 1e-6),
        _rec(1, [0, 8], 0, 0.0, 1e-6),
    ]
}


# ------------------------------------------------------------------ one step, phase by phase (P14)


def test_p14_phase_memory_draws_each_buffer_once_per_phase_and_kind():
    data = stored(STEP)
    fig = phase_memory(data)
    bars = {p.get_gid(): p.get_height() for ax in fig.axes for p in ax.patches if p.get_gid()}
    for phase in data["phases"]:
        memory = phase["during"] or phase["after"]
        for kind in ("device", "pinned_host"):
            drawn = sum(h for gid, h in bars.items() if f":{phase['name']}:{kind}:" in gid)
            held = sum(int(k.get(kind, 0)) for k in memory["by_device"].values())
            assert drawn == held, (phase["name"], kind)
    # The rollout that is the actor: one segment while it generates, labelled with both.
    assert [s[0] for s in segments(data["phases"][0]["during"], "device")] == ["actor = rollout"]


def test_p14_phase_memory_draws_several_steps_on_one_scale():
    data = stored(STEP)
    fig = phase_memory({"offload on": data, "again": data}, only=["generate", "update"])
    assert len(fig.axes) == 2 and fig.axes[0].get_ylim() == fig.axes[1].get_ylim()
    names = {gid.split(":")[3] for ax in fig.axes for p in ax.patches if (gid := p.get_gid())}
    assert names == {"generate", "update"}
    # Each step names the devices its walks are of.
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        "offload on (8 simulated CPU devices)",
        "again (8 simulated CPU devices)",
    ]


def test_phase_memory_refuses_bad_input_with_the_fix():
    data = stored(STEP)
    with pytest.raises(ValueError, match="no phase 'scoring'"):
        phase_memory(data, only=["scoring"])


# ------------------------------------------------------------------ the P11 gap


def test_p11_gap_splits_first_and_later_optimizer_steps():
    fig = p11_gap(RESULT)
    by_gid = {c.get_gid(): c for c in fig.axes[0].collections}
    first = [tuple(map(float, o)) for o in by_gid["points:live:first"].get_offsets()]
    later = [tuple(map(float, o)) for o in by_gid["points:live:later"].get_offsets()]
    assert first == [(0.0, 1e-6), (2.0, 1e-9)]  # an exact 0 is drawn at the floor of the log axis
    assert later == [(1.0, 0.5)]


# ------------------------------------------------------------------ legibility


def test_step_figures_are_legible_and_leave_no_pyplot_figure_open():
    plt.close("all")
    data = stored(STEP)
    for fig in (phase_memory(data), p11_gap(RESULT)):
        assert mpl_problems(fig) == []
    assert plt.get_fignums() == []
