"""Device-to-device resharding (P5, P13): values, shardings, plans and buffer reuse."""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlcluster_lab import Scenario, build_cluster
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.core.meshes import make_mesh
from rlcluster_lab.core.roles import Role
from rlcluster_lab.placement.boxes import Relabel, device_put_keeps, plan_reshard, shard_boxes, to_box
from rlcluster_lab.placement.programs import clear_programs
from rlcluster_lab.placement.reshard import reshard_many
from rlcluster_lab.placement.transfers import shard_buffers, shard_data, shard_devices, shard_keys

DEVICES = jax.devices()
BY_ID = {d.id: d for d in DEVICES}

# Derandomized so runs repeat exactly. Plans alone cost nothing: 30 examples.
PROPERTY = settings(max_examples=30, deadline=None, derandomize=True)
# Every example reshards onto fresh shardings and compiles: the count is the hypothesis profile's
# (tests/conftest.py: 12 in `make test`, 40 with HYPOTHESIS_PROFILE=thorough).
COMPILING = settings(deadline=None, derandomize=True)

MESH_SHAPES = {
    1: [(1, 1)],
    2: [(2, 1), (1, 2)],
    4: [(4, 1), (1, 4), (2, 2)],
    8: [(8, 1), (1, 8), (2, 4)],
}
SPEC_ENTRIES = [None, "fsdp", "tp", ("fsdp", "tp")]


# --- strategies ----------------------------------------------------------------

# Larger device counts first: hypothesis leans towards the first choice.
COUNTS = [8, 4, 2, 1]


def array_plan(x, dst):
    """The block plan of resharding ``x`` onto ``dst``."""
    shape = tuple(x.shape)
    dst_boxes = [(d.id, to_box(idx, shape)) for d, idx in dst.addressable_devices_indices_map(shape).items()]
    return plan_reshard(shape, shard_boxes(x), dst_boxes)


@st.composite
def _device_sets(draw, relations):
    """(source ids, destination ids): the same set, overlapping, or disjoint."""
    relation = draw(st.sampled_from(relations))
    perm = draw(st.permutations(range(8)))
    if relation == "disjoint":
        n_src = draw(st.sampled_from([4, 2, 1]))
        n_dst = draw(st.sampled_from([n for n in (4, 2, 1) if n <= 8 - n_src]))
        return list(perm[:n_src]), list(perm[n_src : n_src + n_dst])
    n_src = draw(st.sampled_from(COUNTS))
    src = list(perm[:n_src])
    if relation == "same":
        return src, list(draw(st.permutations(src)))
    n_dst = draw(st.sampled_from(COUNTS))
    # Overlapping: start with one of the source devices, fill from the rest.
    first = draw(st.sampled_from(src))
    rest = [i for i in draw(st.permutations(range(8))) if i != first]
    return src, [first] + rest[: n_dst - 1]


@st.composite
def _sharding(draw, ids, rank):
    shape = draw(st.sampled_from(MESH_SHAPES[len(ids)]))
    mesh = make_mesh([BY_ID[i] for i in ids], shape)
    used = set()
    spec = []
    for _ in range(rank):
        options = [e for e in SPEC_ENTRIES if e is None or not (set(e if isinstance(e, tuple) else (e,)) & used)]
        entry = draw(st.sampled_from(options))
        if entry is not None:
            used.update(entry if isinstance(entry, tuple) else (entry,))
        spec.append(entry)
    return NamedSharding(mesh, P(*spec))


def reshard(x, dst, **kwargs):
    """One array resharded (``reshard_many`` of one)."""
    return reshard_many([x], [dst], **kwargs)[0]


@st.composite
def _cases(draw, relations=("same", "overlap", "disjoint")):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.sampled_from([16, 8, 32]), min_size=rank, max_size=rank)))
    src_ids, dst_ids = draw(_device_sets(list(relations)))
    src = draw(_sharding(src_ids, rank))
    dst = draw(_sharding(dst_ids, rank))
    return shape, src, dst


def _array(shape, sharding):
    host = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    return host, jax.device_put(host, sharding)


def _shard_boxes(x):
    return {s.device.id: to_box(s.index, x.shape) for s in x.addressable_shards}


def _pointers(x):
    return {s.device.id: s.data.unsafe_buffer_pointer() for s in x.addressable_shards}


def _intersect_size(a, b):
    n = 1
    for (a0, a1), (b0, b1) in zip(a, b):
        n *= max(0, min(a1, b1) - max(a0, b0))
    return n


def _size(box):
    return math.prod(b - a for a, b in box)


def _guarded():
    guard = jax.transfer_guard_device_to_host("disallow_explicit")
    guard2 = jax.transfer_guard_host_to_device("disallow_explicit")
    return guard, guard2


# --- properties ----------------------------------------------------------------


def _check_values(case, strategy):
    shape, src, dst = case
    host, x = _array(shape, src)
    y = reshard(x, dst, strategy=strategy)
    assert y.sharding == dst
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(y), host)


def _check_guarded(case, strategy):
    shape, src, dst = case
    host, x = _array(shape, src)
    d2h, h2d = _guarded()
    with d2h, h2d:
        y = reshard(x, dst, strategy=strategy)
        y.block_until_ready()
    assert y.sharding == dst
    np.testing.assert_array_equal(np.asarray(y), host)


@COMPILING
@given(_cases())
def test_p5_minimal_reshard_has_exact_destination_sharding_and_same_values(case):
    _check_values(case, "minimal")


@COMPILING
@given(_cases())
def test_p5_xla_reshard_has_exact_destination_sharding_and_same_values(case):
    _check_values(case, "xla")


@COMPILING
@given(_cases())
def test_p13_minimal_reshard_runs_under_weight_sync_transfer_guard(case):
    _check_guarded(case, "minimal")


@COMPILING
@given(_cases())
def test_p13_xla_reshard_runs_under_weight_sync_transfer_guard(case):
    _check_guarded(case, "xla")


@PROPERTY
@given(_cases(), st.sampled_from(["device", "pinned_host"]), st.sampled_from([np.float32, np.int8, jnp.bfloat16]))
def test_shard_buffers_are_the_addressable_shards_buffers_in_order(case, kind, dtype):
    """The measurements' cheap read of an array's shards (its own single-device arrays in its
    sharding's device order) gives the very buffers ``addressable_shards`` gives, in the same
    order, with their bytes; and the same while the array lives."""
    shape, sharding, _ = case
    x = jax.device_put(np.ones(shape, dtype), sharding.with_memory_kind(kind))
    shards = x.addressable_shards
    expected = tuple(((s.device.platform, s.device.id, s.data.unsafe_buffer_pointer()), s.data.nbytes) for s in shards)
    assert shard_buffers(x) == expected
    assert shard_buffers(x) is shard_buffers(x)  # read once while it lives
    assert shard_devices(x.sharding, x.shape) == tuple(s.device for s in shards)
    assert [(d, a.unsafe_buffer_pointer()) for d, a in shard_data(x)] == [
        (s.device, s.data.unsafe_buffer_pointer()) for s in shards
    ]
    assert shard_keys(x) == {key for key, _ in expected}


@PROPERTY
@given(_cases())
def test_plan_covers_every_destination_shard_exactly_once(case):
    shape, src, dst = case
    _, x = _array(shape, src)
    plans = array_plan(x, dst)
    dst_map = dst.addressable_devices_indices_map(shape)
    assert sorted(p.device for p in plans) == sorted(d.id for d in dst_map)
    src_boxes = _shard_boxes(x)
    for plan in plans:
        assert plan.box == to_box(dst_map[BY_ID[plan.device]], shape)
        assert sum(p.size() for p in plan.pieces) == _size(plan.box)
        for piece in plan.pieces:
            # Inside the destination box and inside a box its source device really holds.
            assert _intersect_size(piece.box, plan.box) == piece.size()
            assert src_boxes[piece.src_device] == piece.src_box
            assert _intersect_size(piece.box, piece.src_box) == piece.size()
        for a, b in itertools.combinations(plan.pieces, 2):
            assert _intersect_size(a.box, b.box) == 0


def _reused_devices(x, y):
    """Devices whose destination box equals the source box they hold, and whether the buffer is the same."""
    before, after = _pointers(x), _pointers(y)
    src_boxes = _shard_boxes(x)
    return {dev: after[dev] == before[dev] for dev, box in _shard_boxes(y).items() if src_boxes.get(dev) == box}


# Shared devices make equal boxes likely; disjoint sets cannot have any.
REUSE_CASES = _cases(relations=("same", "overlap"))


@COMPILING
@given(REUSE_CASES)
def test_p13_minimal_same_box_on_same_device_reuses_buffer(case):
    shape, src, dst = case
    _, x = _array(shape, src)
    same = _reused_devices(x, reshard(x, dst, strategy="minimal"))
    assert all(same.values()), f"devices copied shards they already held: {same}"


@COMPILING
@given(REUSE_CASES)
def test_p13_same_box_on_same_device_copy_true_gives_new_buffer(case):
    shape, src, dst = case
    _, x = _array(shape, src)
    for strategy in ("minimal", "xla"):
        same = _reused_devices(x, reshard(x, dst, copy=True, strategy=strategy))
        assert not any(same.values()), f"copy=True reused buffers ({strategy}): {same}"


def _same_buffers(x, y):
    """Per device of ``y``: is its shard the very buffer ``x`` holds on that device?"""
    before = _pointers(x)
    return {dev: before.get(dev) == ptr for dev, ptr in _pointers(y).items()}


def _boxes_in_mesh_order(sharding, shape):
    return [(d.id, to_box(ix, shape)) for d, ix in sharding.devices_indices_map(shape).items()]


def _device_put_goes_through_host(src, dst, shape):
    """device_put assembles the array through the host when a destination box is no source shard's."""
    have = {box for _, box in _boxes_in_mesh_order(src, shape)}
    return any(box not in have for _, box in _boxes_in_mesh_order(dst, shape))


@COMPILING
@given(_cases())
def test_p5_device_put_keeps_is_what_jax_device_put_keeps(case):
    """The lab's statement of device_put's reuse, checked against device_put itself (outside
    any guard). Where device_put goes through the host the rule says nothing is kept; on CPU
    the host path may alias a host view of a source buffer, a copy no accelerator makes."""
    shape, src, dst = case
    _, x = _array(shape, src)
    if src == dst or _device_put_goes_through_host(src, dst, shape):
        return
    kept = _same_buffers(x, jax.device_put(x, dst))
    rule = device_put_keeps(_boxes_in_mesh_order(src, shape), _boxes_in_mesh_order(dst, shape))
    assert [kept[d.id] for d in dst.mesh.devices.flat] == rule


@COMPILING
@given(_cases())
def test_p5_xla_reshard_keeps_exactly_what_device_put_keeps(case):
    """The default strategy reuses a source buffer exactly where jax.device_put would (so L2's
    shared buffers are the reference's); the minimal strategy, the lab's named better option,
    keeps every shard whose box its device already holds."""
    shape, src, dst = case
    _, x = _array(shape, src)
    if src == dst:
        return
    rule = device_put_keeps(_boxes_in_mesh_order(src, shape), _boxes_in_mesh_order(dst, shape))
    d2h, h2d = _guarded()
    with d2h, h2d:
        kept = _same_buffers(x, reshard(x, dst, strategy="xla"))
    assert [kept[d.id] for d in dst.mesh.devices.flat] == rule
    with d2h, h2d:
        kept = _same_buffers(x, reshard(x, dst, strategy="minimal"))
    held = dict(_boxes_in_mesh_order(src, shape))
    assert all(kept[d] == (held.get(d) == box) for d, box in _boxes_in_mesh_order(dst, shape))


@PROPERTY
@given(_cases(relations=("same",)))
def test_p5_a_relabel_hands_each_device_its_own_buffer_or_is_refused(case):
    """A relabel (worked out once, then applied without JAX's checks) onto a sharding that lays the
    array out as the source does: every shard is the very buffer its device held, with the right
    values; onto any other layout of the same devices it is refused, never misplaced."""
    shape, src, dst = case
    host, x = _array(shape, src)
    if _boxes_in_mesh_order(src, shape) and dict(_boxes_in_mesh_order(src, shape)) != dict(
        _boxes_in_mesh_order(dst, shape)
    ):
        with pytest.raises(ValueError, match="would misplace blocks"):
            Relabel(x, dst)
        return
    relabel = Relabel(x, dst)
    for _ in range(2):  # the first call and a later one, of a new array in the same sharding
        y = relabel(x)
        assert y.sharding == dst and y.shape == x.shape and y.dtype == x.dtype
        assert all(_same_buffers(x, y).values())
        assert all(s.data.devices() == {s.device} for s in y.addressable_shards)
        np.testing.assert_array_equal(np.asarray(y), host)
        x = jax.device_put(host, src)


@pytest.mark.parametrize("spec", [P(), P("fsdp")])
def test_p5_the_same_devices_in_another_order_keep_nothing_as_device_put(spec):
    """A replicated (or partly replicated) leaf onto the same chips in another order: jax.device_put
    makes every shard anew, and so does the default strategy; the minimal one keeps what each
    device holds."""
    _, x = _array((16, 32), NamedSharding(_mesh24(), spec))
    dst = NamedSharding(make_mesh(DEVICES[::-1], (2, 4)), spec)
    assert not any(_same_buffers(x, jax.device_put(x, dst)).values())
    assert not any(_same_buffers(x, reshard(x, dst, strategy="xla")).values())
    kept = _same_buffers(x, reshard(x, dst, strategy="minimal"))
    held = dict(_boxes_in_mesh_order(x.sharding, x.shape))
    assert kept == {d: held[d] == box for d, box in _boxes_in_mesh_order(dst, x.shape)}
    assert all(kept.values()) == (spec == P())


@PROPERTY
@given(_cases())
def test_l3_plan_moves_only_elements_missing_on_the_destination_device(case):
    shape, src, dst = case
    _, x = _array(shape, src)
    src_boxes = _shard_boxes(x)
    for plan in array_plan(x, dst):
        moved = sum(p.size() for p in plan.pieces if p.src_device != plan.device)
        own = src_boxes.get(plan.device)
        local = 0 if own is None else _intersect_size(own, plan.box)
        assert moved == _size(plan.box) - local


# --- plain tests ----------------------------------------------------------------


def _mesh24():
    return make_mesh(DEVICES, (2, 4))


def _mesh81():
    return make_mesh(DEVICES, (8, 1))


def test_p5_same_sharding_returns_same_object():
    _, x = _array((16, 32), NamedSharding(_mesh24(), P("fsdp", "tp")))
    assert reshard(x, x.sharding) is x


def test_p5_equal_sharding_built_again_returns_same_object():
    _, x = _array((16, 32), NamedSharding(_mesh24(), P("fsdp", "tp")))
    assert reshard(x, NamedSharding(_mesh24(), P("fsdp", "tp"))) is x


def test_p5_copy_true_same_sharding_gives_new_buffers():
    host, x = _array((16, 32), NamedSharding(_mesh24(), P("fsdp", "tp")))
    y = reshard(x, x.sharding, copy=True)
    assert y is not x
    assert y.sharding == x.sharding
    before, after = _pointers(x), _pointers(y)
    assert all(after[d] != before[d] for d in before)
    np.testing.assert_array_equal(np.asarray(y), host)


def test_p5_partial_reuse_keeps_held_shards_and_moves_the_rest():
    # Rows 0:8 live on devices 0-3 and rows 8:16 on 4-7; the destination puts
    # rows 0:8 on devices 0,1 (held already) and rows 8:16 on 2,3 (not held).
    _, x = _array((16, 32), NamedSharding(_mesh24(), P("fsdp", None)))
    dst = NamedSharding(make_mesh(DEVICES[:4], (2, 2)), P("fsdp", None))
    plans = {p.device: p for p in array_plan(x, dst)}
    assert plans[0].reuses_source_buffer and plans[1].reuses_source_buffer
    assert not plans[2].reuses_source_buffer and not plans[3].reuses_source_buffer
    assert plans[2].pieces[0].src_device == 4
    before = _pointers(x)
    y = reshard(x, dst, strategy="minimal")
    after = _pointers(y)
    assert after[0] == before[0] and after[1] == before[1]
    assert after[2] != before[2] and after[3] != before[3]


def test_p5_memory_kind_pinned_host_and_back_keeps_values():
    sharding = NamedSharding(_mesh24(), P("fsdp", "tp"))
    host, x = _array((16, 32), sharding)
    pinned = reshard(x, sharding.with_memory_kind("pinned_host"))
    assert pinned.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(pinned), host)
    back = reshard(pinned, sharding)
    assert back.sharding == sharding
    assert back.sharding.memory_kind == "device"
    np.testing.assert_array_equal(np.asarray(back), host)


def test_p5_pinned_host_source_onto_other_mesh_keeps_values():
    src = NamedSharding(_mesh24(), P("fsdp", "tp"), memory_kind="pinned_host")
    host, x = _array((16, 32), src)
    dst = NamedSharding(_mesh81(), P(None, "fsdp"), memory_kind="pinned_host")
    y = reshard(x, dst)
    assert y.sharding == dst
    np.testing.assert_array_equal(np.asarray(y), host)


def test_p5_reshard_inside_unrelated_mesh_context():
    host, x = _array((16, 32), NamedSharding(_mesh24(), P("fsdp", "tp")))
    dst = NamedSharding(_mesh81(), P(None, "fsdp"))
    unrelated = make_mesh(DEVICES[4:], (2, 2), ("data", "model"))
    with jax.set_mesh(unrelated):
        y = reshard(x, dst)
    assert y.sharding == dst
    np.testing.assert_array_equal(np.asarray(y), host)


def test_p13_single_device_array_onto_eight_device_mesh():
    host = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)
    x = jax.device_put(host, DEVICES[3])
    dst = NamedSharding(_mesh24(), P("fsdp", "tp"))
    d2h, h2d = _guarded()
    with d2h, h2d:
        y = reshard(x, dst)
    assert y.sharding == dst
    np.testing.assert_array_equal(np.asarray(y), host)
    plans = array_plan(x, dst)
    assert all(p.pieces[0].src_device == 3 and len(p.pieces) == 1 for p in plans)


def test_p5_reshard_many_maps_leaves():
    host_a, a = _array((16,), NamedSharding(_mesh24(), P("fsdp")))
    host_b, b = _array((8, 16), NamedSharding(_mesh24(), P(None, "tp")))
    shardings = [NamedSharding(_mesh81(), P()), NamedSharding(_mesh81(), P("fsdp", None))]
    out = reshard_many([a, b], shardings)
    assert out[0].sharding == shardings[0] and out[1].sharding == shardings[1]
    np.testing.assert_array_equal(np.asarray(out[0]), host_a)
    np.testing.assert_array_equal(np.asarray(out[1]), host_b)


def test_plan_prefers_destination_own_replica_then_lowest_id():
    full = ((0, 8), (0, 8))
    src = [(5, full), (2, full), (6, full)]
    plans = plan_reshard((8, 8), src, [(6, full), (1, full)])
    by_dev = {p.device: p for p in plans}
    assert by_dev[6].pieces[0].src_device == 6
    assert by_dev[6].reuses_source_buffer
    assert by_dev[1].pieces[0].src_device == 2
    assert not by_dev[1].reuses_source_buffer


def test_plan_rejects_sources_that_do_not_tile():
    src = [(0, ((0, 4), (0, 8)))]
    with pytest.raises(ValueError, match="does not tile"):
        plan_reshard((8, 8), src, [(1, ((0, 8), (0, 8)))])


def test_to_box_fills_trailing_dims():
    assert to_box((slice(2, 4),), (8, 16, 4)) == ((2, 4), (0, 16), (0, 4))
    assert to_box((slice(None), slice(8, 16)), (8, 16)) == ((0, 8), (8, 16))


# --- programs shared between construction and the sync -------------------------------------------


@st.composite
def _own_copy_layouts(draw):
    """Actor and rollout meshes the lab builds: a standard layout, or meshes of their own over
    any devices in any order; an engine holding its own copy; offload or not."""
    meshes = None
    layout = draw(st.sampled_from(["colocated", "reshaped", "split", "custom"]))
    if layout == "custom":
        order = draw(st.permutations(jax.devices()))
        shapes = st.sampled_from([(2, 2), (1, 4), (4, 1)])
        actor = make_mesh(order[:4], draw(shapes))
        rollout = draw(st.sampled_from([order[4:], order[2:6], order[:4][::-1]]))
        meshes = {Role.ACTOR: actor, Role.REFERENCE: actor, Role.ROLLOUT: make_mesh(rollout, draw(shapes))}
    engine = draw(st.sampled_from(["vllm", "sglang_jax"]))
    return ("split" if meshes else layout), meshes, engine, draw(st.booleans())


@pytest.mark.cluster
@settings(max_examples=max(3, settings.default.max_examples // 4))
@given(config=_own_copy_layouts())
def test_an_engines_own_copy_compiles_the_programs_its_syncs_run(config):
    """place_model reshards each kind of weight apart: a LoRA model's base weights take the
    program the same model without adapters took, its adapters the program every sync runs. So
    after a full model on the same meshes, a LoRA engine's construction builds at most one reshard
    program (the adapters'; none where its copy keeps the actor's layout) and its first sync builds
    none (a sync moves the adapters, P13)."""
    layout, meshes, engine, offload = config
    clear_programs()
    jax.clear_caches()

    def build(lora):
        scenario = Scenario(layout=layout, lora=lora, engine=engine, offload=offload, max_tokens=4)
        if engine == "sglang_jax" and lora:
            scenario = dataclasses.replace(scenario, sglang_static_lora=True)
        return build_cluster(scenario, role_to_mesh=meshes)

    full = build(False)
    full.sync_weights()
    del full

    def reshards(found):
        return [name for name, _, _ in found if name == "jit(identity)"]

    with count_compilations() as built:
        cluster = build(True)
    with count_compilations() as synced:
        report = cluster.sync_weights()
    assert len(reshards(built)) <= 1, [name for name, _, _ in built]
    assert reshards(synced) == [] and not report.includes_compilation, [name for name, _, _ in synced]


@pytest.mark.parametrize("seed", range(3))
def test_p13_copies_of_one_batch_over_devices_in_other_orders_are_new_buffers_in_place(seed):
    # An engine that owns its weights copies each leaf onto its own layout; one batch may hold
    # leaves whose meshes list the same devices in other orders (one program per order).
    rng = np.random.default_rng(seed)
    devices = jax.devices()
    meshes = [make_mesh([devices[i] for i in rng.permutation(8)], (2, 4)) for _ in range(3)]
    specs = [P(), P("fsdp"), P(None, "tp"), P("fsdp", "tp")]
    xs = [
        jax.device_put(jnp.arange(64.0).reshape(8, 8) + n, NamedSharding(meshes[n % 3], specs[rng.integers(4)]))
        for n in range(6)
    ]
    for strategy in ("xla", "minimal"):
        ys = reshard_many(xs, [x.sharding for x in xs], copy=True, strategy=strategy)
        for x, y in zip(xs, ys):
            assert y.sharding == x.sharding and np.array_equal(np.asarray(y), np.asarray(x))
            assert not set(_pointers(x).values()) & set(_pointers(y).values())


@st.composite
def _anchor_cases(draw):
    """Arrays on drawn shardings, some already in pinned host memory, and one of them held elsewhere (or none)."""
    n = draw(st.integers(1, 4))
    cases = [draw(_cases(("same",))) for _ in range(n)]
    pinned = [draw(st.booleans()) for _ in range(n)]
    held = draw(st.sampled_from([None, *range(n)]))
    return [(shape, src) for shape, src, _ in cases], pinned, held


@COMPILING
@given(_anchor_cases())
def test_p8_the_anchor_is_written_over_the_old_buffers_it_alone_holds(case):
    from flax import nnx

    from rlcluster_lab.placement.place import pin_anchor

    layouts, pinned, held = case
    kinds = ["pinned_host" if p else "device" for p in pinned]
    arrays = [_array(shape, s.with_memory_kind(kind))[1] for (shape, s), kind in zip(layouts, kinds)]
    source = nnx.State({f"w{i}": nnx.Param(x) for i, x in enumerate(arrays)})
    old = pin_anchor(source, None)  # the first snapshot: every leaf not pinned already in a new buffer
    before = [_pointers(x) for x in jax.tree.leaves(old)]
    kept = None if held is None else jax.tree.leaves(old)[held]  # a caller holds this leaf
    moved = nnx.State({f"w{i}": nnx.Param(jax.device_put(np.asarray(x) + 1, x.sharding)) for i, x in enumerate(arrays)})
    new = pin_anchor(moved, old)
    for i, (x, y, was) in enumerate(zip(jax.tree.leaves(moved), jax.tree.leaves(new), before)):
        assert y.sharding == x.sharding.with_memory_kind("pinned_host")
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
        if pinned[i]:
            assert y is x  # already pinned: kept, nothing copied
        elif i == held:
            assert _pointers(y) != was and not kept.is_deleted()  # the held buffer stays as it was
        else:
            assert _pointers(y) == was  # written over the old buffer, which nothing else held
    if kept is not None:
        np.testing.assert_array_equal(np.asarray(kept), np.asarray(jax.tree.leaves(source)[held]))


def test_p8_an_anchor_whose_write_over_cannot_be_compiled_goes_to_new_buffers(monkeypatch):
    from flax import nnx

    from rlcluster_lab.placement import place

    sharding = NamedSharding(make_mesh([BY_ID[i] for i in range(4)], (2, 2)), P("fsdp", "tp"))
    source = nnx.State({"w": nnx.Param(_array((8, 8), sharding)[1])})
    old = place.pin_anchor(source, None)
    was = _pointers(jax.tree.leaves(old)[0])

    tried = []

    def refuse(*args, **kwargs):
        tried.append(1)
        raise NotImplementedError("this backend cannot compile a program over pinned host memory")

    clear_programs()
    monkeypatch.setattr(place, "compile_outside_mesh", refuse)
    for _ in range(2):
        new = place.pin_anchor(source, old)
        (y,) = jax.tree.leaves(new)
        assert _pointers(y) != was and not jax.tree.leaves(old)[0].is_deleted()
        assert y.sharding.memory_kind == "pinned_host"
        np.testing.assert_array_equal(np.asarray(y), np.asarray(jax.tree.leaves(source)[0]))
    assert len(tried) == 1  # the refusal is remembered, not met again at every sync
    clear_programs()


@pytest.mark.cluster
@pytest.mark.parametrize(("size", "seed"), [("tiny", 0), ("tiny", 1), ("small", 0)])
def test_programs_that_only_move_data_get_cheap_options_only_while_they_move_little(size, seed, monkeypatch):
    # Cheap code generation (core.compile_options) compiles a reshard 10x faster, and runs the
    # small model's 1.6x slower at every sync: a data-moving program gets it up to
    # MOVE_FAST_MAX_ELEMENTS elements, XLA's defaults above, whatever the model's own programs get.
    import rlcluster_lab.placement.place as place_module
    import rlcluster_lab.placement.xla as xla_module
    from rlcluster_lab.core import compile_options

    monkeypatch.delenv(compile_options.ENV, raising=False)
    cheap = compile_options.accepted_options("cpu", compile_options.FAST_CPU)
    rng = np.random.default_rng(seed)
    asked: list[tuple[str, int, object]] = []
    for module in (xla_module, place_module):
        real = module.compile_outside_mesh

        def spy(jitted, *args, _real=real, options=None):
            moved = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(args[-1]))
            asked.append((getattr(jitted, "__name__", str(jitted)), moved, options))
            return _real(jitted, *args, options=options)

        monkeypatch.setattr(module, "compile_outside_mesh", spy)
    clear_programs()
    lora = bool(rng.integers(0, 2)) if size == "tiny" else False
    cluster = build_cluster(Scenario(layout="reshaped", model_size=size, lora=lora))
    for _ in range(int(rng.integers(1, 3))):
        cluster.sync_weights()
    assert {name for name, _, _ in asked} >= {"identity", "write_anchor_over"}, asked
    for name, moved, options in asked:
        expected = cheap if moved <= compile_options.MOVE_FAST_MAX_ELEMENTS else None
        assert options == expected, (name, moved, options)
    # The tiny model's reshard is cheap to compile; the small model's, moving every weight, is not.
    identity = [(moved, options) for name, moved, options in asked if name == "identity"]
    assert all((options is None) == (size == "small") for _, options in identity), identity
    clear_programs()
