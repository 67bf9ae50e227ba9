"""A what-if plan's memory figure (L4): bars and the capacity line are the plan's numbers."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (only to check that no pyplot figure is left open)
from legibility import mpl_problems  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from rlcluster_lab.lab.figures.mpl import to_png  # noqa: E402
from rlcluster_lab.lab.figures.plan import plan_memory  # noqa: E402

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


def _texts(fig) -> str:
    parts = [t.get_text() for ax in fig.axes for t in ax.texts]
    parts += [ax.get_title(loc="left") for ax in fig.axes]
    if fig._suptitle is not None:
        parts.append(fig._suptitle.get_text())
    return "\n".join(parts)


def test_l4_plan_memory_bars_and_capacity_line_are_the_plans():
    fig = plan_memory(PLAN)
    bars = {p.get_gid(): p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("bar:")}
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


def test_plan_memory_is_legible_and_leaves_no_pyplot_figure_open():
    plt.close("all")
    fig = plan_memory(PLAN)
    assert mpl_problems(fig) == []
    assert plt.get_fignums() == []
    assert to_png(fig).startswith(b"\x89PNG")


def test_l4_plan_memory_draws_each_devices_peak_above_its_rest_as_the_plan_budgets_it():
    # Notebook 08: the 70B model with LoRA, split, on one GPU node. Its busiest device holds 33 GiB
    # at rest and 58 GiB during the actor's update; the figure draws both, the rest as the bar and
    # the step's largest phase on top of it, so the tallest top is the plan's "busiest device".
    from rlcluster_lab.planner import plan_cluster

    plan = plan_cluster("llama3-70b", "gpu-8", layout="split", lora_rank=16).to_json()
    fig = plan_memory(plan)
    bars = {p.get_gid(): p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("bar:device:")}
    for budget in plan["per_device"]:
        d = budget["device"]
        rest, peak = bars[f"bar:device:{d}:device"], bars[f"bar:device:{d}:peak"]
        assert rest.get_height() == plan["memory"]["by_device"][str(d)]["device"]
        assert rest.get_height() + peak.get_height() == budget["peak_bytes"]
    top = max(b.get_y() + b.get_height() for g, b in bars.items() if g.endswith(":peak"))
    assert top == plan["fits"]["peak"]["max_device_bytes"]
    assert "at rest and at the step's peak" in _texts(fig)
    assert mpl_problems(fig) == []
