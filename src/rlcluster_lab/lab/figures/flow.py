"""The decision flow as rows (L1): per decision, the question, its answers and the one that
fired, read from the typed branch each rule recorded, in the order the cluster took them, and
the links from a decision to the ones that read its result: what ``figures.placement.decision_flow``
draws. From the same rows: what a construction changed against the one before it
(``decision_changes``, ``changes_since``), so a line never disagrees with the figure, and the
sharing map beside the measured buffers in words (``measured_text``, ``role_note``). Every view
and the status take their claims about copies from here: "no copy" only where ``no_copy`` holds,
why (``share_reason``), and P4's avoidable copy beside P14's later join of the two host copies
(``p14_joined``, ``p4_text``, ``warning_lines``)."""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.core.trace import seen
from rlcluster_lab.lab.figures.style import ROLE_ORDER, in_order
from rlcluster_lab.rules.anchor import P8
from rlcluster_lab.rules.catalogue import RULES
from rlcluster_lab.rules.loading import P5, P14, LoadBranch, OffloadAnswer, OffloadBranch, P5Values, P14Values
from rlcluster_lab.rules.reference import NO_REFERENCE, P4, P4Values, ReferenceBranch
from rlcluster_lab.rules.registry import Rule
from rlcluster_lab.rules.rollout import P3, P7, MeshBranch, P3Values, P7Values, RolloutBranch
from rlcluster_lab.rules.sharing import P1, P2, LinkBranch, P1Values, P2LinkValues, P2PropagationValues
from rlcluster_lab.rules.steps import P12, P13, P13Values
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
    return "(" + ",".join(str(v) for v in mesh.get("shape", {}).values()) + ")" if mesh else "none"


def flow_rows(report: Mapping[str, Any]) -> list[FlowRow]:
    """The construction (and any sync) decisions of a report, as rows of the flow figure, in
    the order the trace recorded them.

    Which answer fired is read from what the report recorded (the trace's
    values, the sharing map, ``rollout_branch``), never worked out again. A
    row whose rule left no decision in the trace (P4 without a reference,
    P14 without offload) comes last.
    """
    first: dict[str, int] = {}
    for i, d in enumerate(report.get("decisions", [])):
        rule = str(d.get("rule"))
        role = seen(d, P5Values).role if rule == "P5" else None
        first.setdefault(f"{rule}:{role}" if role else rule, i)
    end = len(report.get("decisions", []))
    # sorted() is stable: rows of one rule keep the order they were built in.
    return sorted(_rows(report), key=lambda r: first.get(r.key, first.get(r.key.split(":")[0], end)))


def _rows(report: Mapping[str, Any]) -> list[FlowRow]:
    rows: list[FlowRow] = []

    def add(rule: Rule, fired: Any, detail: str = "", key: str = "", question: str = "") -> None:
        rows.append(FlowRow(key or rule.rule, question or rule.question, rule.values(), str(fired), detail))

    if checks := _decisions(report, "P6"):
        failed = [d for d in checks if d.get("branch") == CheckBranch.ERROR.value]
        fired = (CheckBranch.ERROR if failed else CheckBranch.PASS).value
        add(P6, fired, f"{len(checks) - len(failed)} of {len(checks)} checks passed")
    for d in _decisions(report, "P1")[:1]:
        p1 = seen(d, P1Values)
        detail = f"shapes {mesh_shape_text(p1.actor_mesh)} vs {mesh_shape_text(p1.rollout_mesh)}"
        if p1.same_devices is not None:  # as the rule recorded it (``rules.sharing.same_devices``)
            detail += f"; same devices: {'yes' if p1.same_devices else 'no'}"
        add(P1, d.get("branch"), detail)
    for d in [d for d in _decisions(report, "P2") if d.get("branch") != LinkBranch.PROPAGATED][:1]:
        fired = str(d.get("branch"))
        if fired == LinkBranch.SKIPPED:
            detail = "a model was given as a path"
        else:
            link = seen(d, P2LinkValues)
            lora, ref, same = (
                "yes" if v else "no" for v in (link.actor_has_lora, link.has_reference, link.meshes_equal)
            )
            detail = f"LoRA actor: {lora}; reference: {ref}; same mesh: {same}"
            for prop in _decisions(report, "P2"):
                linked = seen(prop, P2PropagationValues).linked_to_actor or []
                if prop.get("branch") == LinkBranch.PROPAGATED and len(linked) > 1:
                    # P2's propagation: roles linked to the actor are linked to each other.
                    detail += f"; so {' and '.join(linked)} are linked too"
        add(P2, fired, detail)
    for d in _decisions(report, "P3")[:1]:
        detail = d["outcome"]
        if engine_copied(report):
            detail = "handed the actor object, but " + engine_copy_reason(report) + ": the rollout holds a copy"
        add(P3, d.get("branch"), detail)
    if p4 := _decisions(report, "P4"):
        add(P4, p4[0].get("branch"), p4_text(report))
    else:
        add(P4, NO_REFERENCE)
    for d in _decisions(report, "P5"):
        if d.get("branch") not in P5.values():
            continue  # "read from the checkpoint" notes, not a placement branch
        p5 = seen(d, P5Values)
        detail = f"{p5.leaves_on_target or 0} of {p5.leaves} leaves already in their target sharding"
        if d["branch"] != LoadBranch.KEPT and p5.requested_dtype and p5.requested_dtype != p5.dtype:
            detail += f"; cast {p5.dtype} -> {p5.requested_dtype}"
        add(P5, d["branch"], detail, key=f"P5:{p5.role}", question=P5.question.format(role=p5.role))
    moved = sorted(
        {str(seen(d, P14Values).role) for d in _decisions(report, "P14") if d.get("branch") == OffloadBranch.OFFLOADED}
    )
    offload = OffloadAnswer.PINNED_HOST if report.get("offload_to_cpu") else OffloadAnswer.ON_DEVICE
    detail = ("moved to pinned host: " + ", ".join(moved)) if moved else ""
    if p14_joined(report):
        detail += "; then joined the reference's backbone copy to the actor's (P4's avoidable copy)"
    add(P14, offload.value, detail)
    for d in _decisions(report, "P7")[:1]:
        p7 = seen(d, P7Values)
        rebuilt, still = ("yes" if v else "no" for v in (p7.sharing_map_rebuilt, p7.still_registered_as_sharing))
        add(P7, d.get("branch"), f"engine {p7.engine}; map rebuilt: {rebuilt}; still registered as sharing: {still}")
    anchor = report.get("anchor") or {}
    p8 = _decisions(report, "P8")
    if p8 or anchor:
        kind = anchor.get("memory_kind")
        kind = ", ".join(kind) if isinstance(kind, list) else str(kind)
        fired = p8[-1].get("branch") if p8 else anchor.get("mode", "full")
        add(P8, fired, f"{fmt_bytes(anchor.get('bytes', 0))} in {kind}")
    p12 = [d for d in _decisions(report, "P12") if d.get("test") != "critic trainable parameters"]
    for d in (p12 or _decisions(report, "P12"))[:1]:
        add(P12, d.get("branch"), str(d.get("outcome", "")))
    if p13 := _decisions(report, "P13"):
        add(P13, p13[-1].get("branch"), f"{len(p13)} sync(s); sharing map consulted: no")
    return rows


def engine_copied(report: Mapping[str, Any]) -> bool:
    """P3 handed the rollout the actor object, and the engine copied it (measured: the rollout
    holds buffers that are not the actor's). The one test of the engine's copy that every view
    reads: the flow's P3 row, the Devices notes, the Memory view, the summary and the status."""
    return _branch(report, "P3") == RolloutBranch.SHARED and report.get("rollout_shares_actor_weights") is False


def rollout_text(report: Mapping[str, Any]) -> str:
    """What the rollout samples with, in a few words: P3's answer as the flow labels it, and the
    engine's copy where the engine made one (``engine_copied``)."""
    said = f"{answer_label(str(report.get('rollout_branch', _branch(report, 'P3'))))} (P3)"
    if engine_copied(report):
        said += f", then copied by the {report.get('engine', 'rollout')} engine"
        p7 = _decisions(report, "P7")[:1]
        if p7 and p7[0].get("branch") == MeshBranch.REPLACED:
            said += f" onto its own {mesh_shape_text(seen(p7[0], P7Values).engine_mesh)} mesh (P7)"
    return said


def engine_copy_reason(report: Mapping[str, Any]) -> str:
    """Why a rollout that P3 handed the actor object to holds buffers of its own, from what
    the trace recorded: the engine keeps its own copy (P7 says on which mesh)."""
    engine = str(report.get("engine", "the"))
    for d in _decisions(report, "P7")[:1]:
        p7 = seen(d, P7Values)
        if d.get("branch") == MeshBranch.REPLACED:
            return (
                f"the {engine} engine copied it onto its own {mesh_shape_text(p7.engine_mesh)} mesh "
                f"(P7: not the {mesh_shape_text(p7.config_rollout_mesh)} asked for)"
            )
    return f"the {engine} engine copied it to keep a copy of its own"


@dataclasses.dataclass(frozen=True)
class FlowLink:
    """An arrow of the flow: decision ``dst`` read what ``src`` decided (``value``, as ``dst``
    recorded it)."""

    src: str
    dst: str
    value: str  # "rollout linked: yes": the value the later decision recorded
    why: str  # "P3 reads the link P1 made"


# Which decision reads which: (from, to, the field of the value the later rule recorded, its
# name, why). P1 -> P7 only matters when the engine replaced the mesh: the map P1 built is not rebuilt.
FLOW_LINKS: tuple[tuple[str, str, str, str, str], ...] = (
    ("P1", "P3", "rollout_linked_to_actor", "rollout linked", "P3 reads the link P1 made"),
    ("P2", "P4", "linked", "reference linked", "P4 reads the link P2 made"),
    ("P1", "P7", "still_registered_as_sharing", "still registered as sharing", "P7 leaves P1's map as it was"),
    ("P3", "P7", "engine", "engine", "P7 reads the mesh of the engine P3 handed the model to"),
    ("P12", "P13", "lora", "LoRA", "P13 syncs what P12 trains"),
)
# The values each link's later decision recorded, as its rule declares them.
_LINK_VALUES = {"P3": P3Values, "P4": P4Values, "P7": P7Values, "P13": P13Values}


def flow_links(report: Mapping[str, Any]) -> list[FlowLink]:
    """The arrows to draw: each link whose two decisions are in the trace, labelled with the
    value the later one recorded (P1 -> P7 only where P7 replaced the rollout mesh)."""
    out = []
    for src, dst, field, name, why in FLOW_LINKS:
        if not _decisions(report, src) or not _decisions(report, dst):
            continue
        d = _decisions(report, dst)[0]
        if (src, dst) == ("P1", "P7") and d.get("branch") != MeshBranch.REPLACED:
            continue
        value = getattr(seen(d, _LINK_VALUES[dst]), field)
        shown = ("yes" if value else "no") if isinstance(value, bool) else str(value)
        out.append(FlowLink(src, dst, f"{name}: {shown}", why))
    return out


def link_lanes(links: list[FlowLink], row_of: Mapping[str, int]) -> list[int]:
    """A lane (0 nearest the rows) per link, so that links whose spans overlap never share one;
    ``row_of`` gives each rule's first row."""
    spans = [sorted((row_of[link.src], row_of[link.dst])) for link in links]
    out: list[int] = []
    for a, b in spans:
        taken = {k for k, (lo, hi) in zip(out, spans) if not (b < lo or a > hi)}
        out.append(next(k for k in range(len(out) + 1) if k not in taken))
    return out


def link_ends(links: list[FlowLink]) -> list[tuple[float, float]]:
    """Per link, where its two ends sit on their rows, from -1 to 1 (0 is the row's middle):
    links that meet on one row are spread over it, so each arrowhead stays distinct."""
    ends = {rule for link in links for rule in (link.src, link.dst)}
    at = {rule: [i for i, link in enumerate(links) if rule in (link.src, link.dst)] for rule in ends}

    def spread(rule: str, i: int) -> float:
        ids = at[rule]
        return 0.0 if len(ids) == 1 else -1 + 2 * ids.index(i) / (len(ids) - 1)

    return [(spread(link.src, i), spread(link.dst, i)) for i, link in enumerate(links)]


def mesh_coords(mesh: Mapping[str, Any]) -> dict[int, tuple[int, ...]]:
    """Device id -> its position in the mesh (row-major over the shape)."""
    dims = [int(v) for v in mesh.get("shape", {}).values()] or [1]
    ids = mesh.get("device_ids", [])
    return {int(dev): tuple(int(i) for i in np.unravel_index(flat, dims)) for flat, dev in enumerate(ids)}


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

# The sharing map is P1/P2's decision of which roles may share a model; the measured shared
# buffers are the ones two roles really hold in common (L2). They differ where P3 hands the actor
# to an engine that keeps its own copy, and where an unlinked role holds shards the reshard (P5)
# left in place because they are the same on both meshes (replicated leaves).


def shared_bytes(memory: Mapping[str, Any], role: str, other: str, dev: str | None = None) -> int:
    """Bytes ``role`` holds (on ``dev``, or on every device) that are buffers ``other`` holds too."""
    groups = [g for g in memory.get("shared", []) if {role, other} <= set(g.get("roles", []))]
    if dev is None:
        return sum(int(g.get("bytes", 0)) for g in groups)
    return sum(int(v) for g in groups for v in (g.get("by_device") or {}).get(dev, {}).values())


def _branch(report: Mapping[str, Any], rule: str, role: str | None = None) -> str | None:
    for d in _decisions(report, rule):
        if role is None or seen(d, P5Values).role == role:
            return str(d.get("branch"))
    return None


def held_bytes(memory: Mapping[str, Any], role: str) -> int:
    """Bytes ``role`` holds, measured (0 when it holds nothing or is absent)."""
    return int(memory.get("by_role", {}).get(role, {}).get("bytes", 0))


def no_copy(report: Mapping[str, Any], role: str) -> bool:
    """Every byte ``role`` holds is one of the actor's buffers (measured): the one condition under
    which the lab says "no copy" of a role."""
    memory = report.get("memory") or {}
    held = held_bytes(memory, role)
    return role != "actor" and held > 0 and shared_bytes(memory, role, "actor") >= held


def p14_joined(report: Mapping[str, Any]) -> bool:
    """P4 warned of an avoidable copy with offload (the reference's backbone loaded as host copies
    of its own), and the reference now measurably holds only the actor's buffers: P14 joined the
    two copies when a shared role was next loaded, as P4's decision says it would."""
    p4 = _decisions(report, "P4")[:1]
    warned = p4 and p4[0].get("branch") == ReferenceBranch.AVOIDABLE_COPY and seen(p4[0], P4Values).offload_to_cpu
    return bool(warned and no_copy(report, "reference"))


# Why a rollout P3 gave a second copy holds only the actor's buffers, measured (the memory view says it).
SAME_LAYOUT_KEPT = (
    "P3 placed a second copy, but the rollout's mesh lays every leaf out on the same device as the actor's, "
    "so JAX kept the actor's buffers: nothing was copied"
)


def share_reason(report: Mapping[str, Any], role: str) -> str:
    """Why ``role`` holds only the actor's buffers (``no_copy``), in a few words, from the trace;
    "" when no decision says why."""
    if role == "rollout" and _branch(report, "P3") == RolloutBranch.SHARED:
        return "P3: the same object"
    if role == "rollout" and _branch(report, "P3") == RolloutBranch.SECOND_COPY:
        # P1 saw two meshes, but they place every leaf alike on the same devices (reshaped on one
        # device): the vanilla engine's placement kept the actor's buffers, so nothing was copied.
        return SAME_LAYOUT_KEPT
    if role == "reference" and _branch(report, "P4") == ReferenceBranch.ONE_BACKBONE:
        return "P4: one backbone"
    if role == "reference" and p14_joined(report):
        return "P4 warned of a copy, P14 joined it"
    if role == "anchor" and report.get("offload_to_cpu"):
        return "P8 pins it where P14 keeps the actor"
    return ""


def p4_text(report: Mapping[str, Any]) -> str:
    """P4's decision in words: what it decided at construction and, with offload, what P14 has
    done since (joined the two copies, or not yet, measured)."""
    d = _decisions(report, "P4")[0]
    said = str(d.get("outcome", "")).split(";")[0]
    if d.get("branch") != ReferenceBranch.AVOIDABLE_COPY or not seen(d, P4Values).offload_to_cpu:
        return said
    if p14_joined(report):
        return f"{said} at construction; P14 has since joined the two host copies: no copy now (measured)"
    memory = report.get("memory") or {}
    own = held_bytes(memory, "reference") - shared_bytes(memory, "reference", "actor")
    later = "; P14 joins the two host copies when a shared role is next loaded"
    return said + later + (f" (not yet: {fmt_bytes(own)} of its own, measured)" if memory else "")


def warning_lines(report: Mapping[str, Any], short: bool = False) -> list[str]:
    """The cluster's warnings as they stand now: P4's avoidable copy says whether P14 has since
    joined the two host copies (``p14_joined``). ``short``: each up to its first clause."""
    joined = "; P14 has since joined them: the reference holds only the actor's buffers now (measured)"
    shown = [w.split(" (")[0].split(";")[0] if short else w for w in report.get("warnings", [])]
    if not p14_joined(report):
        return shown
    return [w + (", since joined by P14" if short else joined) if w.startswith("P4") else w for w in shown]


def measured_text(report: Mapping[str, Any], role: str) -> str:
    """What the memory walk found ``role`` to hold of the actor's buffers, and why."""
    memory = report.get("memory") or {}
    held = held_bytes(memory, role)
    if not held:
        return ""
    if role == "actor":
        holders = {r for g in memory.get("shared", []) if "actor" in g.get("roles", []) for r in g["roles"]}
        others = in_order(list(holders - {"actor"}), ROLE_ORDER)
        return ("measured: its buffers are held by " + ", ".join(others) + " too") if others else ""
    linked = "actor" in report.get("sharing_map", {}).get(role, [])
    shared = shared_bytes(memory, role, "actor")
    if no_copy(report, role):
        why = share_reason(report, role)
        return f"measured: all {fmt_bytes(held)} are the actor's buffers" + (f" ({why})" if why else "") + ", no copy"
    if role == "rollout" and engine_copied(report):
        return (
            f"measured: {fmt_bytes(held - shared)} of its own: P3 handed over the actor object, but "
            + engine_copy_reason(report)
        )
    if role == "reference" and linked and _branch(report, "P4") == ReferenceBranch.AVOIDABLE_COPY:
        return f"measured: {fmt_bytes(held - shared)} of its own (P4: an avoidable copy)"
    if not shared:
        return f"measured: {fmt_bytes(held)} of its own"
    how = (
        "shards the reshard (P5) left in place because they are the same on both meshes (replicated leaves)"
        if _branch(report, "P5", role) == "resharded"
        else "buffers P5 kept as they were"
    )
    text = f"measured: {fmt_bytes(shared)} of its {fmt_bytes(held)} are the actor's buffers: {how}"
    return text + ("" if linked else ", not a link in the map")


def actor_share_text(report: Mapping[str, Any], role: str) -> str:
    """How much of the actor's buffers ``role`` holds, measured: "all", "10.0 KiB of 588.0 KiB", "none"."""
    memory = report.get("memory") or {}
    held = held_bytes(memory, role)
    if role == "actor" or not held:
        return "-"
    shared = shared_bytes(memory, role, "actor")
    if not shared:
        return "none"
    return f"all {fmt_bytes(held)}" if no_copy(report, role) else f"{fmt_bytes(shared)} of {fmt_bytes(held)}"


def role_note(report: Mapping[str, Any], role: str) -> str:
    """One line per role: the sharing map's links (as P1/P2 decided them), then what the role
    measurably shares, and why."""
    links = ", ".join(report.get("sharing_map", {}).get(role, []))
    measured = measured_text(report, role)
    said = f"linked to {links}" if links else "no link"
    return f"{role}: sharing map (P1, P2): {said}" + (f"; {measured}" if measured else "")


# Rows that are not construction decisions: P13 is the sync's (a sync after the previous
# construction is not something this construction changed).
_NOT_CONSTRUCTION = ("P13",)


def answer_label(value: str) -> str:
    """How the flow figure writes an answer (its rule's declared label)."""
    return OPTION_LABELS.get(value, value)


@dataclasses.dataclass(frozen=True)
class Change:
    """One decision whose answer changed: the flow row's key (``"P3"``, ``"P5:rollout"``), its
    question, the answers before and after (None: the decision was not taken on that side),
    the new answer's detail, and the inputs it read from earlier decisions that changed."""

    key: str
    question: str
    before: str | None
    after: str | None
    detail: str = ""
    because: tuple[tuple[str, str], ...] = ()  # (earlier rule, "rollout linked: no") per changed input

    @property
    def rule(self) -> str:
        return self.key.split(":")[0]

    def text(self) -> str:
        """The change in words: "what does the rollout sample with? (P3): same object -> second copy"."""
        head = f"{self.question} ({self.rule})"
        if self.before is None:
            said = f"{head}: now asked, {answer_label(str(self.after))}"
        elif self.after is None:
            said = f"{head}: no longer asked (was {answer_label(self.before)})"
        else:
            said = f"{head}: {answer_label(self.before)} \u2192 {answer_label(self.after)}"
        if self.after is not None and self.detail:
            said += f" ({self.detail})"
        if self.because:
            said += ", because " + " and ".join(f"{value} ({rule})" for rule, value in self.because)
        return said


def decision_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """Every construction decision whose answer differs between two reports, in the order the
    new cluster took them (then the ones it no longer took)."""
    old = {r.key: r for r in flow_rows(before) if r.key.split(":")[0] not in _NOT_CONSTRUCTION}
    new = {r.key: r for r in flow_rows(after) if r.key.split(":")[0] not in _NOT_CONSTRUCTION}
    before_fired, after_fired = ({k: r.fired for k, r in rows.items()} for rows in (old, new))
    changed = {key for key in old.keys() | new.keys() if before_fired.get(key) != after_fired.get(key)}
    read_before = {(link.src, link.dst): link.value for link in flow_links(before)}
    out = []
    for key in [k for k in new if k in changed] + [k for k in old if k in changed and k not in new]:
        row = new.get(key) or old[key]
        # The arrows into this decision whose value changed: what it read is the reason (not
        # P1 -> P7, which shows what P7 left of P1's map, not what P7 read).
        because = tuple(
            (link.src, link.value)
            for link in flow_links(after)
            if key in new
            and link.dst == key
            and (link.src, link.dst) != ("P1", "P7")
            and read_before.get((link.src, link.dst)) != link.value
        )
        detail = new[key].detail if key in new else ""
        out.append(Change(key, row.question, before_fired.get(key), after_fired.get(key), detail, because))
    return out


# Byte totals a construction changes (measured, physical bytes), by what the line calls them.
_TOTALS = (
    ("bytes held, each buffer once (measured)", lambda r: r["memory"]["unique_bytes"]),
    ("rollout bytes (measured)", lambda r: held_bytes(r["memory"], "rollout")),
)


def changes_since(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """What a construction changed against the previous cluster's report: a line per decision
    whose answer changed (``decision_changes``), then the byte totals that changed. Empty for
    the first construction."""
    if before is None:
        return []
    lines = [c.text() for c in decision_changes(before, after)]
    for label, read in _TOTALS:
        a, b = read(before), read(after)
        if a != b:
            # Exact bytes where the short form would read as no change.
            said = (fmt_bytes(a), fmt_bytes(b)) if fmt_bytes(a) != fmt_bytes(b) else (f"{a:,} B", f"{b:,} B")
            lines.append(f"{label}: {said[0]} \u2192 {said[1]}")
    return lines


def changes_html(changes: Sequence[str]) -> str:
    """The "changed since the last construction" list under the knobs."""
    if not changes:
        return ""
    items = "".join(f"<li>{html.escape(c)}</li>" for c in changes)
    return (
        "<div class='rl-changes'><b>changed since the last construction:</b>"
        f"<ul style='margin:2px 0;padding-left:16px'>{items}</ul></div>"
    )
