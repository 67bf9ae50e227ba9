"""The decision flow as rows (L1): per decision, the question, its answers and the one that
fired, read from the typed branch each rule recorded, in the order the cluster took them, and
the links from a decision to the ones that read its result: what ``placement_figures.decision_flow``
draws."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlcluster_lab.lab.style import fmt_bytes
from rlcluster_lab.rules.anchor import P8
from rlcluster_lab.rules.catalogue import RULES
from rlcluster_lab.rules.loading import P5, P14, LoadBranch, OffloadAnswer, OffloadBranch
from rlcluster_lab.rules.reference import NO_REFERENCE, P4
from rlcluster_lab.rules.rollout import P3, P7, MeshBranch, RolloutBranch
from rlcluster_lab.rules.sharing import P1, P2, LinkBranch
from rlcluster_lab.rules.steps import P12, P13
from rlcluster_lab.rules.validation import P6, CheckBranch


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
    """The construction (and any sync) decisions of a report, as rows of the flow figure, in
    the order the trace recorded them.

    Which answer fired is read from what the report recorded (the trace's
    values, the sharing map, ``rollout_branch``), never worked out again. A
    row whose rule left no decision in the trace (P4 without a reference,
    P14 without offload) comes last.
    """
    return _in_trace_order(report, _rows(report))


def _in_trace_order(report: Mapping[str, Any], rows: list[FlowRow]) -> list[FlowRow]:
    first: dict[str, int] = {}
    for i, d in enumerate(report.get("decisions", [])):
        rule = str(d.get("rule"))
        role = (d.get("values") or {}).get("role")
        first.setdefault(f"{rule}:{role}" if rule == "P5" and role else rule, i)
    end = len(report.get("decisions", []))
    # sorted() is stable: rows of one rule keep the order they were built in.
    return sorted(rows, key=lambda r: first.get(r.key, first.get(r.key.split(":")[0], end)))


def _rows(report: Mapping[str, Any]) -> list[FlowRow]:
    rows: list[FlowRow] = []
    checks = _decisions(report, "P6")
    if checks:
        failed = [d for d in checks if d.get("branch") == CheckBranch.ERROR.value]
        rows.append(
            FlowRow(
                "P6",
                P6.question,
                P6.values(),
                (CheckBranch.ERROR if failed else CheckBranch.PASS).value,
                f"{len(checks) - len(failed)} of {len(checks)} checks passed",
            )
        )
    for d in _decisions(report, "P1")[:1]:
        v = d["values"]
        rows.append(
            FlowRow(
                "P1",
                P1.question,
                P1.values(),
                str(d.get("branch")),
                f"shapes {mesh_shape_text(v.get('actor_mesh'))} vs {mesh_shape_text(v.get('rollout_mesh'))}; "
                f"same devices: {'yes' if v.get('same_devices') else 'no'}",
            )
        )
    p2 = [d for d in _decisions(report, "P2") if d.get("branch") != LinkBranch.PROPAGATED]
    for d in p2[:1]:
        v = d["values"]
        fired = str(d.get("branch"))
        if fired == LinkBranch.SKIPPED:
            detail = "a model was given as a path"
        else:
            detail = (
                f"LoRA actor: {'yes' if v.get('actor_has_lora') else 'no'}; "
                f"reference: {'yes' if v.get('has_reference') else 'no'}; "
                f"same mesh: {'yes' if v.get('meshes_equal') else 'no'}"
            )
            for prop in _decisions(report, "P2"):
                linked = (prop.get("values") or {}).get("linked_to_actor") or []
                if prop.get("branch") == LinkBranch.PROPAGATED and len(linked) > 1:
                    # P2's propagation: roles linked to the actor are linked to each other.
                    detail += f"; so {' and '.join(linked)} are linked too"
        rows.append(FlowRow("P2", P2.question, P2.values(), fired, detail))
    for d in _decisions(report, "P3")[:1]:
        detail = d["outcome"]
        if d.get("branch") == RolloutBranch.SHARED and report.get("rollout_shares_actor_weights") is False:
            # Measured: the rollout holds none of the actor's buffers although P3 handed it over.
            detail = "handed the actor object, but " + engine_copy_reason(report) + ": the rollout holds a copy"
        rows.append(
            FlowRow(
                "P3",
                P3.question,
                P3.values(),
                str(d.get("branch")),
                detail,
            )
        )
    p4 = _decisions(report, "P4")
    if not p4:
        fired, detail = NO_REFERENCE, ""
    else:
        fired, detail = str(p4[0].get("branch")), p4[0]["outcome"].split(";")[0]
    rows.append(FlowRow("P4", P4.question, P4.values(), fired, detail))
    for d in _decisions(report, "P5"):
        v = d["values"]
        if d.get("branch") not in P5.values():
            continue  # "read from the checkpoint" notes, not a placement branch
        role = str(v["role"])
        kept = d["branch"] == LoadBranch.KEPT
        reused = v.get("leaves_on_target", 0)
        detail = f"{reused} of {v['leaves']} leaves already in their target sharding"
        if not kept and v.get("requested_dtype") and v["requested_dtype"] != v.get("dtype"):
            detail += f"; cast {v.get('dtype')} -> {v['requested_dtype']}"
        rows.append(
            FlowRow(
                f"P5:{role}",
                P5.question.format(role=role),
                P5.values(),
                str(d["branch"]),
                detail,
            )
        )
    moved = sorted(
        {str(d["values"]["role"]) for d in _decisions(report, "P14") if d.get("branch") == OffloadBranch.OFFLOADED}
    )
    rows.append(
        FlowRow(
            "P14",
            P14.question,
            P14.values(),
            (OffloadAnswer.PINNED_HOST if report.get("offload_to_cpu") else OffloadAnswer.ON_DEVICE).value,
            ("moved to pinned host: " + ", ".join(moved)) if moved else "",
        )
    )
    for d in _decisions(report, "P7")[:1]:
        v = d["values"]
        rows.append(
            FlowRow(
                "P7",
                P7.question,
                P7.values(),
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
                P8.question,
                P8.values(),
                fired,
                f"{fmt_bytes(anchor.get('bytes', 0))} in {kind}",
            )
        )
    p12 = [d for d in _decisions(report, "P12") if d.get("test") != "critic trainable parameters"]
    for d in (p12 or _decisions(report, "P12"))[:1]:
        rows.append(
            FlowRow(
                "P12",
                P12.question,
                P12.values(),
                str(d.get("branch")),
                str(d.get("outcome", "")),
            )
        )
    p13 = _decisions(report, "P13")
    if p13:
        rows.append(
            FlowRow(
                "P13",
                P13.question,
                P13.values(),
                str(p13[-1].get("branch")),
                f"{len(p13)} sync(s); sharing map consulted: no",
            )
        )
    return rows


def engine_copy_reason(report: Mapping[str, Any]) -> str:
    """Why a rollout that P3 handed the actor object to holds buffers of its own, from what
    the trace recorded: the engine keeps its own copy (P7 says on which mesh)."""
    engine = str(report.get("engine", "the"))
    for d in _decisions(report, "P7")[:1]:
        v = d.get("values") or {}
        if d.get("branch") == MeshBranch.REPLACED:
            return (
                f"the {engine} engine copied it onto its own {mesh_shape_text(v.get('engine_mesh'))} mesh "
                f"(P7: not the {mesh_shape_text(v.get('config_rollout_mesh'))} asked for)"
            )
    return f"the {engine} engine keeps a copy of its own"


@dataclasses.dataclass(frozen=True)
class FlowLink:
    """An arrow of the flow: decision ``dst`` read what ``src`` decided (``label``, from the
    value ``dst`` recorded)."""

    src: str
    dst: str
    value: str  # "rollout linked: yes": the value the later decision recorded
    why: str  # "P3 reads the link P1 made"

    @property
    def label(self) -> str:
        return f"{self.src} -> {self.dst}: {self.why} ({self.value})"


# Which decision reads which: (from, to, the value the later rule recorded, its name, why).
# P1 -> P7 only matters when the engine replaced the mesh: the map P1 built is not rebuilt.
FLOW_LINKS: tuple[tuple[str, str, str, str, str], ...] = (
    ("P1", "P3", "rollout_linked_to_actor", "rollout linked", "P3 reads the link P1 made"),
    ("P2", "P4", "linked", "reference linked", "P4 reads the link P2 made"),
    ("P1", "P7", "still_registered_as_sharing", "still registered as sharing", "P7 leaves P1's map as it was"),
    ("P3", "P7", "engine", "engine", "P7 reads the mesh of the engine P3 handed the model to"),
    ("P12", "P13", "lora", "LoRA", "P13 syncs what P12 trains"),
)


def flow_links(report: Mapping[str, Any]) -> list[FlowLink]:
    """The arrows to draw: each link whose two decisions are in the trace, labelled with the
    value the later one recorded (P1 -> P7 only where P7 replaced the rollout mesh)."""
    out = []
    for src, dst, key, name, why in FLOW_LINKS:
        if not _decisions(report, src) or not _decisions(report, dst):
            continue
        d = _decisions(report, dst)[0]
        if (src, dst) == ("P1", "P7") and d.get("branch") != MeshBranch.REPLACED:
            continue
        value = (d.get("values") or {}).get(key)
        shown = ("yes" if value else "no") if isinstance(value, bool) else str(value)
        out.append(FlowLink(src, dst, f"{name}: {shown}", why))
    return out


def link_lanes(links: list[FlowLink], row_of: Mapping[str, int]) -> list[int]:
    """A lane (0 nearest the rows) per link, so that links whose spans overlap never share one;
    ``row_of`` gives each rule's first row."""
    lanes: list[list[tuple[int, int]]] = []
    out = []
    for link in links:
        a, b = sorted((row_of[link.src], row_of[link.dst]))
        for k, taken in enumerate(lanes):
            if all(b < lo or a > hi for lo, hi in taken):
                taken.append((a, b))
                out.append(k)
                break
        else:
            lanes.append([(a, b)])
            out.append(len(lanes) - 1)
    return out


def link_ends(links: list[FlowLink]) -> list[tuple[float, float]]:
    """Per link, where its two ends sit on their rows, from -1 to 1 (0 is the row's middle):
    links that meet on one row are spread over it, so each arrowhead stays distinct."""
    at: dict[str, list[int]] = {}
    for i, link in enumerate(links):
        at.setdefault(link.src, []).append(i)
        at.setdefault(link.dst, []).append(i)

    def spread(rule: str, i: int) -> float:
        ids = at[rule]
        return 0.0 if len(ids) == 1 else -1 + 2 * ids.index(i) / (len(ids) - 1)

    return [(spread(link.src, i), spread(link.dst, i)) for i, link in enumerate(links)]


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


def _option_labels() -> dict[str, str]:
    """Answer value -> its label, from every rule's declaration; a value two rules label
    differently could not be drawn right, so it is refused here."""
    labels: dict[str, str] = {}
    for entry in RULES:
        for value, label in entry.labels().items():
            if labels.setdefault(value, label) != label:
                raise ValueError(
                    f"the answer {value!r} is labelled {labels[value]!r} by one rule and {label!r} by {entry.rule}; "
                    "give the two answers different values or the same label"
                )
    return {value: label for value, label in labels.items() if label != value}


# How a branch is labelled in the flow figures (matplotlib and SVG), as each rule declares it
# (``rules.registry``); other branches use their own name.
OPTION_LABELS: dict[str, str] = _option_labels()
