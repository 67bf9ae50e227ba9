"""Every operation first enters its role's mesh (SPEC, "Operations"): checked from inside the
work each operation does, by asking JAX for its current mesh at that moment, on meshes that
all differ, so an operation that entered another role's mesh, or none, fails here."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

import rlcluster_lab as rl
from rlcluster_lab.cluster import operations
from rlcluster_lab.cluster.contexts import ContextLog, context_rows
from rlcluster_lab.core.roles import Role
from rlcluster_lab.model import scoring
from rlcluster_lab.training import critic as critic_training
from rlcluster_lab.training.batch import TrainBatch
from rlcluster_lab.training.critic import ValueBatch

pytestmark = pytest.mark.cluster  # every test here builds a cluster

PROMPTS = ["abc", "hello world", "x", "rl"]


def distinct_meshes() -> dict[Role, jax.sharding.Mesh]:
    """Five roles, five meshes: no two roles' meshes are ``==``."""
    d = jax.devices()
    return {
        Role.ACTOR: rl.make_mesh(d[:4], (2, 2)),
        Role.REFERENCE: rl.make_mesh(d[:4], (4, 1)),
        Role.ROLLOUT: rl.make_mesh(d[4:], (2, 2)),
        Role.REWARD: rl.make_mesh(d[4:], (4, 1)),
        Role.CRITIC: rl.make_mesh(d[4:], (1, 4)),
    }


@pytest.fixture(scope="module")
def cluster():
    meshes = distinct_meshes()
    assert len({id(m) for m in meshes.values()}) == 5 and all(
        a != b for i, a in enumerate(meshes.values()) for b in list(meshes.values())[i + 1 :]
    )
    scenario = rl.Scenario(layout="split", with_reward=True, with_critic=True, max_tokens=4)
    return rl.build_cluster(scenario, role_to_mesh=meshes)


class Reached(Exception):
    """Raised by a spy once it has seen the mesh: the work itself (and its compile) is skipped."""


@pytest.fixture()
def seen(cluster, monkeypatch):
    """(what was reached, JAX's current mesh at that moment), for the work inside each operation."""
    out: list[tuple[str, jax.sharding.Mesh]] = []

    def spy(label):
        def reached(*args, **kwargs):
            out.append((label, jax.sharding.get_mesh()))
            raise Reached(label)

        return reached

    engine = cluster.rollout
    monkeypatch.setattr(engine, "generate", spy("engine.generate"))
    monkeypatch.setattr(engine, "get_per_token_logps", spy("engine.logps"))
    monkeypatch.setattr(operations, "logps_from_state", spy("logps"))
    monkeypatch.setattr(operations, "train_step", spy("train_step"))
    monkeypatch.setattr(scoring, "scores_from_state", spy("scores"))
    monkeypatch.setattr(critic_training, "value_train_step", spy("value_step"))
    return out


def tokens() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    prompts = np.array([[1, 2, 3]] * 4, np.int32)
    completions = np.array([[4, 5], [6, 7], [8, 9], [10, 11]], np.int32)
    return prompts, completions, np.zeros((4, 2), np.float32)


# Each operation, the work the spy sees inside it, and the role whose mesh that must be in.
OPERATIONS = [
    ("generate", "engine.generate", Role.ROLLOUT, lambda c, p, t, z: c.generate(PROMPTS)),
    ("rollout log-probs", "engine.logps", Role.ROLLOUT, lambda c, p, t, z: c.get_old_per_token_logps(p, t)),
    ("reference log-probs", "logps", Role.REFERENCE, lambda c, p, t, z: c.get_ref_per_token_logps(p, t)),
    ("actor log-probs (anchor)", "logps", Role.ACTOR, lambda c, p, t, z: c.get_actor_per_token_logps(p, t)),
    ("live actor log-probs", "logps", Role.ACTOR, lambda c, p, t, z: c.get_live_actor_per_token_logps(p, t)),
    ("rewards", "scores", Role.REWARD, lambda c, p, t, z: c.get_rewards(p, t)),
    ("values", "scores", Role.CRITIC, lambda c, p, t, z: c.get_values(p, t)),
    (
        "update_actor",
        "train_step",
        Role.ACTOR,
        lambda c, p, t, z: c.update_actor(TrainBatch(p, t, np.array([1.0, -1.0, 0.5, -0.5], np.float32), z, z)),
    ),
    ("update_critic", "value_step", Role.CRITIC, lambda c, p, t, z: c.update_critic(ValueBatch(p, t, z, z))),
]


def test_every_operation_works_inside_its_roles_mesh(cluster, seen):
    p, t, z = tokens()
    start = len(cluster.contexts_entered)
    for operation, label, role, call in OPERATIONS:
        with pytest.raises(Reached, match=label):
            call(cluster, p, t, z)
        where, mesh = seen[-1]
        assert where == label
        assert mesh == cluster.role_to_mesh[role], f"{operation} ran on {dict(mesh.shape)}, not the {role.value} mesh"
    # The record says the same, entry by entry, read from JAX inside each context.
    entries = cluster.contexts_entered[start:]
    assert [(e.operation, e.role) for e in entries] == [(op, role.value) for op, _, role, _ in OPERATIONS]
    for e in entries:
        mesh = cluster.role_to_mesh[Role(e.role)]
        assert e.is_role_mesh
        assert e.device_ids == tuple(int(d.id) for d in mesh.devices.flat)
        assert dict(e.mesh_shape) == dict(mesh.shape)
    assert context_rows(entries)[0]["current mesh"] == "fsdp=2 x tp=2 on devices 4-7"


def test_construction_is_recorded_and_the_sync_enters_no_role_mesh(cluster):
    # Construction entered the rollout's context for the engine and the actor's for its optimizer.
    first = {(e.operation, e.role) for e in cluster.contexts_entered}
    assert {("construct: engine", "rollout"), ("construct: optimizer state", "actor")} <= first
    before = cluster.contexts_entered
    cluster.sync_weights()  # moves weights between two meshes, inside neither (P13, as the reference)
    assert cluster.contexts_entered == before


def test_the_record_is_bounded_and_read_only(cluster):
    entries = cluster.contexts_entered
    assert isinstance(entries, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        entries[0].role = "critic"
    log = ContextLog(capacity=2)
    mesh = cluster.role_to_mesh[Role.ACTOR]
    with jax.set_mesh(mesh):
        for name in ("a", "b", "c"):
            log.record(name, "actor", mesh)
    assert [e.operation for e in log.entries()] == ["b", "c"]
    outside = ContextLog().record("outside", "actor", mesh)  # no mesh entered: the record says so
    assert not outside.is_role_mesh and outside.mesh_shape == () and outside.mesh_text() == "(no mesh)"
    with pytest.raises(ValueError, match="at least one entry"):
        ContextLog(capacity=0)
