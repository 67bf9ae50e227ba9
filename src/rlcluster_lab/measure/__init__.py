"""What placement costs, measured on the live run: memory per role (L2), the bytes a weight
sync moved (L3), and the placement report that carries both with every decision (L1)."""

from rlcluster_lab.measure.memory import MemoryReport, allocator_stats, memory_of, memory_report
from rlcluster_lab.measure.sync import SyncReport, flat_leaves

__all__ = ["MemoryReport", "SyncReport", "allocator_stats", "flat_leaves", "memory_of", "memory_report"]
