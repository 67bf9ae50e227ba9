"""The backbone sharing map (P1, P2): which roles may hold one set of weights."""

import jax
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcluster_lab.core.meshes import describe_mesh, layout_meshes, make_mesh
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.rules.sharing import build_sharing_map, same_devices, shares, sharing_map_json

DEVICES = jax.devices()


def _mesh_24():
    return make_mesh(DEVICES, (2, 4))


def _mesh_81():
    return make_mesh(DEVICES, (8, 1))


def _all_on(mesh, **overrides):
    r2m = {role: mesh for role in Role}
    r2m.update({Role.parse(k): v for k, v in overrides.items()})
    return r2m


def _build(
    r2m, *, actor_is_module=True, actor_has_lora=False, has_reference=True, reference_is_module=True, trace=None
):
    return build_sharing_map(
        r2m,
        actor_is_module=actor_is_module,
        actor_has_lora=actor_has_lora,
        has_reference=has_reference,
        reference_is_module=reference_is_module,
        trace=trace,
    )


def _assert_symmetric(sharing_map):
    for a, others in sharing_map.items():
        for b in others:
            assert a in sharing_map[b], f"{a} -> {b} but not {b} -> {a}"


# --- JAX mesh identity, which P1 relies on ---------------------------------


def test_p1_make_mesh_same_devices_shape_names_is_same_object():
    assert make_mesh(DEVICES, (2, 4)) is make_mesh(DEVICES, (2, 4))


def test_p1_make_mesh_other_shape_is_different_mesh():
    a, b = _mesh_24(), _mesh_81()
    assert a is not b
    assert a != b
    assert describe_mesh(a)["device_ids"] == describe_mesh(b)["device_ids"]


def test_p1_make_mesh_other_axis_names_is_different_mesh():
    a = make_mesh(DEVICES, (2, 4))
    b = make_mesh(DEVICES, (2, 4), ("data", "model"))
    assert a != b


# --- P1 ---------------------------------------------------------------------


def test_p1_same_mesh_links_actor_and_rollout_both_ways():
    m = _build(_all_on(_mesh_24()))
    assert Role.ROLLOUT in m[Role.ACTOR]
    assert Role.ACTOR in m[Role.ROLLOUT]


def test_p1_colocated_layout_links_actor_and_rollout():
    m = _build(layout_meshes("colocated"))
    assert shares(m, Role.ACTOR, Role.ROLLOUT) and shares(m, Role.ROLLOUT, Role.ACTOR)


def test_p1_same_devices_reshaped_are_not_linked():
    m = _build(_all_on(_mesh_24(), rollout=_mesh_81()))
    assert Role.ROLLOUT not in m[Role.ACTOR]
    assert Role.ACTOR not in m[Role.ROLLOUT]


def test_p1_same_devices_other_axis_names_are_not_linked():
    other = make_mesh(DEVICES, (2, 4), ("data", "model"))
    m = _build(_all_on(_mesh_24(), rollout=other))
    assert not shares(m, Role.ACTOR, Role.ROLLOUT)


def test_p1_reshaped_layout_is_not_linked():
    m = _build(layout_meshes("reshaped"))
    assert not shares(m, Role.ACTOR, Role.ROLLOUT)


def test_p1_split_layout_is_not_linked():
    m = _build(layout_meshes("split"))
    assert m[Role.ROLLOUT] == ()


def test_p1_trace_records_meshes_and_same_devices_when_reshaped():
    trace = Trace()
    _build(_all_on(_mesh_24(), rollout=_mesh_81()), trace=trace)
    (p1,) = trace.by_rule("P1")
    assert p1.values.equal is False
    assert p1.values.same_devices is True
    assert p1.values.actor_mesh == describe_mesh(_mesh_24())
    assert p1.values.rollout_mesh == describe_mesh(_mesh_81())
    assert "not linked" in p1.outcome


def test_p1_trace_records_link_when_equal():
    trace = Trace()
    _build(_all_on(_mesh_24()), trace=trace)
    (p1,) = trace.by_rule("P1")
    assert p1.values.equal is True
    assert p1.outcome == "actor and rollout linked both ways"


def test_p1_trace_split_layout_records_different_devices():
    trace = Trace()
    _build(layout_meshes("split"), trace=trace)
    (p1,) = trace.by_rule("P1")
    assert p1.values.same_devices is False
    assert p1.values.equal is False


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True),
    st.permutations(range(8)),
    st.booleans(),
)
def test_p1_same_devices_is_the_set_of_devices_in_any_order_or_shape(ids, order, tall):
    # The actor on drawn devices as (1, n); the rollout on the same devices reordered, as (n, 1)
    # or (1, n), and on one device less: "same devices" reads the set, never the order or shape.
    devices = {d.id: d for d in jax.devices()[:8]}
    reordered = [i for i in order if i in ids]
    actor = make_mesh([devices[i] for i in ids], (1, len(ids)))
    rollout = make_mesh([devices[i] for i in reordered], (len(ids), 1) if tall else (1, len(ids)))
    trace = Trace()
    _build(_all_on(actor, rollout=rollout), trace=trace)
    (p1,) = trace.by_rule("P1")
    assert p1.values.same_devices is True
    assert same_devices(actor, rollout) and same_devices(describe_mesh(actor), describe_mesh(rollout))
    assert p1.values.equal == (actor == rollout)
    if len(ids) > 1:
        fewer = make_mesh([devices[i] for i in reordered[:-1]], (1, len(ids) - 1))
        assert not same_devices(actor, fewer)


# --- P2 ---------------------------------------------------------------------


def test_p2_lora_reference_same_mesh_links_actor_and_reference_both_ways():
    m = _build(_all_on(_mesh_24(), rollout=_mesh_81()), actor_has_lora=True)
    assert Role.REFERENCE in m[Role.ACTOR]
    assert Role.ACTOR in m[Role.REFERENCE]


def test_p2_without_lora_reference_is_not_linked():
    m = _build(_all_on(_mesh_24()), actor_has_lora=False)
    assert not shares(m, Role.ACTOR, Role.REFERENCE)
    assert not shares(m, Role.REFERENCE, Role.ACTOR)


def test_p2_without_reference_is_not_linked():
    m = _build(_all_on(_mesh_24()), actor_has_lora=True, has_reference=False)
    assert m[Role.REFERENCE] == ()
    assert Role.REFERENCE not in m[Role.ACTOR]


def test_p2_reference_on_other_mesh_is_not_linked():
    m = _build(_all_on(_mesh_24(), reference=_mesh_81()), actor_has_lora=True)
    assert m[Role.REFERENCE] == ()
    assert Role.REFERENCE not in m[Role.ACTOR]


def test_p2_reference_mesh_absent_from_map_is_not_linked():
    r2m = {Role.ACTOR: _mesh_24(), Role.ROLLOUT: _mesh_24()}
    m = _build(r2m, actor_has_lora=True, has_reference=True)
    assert not shares(m, Role.ACTOR, Role.REFERENCE)


def test_p2_propagation_links_rollout_and_reference():
    m = _build(_all_on(_mesh_24()), actor_has_lora=True)
    assert set(m[Role.ACTOR]) == {Role.ROLLOUT, Role.REFERENCE}
    assert Role.REFERENCE in m[Role.ROLLOUT]
    assert Role.ROLLOUT in m[Role.REFERENCE]


def test_p2_no_propagation_when_rollout_not_linked():
    m = _build(_all_on(_mesh_24(), rollout=_mesh_81()), actor_has_lora=True)
    assert m[Role.ROLLOUT] == ()
    assert m[Role.REFERENCE] == (Role.ACTOR,)


def test_p2_reward_and_critic_are_never_linked():
    m = _build(_all_on(_mesh_24()), actor_has_lora=True)
    assert m[Role.REWARD] == () and m[Role.CRITIC] == ()
    for others in m.values():
        assert Role.REWARD not in others and Role.CRITIC not in others


def test_p2_actor_given_as_path_skips_rule():
    trace = Trace()
    m = _build(_all_on(_mesh_24()), actor_is_module=False, actor_has_lora=True, trace=trace)
    assert not shares(m, Role.ACTOR, Role.REFERENCE)
    (p2,) = trace.by_rule("P2")
    assert "skipped" in p2.outcome
    assert p2.values.actor_is_module is False


def test_p2_reference_given_as_path_skips_rule():
    trace = Trace()
    m = _build(_all_on(_mesh_24()), reference_is_module=False, actor_has_lora=True, trace=trace)
    assert not shares(m, Role.ACTOR, Role.REFERENCE)
    (p2,) = trace.by_rule("P2")
    assert "skipped" in p2.outcome
    assert p2.values.reference_is_module is False


def test_p2_skip_keeps_p1_link():
    m = _build(_all_on(_mesh_24()), actor_is_module=False, actor_has_lora=True)
    assert shares(m, Role.ACTOR, Role.ROLLOUT) and shares(m, Role.ROLLOUT, Role.ACTOR)


def test_p2_trace_records_values_when_linked():
    trace = Trace()
    _build(_all_on(_mesh_24()), actor_has_lora=True, trace=trace)
    decisions = trace.by_rule("P2")
    assert trace[0].rule == "P1"
    link = decisions[0]
    assert link.values.actor_has_lora is True
    assert link.values.has_reference is True
    assert link.values.meshes_equal is True
    assert link.values.reference_mesh == describe_mesh(_mesh_24())
    assert link.outcome == "actor and reference linked both ways"
    propagate = decisions[1]
    assert propagate.outcome.startswith("added 2 link(s)")
    assert "rollout->reference" in propagate.outcome and "reference->rollout" in propagate.outcome


def test_p2_trace_records_values_when_not_linked():
    trace = Trace()
    _build(_all_on(_mesh_24(), reference=_mesh_81()), actor_has_lora=True, trace=trace)
    link = trace.by_rule("P2")[0]
    assert link.values.meshes_equal is False
    assert link.values.reference_mesh == describe_mesh(_mesh_81())
    assert link.outcome == "reference not linked"


def test_p2_trace_without_reference_has_no_reference_mesh():
    trace = Trace()
    _build(_all_on(_mesh_24()), actor_has_lora=True, has_reference=False, trace=trace)
    link = trace.by_rule("P2")[0]
    assert link.values.has_reference is False
    assert link.values.reference_mesh is None


def test_trace_is_json_ready():
    import json

    trace = Trace()
    _build(layout_meshes("reshaped"), actor_has_lora=True, trace=trace)
    text = json.dumps(trace.to_json())
    assert '"rule": "P1"' in text and '"rule": "P2"' in text


# --- JSON form --------------------------------------------------------------


def test_sharing_map_json_sorted_lower_case_every_role():
    m = _build(_all_on(_mesh_24()), actor_has_lora=True)
    out = sharing_map_json(m)
    assert set(out) == {"actor", "rollout", "reference", "reward", "critic"}
    assert out["actor"] == ["reference", "rollout"]
    assert out["rollout"] == ["actor", "reference"]
    assert out["reference"] == ["actor", "rollout"]
    assert out["reward"] == [] and out["critic"] == []


def test_sharing_map_json_fills_missing_roles():
    out = sharing_map_json({Role.ACTOR: (Role.ROLLOUT,)})
    assert out == {"actor": ["rollout"], "rollout": [], "reference": [], "reward": [], "critic": []}


# --- property ---------------------------------------------------------------

_POOL = None


def _pool():
    global _POOL
    if _POOL is None:
        d = DEVICES
        _POOL = [
            make_mesh(d, (2, 4)),
            make_mesh(d, (8, 1)),
            make_mesh(d, (2, 4), ("data", "model")),
            make_mesh(d[:4], (2, 2)),
            make_mesh(d[4:], (2, 2)),
        ]
    return _POOL


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    picks=st.lists(st.integers(0, 4), min_size=len(Role), max_size=len(Role)),
    actor_is_module=st.booleans(),
    actor_has_lora=st.booleans(),
    has_reference=st.booleans(),
    reference_is_module=st.booleans(),
)
def test_p1_p2_property_symmetric_irreflexive_actor_rollout_iff_equal(
    picks, actor_is_module, actor_has_lora, has_reference, reference_is_module
):
    pool = _pool()
    r2m = {role: pool[i] for role, i in zip(Role, picks)}
    m = _build(
        r2m,
        actor_is_module=actor_is_module,
        actor_has_lora=actor_has_lora,
        has_reference=has_reference,
        reference_is_module=reference_is_module,
    )
    assert set(m) == set(Role)
    _assert_symmetric(m)
    for role, others in m.items():
        assert role not in others
        assert len(set(others)) == len(others)
    same = r2m[Role.ACTOR] == r2m[Role.ROLLOUT]
    assert shares(m, Role.ACTOR, Role.ROLLOUT) == same
    p2_applies = (
        actor_is_module
        and actor_has_lora
        and has_reference
        and reference_is_module
        and r2m[Role.REFERENCE] == r2m[Role.ACTOR]
    )
    assert shares(m, Role.ACTOR, Role.REFERENCE) == p2_applies
    assert shares(m, Role.ROLLOUT, Role.REFERENCE) == (same and p2_applies)
