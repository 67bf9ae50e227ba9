"""Layout x LoRA x engine, pairwise: the report's decisions against the rules, and a working sync."""

from __future__ import annotations

import numpy as np
import pytest
from pairwise import pairwise

from rlcluster_lab import Scenario, build_cluster, placement_report

pytestmark = pytest.mark.cluster  # every case builds a cluster and syncs it

LAYOUTS = ["colocated", "reshaped", "split"]
ENGINES = ["vanilla", "vllm", "sglang_jax"]

# The expected engine-side rollout mesh (shape, device ids) per layout and engine.
CONFIG_ROLLOUT = {
    "colocated": ({"fsdp": 2, "tp": 4}, list(range(8))),
    "reshaped": ({"fsdp": 8, "tp": 1}, list(range(8))),
    "split": ({"fsdp": 2, "tp": 2}, [4, 5, 6, 7]),
}
VLLM_ROLLOUT = {
    "colocated": ({"fsdp": 1, "tp": 8}, list(range(8))),
    "reshaped": ({"fsdp": 1, "tp": 8}, list(range(8))),
    "split": ({"fsdp": 1, "tp": 4}, [4, 5, 6, 7]),
}


def expected(layout: str, lora: bool, engine: str) -> dict:
    linked = layout == "colocated"  # P1: only there are actor and rollout on one Mesh object
    ref_linked = lora  # P2: the reference always sits on the actor's mesh in these layouts
    actor_links = (["reference"] if ref_linked else []) + (["rollout"] if linked else [])
    sharing = {"actor": sorted(actor_links), "reward": [], "critic": []}
    sharing["rollout"] = sorted((["actor"] if linked else []) + (["reference"] if linked and ref_linked else []))
    sharing["reference"] = sorted((["actor"] if ref_linked else []) + (["rollout"] if linked and ref_linked else []))
    if linked:
        branch = "shared"
    elif engine == "vanilla":
        branch = "second_copy"
    else:
        branch = "engine_initial_value"
    shape, ids = (VLLM_ROLLOUT if engine == "vllm" else CONFIG_ROLLOUT)[layout]
    return {
        "sharing_map": sharing,
        "rollout_branch": branch,
        # Only the vanilla engine on the shared branch samples with the actor's own buffers.
        "rollout_shares_actor_weights": linked and engine == "vanilla",
        "reference_shares_backbone": lora,
        "mesh_overridden_by_engine": engine == "vllm",
        "rollout_shape": shape,
        "rollout_ids": ids,
    }


# Pairwise over layout x LoRA x engine: every expectation above turns on one factor or two
# (the branch and the rollout mesh on layout and engine, the sharing map on layout and LoRA).
MATRIX_CASES = pairwise(
    {"layout": LAYOUTS, "lora": [False, True], "engine": ENGINES},
    [
        ("colocated", False, "vanilla"),
        ("colocated", True, "vllm"),
        ("colocated", True, "sglang_jax"),
        ("reshaped", True, "vanilla"),
        ("reshaped", False, "vllm"),
        ("reshaped", False, "sglang_jax"),
        ("split", False, "vanilla"),
        ("split", True, "vllm"),
        ("split", True, "sglang_jax"),
    ],
)


@pytest.mark.parametrize(
    ("layout", "lora", "engine"), MATRIX_CASES, ids=lambda v: {False: "full", True: "lora"}.get(v, v)
)
def test_p1_to_p8_matrix(layout: str, lora: bool, engine: str) -> None:
    cluster = build_cluster(Scenario(layout=layout, lora=lora, engine=engine, max_tokens=4))
    report = placement_report(cluster)
    want = expected(layout, lora, engine)
    assert report.sharing_map == want["sharing_map"]
    assert report.rollout_branch == want["rollout_branch"]
    assert report.rollout_shares_actor_weights is want["rollout_shares_actor_weights"]
    assert report.reference_shares_backbone is want["reference_shares_backbone"]
    assert report.mesh_overridden_by_engine is want["mesh_overridden_by_engine"]
    assert report.role_to_mesh["rollout"]["shape"] == want["rollout_shape"]
    assert report.role_to_mesh["rollout"]["device_ids"] == want["rollout_ids"]
    assert report.config_role_to_mesh["rollout"]["shape"] == CONFIG_ROLLOUT[layout][0]
    assert report.anchor["memory_kind"] == "pinned_host" and report.anchor["bytes"] > 0
    assert {d["rule"] for d in report.decisions} >= {"P1", "P2", "P3", "P5", "P6", "P7", "P8"}

    # P13: the sync runs under the CPU transfer guard in every combination, and
    # afterwards the engine scores exactly like the actor.
    cluster.sync_weights()
    out = cluster.generate(["ab", "cde"])
    p, c = out.left_padded_prompt_tokens, out.tokens
    rollout = np.asarray(cluster.get_old_per_token_logps(p, c))
    actor = np.asarray(cluster.get_live_actor_per_token_logps(p, c))
    np.testing.assert_allclose(rollout, actor, atol=1e-5)
    np.testing.assert_allclose(rollout, out.logprobs, atol=1e-4)
    assert cluster.global_steps == 1
