"""What a construction changed against the cluster before it, in plain words (L1).

One line per decision whose answer changed, said as the decision-flow figure says it: the
rule's question and the labels of its old and new answers (``rules.registry`` declares both
once), the new answer's detail as the figure writes it, and, where what this decision read
from an earlier one changed (an arrow of the figure, ``lab.flow.flow_links``), that value as the
reason. The lines are built
from the same rows the figure draws (``lab.flow.flow_rows``), so a line never disagrees with
the figure, and never from a rule's test expression.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Mapping, Sequence
from typing import Any

from rlcluster_lab.lab.flow import OPTION_LABELS, FlowRow, flow_links, flow_rows
from rlcluster_lab.lab.style import fmt_bytes

# Rows that are not construction decisions: P13 is the sync's (a sync after the previous
# construction is not something this construction changed).
_NOT_CONSTRUCTION = ("P13",)
_NOT_A_REASON = {("P1", "P7")}


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
    changed = {key for key in old.keys() | new.keys() if _fired(old.get(key)) != _fired(new.get(key))}
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
            and (link.src, link.dst) not in _NOT_A_REASON
            and read_before.get((link.src, link.dst)) != link.value
        )
        out.append(
            Change(
                key,
                row.question,
                _fired(old.get(key)),
                _fired(new.get(key)),
                new[key].detail if key in new else "",
                because,
            )
        )
    return out


def _fired(row: FlowRow | None) -> str | None:
    return None if row is None else row.fired


# Byte totals a construction changes (measured, physical bytes), by what the line calls them.
_TOTALS = (
    ("bytes held, each buffer once (measured)", lambda r: r["memory"]["unique_bytes"]),
    ("rollout bytes (measured)", lambda r: r["memory"]["by_role"].get("rollout", {}).get("bytes", 0)),
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
