"""The lab's rehearsal (lab.widget.rehearsal) is the learner's own next step, taken on twins of the
learner and its cluster: the step that follows compiles nothing, whatever the configuration,
and the rehearsal touches nothing a call on the cluster reads: not the engine's seeds, the
weights, their memory kinds, the optimizer states, the anchor, the step count, the decision
trace or the record of contexts entered; it takes no lock of the cluster's and reaches no
observer of it."""

from __future__ import annotations

import collections
import copy
import gc
import threading

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlcluster_lab import GRPOLearner, LearnerConfig, Role, Scenario, TrainingConfig, build_cluster, make_mesh
from rlcluster_lab.cluster.observe import observing
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.engines import RolloutEngine
from rlcluster_lab.lab.widget.rehearsal import rehearse_next_step
from rlcluster_lab.placement.programs import clear_programs
from rlcluster_lab.rl_cluster import RLCluster
from rlcluster_lab.training.batch import TrainBatch

pytestmark = pytest.mark.cluster  # every test here builds a cluster and compiles a step

PROMPTS = ["abc", "hello world", "x", "rl"]
SIZES = {"steps": 1, "prompts_per_step": 2, "group_size": 2}


@pytest.fixture(scope="module")
def cluster():
    return build_cluster(Scenario(layout="split", max_tokens=4))


def _custom_meshes() -> dict:
    """Every role on a mesh of its own, the rollout's over the devices in reverse order."""
    d = jax.devices()
    return {
        Role.ACTOR: make_mesh(d[:4], (2, 2)),
        Role.REFERENCE: make_mesh(d[:4], (4, 1)),
        Role.ROLLOUT: make_mesh(d[::-1][:4], (1, 4)),
        Role.REWARD: make_mesh(d[4:], (4, 1)),
        Role.CRITIC: make_mesh(d[4:], (1, 4)),
    }


# id -> (scenario, training config, learner knobs, rewards from the reward model, custom meshes)
CASES = {
    "split": (Scenario(layout="split", max_tokens=4), None, {}, False, False),
    "lora-trainable-anchor": (
        Scenario(layout="colocated", lora=True, anchor="trainable", max_tokens=4),
        None,
        {},
        False,
        False,
    ),
    "offload": (Scenario(layout="colocated", offload=True, max_tokens=4), None, {}, False, False),
    "reward-critic-custom-meshes": (
        Scenario(layout="split", with_reward=True, with_critic=True, max_tokens=4),
        None,
        {"critic": True},
        True,
        True,
    ),
    "vllm-lora-chunked-sync-accumulated-minibatches": (
        Scenario(layout="reshaped", engine="vllm", lora=True, sync_chunk_bytes=4096, max_tokens=4),
        TrainingConfig(mini_batch_size=2, train_micro_batch_size=1, num_iterations=2),
        {},
        False,
        False,
    ),
}


def _held(cluster) -> tuple[list, tuple]:
    """What a call on the cluster reads: the arrays and states (compared by identity, so their
    memory kinds too), and the step count, the contexts entered, the trace's length and every
    live buffer of the process (what the lab's memory figures measure), garbage an earlier test
    left collected first so that only what is alive counts."""
    gc.collect()
    leaves = [x for m in cluster.models().values() for x in jax.tree.leaves(nnx.state(m))]
    states = [cluster.optimizer_state, cluster.critic_optimizer_state, cluster.pinned_anchor_state]
    buffers = {
        (s.device.id, s.data.unsafe_buffer_pointer())
        for x in jax.live_arrays()
        if not x.is_deleted()
        for s in x.addressable_shards
    }
    return leaves + states, (cluster.global_steps, cluster.contexts_entered, len(cluster.trace), buffers)


@pytest.mark.parametrize("case", list(CASES))
def test_after_a_rehearsal_the_learners_next_step_compiles_nothing_and_is_the_rehearsed_one(case):
    """The rehearsal cannot drift from the step: the step that follows finds every program it
    runs built, and gives the rehearsal's very record, so the rehearsal changed nothing it reads
    (the weights, the optimizer state, the anchor, the seed it samples with); what the rehearsal
    made is gone when it ends."""
    scenario, training, knobs, reward_model, custom = CASES[case]
    cluster = build_cluster(scenario, training_config=training, role_to_mesh=_custom_meshes() if custom else None)
    learner = GRPOLearner(cluster, LearnerConfig(**SIZES, **knobs), use_reward_model=reward_model)
    clear_programs()
    jax.clear_caches()  # nothing left from construction or an earlier case: the rehearsal builds it all
    held, rehearsed, observed = _held(cluster), [], []
    with observing(cluster, lambda role, working: observed.append(role)):
        # On a thread of its own, as in the lab.
        thread = threading.Thread(target=lambda: rehearsed.append(rehearse_next_step(learner)))
        thread.start()
        thread.join()
    assert len(rehearsed) == 1 and observed == []
    (objects, values), (objects_before, values_before) = _held(cluster), held
    assert all(a is b for a, b in zip(objects, objects_before, strict=True)) and values == values_before
    assert learner.history == [] and learner.p11 == []
    with count_compilations() as compiled:
        record = learner.step()
    assert compiled == [], f"the step compiled {[name for name, _, _ in compiled]}"
    assert record == rehearsed[0] and cluster.global_steps == 1


def test_a_rehearsal_takes_no_lock_and_generate_calls_meanwhile_draw_new_seeds(cluster, monkeypatch):
    """Before, the rehearsal saved the engine's call counter and put it back afterwards, so
    generate calls made meanwhile from another thread reused their seeds."""
    engine = cluster.rollout
    sample = engine.generate_with_seed
    seeds: list[int] = []
    inside, release = threading.Event(), threading.Event()

    def recording(prompts, rollout_config, seed):
        if threading.current_thread().name == "rehearsal":
            inside.set()  # the rehearsal is sampling: the user's calls happen now
            release.wait(timeout=120)
        else:
            seeds.append(seed)
        return sample(prompts, rollout_config, seed)

    monkeypatch.setattr(engine, "generate_with_seed", recording)
    learner = GRPOLearner(cluster, LearnerConfig(**SIZES))
    rehearsal = threading.Thread(target=rehearse_next_step, args=(learner,), name="rehearsal")
    rehearsal.start()
    assert inside.wait(timeout=120)
    try:
        assert cluster.state.lock.acquire(blocking=False)  # nobody holds the cluster's lock
        cluster.state.lock.release()
        texts = [cluster.generate(PROMPTS).text for _ in range(3)]
    finally:
        release.set()
        rehearsal.join()
    texts += [cluster.generate(PROMPTS).text for _ in range(3)]
    assert len(set(seeds)) == 6
    assert len({tuple(t) for t in texts}) == 6


def test_an_engine_whose_twin_keeps_its_model_is_refused_before_anything_runs(cluster, monkeypatch):
    monkeypatch.setattr(RolloutEngine, "twin", lambda self, clones: copy.copy(self))
    contexts = cluster.contexts_entered
    with pytest.raises(TypeError, match="override RolloutEngine.twin"):
        rehearse_next_step(GRPOLearner(cluster, LearnerConfig(**SIZES)))
    assert cluster.contexts_entered == contexts


def _built(compiled: list) -> collections.Counter:
    """The programs ``count_compilations`` recorded, by name, without the element-wise ones JAX
    compiles for its own eager calls (two threads may both build one of those)."""
    eager = ("jit(convert_element_type)", "jit(stage)", "jit(_threefry_seed)")
    return collections.Counter(name for name, _, _ in compiled if name not in eager)


def _first_step(config: tuple, ahead: bool | tuple, monkeypatch) -> tuple[collections.Counter, object, list, list]:
    """A cold first step of ``config`` (scenario, training config, learner knobs, rewards from the
    reward model, meshes per role or None), with the programs ``ahead`` names built beside the
    sampling (``GRPOLearner.builds_ahead``): the programs it built (the element-wise ones JAX
    compiles for its own eager calls left out: two threads may both build one of those), its
    record, the actor's weights, and the parts ``RLCluster.build_ahead`` started."""
    scenario, training, knobs, reward_model, meshes = config
    cluster = build_cluster(scenario, training_config=training, role_to_mesh=meshes)
    learner = GRPOLearner(cluster, LearnerConfig(**SIZES, **knobs), use_reward_model=reward_model)
    learner.builds_ahead = ahead
    started: list = []
    real = RLCluster.build_ahead

    def recorded(self, *args):
        parts = real(self, *args)
        started.append(sorted(parts))
        return parts

    monkeypatch.setattr(RLCluster, "build_ahead", recorded)
    clear_programs()
    jax.clear_caches()
    with count_compilations() as compiled:
        record = learner.step()
    programs = _built(compiled)
    return programs, record, [np.asarray(x) for x in jax.tree.leaves(nnx.state(cluster.actor_model))], started


@st.composite
def first_step_configs(draw) -> tuple:
    """A configuration the lab builds: a standard layout or meshes of its own per role over any
    devices in any order, LoRA, the engine, offload, reward and critic, a chunked sync, and
    mini-batches with accumulation and several iterations."""
    custom = draw(st.booleans())
    meshes = None
    if custom:
        order = draw(st.permutations(jax.devices()))
        shapes = st.sampled_from([(2, 2), (1, 4), (4, 1)])
        actor, rollout = order[:4], draw(st.sampled_from([order[4:], order[2:6], order[:4][::-1]]))
        meshes = {
            Role.ACTOR: make_mesh(actor, draw(shapes)),
            Role.REFERENCE: make_mesh(actor, draw(shapes)),
            Role.ROLLOUT: make_mesh(rollout, draw(shapes)),
            Role.REWARD: make_mesh(order[4:], draw(shapes)),
            Role.CRITIC: make_mesh(order[4:], draw(shapes)),
        }
    judges = draw(st.booleans())  # a reward model and a critic, PPO-style
    scenario = Scenario(
        layout="split" if custom else draw(st.sampled_from(["colocated", "reshaped", "split"])),
        lora=draw(st.booleans()),
        engine=draw(st.sampled_from(["vanilla", "vllm"])),
        offload=draw(st.booleans()),
        sync_chunk_bytes=draw(st.sampled_from([None, 4096])),
        with_reward=judges,
        with_critic=judges,
        max_tokens=4,
    )
    training = draw(
        st.sampled_from([None, TrainingConfig(mini_batch_size=2, train_micro_batch_size=1, num_iterations=2)])
    )
    return scenario, training, {"critic": True} if judges else {}, judges, meshes


@settings(max_examples=max(4, settings.default.max_examples // 3))
@given(config=first_step_configs(), parts=st.sampled_from([True, ("update",), ("scoring",)]))
@example(
    config=(Scenario(layout="colocated", lora=True, offload=True, max_tokens=4), None, {}, False, None), parts=True
)
def test_a_first_step_builds_its_scoring_and_update_beside_the_sampling_each_once_and_the_same_step(config, parts):
    """The threads build the very programs the step runs (none twice, none missing: the step's
    own count, helpers included, equals a step without them) and change nothing it computes,
    whichever of them start (the lab's rehearsal starts the update's alone)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        programs, record, weights, started = _first_step(config, parts, monkeypatch)
        alone, record_alone, weights_alone, none_started = _first_step(config, False, monkeypatch)
    assert started[0] == (["scoring", "update"] if parts is True else list(parts)) and none_started == []
    assert programs == alone and max(programs.values()) >= 1
    assert record == record_alone
    assert all(np.array_equal(a, b) for a, b in zip(weights, weights_alone, strict=True))


def test_a_first_step_that_fails_leaves_no_helper_running(cluster, monkeypatch):
    """The helpers are still compiling when the step fails at once; the step joins them before
    the error reaches the caller."""
    learner = GRPOLearner(cluster, LearnerConfig(**SIZES))

    def refused(*args, **kwargs):
        raise RuntimeError("no sampling today")

    monkeypatch.setattr(cluster, "generate", refused)
    jax.clear_caches()  # the helpers have whole programs to build
    with pytest.raises(RuntimeError, match="no sampling today"):
        learner.step()
    assert [t.name for t in threading.enumerate() if t.name.startswith("rlcluster-lab-ahead")] == []


def _hand_written_first_step(
    scenario: Scenario, ahead: bool, steps: int | None = None
) -> tuple[collections.Counter, list, list]:
    """A cold first step through the cluster's own calls (as a loop of a user's would take it),
    with ``RLCluster.build_ahead`` called first or not: the programs built (JAX's element-wise
    ones left out), the values every call returned, and the actor's weights. ``steps``: the
    sampler's ``max_generation_steps``, given to both."""
    cluster = build_cluster(scenario)
    prompts = PROMPTS * 2
    clear_programs()
    jax.clear_caches()
    with count_compilations() as compiled:
        started = cluster.build_ahead(prompts, max_generation_steps=steps) if ahead else ()
        out = cluster.generate(prompts, max_generation_steps=steps)
        p, c = out.left_padded_prompt_tokens, out.tokens
        anchor = np.asarray(cluster.per_token_logps(Role.ACTOR, p, c))
        ref = np.asarray(cluster.per_token_logps(Role.REFERENCE, p, c)) if cluster.scores_reference else None
        advantages = np.linspace(-1, 1, len(prompts), dtype=np.float32)
        metrics = cluster.update_actor(TrainBatch(p, c, advantages, anchor, ref))
        cluster.sync_weights()
    assert started == (("update", "scoring") if ahead else ())
    assert [t.name for t in threading.enumerate() if t.name.startswith("rlcluster-lab-ahead")] == []
    programs = _built(compiled)
    values = [out.tokens, out.logprobs, anchor, ref, metrics]
    return programs, values, [np.asarray(x) for x in jax.tree.leaves(nnx.state(cluster.actor_model))]


@pytest.mark.parametrize(
    ("scenario", "steps"),
    [
        (Scenario(layout="colocated", lora=True, max_tokens=4), None),
        (Scenario(layout="split", engine="vllm", offload=True, sync_chunk_bytes=4096, max_tokens=4), 3),
    ],
    ids=["colocated-lora", "split-vllm-offload-chunked-3-steps"],
)
def test_a_hand_written_first_step_after_build_ahead_builds_each_program_once_and_computes_the_same(scenario, steps):
    """The cluster's own calls wait for the helper building their programs: each program is
    built once (helpers included, the same count as without them), every call returns what it
    returns without them, and no helper is left running after the last call."""
    programs, values, weights = _hand_written_first_step(scenario, ahead=True, steps=steps)
    programs_alone, values_alone, weights_alone = _hand_written_first_step(scenario, ahead=False, steps=steps)
    assert programs == programs_alone and max(programs.values()) >= 1
    for got, want in zip(values, values_alone, strict=True):
        if isinstance(got, np.ndarray):
            np.testing.assert_array_equal(got, want)
        else:
            assert got == want
    assert all(np.array_equal(a, b) for a, b in zip(weights, weights_alone, strict=True))


def test_build_ahead_checks_its_parts_starts_nothing_for_bad_prompts_and_twins_keep_their_own(cluster):
    with pytest.raises(ValueError, match=r"builds 'scoring' and 'update', not 'sampling'.*True for both"):
        cluster.build_ahead(PROMPTS, ("update", "sampling"))
    assert cluster.build_ahead(PROMPTS, False) == ()
    # Prompts the cluster would refuse: nothing starts, and generate itself says what is wrong.
    assert cluster.build_ahead([]) == ()
    with pytest.raises(ValueError, match="prompts"):
        cluster.generate([])
    # A twin's helpers are its own: the twin starts both parts while the cluster's still run
    # or have finished, and each waits for its own.
    jax.clear_caches()
    assert cluster.build_ahead(PROMPTS, "scoring") == ("scoring",)
    twin = cluster.isolated()
    assert twin.build_ahead(PROMPTS) == ("update", "scoring")
    cluster.wait_for_builds()
    twin.wait_for_builds()
    assert [t.name for t in threading.enumerate() if t.name.startswith("rlcluster-lab-ahead")] == []


def test_helpers_start_where_compiling_is_the_wait(monkeypatch):
    """``build_ahead`` starts its helpers for a small model on CPU devices (the lab compiles it
    cheaply, and compiling is the wait) and for any model on a TPU; a larger model on CPU
    devices keeps XLA's default compiling, its cores busy sampling: nothing starts."""
    from rlcluster_lab import rl_cluster
    from rlcluster_lab.core.states import model_split
    from rlcluster_lab.model.init import init_model

    small, larger = init_model("tiny"), init_model("base")
    assert rl_cluster._compiling_is_the_wait(*model_split(small))
    assert not rl_cluster._compiling_is_the_wait(*model_split(larger))
    monkeypatch.setattr(rl_cluster, "platform_of", lambda state: "tpu")  # the same model's arrays on a TPU
    assert rl_cluster._compiling_is_the_wait(*model_split(larger))


@pytest.mark.parametrize("part", ["scoring", "update"])
def test_a_call_waits_for_the_helper_building_its_program(cluster, monkeypatch, part):
    """The call that runs a part's programs does not start before that part's helper finished
    (else both would compile the same program at once); other calls do not wait for it."""
    from rlcluster_lab import rl_cluster

    go, real = threading.Event(), rl_cluster.build

    def held(operation):
        go.wait()  # the helper holds here until the test lets it go
        real(operation)

    monkeypatch.setattr(rl_cluster, "build", held)
    out = cluster.generate(PROMPTS)
    p, c = out.left_padded_prompt_tokens, out.tokens
    logps = np.asarray(cluster.per_token_logps(Role.ACTOR, p, c))
    assert cluster.build_ahead(PROMPTS, part) == (part,)
    call = {
        "scoring": lambda: cluster.per_token_logps(Role.ACTOR, p, c),
        "update": lambda: cluster.update_actor(TrainBatch(p, c, np.zeros(len(p), np.float32), logps, logps)),
    }[part]
    try:
        # A call that runs none of the part's programs goes ahead meanwhile.
        other = threading.Thread(target=lambda: cluster.per_token_logps(Role.ROLLOUT, p, c))
        other.start()
        other.join(timeout=120)
        went_ahead = not other.is_alive()
        caller = threading.Thread(target=call)
        caller.start()
        caller.join(timeout=1.0)
        held_back = caller.is_alive()
    finally:
        go.set()
    other.join()
    caller.join()
    cluster.wait_for_builds()
    assert went_ahead
    assert held_back
