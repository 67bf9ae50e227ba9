"""The decision flow as rows (L1): per decision, the question, its answers and the one that
fired, read from the typed branch each rule recorded. Both the matplotlib figure and the SVG
panel draw these rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlcluster_lab.lab.style import fmt_bytes


@dataclasses.dataclass(frozen=True)
class FlowRow:
    """One decision drawn as a question and its possible answers, one of which fired."""

    key: str  # "P3", or "P5:actor" for per-role rows
    question: str
    options: tuple[str, ...]
    fired: str
    detail: str = ""


def _decisions(report: Mapping[str, Any], rule: str) -> list[Mapping[str, Any]]:
    return [d for d in report.get("decisions", []) if d.get("rule") == rule]


def mesh_shape_text(mesh: Mapping[str, Any] | None) -> str:
    if not mesh:
        return "none"
    return "(" + ",".join(str(v) for v in mesh.get("shape", {}).values()) + ")"


def flow_rows(report: Mapping[str, Any]) -> list[FlowRow]:
    """The construction (and any sync) decisions of a report, as rows of the flow figure.

    Which answer fired is read from what the report recorded (the trace's
    values, the sharing map, ``rollout_branch``), never worked out again.
    """
    rows: list[FlowRow] = []
    checks = _decisions(report, "P6")
    if checks:
        failed = [d for d in checks if d.get("branch") == "error"]
        rows.append(
            FlowRow(
                "P6",
                "config checks pass?",
                ("pass", "error"),
                "error" if failed else "pass",
                f"{len(checks) - len(failed)} of {len(checks)} checks passed",
            )
        )
    for d in _decisions(report, "P1")[:1]:
        v = d["values"]
        rows.append(
            FlowRow(
                "P1",
                "actor mesh == rollout mesh?",
                ("linked", "not linked"),
                str(d.get("branch")),
                f"shapes {mesh_shape_text(v.get('actor_mesh'))} vs {mesh_shape_text(v.get('rollout_mesh'))}; "
                f"same devices: {'yes' if v.get('same_devices') else 'no'}",
            )
        )
    p2 = [d for d in _decisions(report, "P2") if d.get("branch") != "propagated"]
    for d in p2[:1]:
        v = d["values"]
        fired = str(d.get("branch"))
        if fired == "skipped":
            detail = "a model was given as a path"
        else:
            detail = (
                f"LoRA actor: {'yes' if v.get('actor_has_lora') else 'no'}; "
                f"reference: {'yes' if v.get('has_reference') else 'no'}; "
                f"same mesh: {'yes' if v.get('meshes_equal') else 'no'}"
            )
        rows.append(
            FlowRow("P2", "LoRA actor, reference on its mesh?", ("linked", "not linked", "skipped"), fired, detail)
        )
    for d in _decisions(report, "P3")[:1]:
        detail = d["outcome"]
        if d.get("branch") == "shared" and report.get("rollout_shares_actor_weights") is False:
            # P3 handed over the actor object; an engine that owns its weights copied it (P7's case).
            detail += "; the engine then keeps a copy of its own"
        rows.append(
            FlowRow(
                "P3",
                "what does the rollout sample with?",
                ("shared", "second_copy", "engine_initial_value"),
                str(d.get("branch")),
                detail,
            )
        )
    p4 = _decisions(report, "P4")
    if not p4:
        fired, detail = "no reference", ""
    else:
        fired, detail = str(p4[0].get("branch")), p4[0]["outcome"].split(";")[0]
    rows.append(
        FlowRow(
            "P4", "reference backbone", ("one backbone", "avoidable copy", "own weights", "no reference"), fired, detail
        )
    )
    for d in _decisions(report, "P5"):
        v = d["values"]
        if d.get("branch") not in ("kept as is", "resharded"):
            continue  # "read from the checkpoint" notes, not a placement branch
        role = str(v["role"])
        kept = d["branch"] == "kept as is"
        reused = v.get("leaves_on_target", 0)
        detail = f"{reused} of {v['leaves']} leaves already in place"
        if not kept and v.get("requested_dtype") and v["requested_dtype"] != v.get("dtype"):
            detail += f"; cast {v.get('dtype')} -> {v['requested_dtype']}"
        rows.append(
            FlowRow(
                f"P5:{role}",
                f"load {role} onto its mesh",
                ("kept as is", "resharded"),
                "kept as is" if kept else "resharded",
                detail,
            )
        )
    moved = sorted(
        {str(d["values"]["role"]) for d in _decisions(report, "P14") if d.get("branch") == "moved to pinned_host"}
    )
    rows.append(
        FlowRow(
            "P14",
            "offload_to_cpu?",
            ("pinned host between uses", "stays on device"),
            "pinned host between uses" if report.get("offload_to_cpu") else "stays on device",
            ("moved to pinned host: " + ", ".join(moved)) if moved else "",
        )
    )
    for d in _decisions(report, "P7")[:1]:
        v = d["values"]
        rows.append(
            FlowRow(
                "P7",
                "engine exposes a mesh?",
                ("kept", "replaced"),
                str(d.get("branch")),
                f"engine {v.get('engine')}; map rebuilt: {'yes' if v.get('sharing_map_rebuilt') else 'no'}; "
                "still registered as sharing: "
                f"{'yes' if v.get('still_registered_as_sharing') else 'no'}",
            )
        )
    anchor = report.get("anchor") or {}
    if _decisions(report, "P8") or anchor:
        kind = anchor.get("memory_kind")
        kind = ", ".join(kind) if isinstance(kind, list) else str(kind)
        p8 = _decisions(report, "P8")
        fired = str(p8[-1].get("branch")) if p8 else str(anchor.get("mode", "full"))
        rows.append(
            FlowRow(
                "P8",
                "anchor policy state holds",
                ("full", "trainable"),
                fired,
                f"{fmt_bytes(anchor.get('bytes', 0))} in {kind}",
            )
        )
    p13 = _decisions(report, "P13")
    if p13:
        rows.append(
            FlowRow(
                "P13",
                "sync hands the engine",
                ("LoRA params", "all params"),
                str(p13[-1].get("branch")),
                f"{len(p13)} sync(s); sharing map consulted: no",
            )
        )
    return rows


def mesh_coords(mesh: Mapping[str, Any]) -> dict[int, tuple[int, ...]]:
    """Device id -> its position in the mesh (row-major over the shape)."""
    dims = [int(v) for v in mesh.get("shape", {}).values()] or [1]
    out: dict[int, tuple[int, ...]] = {}
    for flat, dev in enumerate(mesh.get("device_ids", [])):
        coord, rest = [], flat
        for size in reversed(dims):
            coord.append(rest % size)
            rest //= size
        out[int(dev)] = tuple(reversed(coord))
    return out


# How a branch is labelled in the flow figures (matplotlib and SVG); other branches use their own name.
OPTION_LABELS = {
    "second_copy": "second copy",
    "engine_initial_value": "engine's initial value",
    "shared": "same object",
    "full": "full state",
    "trainable": "trainable only",
    "kept": "rollout mesh kept",
    "replaced": "engine's mesh",
}
