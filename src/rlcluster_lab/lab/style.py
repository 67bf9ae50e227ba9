"""The lab's visual vocabulary, shared by the matplotlib figures and the SVG panels: role
order and colours, memory kinds, the parts of a sync, and how bytes are written."""

from __future__ import annotations

from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import MEMORY_KINDS
from rlcluster_lab.measure.memory import MEMORY_ENTRIES

ROLE_ORDER: tuple[str, ...] = tuple(role.value for role in Role)


ENTRY_ORDER: tuple[str, ...] = MEMORY_ENTRIES


KINDS: tuple[str, ...] = MEMORY_KINDS


ROLE_COLORS: dict[str, str] = {
    "actor": "#4c72b0",
    "rollout": "#dd8452",
    "reference": "#55a868",
    "reward": "#8172b3",
    "critic": "#937860",
    "anchor": "#da8bc3",
    "optimizer": "#8c8c8c",
    "critic_optimizer": "#b5a28f",
}


KIND_COLORS: dict[str, str] = {"device": "#4c72b0", "pinned_host": "#ccb974"}


SYNC_PARTS: tuple[tuple[str, str, str], ...] = (
    # (report key, legend label, colour): the identity synced = moved + copied + reused (L3).
    ("moved_cross_device_bytes", "moved between devices", "#c44e52"),
    ("copied_same_device_bytes", "copied within a device", "#dd8452"),
    ("reused_bytes", "reused (no copy)", "#55a868"),
)


HIGHLIGHT = "#f6c343"  # the branch that fired


IDLE = "#eeeeee"  # the branches that did not


IDLE_TEXT = "#9a9a9a"


PHYSICAL = "physical bytes (every device shard counted)"


def fmt_bytes(n: float) -> str:
    """Bytes in binary units, short and stable: 534528 -> '522.0 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
