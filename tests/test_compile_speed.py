"""What a first step compiles: compiler options chosen for the platform and the model's size,
one log-prob program for every role whose model graph and shardings allow it, and prompt
lengths bucketed so a new length in the same bucket compiles nothing."""

from __future__ import annotations

import collections
import dataclasses
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlcluster_lab import Scenario, build_cluster
from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig
from rlcluster_lab.core import compile_options
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.core.config import TrainingConfig
from rlcluster_lab.core.model_config import MODEL_SIZES
from rlcluster_lab.model import init_model
from rlcluster_lab.model.logps import LOGPS
from rlcluster_lab.model.sampling import PROMPT_BUCKET
from rlcluster_lab.training.step import train_step

TINY = MODEL_SIZES["tiny"].num_params
LARGE = MODEL_SIZES["large"].num_params


# ------------------------------------------------------------------ the options


def _accepted_cpu() -> dict:
    return compile_options.accepted_options("cpu", compile_options.FAST_CPU)


def test_cpu_programs_of_small_models_get_cheap_code_generation(monkeypatch):
    monkeypatch.delenv(compile_options.ENV, raising=False)
    fast = _accepted_cpu()
    assert fast and fast.items() <= dict(compile_options.FAST_CPU).items()
    assert compile_options.compiler_options("cpu", TINY) == fast
    assert compile_options.compiler_options("cpu", MODEL_SIZES["small"].num_params) == fast


def test_the_options_a_program_gets_are_exactly_those_the_running_xla_accepts():
    """Asked of XLA, not guessed from a version: each option kept compiles a program on its own,
    each one left out is refused on its own by this XLA."""
    fast = _accepted_cpu()
    x = jax.ShapeDtypeStruct((), jnp.float32)
    for name, value in compile_options.FAST_CPU.items():
        try:
            jax.jit(lambda a: a + 1, compiler_options={name: value}).lower(x).compile()
            refused = False
        except Exception:  # noqa: BLE001 - XLA's refusal, whatever this version calls it
            refused = True
        assert (name in fast) is not refused, name


def test_an_option_xla_does_not_know_is_left_out_with_one_line_in_the_log(caplog):
    wanted = {**compile_options.FAST_CPU, "xla_no_such_option_for_this_test": 1, "xla_backend_optimization_level": "x"}
    with caplog.at_level("INFO", logger=compile_options.__name__):
        got = compile_options.accepted_options("cpu", wanted)
    assert got == {k: v for k, v in _accepted_cpu().items() if k != "xla_backend_optimization_level"}
    lines = [r.getMessage() for r in caplog.records if "refused compile option" in r.getMessage()]
    refused = {name for name in wanted if name not in got}
    assert len(lines) == len(refused) and all(any(name in line for line in lines) for name in refused)
    assert "xla_no_such_option_for_this_test" in refused and "xla_backend_optimization_level" in refused


def test_xla_is_asked_outside_the_mesh_an_operation_entered():
    """The first program a process compiles runs inside a role's mesh (``jax.set_mesh``); the
    question to XLA is a program of its own, which that mesh must not refuse (it would drop
    every option: nothing in the error named one)."""
    wanted = {k: v for k, v in compile_options.FAST_CPU.items() if k != "xla_cpu_parallel_codegen_split_count"}
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
    with jax.set_mesh(mesh):
        got = compile_options.accepted_options("cpu", wanted)
    assert got == {k: v for k, v in _accepted_cpu().items() if k in wanted}


def test_a_failure_naming_no_option_keeps_the_options_as_asked(monkeypatch, caplog):
    monkeypatch.setattr(compile_options, "run_apart", lambda probe: "some other failure")
    wanted = {"xla_backend_optimization_level": 1}
    with caplog.at_level("INFO", logger=compile_options.__name__):
        assert compile_options._ask_xla("cpu", dict(wanted)) == wanted
    assert any("kept as asked" in r.getMessage() for r in caplog.records)


def test_xla_is_asked_once_per_process_and_option_set(monkeypatch):
    _accepted_cpu()
    monkeypatch.setattr(compile_options, "_ask_xla", lambda *a: pytest.fail("XLA asked again"))
    assert compile_options.accepted_options("cpu", compile_options.FAST_CPU) == _accepted_cpu()


def test_gpu_programs_of_small_models_skip_autotuning(monkeypatch):
    monkeypatch.delenv(compile_options.ENV, raising=False)
    assert compile_options.compiler_options("gpu", TINY) == dict(compile_options.FAST_GPU)
    assert compile_options.compiler_options("gpu", LARGE) is None
    monkeypatch.setenv(compile_options.ENV, "off")
    assert compile_options.compiler_options("gpu", TINY) is None


@pytest.mark.parametrize("platform", ["tpu", None])
def test_other_platforms_keep_xla_defaults(monkeypatch, platform):
    monkeypatch.delenv(compile_options.ENV, raising=False)
    assert compile_options.compiler_options(platform, TINY) is None


def test_larger_models_keep_xla_defaults_unless_asked(monkeypatch):
    monkeypatch.delenv(compile_options.ENV, raising=False)
    assert compile_options.compiler_options("cpu", LARGE) is None
    monkeypatch.setenv(compile_options.ENV, "on")
    assert compile_options.compiler_options("cpu", LARGE) == _accepted_cpu()
    # No GPU backend in this process: nothing can be compiled for it, so XLA is not asked.
    assert compile_options.compiler_options("gpu", LARGE) == dict(compile_options.FAST_GPU)
    assert compile_options.compiler_options("tpu", TINY) is None


def test_the_environment_turns_the_cheap_options_off(monkeypatch):
    monkeypatch.setenv(compile_options.ENV, "off")
    assert compile_options.compiler_options("cpu", TINY) is None


def test_an_unknown_compile_mode_is_refused_naming_the_choices(monkeypatch):
    monkeypatch.setenv(compile_options.ENV, "fast")
    with pytest.raises(ValueError, match="auto, on, off"):
        compile_options.compiler_options("cpu", TINY)


@pytest.mark.parametrize("seed", range(3))
def test_data_moving_programs_get_cheap_options_up_to_their_own_bound(seed, monkeypatch):
    # A reshard of few elements compiles fast and moves as fast; above MOVE_FAST_MAX_ELEMENTS the
    # cheap code slows every move, so XLA's defaults, unless the environment asks otherwise.
    rng = np.random.default_rng(seed)
    bound = compile_options.MOVE_FAST_MAX_ELEMENTS
    under = [jax.ShapeDtypeStruct((int(n),), jnp.float32) for n in rng.integers(1, bound // 4, size=3)]
    over = [*under, jax.ShapeDtypeStruct((bound,), jnp.bfloat16)]
    monkeypatch.delenv(compile_options.ENV, raising=False)
    assert compile_options.move_options(under, "cpu") == _accepted_cpu()
    assert compile_options.move_options(over, "cpu") is None
    assert compile_options.move_options(under, str(rng.choice(["tpu", "rocm"]))) is None
    assert compile_options.move_options(under, "gpu") == dict(compile_options.FAST_GPU)
    monkeypatch.setenv(compile_options.ENV, "on")
    assert compile_options.move_options(over, "cpu") == _accepted_cpu()
    monkeypatch.setenv(compile_options.ENV, "off")
    assert compile_options.move_options(under, "cpu") is None


def test_options_follow_the_platform_of_the_arrays(monkeypatch):
    monkeypatch.delenv(compile_options.ENV, raising=False)
    x = jnp.zeros((4, 4))
    assert compile_options.platform_of({"a": x}) == "cpu"
    assert compile_options.platform_of({}) is None
    assert compile_options.options_for([x]) == _accepted_cpu()
    assert compile_options.options_for([x], elements=LARGE) is None


def test_p10_log_probs_with_cheap_code_generation_match_xla_defaults():
    """The options change how XLA:CPU generates code, not what the program computes."""
    graphdef, state = nnx.split(init_model("tiny", seed=3))
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(1, 200, (4, 16)), jnp.int32)
    completion = jnp.asarray(rng.integers(1, 200, (4, 8)), jnp.int32)
    args = (graphdef, state, prompt, completion, 0, jnp.float32(1.0))
    fast = np.asarray(LOGPS.jitted(_accepted_cpu())(*args))
    default = np.asarray(LOGPS.jitted(None)(*args))
    assert np.isfinite(fast).all()
    np.testing.assert_allclose(fast, default, rtol=0, atol=1e-5)


def test_cheap_code_generation_keeps_matrix_products_out_of_ynnpack_fusions():
    """A YNNPACK fusion builds its runtime at its program's first run (about 0.3 ms a product,
    each new program, also one read back from the disk cache): the lab's CPU options keep the
    model's products in XLA's own dot kernels; the same options without it fuse them."""
    graphdef, state = nnx.split(init_model("tiny", seed=3))
    args = (graphdef, state, jnp.ones((2, 8), jnp.int32), jnp.ones((2, 4), jnp.int32), 0, jnp.float32(1.0))

    def optimized_hlo(options):
        return LOGPS.jitted(options).lower(*args).compile().as_text()

    fast_options = _accepted_cpu()
    fast = optimized_hlo(fast_options)
    assert " dot(" in fast or "__ynn_fusion" not in fast
    if "xla_cpu_experimental_ynn_fusion_type" in fast_options:  # this XLA has the fusions to turn off
        assert "__ynn_fusion" not in fast
        assert "__ynn_fusion" in optimized_hlo({k: v for k, v in fast_options.items() if "ynn" not in k})


def test_one_program_family_keeps_one_jitted_function_per_option_set():
    family = compile_options.ProgramFamily(lambda x: x + 1)
    assert family.jitted(None) is family.jitted({})
    assert family.jitted({"xla_backend_optimization_level": 0}) is not family.jitted(None)
    assert int(family.jitted({"xla_backend_optimization_level": 0})(jnp.int32(1))) == 2


# ------------------------------------------------------------------ what a step compiles


def _names(found) -> collections.Counter:
    return collections.Counter(name for name, _, _ in found)


def _learner(cluster, prompts) -> GRPOLearner:
    return GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=2, group_size=4), prompts=prompts)


@pytest.mark.parametrize("sharded", [False, True])
def test_a_program_built_only_on_one_thread_runs_on_another_without_compiling(sharded):
    """build compiles the first program a call reaches and ends the call there (Built);
    the same call later, on another thread, runs that program: nothing compiles again."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
    spec = jax.sharding.PartitionSpec("a", "b") if sharded else jax.sharding.PartitionSpec()
    x = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), jax.sharding.NamedSharding(mesh, spec))
    jitted = jax.jit(lambda a, k: (a * k).sum(axis=0) + 1.0, static_argnames="k")
    reached = []

    def operation() -> None:
        compile_options.run(jitted, x, 3)
        reached.append("past the program")  # never: Built ended the call

    def build() -> None:
        with count_compilations() as made:
            compile_options.build(operation)
        reached.append(len(made))

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    assert reached == [1]
    with count_compilations() as made:
        out = compile_options.run(jitted, x, 3)
    assert made == [] and np.allclose(out, np.arange(64).reshape(8, 8).sum(axis=0) * 3 + 1.0)
    with count_compilations() as made:  # another static argument: a program of its own
        compile_options.run(jitted, x, 4)
    assert len(made) == 1


@pytest.mark.cluster
def test_p10_p11_a_full_step_runs_one_log_prob_program_for_anchor_reference_and_live_actor():
    """Without LoRA the reference, the anchor and the live actor (P11's probe, on every
    mini-batch) have one graph and one set of shardings: one program."""
    cluster = build_cluster(
        Scenario(layout="colocated", max_tokens=4), training_config=TrainingConfig(mini_batch_size=4)
    )
    learner = _learner(cluster, ["abc", "hello"])
    jax.clear_caches()
    with count_compilations() as found:
        learner.step()
    names = _names(found)
    assert names["jit(_logps)"] == 1, names
    assert names["jit(grpo_train_step)"] == 1 and names["jit(_generate)"] == 1, names
    assert len(learner.p11) == 2  # two mini-batches probed, by the same program


@pytest.mark.cluster
def test_p10_with_lora_the_reference_is_another_graph_and_the_only_second_log_prob_program():
    cluster = build_cluster(Scenario(layout="colocated", lora=True, max_tokens=4))
    learner = _learner(cluster, ["abc", "hello"])
    jax.clear_caches()
    with count_compilations() as found:
        learner.step()
    assert _names(found)["jit(_logps)"] == 2, _names(found)


@pytest.mark.cluster
def test_a_second_prompt_length_in_the_same_bucket_compiles_nothing():
    cluster = build_cluster(Scenario(layout="colocated", lora=True, max_tokens=4))
    _learner(cluster, ["abc"]).step()
    longer = "x" * (PROMPT_BUCKET - 2)
    with count_compilations() as found:
        record = _learner(cluster, [longer]).step()
    assert found == [], _names(found)
    assert record.optimizer_steps >= 1


# ------------------------------------------------------------------ depth costs nothing to compile


def _train_step_program_lines(monkeypatch, num_layers: int, lora_rank: int, micro_batch_size: int | None) -> int:
    """Lines of the training step's lowered program (StableHLO text) for a tiny model of
    ``num_layers`` layers: the program ``train_step`` runs, lowered where it would run it."""
    from rlcluster_lab.model import with_lora
    from rlcluster_lab.training import step as step_module

    class Lowered(Exception):  # noqa: N818 - the signal that ends the call once the program is read
        pass

    texts = []

    def lower_only(jitted, *args):
        texts.append(jitted.lower(*args).as_text())
        raise Lowered

    monkeypatch.setattr(step_module, "run", lower_only)
    config = dataclasses.replace(MODEL_SIZES["tiny"], num_layers=num_layers)
    model = init_model(config, seed=num_layers)
    if lora_rank:
        model = with_lora(model, lora_rank, seed=2)
    graphdef, trainable, frozen = nnx.split(model, nnx.LoRAParam if lora_rank else nnx.Param, ...)
    tx = optax.adam(1e-3)
    opt_state = jax.tree.map(jnp.zeros_like, tx.init(trainable))
    rows, prompt, completion = 4, 6, 5
    rng = np.random.default_rng(num_layers)
    batch = {
        "prompt_tokens": rng.integers(1, config.vocab_size, (rows, prompt), dtype=np.int32),
        "completion_tokens": rng.integers(1, config.vocab_size, (rows, completion), dtype=np.int32),
        "old_logps": np.full((rows, completion), -1.0, np.float32),
        "ref_logps": np.full((rows, completion), -1.0, np.float32),
        "advantages": np.linspace(-1, 1, rows, dtype=np.float32),
    }
    with pytest.raises(Lowered):
        train_step(
            graphdef,
            tx,
            trainable,
            frozen,
            opt_state,
            batch,
            1.0,
            pad_id=0,
            beta=0.04,
            epsilon=0.2,
            micro_batch_size=micro_batch_size,
        )
    (text,) = texts
    return len(text.splitlines())


@pytest.mark.parametrize("lora_rank, micro_batch_size", [(0, None), (4, None), (0, 2), (2, 1)])
def test_the_training_steps_program_for_12_layers_is_hardly_larger_than_for_2(monkeypatch, lora_rank, micro_batch_size):
    """The layers are one stacked array per weight, run in a scan: the step's program holds one
    layer's code whatever the depth, so what it costs to compile does not grow with it. Read
    from the program's text (deterministic; nothing is timed). The bound, 1.25x: only array
    extents differ between depths (the same line count here, 1,879-2,305 lines for these four
    steps at both depths), leaving room for a lowering that folds a constant differently, while
    a program holding each layer's own code (the layers as a Python loop over a list) grows with
    every layer: 4.2-5.0x here (1,984-3,460 lines at 2 layers, 8,709-17,389 at 12)."""
    two = _train_step_program_lines(monkeypatch, 2, lora_rank, micro_batch_size)
    twelve = _train_step_program_lines(monkeypatch, 12, lora_rank, micro_batch_size)
    assert twelve <= 1.25 * two, f"12 layers: {twelve} lines, 2 layers: {two}"


@pytest.mark.parametrize("with_cache", [False, True])
def test_the_layers_scan_holds_the_attention_mask_as_a_float_bias_not_a_boolean_array(with_cache):
    # XLA:CPU compiles a kernel that writes a boolean (B, T, S) array for over a second at the
    # large preset's shapes, a float32 one in a tenth: the scan over the layers carries the bias.
    from rlcluster_lab.model.transformer import init_cache

    model = init_model("tiny")
    graphdef, state = nnx.split(model)
    tokens = jnp.ones((4, 11), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(11), (4, 11))
    pad = jnp.ones((4, 11, 11 if not with_cache else 16), bool)
    cache = init_cache(model.config, 4, 16) if with_cache else None

    def forward(state, tokens, positions, pad):
        return nnx.merge(graphdef, state)(tokens, positions, pad, cache)[0]

    text = jax.jit(forward).lower(state, tokens, positions, pad).compile().as_text()
    loops = [line for line in text.splitlines() if " while(" in line]
    s = 16 if with_cache else 11
    assert loops and all(f"pred[4,11,{s}]" not in line for line in loops)
    assert any(f"f32[4,11,{s}]" in line for line in loops)
