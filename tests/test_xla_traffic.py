"""L3 for the xla strategy: the bytes a compiled reshard moves, read from its collectives."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlcluster_lab.core.meshes import make_mesh
from rlcluster_lab.placement import xla as reshard_xla
from rlcluster_lab.placement.boxes import minimum_cross_device_elements, shard_boxes, to_box
from rlcluster_lab.placement.traffic import _flows, _groups, _pairs, _Unreadable, program_traffic

DEVICES = jax.devices()


# --- the printed formats ------------------------------------------------------------


def test_explicit_and_empty_replica_groups():
    assert _groups("x, replica_groups={{0,1},{2,3}}, dimensions={0}", 4) == [[0, 1], [2, 3]]
    assert _groups("x, replica_groups={}, dimensions={0}", 4) == [[0, 1, 2, 3]]
    assert _groups("x, dimensions={0}", 3) == [[0, 1, 2]]


def test_iota_replica_groups():
    assert _groups("x, replica_groups=[2,4]<=[8], dims", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert _groups("x, replica_groups=[4,2]<=[2,4]T(1,0), dims", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_mesh_replica_groups_with_device_ids_and_sub_axes():
    # Groups along axis_1 of a (2,4,1) mesh over 0..7.
    text = "x, replica_groups=mesh['axis_0'=2,'axis_1'=4,'axis_2'=1] {'axis_1'}"
    assert _groups(text, 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # A (4,1,2) mesh over 0..7 transposed: groups along axis_0 are the rows of the (2,4) grid.
    text = "x, replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}"
    assert _groups(text, 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # A sub-axis: axis_0 (size 4) split (2, 2, 1); groups along its second part.
    text = "x, replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_0':(2)2}"
    groups = _groups(text, 8)
    assert sorted(sum(groups, [])) == list(range(8)) and all(len(g) == 2 for g in groups)


def test_source_target_pairs():
    text = "x, channel_id=2, source_target_pairs={{0,0},{4,1},{1,2}}"
    assert _pairs(text) == [(0, 0), (4, 1), (1, 2)]


def test_an_unknown_group_format_is_unreadable_not_guessed():
    with pytest.raises(_Unreadable):
        _groups("x, replica_groups=somethingnew{0:1}", 8)


class _Fake:
    """Just enough of an HLO instruction for ``_flows``."""

    def __init__(self, name: str, text: str, operands: list | None = None) -> None:
        self.name, self._text, self._operands = name, text, operands or []

    def to_string(self) -> str:
        return self._text

    def operands(self) -> list:
        return self._operands


def test_flows_of_an_all_gather_and_a_tuple_all_to_all():
    param = _Fake("p", "%p = f32[4,8]{1,0} parameter(0)")
    flows = _flows("all-gather", "%g = f32[8,8] all-gather(%p), replica_groups={{0,1}}", [param], 2, {"p": 0})
    # Each member receives the other's 4x8 float32 operand.
    assert sorted((s, t, n) for s, t, n, _ in flows if s != t) == [(0, 1, 128), (1, 0, 128)]
    chunks = [_Fake(f"c{i}", f"%c{i} = f32[2,8]{{1,0}} slice(%p)", [param]) for i in range(2)]
    flows = _flows(
        "all-to-all", "%a = (f32[2,8], f32[2,8]) all-to-all(...), replica_groups={{0,1}}", chunks, 2, {"p": 0}
    )
    # Member 0 sends chunk 1 to member 1 and member 1 sends chunk 0 to member 0.
    assert sorted((s, t, n, p) for s, t, n, p in flows if s != t) == [(0, 1, 64, 0), (1, 0, 64, 0)]


# --- compiled programs ------------------------------------------------------------


def _minimum(x, dst) -> int:
    shape = tuple(x.shape)
    dst_boxes = [(d.id, to_box(i, shape)) for d, i in dst.devices_indices_map(shape).items()]
    return sum(minimum_cross_device_elements(shard_boxes(x), dst_boxes)) * x.dtype.itemsize


SINGLE_HOP = [
    ((2, 4), P("fsdp", "tp"), (8, 1), P("fsdp", "tp")),  # all-to-all within rows
    ((2, 4), P("tp", None), (8, 1), P("tp", None)),  # all-gather within rows
    ((2, 4), P("fsdp", "tp"), (2, 4), P()),  # two all-gathers, each keeping all it receives
    ((2, 4), P("fsdp", None), (8, 1), P("fsdp", None)),  # nothing crosses: a local slice
]


@pytest.mark.parametrize("src_shape,src_spec,dst_shape,dst_spec", SINGLE_HOP)
def test_collective_bytes_equal_what_arrived_and_the_minimum(src_shape, src_spec, dst_shape, dst_spec):
    """An independent check of the reading: where every byte that crosses is kept where it
    lands, the collectives' bytes equal what the tagged run saw arrive, and the minimum."""
    x = jax.device_put(np.zeros((64, 128), np.float32), NamedSharding(make_mesh(DEVICES, src_shape), src_spec))
    dst = NamedSharding(make_mesh(DEVICES, dst_shape), dst_spec)
    prog, _ = reshard_xla.program([x], [dst])
    traffic = sum(f.nbytes for f in prog.traffic.flows)
    assert prog.traffic.exact
    origins = prog.provenance.by_leaf[0]
    arrived = sum(c for dev, counts in origins.items() for origin, c in counts.items() if origin != dev) * 4
    assert traffic == arrived == _minimum(x, dst)
    assert all(f.param == 0 for f in prog.traffic.flows)


def test_a_two_hop_program_shows_the_bytes_moved_twice():
    """(2,4) onto (1,8): XLA does an all-to-all, then a permutation; some bytes cross twice."""
    x = jax.device_put(np.zeros((64, 128), np.float32), NamedSharding(make_mesh(DEVICES, (2, 4)), P("fsdp", "tp")))
    dst = NamedSharding(make_mesh(DEVICES, (1, 8)), P("fsdp", "tp"))
    prog, _ = reshard_xla.program([x], [dst])
    ops = {f.op for f in prog.traffic.flows}
    traffic = sum(f.nbytes for f in prog.traffic.flows)
    origins = prog.provenance.by_leaf[0]
    arrived = sum(c for dev, counts in origins.items() for origin, c in counts.items() if origin != dev) * 4
    assert {"all-to-all", "collective-permute"} <= ops
    assert traffic > arrived >= _minimum(x, dst)


def test_program_traffic_reads_a_program_loaded_back_from_its_device_order():
    x = jax.device_put(np.zeros((16, 16), np.float32), NamedSharding(make_mesh(DEVICES, (2, 4)), P("tp", None)))
    dst = NamedSharding(make_mesh(DEVICES, (8, 1)), P("tp", None))
    compiled = jax.jit(lambda t: t, out_shardings=dst).lower(x).compile()
    flows = program_traffic(compiled, list(make_mesh(DEVICES, (2, 4)).devices.flat)).flows
    # Rows split in 4 over tp on (2,4), replicated on (8,1): each device gathers 3 quarters.
    assert sum(f.nbytes for f in flows) == 8 * 3 * (4 * 16 * 4)
    assert {f.src_device for f in flows} == set(range(8))
