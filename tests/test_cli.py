"""`python -m rlcluster_lab`: the JSON report, the text summary, and one-line errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from rlcluster_lab.cli.main import main

KEYS = {
    "sharing_map",
    "rollout_branch",
    "rollout_shares_actor_weights",
    "reference_shares_backbone",
    "role_to_mesh",
    "mesh_overridden_by_engine",
    "decisions",
    "anchor",
}


def run_json(capsys, *args: str) -> dict:
    assert main(["report", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.cluster
def test_report_json_has_the_documented_keys(capsys):
    data = run_json(capsys, "--layout", "colocated")
    assert KEYS <= set(data)
    assert data["sharing_map"]["actor"] == ["rollout"]
    assert data["rollout_branch"] == "shared"
    assert data["rollout_shares_actor_weights"] is True
    assert data["role_to_mesh"]["actor"] == {
        "axis_names": ["fsdp", "tp"],
        "shape": {"fsdp": 2, "tp": 4},
        "device_ids": list(range(8)),
    }
    assert all(set(d) == {"rule", "test", "values", "outcome", "branch"} for d in data["decisions"])
    assert data["anchor"]["memory_kind"] == "pinned_host"


@pytest.mark.cluster
def test_report_json_memory_and_sync_keys(capsys):
    data = run_json(capsys, "--layout", "split", "--lora")
    assert set(data["memory"]) >= {"by_role", "by_device", "shared", "unique_bytes", "naive_bytes", "allocator"}
    assert data["sync"] is None
    data = run_json(capsys, "--layout", "split", "--lora", "--sync", "--anchor", "trainable")
    sync = data["sync"]
    assert set(sync) >= {
        "synced_bytes",
        "moved_cross_device_bytes",
        "copied_same_device_bytes",
        "reused_bytes",
        "minimum_cross_device_bytes",
        "synced_logical_bytes",
        "anchor_bytes",
        "seconds",
        "leaves",
    }
    assert sync["moved_cross_device_bytes"] == sync["synced_bytes"] == sync["minimum_cross_device_bytes"] > 0
    # What the sync ran, and the floor it is timed against (report --sync asks for both).
    assert len(sync["plan"]) == 1 and sync["plan"][0].startswith("14 leaves from devices 0-3 to devices 4-7")
    assert sync["device_put_seconds"] > 0
    assert data["anchor"]["mode"] == "trainable"
    assert sync["anchor_bytes"] == data["anchor"]["bytes"]


@pytest.mark.cluster
def test_report_reshaped_same_chips_is_a_second_copy(capsys):
    data = run_json(capsys, "--layout", "reshaped")
    assert data["sharing_map"]["actor"] == []
    assert data["rollout_branch"] == "second_copy"
    assert data["rollout_shares_actor_weights"] is False
    assert data["role_to_mesh"]["rollout"]["device_ids"] == data["role_to_mesh"]["actor"]["device_ids"]


@pytest.mark.cluster
def test_report_lora_shares_the_reference_backbone(capsys):
    data = run_json(capsys, "--layout", "split", "--lora", "--engine", "vllm")
    assert data["sharing_map"]["reference"] == ["actor"]
    assert data["reference_shares_backbone"] is True
    assert data["rollout_branch"] == "engine_initial_value"
    assert data["mesh_overridden_by_engine"] is True


@pytest.mark.cluster
def test_p4_report_lora_separate_base_warns(capsys):
    data = run_json(capsys, "--lora", "--lora-separate-base")
    assert data["reference_shares_backbone"] is False
    assert any("avoidable copy" in w for w in data["warnings"])


@pytest.mark.cluster
def test_report_text_summary(capsys):
    assert main(["report", "--layout", "split", "--rollout-dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "rollout branch (P3): second_copy" in out
    assert "cast to bfloat16" in out
    assert main(["report", "--layout", "split", "--sync"]) == 0
    out = capsys.readouterr().out
    assert "  plan: 12 leaves from devices 0-3 to devices 4-7: 48 whole shards cross" in out
    assert re.search(r"one device_put of the same tree [\d.]+ ms: the handover took [\d.]+x", out)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--layout", "diagonal"], "invalid choice"),
        (["--lora-separate-base"], "--lora-separate-base needs --lora"),
        (["--lora", "--engine", "sglang_jax", "--no-static-lora"], "static-LoRA"),
        (["--model-size", "huge"], "invalid choice"),
        (["--devices", "4"], "restart"),  # the backend already runs with 8 devices here
    ],
)
def test_bad_flags_exit_nonzero_with_one_line(capsys, args, fragment):
    assert main_exit(["report", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert fragment in err


def main_exit(argv):
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.cluster
def test_devices_flag_sets_the_simulated_device_count():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, "-m", "rlcluster_lab", "report", "--devices", "4", "--layout", "split", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["device_count"] == 4
    assert data["role_to_mesh"]["rollout"]["device_ids"] == [2, 3]
    assert "Traceback" not in proc.stderr


@pytest.mark.cluster
def test_a_rollout_engine_whose_own_mesh_cannot_hold_the_model_is_refused_before_a_build():
    # 16 devices: the vllm stand-in's own mesh is (1, 16) (P7), and 16 does not divide the 264-token
    # vocabulary of any model size. Refused by the checks before a build, naming the engine first.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlcluster_lab",
            "report",
            "--devices",
            "16",
            "--layout",
            "reshaped",
            "--engine",
            "vllm",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr == (
        "error: the rollout model has a dimension of size 264 sharded over mesh axes ('tp',) of total size 16, "
        "which does not divide it; no other model size fits these meshes either. The flag to change: --engine "
        "(or --devices).\n"
    )


@pytest.mark.cluster
def test_p4_p14_offload_lora_warns_at_construction_then_rejoins(capsys):
    data = run_json(capsys, "--lora", "--offload")
    assert any("offload_to_cpu" in w for w in data["warnings"])
    # By the end of construction P14 has the reference on the actor's buffers again.
    assert data["reference_shares_backbone"] is True
    assert data["anchor"]["memory_kind"] == "pinned_host"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--micro-batch-size", "3", "--mini-batch-size", "8"], "--mini-batch-size = 8 must be a multiple of"),
        (["--micro-batch-size", "0", "--mini-batch-size", "8"], "--micro-batch-size must be a positive integer"),
        (
            ["--prompts-per-step", "3", "--group-size", "3", "--mini-batch-size", "2", "--micro-batch-size", "2"],
            "a learner step trains on 9 completions (3 prompts x 3 per group), not a multiple of --mini-batch-size = 2",
        ),
    ],
)
def test_learn_refuses_bad_micro_batch_sizes_before_the_backend_starts(capsys, args, fragment):
    assert main_exit(["learn", "--steps", "1", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err
    assert "_size" not in err and "None" not in err  # the command's flags, never a Python field or value


@pytest.mark.cluster
def test_learn_says_a_step_was_rejected_and_stops_a_diverged_run_naming_the_flag(capsys):
    """A learning rate of 1e9: the first step's second optimizer step has a NaN loss and keeps
    the previous parameters (said under the step's line); the weights the first one took still
    overflow the forward pass, so the next step stops before scoring anything, saying the run
    diverged and which flag to change (not a refusal of the batch those values would make)."""
    assert main_exit(["learn", "--steps", "3", "--learning-rate", "1e9"]) == 2
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()[1:]  # after the line saying what is rewarded
    assert lines[0].startswith("step   0") and "rejected: 1 of 2 optimizer steps kept the previous" in lines[1]
    assert len(err.strip().splitlines()) == 1
    assert "step 1: the rollout's log-probs are not finite" in err and "the run has diverged" in err
    assert "The flag to change: --learning-rate." in err and "TrainBatch" not in err


@pytest.mark.cluster
def test_learn_says_what_is_rewarded_and_what_a_rising_curve_means_before_the_curve(capsys):
    """The words come from the learner's reward function itself (``@rewards``), in text and JSON."""
    from rlcluster_lab.app.learner import lowercase_reward

    words = lowercase_reward.reward_words
    assert main_exit(["learn", "--steps", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"reward: {words.rewarded}; a rising mean reward means {words.rising}."
    assert "lowercase ASCII letters" in lines[0] and lines[1].startswith("step   0  mean reward")
    assert main_exit(["learn", "--steps", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reward"] == {"rewarded": words.rewarded, "rising": words.rising}
