"""The lab's standard layouts (the meshes P1 compares) and mesh helpers."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from rlcluster_lab.core.meshes import (
    LAYOUTS,
    MESH_AXES,
    default_shape,
    describe_mesh,
    describe_meshes,
    layout_meshes,
    make_mesh,
    mesh_from_ids,
    reachable_layouts,
)
from rlcluster_lab.core.roles import Role
from rlcluster_lab.rules.sharing import p1_link_actor_rollout

DEVICES = jax.devices()


def _ids(mesh):
    return [d.id for d in np.asarray(mesh.devices).flatten()]


def test_eight_simulated_devices():
    assert len(DEVICES) == 8


def test_colocated_every_role_on_one_mesh():
    meshes = layout_meshes("colocated")
    assert set(meshes) == set(Role)
    first = meshes[Role.ACTOR]
    assert all(m is first for m in meshes.values())


def test_colocated_mesh_is_2x4_over_all_devices():
    mesh = layout_meshes("colocated")[Role.ACTOR]
    assert dict(mesh.shape) == {"fsdp": 2, "tp": 4}
    assert tuple(mesh.axis_names) == MESH_AXES
    assert _ids(mesh) == list(range(8))


def test_p1_reshaped_rollout_is_8x1_over_same_devices():
    meshes = layout_meshes("reshaped")
    rollout, actor = meshes[Role.ROLLOUT], meshes[Role.ACTOR]
    assert dict(rollout.shape) == {"fsdp": 8, "tp": 1}
    assert sorted(_ids(rollout)) == sorted(_ids(actor)) == list(range(8))
    assert rollout != actor


def test_reshaped_other_roles_share_actor_mesh():
    meshes = layout_meshes("reshaped")
    for role in (Role.REFERENCE, Role.REWARD, Role.CRITIC):
        assert meshes[role] is meshes[Role.ACTOR]
    assert dict(meshes[Role.ACTOR].shape) == {"fsdp": 2, "tp": 4}


def test_split_actor_first_half_rollout_second_half():
    meshes = layout_meshes("split")
    actor, rollout = meshes[Role.ACTOR], meshes[Role.ROLLOUT]
    assert _ids(actor) == [0, 1, 2, 3]
    assert _ids(rollout) == [4, 5, 6, 7]
    assert not set(_ids(actor)) & set(_ids(rollout))
    assert dict(actor.shape) == dict(rollout.shape) == {"fsdp": 2, "tp": 2}


def test_split_other_roles_on_actor_mesh():
    meshes = layout_meshes("split")
    for role in (Role.REFERENCE, Role.REWARD, Role.CRITIC):
        assert meshes[role] is meshes[Role.ACTOR]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_mesh_has_explicit_auto_axis_types(layout):
    for mesh in layout_meshes(layout).values():
        assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)


def test_make_mesh_axis_types_auto_for_any_rank():
    mesh = make_mesh(DEVICES, (2, 2, 2), ("a", "b", "c"))
    assert mesh.axis_types == (AxisType.Auto,) * 3


def test_make_mesh_keeps_device_order():
    order = [DEVICES[i] for i in (7, 6, 5, 4, 3, 2, 1, 0)]
    assert _ids(make_mesh(order, (2, 4))) == [7, 6, 5, 4, 3, 2, 1, 0]


def test_make_mesh_wrong_device_count_names_shape():
    with pytest.raises(ValueError, match=r"holds 6 devices but 8 were given"):
        make_mesh(DEVICES, (2, 3))


def test_make_mesh_rejects_repeated_device():
    with pytest.raises(ValueError, match="same device twice"):
        make_mesh([DEVICES[0], DEVICES[0]], (1, 2))


def test_make_mesh_rejects_mismatched_axis_names():
    with pytest.raises(ValueError, match="differ in length"):
        make_mesh(DEVICES, (2, 4), ("fsdp",))


def test_mesh_from_ids_builds_default_shape():
    mesh = mesh_from_ids([4, 5, 6, 7])
    assert _ids(mesh) == [4, 5, 6, 7]
    assert dict(mesh.shape) == {"fsdp": 2, "tp": 2}


def test_mesh_from_ids_is_same_object_as_make_mesh():
    assert mesh_from_ids(range(8)) is make_mesh(DEVICES, (2, 4))


def test_mesh_from_ids_nonexistent_id_names_existing_ids():
    with pytest.raises(ValueError) as err:
        mesh_from_ids([0, 1, 42, 3])
    msg = str(err.value)
    assert "[42]" in msg
    assert str(list(range(8))) in msg


def test_mesh_from_ids_empty_raises():
    with pytest.raises(ValueError, match="at least one device"):
        mesh_from_ids([])


@pytest.mark.parametrize("count,shape", [(8, (2, 4)), (4, (2, 2)), (2, (1, 2)), (1, (1, 1)), (6, (3, 2))])
def test_default_shape(count, shape):
    assert default_shape(count) == shape


def test_reachable_layouts_one_device_are_colocated_and_reshaped():
    assert reachable_layouts(DEVICES[:1]) == ["colocated", "reshaped"]
    assert reachable_layouts(DEVICES[:3]) == ["colocated"]  # (3, 1) has no second arrangement


def test_reachable_layouts_eight_devices_all_three():
    assert reachable_layouts(DEVICES) == ["colocated", "reshaped", "split"]


def test_reachable_layouts_defaults_to_all_devices():
    assert reachable_layouts() == ["colocated", "reshaped", "split"]


@pytest.mark.parametrize("device", range(8))
def test_reshaped_on_one_device_is_the_same_device_as_another_mesh(device):
    """Same chip, another mesh: on one device the rollout's (1, 1) mesh names the axes the other way
    round, so P1 sees two meshes over the same device and every partition spec still finds its axis."""
    meshes = layout_meshes("reshaped", DEVICES[device : device + 1])
    main, rollout = meshes[Role.ACTOR], meshes[Role.ROLLOUT]
    assert main != rollout and list(rollout.devices.flat) == list(main.devices.flat) == [DEVICES[device]]
    assert tuple(main.axis_names) == MESH_AXES and tuple(rollout.axis_names) == MESH_AXES[::-1]
    assert all(meshes[r] is main for r in Role if r is not Role.ROLLOUT)
    assert not p1_link_actor_rollout(main, rollout).values.equal


def test_reshaped_with_three_devices_error_names_fix():
    with pytest.raises(ValueError) as err:
        layout_meshes("reshaped", DEVICES[:3])
    msg = str(err.value)
    assert "'colocated'" in msg and "more devices" in msg and "one device" in msg


def test_split_with_one_device_error_names_fix():
    with pytest.raises(ValueError) as err:
        layout_meshes("split", DEVICES[:1])
    msg = str(err.value)
    assert "'colocated'" in msg and "more devices" in msg


def test_split_with_odd_device_count_raises():
    with pytest.raises(ValueError, match="even number"):
        layout_meshes("split", DEVICES[:3])


def test_unknown_layout_lists_choices():
    with pytest.raises(ValueError, match="colocated, reshaped, split"):
        layout_meshes("sideways")


def test_describe_mesh_output():
    mesh = make_mesh([DEVICES[i] for i in (4, 5, 6, 7)], (2, 2))
    assert describe_mesh(mesh) == {
        "axis_names": ["fsdp", "tp"],
        "shape": {"fsdp": 2, "tp": 2},
        "device_ids": [4, 5, 6, 7],
    }


def test_describe_mesh_of_none_is_empty():
    assert describe_mesh(None) == {"axis_names": [], "shape": {}, "device_ids": []}


def test_describe_meshes_keys_are_role_names():
    out = describe_meshes(layout_meshes("reshaped"))
    assert set(out) == {"actor", "rollout", "reference", "reward", "critic"}
    assert out["rollout"]["shape"] == {"fsdp": 8, "tp": 1}
    assert out["actor"]["shape"] == {"fsdp": 2, "tp": 4}
