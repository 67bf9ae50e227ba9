"""What placement costs, measured on the live run: memory per role (L2), the bytes a weight
sync moved (L3), and the placement report that carries both with every decision (L1)."""

from rlcluster_lab.measure.memory import MEMORY_ENTRIES, UNITS, MemoryReport, allocator_stats, memory_of, memory_report
from rlcluster_lab.measure.sync import (
    LeafSync,
    ShardFacts,
    SyncPiece,
    SyncReport,
    describe_sharding,
    flat_leaves,
    shard_facts,
    sync_ledger,
    sync_report,
)

__all__ = [
    "LeafSync",
    "MEMORY_ENTRIES",
    "MemoryReport",
    "ShardFacts",
    "SyncPiece",
    "SyncReport",
    "UNITS",
    "allocator_stats",
    "describe_sharding",
    "flat_leaves",
    "memory_of",
    "memory_report",
    "shard_facts",
    "sync_ledger",
    "sync_report",
]
