"""Every sentence and table about a weight sync compares a part with its whole (L3): the bytes
that arrived from other devices are a part of the synced bytes (``synced = arrived + copied +
reused``), and the bytes relayed (crossed devices without staying) are said apart, never
counted into a share of the synced bytes.

Over drawn sync reports (leaves with any mix of arrived, relayed, copied and reused bytes, as a
custom rollout mesh with LoRA and the xla reshard makes them) and over every stored report.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from stored_reports import PLACEMENTS, stored

from rlcluster_lab.cli.text import format_sync
from rlcluster_lab.lab.figures import shard_data as shards
from rlcluster_lab.lab.widget import status as sentences
from rlcluster_lab.measure.sync import LeafSync, SyncPiece, SyncReport

_UNIT = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
_OF = re.compile(r"([\d.]+) (B|KiB|MiB|GiB|TiB) of the ([\d.]+) (B|KiB|MiB|GiB|TiB)")


def _leaf(i: int, arrived: int, relayed: int, copied: int, reused: int, spec: str) -> LeafSync:
    pieces = [SyncPiece("moved", 0, 1, arrived + relayed)] if arrived + relayed else []
    pieces += [SyncPiece("copied", 1, 1, copied)] if copied else []
    pieces += [SyncPiece("reused", 1, 1, reused)] if reused else []
    return LeafSync(
        path=f"blocks/{i}/attn/q/lora_a",
        dtype="float32",
        dst_dtype="float32",
        shape=(4, 4),
        src_sharding=f"mesh(fsdp=2,tp=1) devices 0-1 P({spec}) device",
        dst_sharding=f"mesh(fsdp=3,tp=1) devices 1,4,6 P({spec}) device",
        synced_bytes=arrived + copied + reused,
        moved_cross_device_bytes=arrived + relayed,
        copied_same_device_bytes=copied,
        reused_bytes=reused,
        minimum_cross_device_bytes=arrived,
        logical_bytes=64,
        relayed_cross_device_bytes=relayed,
        pieces=tuple(pieces),
    )


_LEAVES = st.lists(
    st.tuples(
        st.integers(0, 70_000),
        st.integers(0, 70_000),
        st.integers(0, 9_000),
        st.integers(0, 9_000),
        st.sampled_from(["'fsdp', None", "None, 'tp'", "None, None"]),
    ),
    min_size=1,
    max_size=6,
)


def _report(drawn: list[tuple[int, int, int, int, str]]) -> dict:
    leaves = tuple(_leaf(i, *d) for i, d in enumerate(drawn))
    return SyncReport(
        method="measured",
        lora=True,
        leaves=leaves,
        anchor_bytes=0,
        anchor_mode="trainable",
        seconds=0.01,
        anchor_seconds=0.0,
        arrived_by_device={},
        peak_extra_bytes={},
        global_step=1,
        reshard_strategy="xla",
    ).to_json()


def check_parts(sync: dict) -> None:
    """Every "X of Y" and every share about one sync has its part within its whole."""
    synced = int(sync["synced_bytes"])
    assert sync["arrived_cross_device_bytes"] + sync["copied_same_device_bytes"] + sync["reused_bytes"] == synced
    said = sentences.synced(sync, 0.5)
    for part, unit, whole, whole_unit in _OF.findall(said):
        assert float(part) * _UNIT[unit] <= float(whole) * _UNIT[whole_unit] + 0.05 * _UNIT[whole_unit], said
    if sync["relayed_cross_device_bytes"]:
        assert "relayed" in said, said
    for row in shards.spec_rows(sync):
        assert row["arrived"] + row["copied"] + row["reused"] == row["synced"], row
        assert row["arrived %"] == "-" or float(row["arrived %"]) <= 100.0, row
    (row,) = shards.share_rows({"run": sync})
    assert row["arrived"] <= row["synced physical"], row
    assert row["arrived % of physical"] == "-" or float(row["arrived % of physical"]) <= 100.0, row
    if synced and all("pieces" in lf for lf in sync["leaves"]):
        flows = shards.sync_flows(sync)
        assert flows.arrived_bytes + flows.copied_bytes + flows.reused_bytes == flows.synced_bytes
        assert 0.0 <= flows.arrived_share <= 1.0
    if synced:
        head = shards.share_lines(sync).splitlines()[0]
        part, whole = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+) / ([\d,]+)", head)[0])
        assert part <= whole == synced, head
    (line,) = [ln for ln in format_sync(sync) if ln.strip().startswith("synced ")]
    numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", line)]
    assert numbers[0] == sum(numbers[1:4]), line  # synced = its three parts, as written


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_LEAVES)
def test_a_syncs_sentences_never_say_a_part_larger_than_its_whole(drawn):
    check_parts(_report(drawn))


def test_every_stored_syncs_sentences_compare_a_part_with_its_whole():
    """The stored reports include a custom rollout mesh with LoRA whose reshard relayed bytes
    (more crossed devices than were synced): the sentences say what arrived, and the relayed apart."""
    relayed = 0
    for name in PLACEMENTS:
        sync = stored(name).get("sync")
        if sync and "leaves" in sync:
            check_parts(sync)
            relayed += sync["moved_cross_device_bytes"] > sync["synced_bytes"]
    assert relayed, "no stored sync moved more than it synced: the case this test is for is missing"
