"""Figures of training steps (matplotlib, shown by the notebooks): per phase of an RL step,
the bytes each role holds in device and in pinned host memory, measured inside the phase
(P14, ``lab.experiments.step_phases``); and per optimizer step, the P11 gap between the live actor's
log-probs, the anchor's and the sampler's (``LearnerResult.to_json()``). Pure functions of
that JSON. In ``phase_memory`` a buffer several entries hold is one segment, labelled with
every holder, so a bar's height is what the memory kind really holds (physical bytes).

Artists carry a ``gid``: ``"bar:phase:<step label>:<phase>:<kind>:<segment>"`` for a bar,
``"points:live:first"``, ``"points:live:later"`` and ``"line:sampler"`` for the P11 gap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from rlcluster_lab.lab.figures.mpl import FONT, MIN_PT, bytes_axis, legend_columns, new_figure
from rlcluster_lab.lab.figures.style import ENTRY_ORDER, KINDS, PHYSICAL, ROLE_COLORS, in_order, role_color

HOST_ALPHA = 0.45  # pinned host bars are drawn paler than device bars


def _colour(entry: str) -> str:
    """An entry's colour; a working copy ("anchor (device copy)") takes its owner's."""
    return role_color(entry.split(" (")[0])


def _look(holders: tuple[str, ...]) -> dict[str, Any]:
    """Fill, hatch and hatch colour of a piece: an entry's own colour; a working copy
    cross-hatched; buffers several entries hold in the first one's colour, hatched in the
    last one's (denser for three or more)."""
    if len(holders) == 1:
        return {"facecolor": _colour(holders[0]), "hatch": "xx" if "(" in holders[0] else None, "edgecolor": "white"}
    hatch = "//" if len(holders) == 2 else "////"
    return {"facecolor": _colour(holders[0]), "hatch": hatch, "edgecolor": _colour(holders[-1])}


def segments(memory: Mapping[str, Any], kind: str) -> list[tuple[str, tuple[str, ...], int]]:
    """The pieces of one memory kind of a walk, each buffer once: (label, entries, bytes).

    An entry's own piece is what no other entry holds; each set of entries holding
    buffers in common (``memory["shared"]``) is one piece of its own, labelled
    ``"actor = rollout"``. The pieces add up to the kind's bytes counted once.
    """
    by_role = memory.get("by_role", {})
    groups = [
        (g["roles"], sum(int(k.get(kind, 0)) for k in g.get("by_device", {}).values()))
        for g in memory.get("shared", [])
    ]
    out = [
        (e, (e,), int(by_role[e].get("by_kind", {}).get(kind, 0)) - sum(held for roles, held in groups if e in roles))
        for e in in_order(list(by_role), ENTRY_ORDER)
    ]
    out += [(" = ".join(roles), tuple(roles), held) for roles, held in groups]
    return [s for s in out if s[2] > 0]


def phase_memory(
    steps: Mapping[str, Mapping[str, Any]] | Mapping[str, Any], *, only: Sequence[str] | None = None
) -> Figure:
    """Per phase of an RL step, device and pinned host bytes stacked by role, each buffer once,
    from the walk at each operation's work point (phases without one, host code and the sync,
    use the walk after them and are marked ``*``).

    Args:
        steps: one ``StepPhases.to_json()``, or ``{label: StepPhases.to_json()}`` to draw
            several steps (offload on and off) one above the other on one byte scale.
        only: the phases to draw (names as in the step), default all.

    Raises:
        ValueError: ``only`` names a phase no step ran.
    """
    if "phases" in steps:
        runs = {f"step {steps.get('step', 0)}, offload {'on' if steps.get('offload') else 'off'}": steps}
    else:
        runs = {str(k): v for k, v in steps.items()}
    picked: dict[str, list[Mapping[str, Any]]] = {}
    for label, step in runs.items():
        phases = list(step.get("phases", []))
        if only is not None:
            names = [p["name"] for p in phases]
            if missing := [n for n in only if n not in names]:
                raise ValueError(f"no phase {', '.join(map(repr, missing))} in {label!r}; it ran {', '.join(names)}")
            phases = [p for p in phases if p["name"] in only]
        picked[label] = phases
    fig = new_figure(max(7.0, 1.6 * max(len(p) for p in picked.values()) + 3.8), 3.4 * len(picked) + 0.3)
    axes = fig.subplots(len(picked), 1, squeeze=False)[:, 0]
    legend: dict[str, Patch] = {}
    top = 1
    marked = False
    for ax, (label, phases) in zip(axes, picked.items()):
        for i, phase in enumerate(phases):
            memory = phase["after"] if phase.get("during") is None else phase["during"]
            marked |= phase.get("during") is None
            for k, kind in enumerate(KINDS):
                x, alpha = i - 0.2 + 0.4 * k, 1.0 if kind == "device" else HOST_ALPHA
                bottom = 0
                for name, holders, nbytes in segments(memory, kind):
                    look = _look(holders)
                    bar = ax.bar(x, nbytes, 0.36, bottom=bottom, alpha=alpha, linewidth=0.6, **look)[0]
                    bar.set_gid(f"bar:phase:{label}:{phase['name']}:{kind}:{name}")
                    shared = "  (one set of buffers)" if len(holders) > 1 else ""
                    legend.setdefault(name, Patch(label=name + shared, **look))
                    bottom += nbytes
                top = max(top, bottom)
        ticks = [i - 0.2 + 0.4 * k for i in range(len(phases)) for k in range(len(KINDS))]
        ax.set_xticks(ticks, ["device", "pinned"] * len(phases), minor=True, fontsize=MIN_PT)
        names = [
            p["name"].replace(": ", ":\n") + ("*" if p.get("during") is None else "") + f"\n{p['seconds'] * 1e3:.0f} ms"
            for p in phases
        ]
        ax.set_xticks(range(len(phases)), names, fontsize=MIN_PT)
        ax.tick_params(axis="x", which="major", pad=16, length=0)
        ax.tick_params(axis="x", which="minor", length=2)
        ax.tick_params(axis="y", labelsize=MIN_PT)
        ax.set_xlim(-0.6, len(phases) - 0.4)
        ax.set_ylabel(PHYSICAL.replace(" (", "\n("), fontsize=MIN_PT)
        # The devices the walks are of (each phase's memory report names them).
        where = next((str(p["after"]["where"]) for p in phases if (p.get("after") or {}).get("where")), "")
        ax.set_title(f"{label} ({where})" if where else label, fontsize=MIN_PT + 1, loc="left")
    for ax in axes:
        ax.set_ylim(0, top * 1.08)
        bytes_axis(ax.yaxis, top * 1.08)
    handles = [legend[n] for n in in_order(list(legend), ENTRY_ORDER)]
    handles.append(Patch(facecolor=ROLE_COLORS["actor"], alpha=HOST_ALPHA, label="pale colour: pinned host memory"))
    axes[0].legend(handles=handles, fontsize=MIN_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    note = "memory inside each operation, at its work point"
    if marked:
        note += "; * no work point (host code, the sync): the walk after it"
    fig.suptitle(f"{note}\neach buffer drawn once; bytes and times measured", fontsize=MIN_PT, x=0.01, ha="left")
    return fig


def p11_gap(result: Mapping[str, Any]) -> Figure:
    """Per optimizer step: how far the live actor's log-probs are from the anchor's,
    and the anchor's from the sampler's (P11), from ``LearnerResult.to_json()``.

    Steps whose actor had not stepped yet in that global step are drawn as
    open circles; later mini-batches and iterations as filled ones.
    """
    records = list(result.get("p11", []))
    xs = list(range(len(records)))
    floor = 1e-9  # a gap of exactly 0 still gets a point on a log axis
    live = [max(float(r["live_vs_anchor"]), floor) for r in records]
    sampler = [max(float(r["anchor_vs_sampler"]), floor) for r in records]
    fresh = [r.get("steps_taken_before", 0) == 0 for r in records]
    fig = new_figure(8.0, 4.2)
    ax = fig.add_subplot()
    ax.set_yscale("log")
    ax.plot(xs, live, color=ROLE_COLORS["actor"], linewidth=0.8, alpha=0.6)
    open_dots, dots = {"facecolors": "none", "edgecolors": ROLE_COLORS["actor"]}, {"color": ROLE_COLORS["actor"]}
    for first, look, said, gid in (
        (True, open_dots, "first optimizer step of a global step", "first"),
        (False, dots, "after the actor stepped", "later"),
    ):
        at = [i for i, f in enumerate(fresh) if f == first]
        ax.scatter(at, [live[i] for i in at], label=f"live vs anchor, {said}", gid=f"points:live:{gid}", **look)
    ax.plot(
        xs, sampler, ".-", color=ROLE_COLORS["rollout"], linewidth=0.8, label="anchor vs sampler", gid="line:sampler"
    )
    ax.set_xlabel("optimizer step", fontsize=MIN_PT)
    ax.set_ylabel("max |difference| of per-token\nlog-prob (nats)", fontsize=MIN_PT)
    labels = ax.get_legend_handles_labels()[1]
    fig.legend(loc="outside lower center", ncols=legend_columns(fig, labels), fontsize=MIN_PT, frameon=False)
    ax.set_title(
        "P11: old log-probs from live weights drift; the anchor matches the sampler", fontsize=FONT, loc="left"
    )
    return fig
