"""One RL step measured phase by phase (lab.experiments.step_phases): the learner's own operations, in
order, with memory walked from the live buffers inside each operation (observe.at_work).
Its figure is tested on a stored step (test_step_figures.py)."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from flax import nnx

from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, TrainingConfig, build_cluster
from rlcluster_lab.cluster import observe
from rlcluster_lab.lab.experiments.step_phases import (
    EVEN_PROMPTS,
    OTHER_THREADS,
    PRECISION,
    compare_rows,
    measure_step,
    memory_rows,
    output_rows,
    precision_rows,
    returned_rows,
    run_steps,
    time_rows,
)
from rlcluster_lab.placement.buffers import state_bytes

pytestmark = pytest.mark.cluster  # every test here builds a cluster and runs a learner step

PHASES = ["generate", "rewards", "log-probs: actor (anchor)", "log-probs: reference", "update", "sync"]
MAX_TOKENS = 4


def _cluster(offload: bool):
    return build_cluster(
        Scenario(layout="colocated", offload=offload, max_tokens=MAX_TOKENS, kv_cache_size=16),
        training_config=TrainingConfig(),
    )


def _learner(cluster):
    return GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=2, group_size=2), prompts=EVEN_PROMPTS[:2])


@pytest.fixture(scope="module")
def offloaded():
    cluster = _cluster(offload=True)
    learner = _learner(cluster)
    return cluster, learner, measure_step(learner)


def test_phases_are_the_learner_steps_operations_in_order(offloaded):
    cluster, learner, step = offloaded
    assert [p.name for p in step.phases] == PHASES
    assert step.record is learner.history[0]  # the learner's own step, recorded by it
    assert dict(step.phase("sync").returned)["global_step"] == "1"  # the cluster's counter (P13)
    assert learner.cluster is cluster  # given back after the step
    assert not observe._OBSERVERS  # the observer is gone too
    assert step.phase("update").returned[0][1].startswith("list of 1 dict")


def test_generate_returns_shapes_of_the_batch(offloaded):
    _, _, step = offloaded
    returned = dict(step.phase("generate").returned)
    assert returned["tokens"] == f"(4, {MAX_TOKENS}) int32"
    assert returned["logprobs"] == f"(4, {MAX_TOKENS}) float32"
    assert dict(step.phase("log-probs: reference").returned)["value"] == f"(4, {MAX_TOKENS}) float32"
    assert dict(step.phase("sync").returned)["global_step"] == "1"


def test_offload_brings_each_role_to_device_only_inside_its_phase_P14(offloaded):
    cluster, _, step = offloaded
    actor_bytes = state_bytes(nnx.state(cluster.actor_model))
    for phase in step.phases:
        assert phase.on_device("after") == [], phase.name  # between phases: all in pinned host
    update = step.phase("update").bytes_by_entry("during")
    assert update["actor"] == {"device": actor_bytes}  # the live buffers, all on device
    assert update["optimizer"].get("device") and not update["optimizer"].get("pinned_host")
    assert update["reference"] == {"pinned_host": actor_bytes}
    assert step.phase("update").bytes_by_entry("after")["actor"] == {"pinned_host": actor_bytes}
    assert set(step.phase("generate").on_device()) == {"actor", "rollout"}  # one model, moved together
    assert step.phase("log-probs: reference").on_device() == ["reference"]
    # P10: the actor's log-probs read the anchor, brought to device for the work; the actor stays pinned.
    assert step.phase("log-probs: actor (anchor)").on_device() == ["anchor (device copy)"]
    assert step.phase("rewards").during is None and step.phase("sync").during is None


def test_without_offload_the_anchor_alone_waits_in_pinned_host():
    cluster = _cluster(offload=False)
    step = measure_step(_learner(cluster))
    for phase in step.phases:
        held = phase.bytes_by_entry("after")
        assert [e for e, kinds in held.items() if kinds.get("pinned_host")] == ["anchor"], phase.name
    assert "anchor (device copy)" in step.phase("log-probs: actor (anchor)").on_device()


def test_measurements_are_deterministic_apart_from_times(offloaded):
    _, _, first = offloaded
    again = measure_step(_learner(_cluster(offload=True)))

    def timeless(step):
        out = step.to_json()
        out.pop("seconds")
        for p in out["phases"]:
            timed = ("seconds", "trace_seconds", "compile_seconds", "programs", "cache_hits", "callback_seconds")
            for key in (*timed, "other_threads_seconds"):
                p.pop(key)
            for when in ("during", "after"):
                if p[when] is not None:
                    p[when].pop("allocator")
        return out

    assert timeless(again) == timeless(first)
    assert memory_rows(again) == memory_rows(first)
    assert returned_rows(again) == returned_rows(first)


def test_tables_name_every_phase_and_total_the_step(offloaded):
    _, _, step = offloaded
    rows = time_rows(step)
    assert [r["phase"] for r in rows] == PHASES + ["step 0 in all"]
    mem = memory_rows(step)
    assert mem[4] == {
        "phase": "update",
        "on device": "actor, rollout, optimizer",
        "device B": sum(int(k.get("device", 0)) for k in step.phase("update").during.by_device.values()),
        "pinned_host B": sum(int(k.get("pinned_host", 0)) for k in step.phase("update").during.by_device.values()),
    }
    assert mem[1]["phase"] == "rewards *"  # no work point: the walk after it


def test_the_tables_say_each_programs_precision_and_why(offloaded):
    """The programs P11 compares at the cluster's precision (highest), the update at the
    platform's default; host code (the toy reward) and the sync multiply no matrices."""
    _, _, step = offloaded
    ran = ["highest", "-", "highest", "highest", "platform default", "-"]
    assert [r[PRECISION] for r in time_rows(step)[:-1]] == ran
    assert [r[PRECISION] for r in compare_rows(step, step)] == ran
    why = {r["phase"]: (r["program"], r[PRECISION], r["why"]) for r in precision_rows(step)}
    assert list(why) == [name for name, p in zip(PHASES, ran) if p != "-"]
    assert why["update"][:2] == ("train step", "platform default") and "not the update's gradient" in why["update"][2]
    assert why["generate"][:2] == ("sampler", "highest") and all("P11" in w for _, _, w in why.values())


def test_bad_input_is_refused_with_the_fix(offloaded):
    cluster, _, _ = offloaded
    with pytest.raises(ValueError, match="steps must be at least 1"):
        run_steps(cluster, steps=0)
    with pytest.raises(TypeError, match="dataclass instance"):
        output_rows(np.zeros(3))
    with pytest.raises(RuntimeError, match="already has a work observer"):
        with observe.observing(cluster, lambda *_: None), observe.observing(cluster, lambda *_: None):
            pass


def test_a_second_step_of_one_shape_compiles_nothing(offloaded):
    _, learner, _ = offloaded
    again = measure_step(learner)
    assert [(p.name, p.programs) for p in again.phases] == [(name, 0) for name in PHASES]
    assert again.step == 1 and again.phase("sync").returned[-1] == ("global_step", "2")


@pytest.mark.parametrize("offload", [False, True])
def test_a_phases_parts_fit_its_time_and_other_threads_work_is_said_apart(offload):
    """A phase's trace and compile are its own thread's, parts of its time; what other threads
    traced and compiled meanwhile (a first step's builds ahead; here a reward function that
    compiles on a thread of its own) is a column of its own, not counted into the phase."""
    built = []

    def reward_fn(prompts, completions):
        """The toy reward, after a program traced and compiled on another thread."""
        worker = threading.Thread(target=lambda: built.append(jax.jit(lambda x: x * 3.0 + len(built))(np.ones(3))))
        worker.start()
        worker.join()
        return np.asarray([float(c.islower()) for c in completions], np.float32)

    cluster = _cluster(offload=offload)
    learner = GRPOLearner(
        cluster, LearnerConfig(steps=2, prompts_per_step=2, group_size=2), reward_fn=reward_fn, prompts=EVEN_PROMPTS
    )
    steps = [measure_step(learner) for _ in range(2)]
    for step in steps:
        rewards = step.phase("rewards")
        assert rewards.trace_seconds == rewards.compile_seconds == 0.0  # host code: nothing traced on its thread
        assert rewards.other_threads_seconds > 0.0  # the reward function's thread traced and compiled
        for p in step.phases:
            assert p.trace_seconds + p.compile_seconds <= p.seconds, p.name
        assert sum(p.trace_seconds + p.compile_seconds for p in step.phases) <= step.seconds
        for row in time_rows(step):
            assert float(row["trace ms"]) + float(row["compile ms"]) <= float(row["ms"]) + 0.1, row
            assert OTHER_THREADS in row
    for row in compare_rows(*steps):
        assert float(row["of which trace ms"]) + float(row["of which compile ms"]) <= float(row["step 0 ms"]) + 0.1
