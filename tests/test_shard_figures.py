"""Shards you can see (L3): boxes read from live arrays, and a sync's pieces that add up to its report."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from rlcluster_lab.lab.figures import shard as sf
from rlcluster_lab.lab.figures import shard_data as shards
from rlcluster_lab.measure.sync import TransferLog, shard_facts, sync_ledger, sync_report
from rlcluster_lab.placement.events import listening
from rlcluster_lab.placement.reshard import reshard_many


def _mesh(shape: tuple[int, int]) -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(shape), ("fsdp", "tp"))


def _put(shape: tuple[int, ...], mesh: Mesh, spec: P) -> jax.Array:
    host = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return jax.device_put(host, NamedSharding(mesh, spec))


def _coverage(shape: tuple[int, int], boxes) -> np.ndarray:
    """How many (box, device) pairs cover each element."""
    count = np.zeros(shape, int)
    for box, devices in boxes:
        (r0, r1), (c0, c1) = box
        count[r0:r1, c0:c1] += len(devices)
    return count


def _drawn_boxes(fig) -> list[tuple[tuple[tuple[int, int], ...], tuple[int, ...]]]:
    """(box, devices) of every shard box the figure drew, read back from the artists' gids."""
    out = []
    for patch in fig.findobj(Rectangle):
        gid = patch.get_gid() or ""
        if gid.startswith("shard:"):
            _, _, box, devices = gid.rsplit(":", 3)
            dims = tuple(tuple(int(v) for v in part.split("-")) for part in box.split("x"))
            out.append((dims, tuple(int(d) for d in devices.split(","))))
    return out


# --------------------------------------------------------------------------- one array's shards


def test_a_2x4_sharded_matrix_is_8_boxes_covering_it_once_read_from_its_shards():
    x = _put((64, 64), _mesh((2, 4)), P("fsdp", "tp"))
    layout = shards.shard_layout(x, "actor")
    assert len(layout.shards) == 8
    # The boxes are the array's own: the same as its sharding's map of device -> index.
    expected = {
        (d.id, tuple((s.start or 0, s.stop or n) for s, n in zip(idx, x.shape)))
        for d, idx in x.sharding.devices_indices_map(x.shape).items()
    }
    assert {(s.device, s.box) for s in layout.shards} == expected
    assert all(s.nbytes == 32 * 16 * 4 for s in layout.shards)
    assert layout.physical_bytes == layout.logical_bytes == x.nbytes
    assert (_coverage((64, 64), layout.boxes().items()) == 1).all()
    fig = sf.shard_layouts([layout])
    drawn = _drawn_boxes(fig)
    assert len(drawn) == 8 and all(len(devs) == 1 for _, devs in drawn)
    assert (_coverage((64, 64), drawn) == 1).all()
    assert sorted(d for _, devs in drawn for d in devs) == list(range(8))


@pytest.mark.parametrize(
    ("mesh", "spec", "boxes", "replicas"),
    [
        ((2, 4), P("fsdp", None), 2, 4),  # a q/k/v/gate/up lora_a on the actor's mesh
        ((2, 4), P("tp", None), 4, 2),  # an o/down lora_a on the actor's mesh
        ((8, 1), P("tp", None), 1, 8),  # the same on the rollout's (8, 1): whole on every device
        ((8, 1), P("fsdp", None), 8, 1),
    ],
)
def test_replicated_boxes_are_drawn_once_with_every_holder(mesh, spec, boxes, replicas):
    x = _put((64, 4), _mesh(mesh), spec)
    layout = shards.shard_layout(x)
    assert len(layout.shards) == 8  # one per device, as JAX keeps them
    assert len(layout.boxes()) == boxes
    assert layout.replicas == replicas == layout.physical_bytes // layout.logical_bytes
    fig = sf.shard_layouts([layout])
    drawn = _drawn_boxes(fig)
    assert len(drawn) == boxes
    # The union covers the matrix exactly once per replica.
    assert (_coverage((64, 4), drawn) == replicas).all()
    chips = [p for p in fig.findobj(Rectangle) if (p.get_gid() or "").startswith("chip:")]
    assert len(chips) == (8 if replicas > 1 else 0)


def test_shard_layout_refuses_what_is_not_an_array_and_draws_a_stack_split_along_its_last_two_dimensions():
    with pytest.raises(TypeError, match="jax.Array"):
        shards.shard_layout(np.ones((2, 2)))
    cube = shards.shard_layout(_put((2, 4, 8), _mesh((2, 4)), P("fsdp", "tp")))
    with pytest.raises(ValueError, match="splits a leading one"):
        sf.shard_layouts([cube])
    # A layer stack (its leading axis never split) is drawn as one layer's matrix, cut alike.
    for layers, spec in ((2, P(None, "fsdp", "tp")), (3, P(None, "tp", None)), (1, P(None, None, "fsdp"))):
        stack = shards.shard_layout(_put((layers, 4, 8), _mesh((2, 4)), spec))
        flat = shards.shard_layout(_put((4, 8), _mesh((2, 4)), P(*spec[1:])))
        fig = sf.shard_layouts([stack])
        boxes = [p for p in fig.findobj(Rectangle) if (p.get_gid() or "").startswith("shard:")]
        assert len(boxes) == len(flat.boxes())


# --------------------------------------------------------------------------- a sync's pieces


def _synced(arrays: dict[str, jax.Array], dst_mesh: Mesh, strategy: str) -> dict:
    """Reshard each array onto the same spec over ``dst_mesh`` as a sync does, and report it (L3)."""
    facts = {path: shard_facts(x) for path, x in arrays.items()}
    dsts = [NamedSharding(dst_mesh, x.sharding.spec) for x in arrays.values()]
    log = TransferLog()
    with listening(log):
        out = reshard_many(list(arrays.values()), dsts, labels=list(arrays), strategy=strategy)
    jax.block_until_ready(out)
    rep = sync_report(
        sync_ledger(facts, dict(zip(arrays, out)), log),
        log,
        lora=False,
        seconds=0.0,
        new_anchor_shards=[],
        anchor_mode="full",
        anchor_seconds=0.0,
        global_step=1,
    )
    for x, y in zip(arrays.values(), out):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    return rep.to_json()


def _gid_bytes(fig, prefix: str) -> dict[str, int]:
    """Bytes per kind (moved/copied/reused) of the artists whose gid starts with ``prefix``."""
    out: dict[str, int] = {}
    for artist in fig.findobj(lambda a: (a.get_gid() or "").startswith(prefix + ":")):
        parts = artist.get_gid().split(":")
        out[parts[1]] = out.get(parts[1], 0) + int(parts[-1])
    return out


@pytest.fixture(scope="module")
def synced() -> dict[str, dict]:
    """One sync of four leaves from the actor's (2, 4) mesh to the rollout's (8, 1), per strategy."""
    actor = _mesh((2, 4))
    arrays = {
        "o/lora_a": _put((64, 4), actor, P("tp", None)),  # moves on the rollout's mesh
        "q/lora_a": _put((64, 4), actor, P("fsdp", None)),  # copied within each device
        "norm/scale": _put((64,), actor, P(None)),  # replicated on both meshes: reused
        "q/kernel": _put((64, 64), actor, P("fsdp", "tp")),
    }
    return {strategy: _synced(arrays, _mesh((8, 1)), strategy) for strategy in ("minimal", "xla")}


@pytest.mark.parametrize("strategy", ["minimal", "xla"])
def test_the_drawn_pieces_add_up_to_the_sync_reports_totals(synced, strategy):
    rep = synced[strategy]
    flows = shards.sync_flows(rep)
    assert sum(flows.moved.values()) == flows.moved_bytes == rep["moved_cross_device_bytes"]
    assert sum(flows.copied.values()) == flows.copied_bytes == rep["copied_same_device_bytes"]
    assert sum(flows.reused.values()) == flows.reused_bytes == rep["reused_bytes"]
    assert flows.synced_bytes == rep["synced_bytes"]
    assert flows.synced_bytes == flows.moved_bytes - flows.relayed_bytes + flows.copied_bytes + flows.reused_bytes
    assert all(s != d for s, d in flows.moved)  # a move crosses devices
    # Per destination device: what arrived, was copied or reused is its shards' bytes
    # (every leaf here has equal shards on the 8 devices of the (8, 1) mesh).
    assert flows.relayed_bytes == 0
    for d in range(8):
        assert flows.arrived(d) + flows.copied.get(d, 0) + flows.reused.get(d, 0) == flows.synced_bytes // 8
    # The figures draw exactly these bytes.
    fig = sf.sync_summary(flows)
    grid, bars = _gid_bytes(fig, "flow"), _gid_bytes(fig, "bar")
    for how, total in (("moved", flows.moved_bytes), ("copied", flows.copied_bytes), ("reused", flows.reused_bytes)):
        assert grid.get(how, 0) == total
        assert bars.get(how, 0) == total


@pytest.mark.parametrize("strategy", ["minimal", "xla"])
def test_each_leaf_moves_copies_or_reuses_as_its_shards_say(synced, strategy):
    """On (2, 4) -> (8, 1): o's lora_a lacks 3/4 of its rollout shard, q's lies inside its own
    actor shard, and a replicated vector is the same buffer (the reasons notebook 05 gives)."""
    rep = synced[strategy]
    o, q, norm = (shards.sync_flows(rep, [p]) for p in ("o/lora_a", "q/lora_a", "norm/scale"))
    assert o.moved_bytes == o.minimum_bytes == 3 * 8 * 64 * 4  # 3 of 4 quarters, on each of 8 devices
    assert o.copied_bytes == 8 * 64 * 4
    assert q.moved_bytes == q.reused_bytes == 0 and q.copied_bytes == 64 * 4 * 4
    assert norm.reused_bytes == norm.synced_bytes == 8 * 64 * 4
    assert norm.moved_bytes == norm.copied_bytes == 0
    # Each device lacks three quarters and gets each from one other holder of that quarter.
    for d in range(8):
        senders = [s for (s, t) in o.moved if t == d]
        assert len(senders) == 3 and d not in senders
        assert len({s % 4 for s in senders} | {d % 4}) == 4
    src = shards.shard_layout(_put((64, 4), _mesh((2, 4)), P("tp", None)), "actor")
    dst = shards.shard_layout(_put((64, 4), _mesh((8, 1)), P("tp", None)), "rollout")
    assert (src.replicas, dst.replicas) == (2, 8)
    fig = sf.sync_leaf(o, src, dst)
    assert _gid_bytes(fig, "flow").get("moved") == o.moved_bytes


def test_the_arrived_share_is_each_sharded_groups_share_times_their_part_of_the_bytes(synced):
    """The reshaped layout's 73 %: every leaf whose boxes change moves 3/4, the others none."""
    rep = synced["minimal"]
    kernel, lora, norm = 64 * 64 * 4, 64 * 4 * 4, 8 * 64 * 4
    total = kernel + 8 * lora + lora + norm  # o's lora_a is whole on all 8 rollout devices
    moving = kernel + 8 * lora
    assert rep["synced_bytes"] == total
    assert rep["moved_cross_device_bytes"] == rep["arrived_cross_device_bytes"] == 3 * moving // 4
    text = shards.share_lines(rep)
    assert f"= {3 * moving // 4:,} / {total:,} = {3 * moving / 4 / total:.1%}" in text
    assert f"= 75.0% (what each group that receives from other devices gets so) x {moving:,} / {total:,}" in text
    rows = {r["partition spec"]: r for r in shards.spec_rows(rep)}
    assert rows["P('fsdp', 'tp')"]["arrived %"] == rows["P('tp', None)"]["arrived %"] == "75.0"
    assert rows["P(None)"]["reused"] == norm and rows["P('fsdp', None)"]["copied"] == lora


def test_sync_flows_names_what_is_missing():
    rep = {"leaves": [{"path": "a", "synced_bytes": 0}], "reshard_strategy": "xla", "method": "m"}
    with pytest.raises(KeyError, match="did not carry"):
        shards.sync_flows(rep, ["b"])
    with pytest.raises(ValueError, match="no per-device pieces"):
        shards.sync_flows(rep)


# --------------------------------------------------------------------------- legibility


def _figures(rep: dict) -> list:
    flows = shards.sync_flows(rep, ["o/lora_a"])
    src = shards.shard_layout(_put((64, 4), _mesh((2, 4)), P("tp", None)), "actor")
    dst = shards.shard_layout(_put((64, 4), _mesh((8, 1)), P("tp", None)), "rollout")
    kernel = shards.shard_layout(_put((64, 64), _mesh((2, 4)), P("fsdp", "tp")), "actor")
    whole = shards.sync_flows(rep)
    return [sf.shard_layouts([kernel, src, dst]), sf.sync_leaf(flows, src, dst), sf.sync_summary(whole)]


def test_figures_fit_a_notebook_with_text_of_at_least_9_points_and_legends_over_nothing(synced):
    for fig in _figures(synced["xla"]):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()  # lays the figure out
        assert fig.get_figwidth() <= sf.MAX_WIDTH
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
        small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_fontsize() < sf.MIN_FONT]
        assert not small, small
        renderer = canvas.get_renderer()
        legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        for legend in legends:
            box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                # Neither the plot area, nor its tick labels and axis labels, nor its title.
                taken = [ax.get_window_extent(renderer), ax.xaxis.get_tightbbox(renderer)]
                taken += [ax.yaxis.get_tightbbox(renderer), ax.title.get_window_extent(renderer)]
                for other in taken:
                    assert other is None or not box.overlaps(other), (legend, ax.get_title())


def test_short_bytes_fits_five_characters():
    assert [sf.short_bytes(n) for n in (0, 384, 1024, 13_440, 108_800, 3 * 1024**2)] == [
        "0",
        "384",
        "1.0K",
        "13.1K",
        "106K",
        "3.0M",
    ]
    assert all(len(sf.short_bytes(n)) <= 5 for n in (1023, 102_399, 1024**2 - 1))
    assert re.fullmatch(r"#[0-9a-f]{6}", sf.device_color(11))
