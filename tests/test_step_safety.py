"""The optimizer step is transactional, and its compiled program is shared and released.

A step whose loss, gradients or result is not finite keeps the previous parameters and
optimizer state and says why (before, one such step turned every actor leaf to NaN for
good). A rebuilt cluster with an equal optimizer reuses the compiled step (before, each
fresh ``optax.adam`` compiled it again and kept the old executable: tens of MB a rebuild).
"""

from __future__ import annotations

import gc
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, TrainBatch, TrainingConfig, build_cluster
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.model import init_model
from rlcluster_lab.model.tokenizer import ByteTokenizer
from rlcluster_lab.training import step as step_module
from rlcluster_lab.training.batch import batch_arrays
from rlcluster_lab.training.step import finite_flags, init_optimizer_state, rejection_reason, train_step

TOK = ByteTokenizer()
ONE_DEVICE = Mesh(np.array(jax.devices()[:1]), ("data",))


def adam(learning_rate: float = 1e-2) -> optax.GradientTransformation:
    """A new Adam object each call, its rate held in the state: a NaN rate needs no new program."""
    return optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate)


def poison_learning_rate(opt_state) -> None:
    """Set the injected learning rate to NaN, in place and in the same layout."""
    rate = opt_state.hyperparams["learning_rate"]
    opt_state.hyperparams["learning_rate"] = jax.device_put(jnp.full_like(rate, jnp.nan), rate.sharding)


def host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))


def batch(advantages=(1.0, -1.0, 0.5, -0.5), old_logps: float = -1.0) -> TrainBatch:
    prompts = TOK.encode_batch_left_padded(["ab", "cde", "f", "gh"], length=4)
    completion = np.array([[104, 105, 258], [106, 258, 256], [107, 108, 109], [110, 258, 256]], np.int32)
    old = np.full(completion.shape, old_logps, np.float32)
    return TrainBatch(prompts, completion, np.asarray(advantages, np.float32), old, old.copy())


class Setup:
    """A tiny actor split for the step, with ``tx``'s state."""

    def __init__(self, tx: optax.GradientTransformation, seed: int = 0) -> None:
        self.tx = tx
        self.graphdef, self.trainable, self.frozen = nnx.split(init_model("tiny", seed=seed), nnx.Param, ...)
        self.opt_state = init_optimizer_state(tx, self.trainable, ONE_DEVICE)

    def step(self, b: TrainBatch) -> tuple[object, object, dict[str, float]]:
        new, opt, m = train_step(
            self.graphdef,
            self.tx,
            self.trainable,
            self.frozen,
            self.opt_state,
            batch_arrays(b),
            1.0,
            pad_id=TOK.pad_id,
            beta=0.04,
            epsilon=0.2,
        )
        return new, opt, {k: float(v) for k, v in m.items()}


# ------------------------------------------------------------------ transactional step


def test_an_update_that_makes_parameters_nan_keeps_the_old_parameters_and_optimizer_state():
    s = Setup(adam())
    poison_learning_rate(s.opt_state)
    new, opt, m = s.step(batch())
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
    assert rejection_reason(m) == "the update would make a parameter non-finite"
    assert same(host(new), host(s.trainable))
    # Adam's moments and step count would have moved: they are kept too.
    assert same(host(opt), host(s.opt_state))


def nan_state() -> optax.GradientTransformation:
    """Updates left as they are, a state that turns NaN: only the optimizer state goes bad."""

    def init(params):
        return jnp.zeros([], jnp.float32)

    def update(updates, state, params=None):
        return updates, state + jnp.nan

    return optax.GradientTransformation(init, update)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("poison", ["parameters", "optimizer state"])
def test_a_non_finite_new_state_is_caught_inside_the_one_step_program_and_the_inputs_come_back(
    monkeypatch, poison, seed
):
    """The step's own program checks the loss, the gradients, the new parameters and the new
    optimizer state, and hands back the inputs' values with the reason: nothing but the step is
    compiled (the check is no program of its own, even where arrays are not read on the host,
    as on GPUs and TPUs), and an accepted step returns the new state."""
    monkeypatch.setattr(step_module, "_host_readable", lambda x: False)
    jax.clear_caches()
    if poison == "parameters":
        s = Setup(adam(), seed)
        poison_learning_rate(s.opt_state)
        reason = "the update would make a parameter non-finite"
    else:
        s = Setup(optax.chain(optax.sgd(1e-2), nan_state()), seed)
        reason = "the update would make the optimizer state non-finite"
    with count_compilations() as built:
        new, opt, m = s.step(batch())
    assert [name for name, _, _ in built] == ["jit(grpo_train_step)"]
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
    assert rejection_reason(m) == reason
    assert same(host(new), host(s.trainable)) and same(host(opt), host(s.opt_state))
    fine = Setup(adam(), seed)
    new, opt, m = fine.step(batch())
    assert m["rejected"] == 0.0 and not same(host(new), host(fine.trainable))
    assert all(np.isfinite(x).all() for x in host(new))


def test_a_non_finite_loss_is_rejected_before_it_reaches_the_parameters():
    # Finite inputs whose ratio exp(logp - old) overflows: the loss is inf, the gradients NaN.
    s = Setup(adam())
    new, opt, m = s.step(batch(advantages=(-1.0, -1.0, -1.0, -1.0), old_logps=-1e30))
    assert not math.isfinite(m["loss"])
    assert rejection_reason(m) == "the loss is not finite"
    assert same(host(new), host(s.trainable)) and same(host(opt), host(s.opt_state))


def test_a_finite_update_is_applied_and_reports_no_rejection():
    s = Setup(adam())
    new, opt, m = s.step(batch())
    assert m["rejected"] == 0.0 and rejection_reason(m) is None
    assert not same(host(new), host(s.trainable))
    assert not same(host(opt), host(s.opt_state))
    assert all(np.isfinite(x).all() for x in host(new))


@pytest.mark.cluster
def test_the_learner_reports_rejected_steps_and_the_actor_stays_finite():
    cluster = build_cluster(
        Scenario(layout="colocated", max_tokens=4), training_config=TrainingConfig(optimizer=adam())
    )
    poison_learning_rate(cluster.optimizer_state)
    before = host(nnx.state(cluster.actor_model, nnx.Param))
    record = GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=2, group_size=2)).run().steps[0]
    assert record.rejected_steps == record.optimizer_steps == 1
    assert "kept the previous parameters and optimizer state" in record.rejected
    assert "non-finite" in record.rejected
    assert record.to_json()["rejected"] == record.rejected
    assert same(host(nnx.state(cluster.actor_model, nnx.Param)), before)
    assert cluster.global_steps == 1  # the sync still ran, with the kept weights


# ------------------------------------------------------------------ one compiled step per configuration


def step_programs(found) -> list[str]:
    return [name for name, _, _ in found if "step" in name]


def test_equal_optimizers_share_one_compiled_step_and_release_it_when_unused(monkeypatch):
    from rlcluster_lab.training import step

    gc.collect()
    step._STEPS.release_unused()
    jax.clear_caches()  # whatever earlier tests compiled is built again (from the disk cache) and counted
    held = len(step._STEPS)
    setups = []
    with count_compilations() as found:
        for _ in range(3):
            s = Setup(adam())  # a new, equal optimizer object each time
            s.step(batch())
            setups.append(s)
    assert len(step_programs(found)) == 1, found
    assert len(step._STEPS) == held + 1
    # Every user gone: the program is idle, kept for a rebuild of the same configuration...
    del setups, s
    gc.collect()
    assert len(step._STEPS) == held + 1
    with count_compilations() as found:
        Setup(adam()).step(batch())
    assert step_programs(found) == []
    # ...and released on demand, or at once when no idle program is to be kept.
    gc.collect()
    assert step._STEPS.release_unused() == 1 and len(step._STEPS) == held
    monkeypatch.setattr(step._STEPS, "idle_limit", 0)
    s = Setup(adam())
    s.step(batch())
    assert len(step._STEPS) == held + 1
    del s
    gc.collect()
    assert len(step._STEPS) == held


@pytest.mark.cluster
def test_rebuilt_clusters_with_equal_optimizers_compile_the_step_once():
    b = batch()
    gc.collect()
    jax.clear_caches()
    with count_compilations() as found:
        for _ in range(3):
            cluster = build_cluster(
                Scenario(layout="colocated", max_tokens=4), training_config=TrainingConfig(optimizer=adam())
            )
            metrics = cluster.update_actor(b)
            assert metrics[0]["rejected"] == 0.0
    assert len(step_programs(found)) == 1, found


def test_optimizers_are_told_apart_by_value_not_identity():
    from rlcluster_lab.training.fingerprint import describe_transformation

    def key(tx):
        return describe_transformation(tx)[0]

    assert key(optax.adam(1e-3)) == key(optax.adam(1e-3))
    assert key(optax.adam(1e-3)) != key(optax.adam(2e-3))
    assert key(optax.adam(1e-3)) != key(optax.sgd(1e-3))
    schedule = lambda n: optax.adamw(optax.cosine_decay_schedule(1e-3, n))  # noqa: E731
    assert key(schedule(100)) == key(schedule(100)) and key(schedule(100)) != key(schedule(200))
    assert key(adam()) == key(adam())

    class Opaque:  # an object the description cannot look inside: told apart by identity
        scale = 2.0

    def scaled(obj):
        return optax.GradientTransformation(
            lambda p: (), lambda u, s, p=None: (jax.tree.map(lambda x: x * obj.scale, u), s)
        )

    one = Opaque()
    assert key(scaled(one)) == key(scaled(one))
    assert key(scaled(one)) != key(scaled(Opaque()))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status VmRSS here")


@pytest.mark.slow
@pytest.mark.cluster
def test_identical_rebuilds_keep_host_memory_bounded():
    """Eight rebuilds, each with a fresh (equal) optimizer and one optimizer step, grow RSS by
    < 25 MB, about 3 MB a rebuild (before, each kept its own compiled step: 17-29 MB a rebuild;
    now about 0.4 MB, measured standalone)."""
    b = batch()

    def rebuild() -> None:
        cluster = build_cluster(Scenario(), training_config=TrainingConfig(optimizer=adam()))
        cluster.update_actor(b)
        del cluster
        gc.collect()

    rebuild()  # warm-up: compiles what every rebuild reuses
    start = rss_mb()
    for _ in range(8):
        rebuild()
    grown = rss_mb() - start
    assert grown < 25, f"RSS grew {grown:.1f} MB over 8 identical rebuilds"


@given(data=st.data())
def test_the_sync_finite_check_read_in_place_agrees_with_the_compiled_one(data):
    """The sync's check reads CPU shards with NumPy (nothing compiled); on other platforms one
    compiled reduction. Both must flag the same leaves, wherever the bad value lies: in any
    shard, in a replicated block, in host memory, in any float type."""
    devices = jax.devices()
    count = data.draw(st.sampled_from([1, 2, 4, 8]), label="devices")
    chosen = data.draw(st.permutations(devices), label="order")[:count]
    rows = data.draw(st.sampled_from([c for c in (1, 2, 4, 8) if count % c == 0]), label="rows")
    mesh = Mesh(np.array(chosen).reshape(rows, count // rows), ("a", "b"))
    arrays, expected = [], []
    for k in range(data.draw(st.integers(1, 4), label="leaves")):
        dtype = data.draw(st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]), label=f"dtype{k}")
        spec = data.draw(st.sampled_from([P(), P("a"), P(None, "b"), P("a", "b"), P("b", "a")]), label=f"spec{k}")
        kind = data.draw(st.sampled_from(["device", "pinned_host"]), label=f"kind{k}")
        values = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 7.0
        bad = data.draw(st.sampled_from([None, np.nan, np.inf, -np.inf]), label=f"bad{k}")
        if bad is not None:
            r, c = data.draw(st.integers(0, 7), label=f"row{k}"), data.draw(st.integers(0, 15), label=f"col{k}")
            values[r, c] = bad
        arrays.append(jax.device_put(jnp.asarray(values, dtype), NamedSharding(mesh, spec, memory_kind=kind)))
        expected.append(bad is None)
    assert finite_flags(arrays, in_place=True) == expected
    assert finite_flags(arrays, in_place=False) == expected
    assert finite_flags(arrays) == expected  # on these CPU devices: the in-place read
    # Some leaves read on the host and the others by the program (an accelerator's pinned host
    # memory beside its own): each flag still lands on its own leaf.
    on_host = data.draw(st.lists(st.booleans(), min_size=len(arrays), max_size=len(arrays)), label="on host")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_module, "_host_readable", lambda x: on_host[[a is x for a in arrays].index(True)])
        assert finite_flags(arrays) == expected


def test_an_accelerators_host_memory_is_read_on_the_host_and_its_own_memory_by_a_program():
    """XLA:GPU refuses a reduction over pinned host inputs (an offloaded actor at a sync): such
    arrays are read on the host, like every array of XLA:CPU devices."""

    def array(platform: str, kind: str) -> object:
        device = type("Device", (), {"platform": platform})()
        sharding = type("Sharding", (), {"memory_kind": kind, "device_set": {device}})()
        return type("Array", (), {"sharding": sharding})()

    assert step_module._host_readable(array("gpu", "pinned_host"))
    assert step_module._host_readable(array("tpu", "unpinned_host"))
    assert not step_module._host_readable(array("gpu", "device"))
    assert step_module._host_readable(array("cpu", "device"))


def test_an_array_found_finite_is_not_read_again_while_it_lives(monkeypatch):
    """Arrays never change: one found finite is remembered while it lives (a LoRA actor's frozen
    backbone is read at its first sync only); a non-finite one, or a new array, is read each time."""
    reads = []
    real = step_module._one_replica_each
    monkeypatch.setattr(step_module, "_one_replica_each", lambda x: reads.append(x) or real(x))
    sharding = NamedSharding(Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b")), P("a"))
    good = jax.device_put(np.ones((8, 4), np.float32), sharding)
    bad = jax.device_put(np.full((8, 4), np.nan, np.float32), sharding)
    assert finite_flags([good, bad], in_place=True) == [True, False]
    assert finite_flags([good, bad], in_place=True) == [True, False]
    assert [x is good for x in reads] == [True, False, False]  # good once, bad both times
    again = jax.device_put(np.ones((8, 4), np.float32), sharding)  # equal values, another array
    assert finite_flags([again], in_place=True) == [True]
    assert reads[-1] is again


# --- the optimizer state written from the host -----------------------------------------------


OPTIMIZERS = {
    "adam": lambda: optax.adam(1e-3),
    "adamw": lambda: optax.adamw(1e-3, weight_decay=0.1),
    "sgd_momentum": lambda: optax.sgd(1e-2, momentum=0.9),
    "clipped_adamw_schedule": lambda: optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(optax.linear_schedule(1e-3, 0.0, 10))
    ),
    "injected_adam": adam,  # its hyperparameters are constants in the state too
    "lion": lambda: optax.lion(1e-4),
    "schedule_free_adamw": lambda: optax.contrib.schedule_free_adamw(1e-3),  # keeps a copy of the parameters
}


@given(
    name=st.sampled_from(sorted(OPTIMIZERS)),
    devices=st.permutations(list(range(8))),
    shape=st.sampled_from([(8,), (2, 4), (4, 2), (1, 8)]),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
)
def test_an_optimizer_state_of_constants_is_written_from_the_host_as_the_program_makes_it(name, devices, shape, dtype):
    """The same leaves (values, dtypes, weak types, shardings) as the compiled init on any mesh of
    the 8 CPU devices, without compiling anything when every leaf is a constant."""
    mesh = Mesh(np.array([jax.devices()[i] for i in devices]).reshape(shape), ("fsdp", "tp")[: len(shape)] or ("x",))
    spec = P(*mesh.axis_names)
    params = {
        "w": jax.device_put(jnp.ones((8, 16), dtype), NamedSharding(mesh, spec)),
        "b": jax.device_put(jnp.ones((16,), dtype), NamedSharding(mesh, P(mesh.axis_names[-1]))),
        "s": jax.device_put(jnp.ones((), jnp.float32), NamedSharding(mesh, P())),
    }
    tx = OPTIMIZERS[name]()
    jax.clear_caches()
    with count_compilations() as made:
        state = init_optimizer_state(tx, params, mesh)
    compiled = jax.jit(tx.init, out_shardings=jax.tree.map(lambda x: x.sharding, state))(params)
    got, want = jax.tree.leaves(state), jax.tree.leaves(compiled)
    assert jax.tree.structure(state) == jax.tree.structure(compiled)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.weak_type == b.weak_type and a.shape == b.shape
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
        assert np.array_equal(np.asarray(a), np.asarray(b))
    constant = name != "schedule_free_adamw"
    assert ([n for n, _, _ in made] == []) == constant, [n for n, _, _ in made]
