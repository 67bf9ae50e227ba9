"""Write the reports the figure tests read: placement reports (tests/data/reports/*.json) and
one RL step measured phase by phase (tests/data/reports/step-offload.json).

The figures are pure functions of a report's JSON, so their tests read stored reports
instead of building clusters. Regenerate the files after a change to what a report holds:

    PYTHONPATH=src python tests/data/make_reports.py

Each scenario's cluster is built on eight simulated CPU devices and synced once, and its
placement report, sync included, is written with sorted keys, less each sync leaf's
``pieces`` (the per-device copies that ``lab.figures.shard_data`` reads; no figure here draws them, and
they are most of a report's size). Timings (``seconds``) are measured and so differ from run
to run; no test reads them. ``tests/test_report_fixtures.py``
(a slow test) checks that the byte counts and decisions still match what the code produces.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rlcluster_lab.core.devices import ensure_simulated_devices

OUT = Path(__file__).resolve().parent / "reports"

# name -> the Scenario's knobs: the cases the figure tests need (shared and copied rollouts, a
# LoRA reference on the actor's backbone and on a copy, an engine that replaces the mesh (P7),
# relayed sync bytes, offload to pinned host, a reward model, a LoRA reference whose copy P4
# warned of and P14 joined, the sglang_jax engine, a chunked sync), and the lab's words about
# them (tests/test_lab_words.py). ``rollout_mesh``: a custom rollout mesh, (device ids, shape),
# as the lab's custom layout builds it (the other roles keep the colocated mesh).
SCENARIOS: dict[str, dict[str, Any]] = {
    "colocated-lora": {"lora": True, "with_reward": True},
    "colocated-lora-offload": {"lora": True, "offload": True},
    "colocated-offload-chunked": {"offload": True, "with_critic": True, "sync_chunk_bytes": 16 << 10},
    "colocated-vllm": {"engine": "vllm"},
    "colocated-vllm-lora": {"lora": True, "engine": "vllm"},
    "custom-lora-chunked": {"lora": True, "rollout_mesh": ((4, 5, 6, 7), (2, 2)), "sync_chunk_bytes": 16 << 10},
    "reshaped-lora": {"layout": "reshaped", "lora": True},
    "reshaped-separate-base": {"layout": "reshaped", "lora": True, "lora_separate_base": True},
    "reshaped-sglang-lora": {"layout": "reshaped", "lora": True, "engine": "sglang_jax", "anchor": "trainable"},
    "reshaped-vllm": {"layout": "reshaped", "engine": "vllm"},
    "split": {"layout": "split"},
    "split-offload": {"layout": "split", "lora": True, "offload": True},
}


def make_report(name: str) -> dict[str, Any]:
    """The placement report, with one sync, of the scenario ``name`` (``SCENARIOS``), as JSON."""
    import jax

    from rlcluster_lab.app.report import placement_report
    from rlcluster_lab.app.scenario import Scenario, build_cluster
    from rlcluster_lab.core.meshes import layout_meshes, make_mesh
    from rlcluster_lab.core.roles import Role

    knobs = dict(SCENARIOS[name])
    role_to_mesh = None
    if "rollout_mesh" in knobs:
        ids, shape = knobs.pop("rollout_mesh")
        role_to_mesh = layout_meshes("colocated", jax.devices())
        role_to_mesh[Role.ROLLOUT] = make_mesh([jax.devices()[i] for i in ids], shape)
    cluster = build_cluster(Scenario(**knobs), role_to_mesh=role_to_mesh)
    report = placement_report(cluster, sync=cluster.sync_weights()).to_json()
    for leaf in report["sync"]["leaves"]:
        leaf.pop("pieces", None)
    return report


STEP = "step-offload"  # one GRPO step on the colocated layout with offload (P14), phase by phase


def make_step() -> dict[str, Any]:
    """One learner step of a colocated cluster with offload, measured phase by phase, as JSON."""
    from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig
    from rlcluster_lab.app.scenario import Scenario, build_cluster
    from rlcluster_lab.core.config import TrainingConfig
    from rlcluster_lab.lab.experiments.step_phases import EVEN_PROMPTS, measure_step

    cluster = build_cluster(
        Scenario(layout="colocated", offload=True, max_tokens=4, kv_cache_size=16), training_config=TrainingConfig()
    )
    learner = GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=2, group_size=2), prompts=EVEN_PROMPTS[:2])
    return measure_step(learner).to_json()


def main(names: list[str]) -> None:
    ensure_simulated_devices(8)
    OUT.mkdir(exist_ok=True)
    for name in names or [*SCENARIOS, STEP]:
        path = OUT / f"{name}.json"
        data = make_step() if name == STEP else make_report(name)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main(sys.argv[1:])
