"""What the lab's status says after each action: one short sentence (what happened, and the one
figure that matters, measured), and the details behind its toggle (what the action cost).

Pure functions of the report and the action's timings, so a test reads exactly what a user
reads. One step counter is named: the cluster's global step, which every sync advances (P13),
the sync a training step ends with included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlcluster_lab.lab.changes import answer_label
from rlcluster_lab.lab.status import program_name
from rlcluster_lab.lab.style import fmt_bytes

STEP_COUNTER = "global step"  # the one step counter the lab names (the cluster's syncs so far)


def constructed(report: Mapping[str, Any], seconds: float) -> str:
    """After Construct: the rollout's branch (P3) and the bytes held, measured."""
    memory = report.get("memory") or {}
    return (
        f"Constructed in {seconds:.1f} s. Rollout: {answer_label(report['rollout_branch'])} (P3); "
        f"{fmt_bytes(memory.get('unique_bytes', 0))} held (measured)."
    )


def synced(sync: Mapping[str, Any], seconds: float) -> str:
    """After Sync weights: the global step it reached and the bytes that crossed devices, measured."""
    return (
        f"Synced in {seconds:.2f} s, now at {STEP_COUNTER} {sync['global_step']}: "
        f"{fmt_bytes(sync['moved_cross_device_bytes'])} of {fmt_bytes(sync['synced_bytes'])} "
        "crossed devices (measured)."
    )


def stepped(global_step: int, mean_reward: float, seconds: float) -> str:
    """After Training step: the global step its sync reached, and the batch's mean reward."""
    return f"Training step done in {seconds:.1f} s, now at {STEP_COUNTER} {global_step}: mean reward {mean_reward:.3f}."


def refused(kept: bool, outlined: bool, *, failed: bool = False) -> str:
    """After a refusal (the checks before a build) or a failure (of the action itself): where
    its message is (beside the outlined knob it names, or beside the buttons), and which
    cluster is live."""
    where = "see the note by the outlined knob" if outlined else "see the note by the buttons"
    after = "The cluster shown is still the previous one." if kept else "No cluster is live now."
    return f"{'Failed' if failed else 'Refused'}: {where}. {after}"


def details(
    timings: Mapping[str, Any], compiled: Sequence[tuple[str, float, bool]], waited: float, released: str = ""
) -> str:
    """What the last action cost, measured: the work, the report, the redraw, the programs it
    compiled or read back from the compilation cache, and any wait for the background compile."""
    redrawn = ", ".join(timings.get("redrawn", [])) or "nothing"
    built = [program_name(name) for name, _, cached in compiled if not cached]
    loaded = sum(cached for _, _, cached in compiled)
    parts = [
        f"{timings.get('work', 0):.2f} s work, {timings.get('report', 0):.2f} s report, "
        f"{timings.get('draw', 0):.2f} s drawing (redrawn: {redrawn})",
        (f"compiled {len(built)} program(s): {', '.join(built)}" if built else "nothing compiled")
        + (f", read {loaded} from the compilation cache" if loaded else ""),
    ]
    if waited > 0.05:
        parts.append(f"waited {waited:.1f} s for the background compile of the step's programs")
    if released:
        parts.append(released)
    return "; ".join(parts) + "."
