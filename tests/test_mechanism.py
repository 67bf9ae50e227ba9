"""The mechanism notebooks 01-04 show: the sharing decisions without a model are the ones a
built cluster takes, and P3's branches leave the rollout with the actor's buffers or none of
them."""

from __future__ import annotations

import jax
import pytest

import rlcluster_lab as rl
from rlcluster_lab.lab.experiments.mechanism import p3_branch_rows, sharing_decisions

pytestmark = pytest.mark.cluster  # compared with a built cluster


def test_sharing_decisions_are_the_ones_a_cluster_takes():
    built = rl.build_cluster(rl.Scenario(layout="colocated", lora=True))
    taken = [d.to_json() for d in built.trace if d.rule in ("P1", "P2")]
    assert [d.to_json() for d in sharing_decisions(jax.devices(), "colocated", lora=True)] == taken
    assert [d["branch"] for d in taken] == ["linked", "linked", "propagated"]


def test_p3_branches_measured_on_the_buffers():
    rows, reports = p3_branch_rows(jax.devices(), [("colocated", "vanilla"), ("split", "vllm")])
    shared, own = rows
    assert shared["P3 branch"] == "shared" and shared["rollout model is the actor"]
    assert shared["of them the actor's"] == shared["rollout buffers"] > 0
    assert own["P3 branch"] == "engine_initial_value" and not own["rollout model is the actor"]
    assert own["rollout buffers"] > 0 and own["of them the actor's"] == 0 and own["bytes shared with actor"] == 0
    assert reports["split, vllm"]["rollout_branch"] == "engine_initial_value"
