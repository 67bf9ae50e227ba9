"""Input contracts where data enters the model: token ids inside the vocabulary, the shapes the
loss needs, finite values and settings, a list of prompts (not a string), positive batch sizes.

Each was a silent failure before: an id past the vocabulary scored NaN, a (B, 1) advantage
column broadcast into a (B, B, C) loss, a NaN advantage or rate turned every parameter to
NaN, ``generate("hello")`` sampled five one-letter prompts.
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcluster_lab import (
    GRPOLearner,
    LearnerConfig,
    Mode,
    Role,
    RolloutConfig,
    Scenario,
    TrainBatch,
    TrainingConfig,
    build_cluster,
    placement_report,
    with_lora,
)
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.measure.memory import memory_report
from rlcluster_lab.model import init_model, logps_from_state
from rlcluster_lab.model.sampling import sample
from rlcluster_lab.model.scoring import init_score_model, scores_from_state
from rlcluster_lab.model.tokenizer import ByteTokenizer
from rlcluster_lab.training.batch import batch_arrays, mini_batches, validate_batch_arrays, validate_prompts
from rlcluster_lab.training.critic import ValueBatch

TOK = ByteTokenizer()
VOCAB = 264  # the tiny model's vocabulary
B, P, C = 4, 3, 2


@pytest.fixture(scope="module")
def split_model():
    return nnx.split(init_model("tiny", seed=0))


@pytest.fixture(scope="module")
def cluster():
    return build_cluster(Scenario(layout="colocated", max_tokens=4))


def good_batch(rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    rng = rng or np.random.default_rng(0)
    return {
        "prompt_tokens": rng.integers(0, 256, (B, P)).astype(np.int32),
        "completion_tokens": rng.integers(0, 256, (B, C)).astype(np.int32),
        "advantages": rng.standard_normal(B).astype(np.float32),
        "old_logps": -rng.random((B, C)).astype(np.float32),
        "ref_logps": -rng.random((B, C)).astype(np.float32),
    }


# ------------------------------------------------------------------ token ids


@pytest.mark.parametrize("bad_id", [VOCAB, 100_000, -1, 2**31 + 5])
@pytest.mark.parametrize("where", ["prompt_tokens", "completion_tokens"])
def test_logps_refuse_ids_outside_the_vocabulary(split_model, bad_id, where):
    tokens = good_batch()
    ids = {k: tokens[k].astype(np.int64) for k in ("prompt_tokens", "completion_tokens")}
    ids[where][1, 0] = bad_id
    with pytest.raises(ConfigError, match=rf"{where} holds token id {bad_id} at index \(1, 0\).*\[0, {VOCAB}\)"):
        logps_from_state(*split_model, ids["prompt_tokens"], ids["completion_tokens"], TOK.pad_id)


def test_logps_refuse_float_ids_rather_than_truncate_them(split_model):
    batch = good_batch()
    with pytest.raises(TypeError, match="completion_tokens must hold integer token ids, got dtype float"):
        logps_from_state(*split_model, batch["prompt_tokens"], batch["completion_tokens"] + 0.7, TOK.pad_id)


def test_logps_refuse_a_pad_id_outside_the_vocabulary(split_model):
    batch = good_batch()
    with pytest.raises(ConfigError, match="pad_id is 300"):
        logps_from_state(*split_model, batch["prompt_tokens"], batch["completion_tokens"], 300)


@pytest.mark.cluster
def test_cluster_logps_refuse_ids_outside_the_vocabulary_for_every_role(cluster):
    batch = good_batch()
    completion = batch["completion_tokens"].copy()
    completion[0, 1] = VOCAB + 3
    for role in (Role.ACTOR, Role.ROLLOUT):
        with pytest.raises(ConfigError, match=f"completion_tokens holds token id {VOCAB + 3}"):
            cluster.per_token_logps(role, batch["prompt_tokens"], completion)


def test_reward_scores_refuse_ids_outside_the_vocabulary():
    graphdef, state = nnx.split(init_score_model("tiny", seed=0))
    batch = good_batch()
    prompt = batch["prompt_tokens"].copy()
    prompt[2, 2] = 5000
    with pytest.raises(ConfigError, match="prompt_tokens holds token id 5000"):
        scores_from_state(graphdef, state, prompt, batch["completion_tokens"], TOK.pad_id, per_token=False)


class WideTokenizer(ByteTokenizer):
    """A tokenizer with more ids than the model: every character becomes id 300."""

    vocab_size = 512

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return [self.bos_id] * add_bos + [300] * len(text)


def test_sample_refuses_prompts_the_model_cannot_embed(split_model):
    with pytest.raises(ConfigError, match="holds token id 300.*vocabulary \\[0, 264\\)"):
        sample(*split_model, WideTokenizer(), ["hi"], max_new_tokens=2, temperature=1.0, cache_size=32, seed=0)


@pytest.mark.cluster
def test_train_batch_refuses_negative_ids_and_the_step_refuses_ids_past_the_vocabulary(cluster):
    batch = good_batch()
    negative = batch["prompt_tokens"].copy()
    negative[0, 0] = -4
    with pytest.raises(ConfigError, match="TrainBatch.prompt_tokens holds token id -4"):
        TrainBatch(negative, batch["completion_tokens"], batch["advantages"], batch["old_logps"])
    completion = batch["completion_tokens"].copy()
    completion[3, 1] = VOCAB
    before = [np.asarray(x) for x in jax.tree.leaves(nnx.state(cluster.actor_model, nnx.Param))]
    with pytest.raises(ConfigError, match=f"completion_tokens.*holds token id {VOCAB}"):
        cluster.update_actor(TrainBatch(batch["prompt_tokens"], completion, batch["advantages"], batch["old_logps"]))
    after = [np.asarray(x) for x in jax.tree.leaves(nnx.state(cluster.actor_model, nnx.Param))]
    assert all(np.array_equal(x, y) for x, y in zip(before, after))


# ------------------------------------------------------------------ shapes


@pytest.mark.parametrize(
    "field, shape, expected",
    [
        ("advantages", (B, 1), (B,)),
        ("advantages", (B - 1,), (B,)),
        ("old_logps", (B, 1), (B, C)),
        ("old_logps", (B,), (B, C)),
        ("ref_logps", (B, C + 1), (B, C)),
    ],
)
def test_train_batch_names_the_argument_the_shape_given_and_the_shape_expected(field, shape, expected):
    batch = good_batch()
    batch[field] = np.zeros(shape, np.float32)
    message = rf"TrainBatch\.{field} has shape {re_tuple(shape)}; expected {re_tuple(expected)}"
    with pytest.raises(ConfigError, match=message):
        TrainBatch(**batch)


@pytest.mark.parametrize("field", ["returns", "old_values"])
def test_value_batch_names_its_own_argument(field):
    batch = good_batch()
    values = {"returns": np.zeros((B, C), np.float32), "old_values": np.zeros((B, C), np.float32)}
    values[field] = np.zeros((B, C + 1), np.float32)
    message = rf"ValueBatch\.{field} has shape {re_tuple((B, C + 1))}; expected {re_tuple((B, C))}"
    with pytest.raises(ConfigError, match=message):
        ValueBatch(batch["prompt_tokens"], batch["completion_tokens"], **values)


def re_tuple(shape: tuple[int, ...]) -> str:
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


def test_the_step_refuses_a_broadcasting_advantage_column_given_directly(split_model):
    arrays = batch_arrays(TrainBatch(**good_batch()))
    arrays["advantages"] = arrays["advantages"][:, None]
    with pytest.raises(ConfigError, match=r"batch\['advantages'\] has shape \(4, 1\); expected \(4,\)"):
        validate_batch_arrays(arrays, VOCAB)


# ------------------------------------------------------------------ finite values and settings


@pytest.mark.parametrize("field, value", [("advantages", np.nan), ("old_logps", -np.inf), ("ref_logps", np.nan)])
def test_train_batch_refuses_non_finite_values(field, value):
    batch = good_batch()
    batch[field] = batch[field].copy()
    batch[field].flat[1] = value
    with pytest.raises(ConfigError, match=rf"TrainBatch\.{field} holds .*must be finite"):
        TrainBatch(**batch)


@pytest.mark.parametrize(
    "knobs, name",
    [
        ({"learning_rate": math.nan}, "learning_rate"),
        ({"learning_rate": math.inf}, "learning_rate"),
        ({"beta": math.nan}, "beta"),
        ({"epsilon": math.nan}, "epsilon"),
        ({"mini_batch_size": 2.5}, "mini_batch_size"),
    ],
)
def test_training_config_refuses_non_finite_or_fractional_knobs(knobs, name):
    with pytest.raises(ConfigError, match=name):
        TrainingConfig(**knobs)


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"temperature": math.nan}, "temperature must be >= 0 .* and finite, got nan"),
        ({"temperature": math.inf}, "temperature must be >= 0 .* and finite, got inf"),
        ({"max_tokens_to_generate": 4.0}, "max_tokens_to_generate must be an int, got float"),
    ],
)
def test_rollout_config_refuses_non_finite_temperature_and_float_lengths(knobs, message):
    with pytest.raises(ConfigError, match=message):
        RolloutConfig(**knobs)


@pytest.mark.parametrize("temperature", [math.nan, math.inf, -1.0])
def test_sampler_and_scorer_refuse_bad_temperatures(split_model, temperature):
    with pytest.raises(ConfigError, match="temperature must be >= 0"):
        sample(*split_model, TOK, ["hi"], max_new_tokens=2, temperature=temperature, cache_size=32, seed=0)
    batch = good_batch()
    with pytest.raises(ConfigError, match="temperature must be >= 0"):
        logps_from_state(*split_model, batch["prompt_tokens"], batch["completion_tokens"], TOK.pad_id, temperature)


def test_sampler_refuses_a_float_length(split_model):
    with pytest.raises(TypeError, match="max_new_tokens must be a positive int, got float"):
        sample(*split_model, TOK, ["hi"], max_new_tokens=2.5, temperature=1.0, cache_size=32, seed=0)


@pytest.mark.parametrize("size", [0, -1])
@pytest.mark.cluster
def test_micro_batch_size_must_be_positive(cluster, size):
    batch = good_batch()
    with pytest.raises(ConfigError, match=f"micro_batch_size must be a positive int .* got {size}"):
        cluster.per_token_logps(Role.ACTOR, batch["prompt_tokens"], batch["completion_tokens"], micro_batch_size=size)


def test_empty_batches_are_clear_errors(split_model):
    with pytest.raises(ConfigError, match="empty batch"):
        mini_batches(0, None)
    with pytest.raises(ConfigError, match="empty batch cannot be scored"):
        logps_from_state(*split_model, np.zeros((0, 3), np.int32), np.zeros((0, 2), np.int32), TOK.pad_id)


# ------------------------------------------------------------------ a string is not a list of prompts


@pytest.mark.cluster
def test_engine_generate_refuses_a_bare_string(cluster):
    with pytest.raises(TypeError, match=r"prompts must be a list of prompt strings.*pass \['hello'\]"):
        cluster.rollout.generate("hello", cluster.get_rollout_config())


def test_sampler_refuses_a_bare_string_and_non_strings(split_model):
    kw = dict(max_new_tokens=2, temperature=1.0, cache_size=32, seed=0)
    with pytest.raises(TypeError, match=r"pass \[b'hi'\]"):
        sample(*split_model, TOK, b"hi", **kw)
    with pytest.raises(TypeError, match=r"prompts\[1\] must be a str, got int"):
        sample(*split_model, TOK, ["ok", 7], **kw)


@pytest.mark.cluster
def test_learner_refuses_a_bare_string(cluster):
    with pytest.raises(TypeError, match=r"pass \['hello'\]"):
        GRPOLearner(cluster, prompts="hello")


def test_validate_prompts_keeps_a_list_and_refuses_a_string():
    assert validate_prompts(("a", "b")) == ["a", "b"]
    with pytest.raises(TypeError, match="prompts must be a list"):
        validate_prompts("hello")


@pytest.mark.cluster
def test_cluster_generate_refuses_a_bare_string(cluster):
    with pytest.raises(TypeError, match=r"pass \['hello'\]"):
        cluster.generate("hello")


# ------------------------------------------------------------------ property: no malformed batch passes

FLOAT_FIELDS = ("advantages", "old_logps", "ref_logps")
ID_FIELDS = ("prompt_tokens", "completion_tokens")
CORRUPTIONS = {
    "trailing_axis": lambda x, r: x[..., None],
    "drop_row": lambda x, r: x[1:],
    "extra_column": lambda x, r: np.concatenate([x, x[:, :1]], axis=-1) if x.ndim == 2 else np.tile(x, 2),
    "nan": lambda x, r: _put(x.astype(np.float32), r, np.nan),
    "inf": lambda x, r: _put(x.astype(np.float32), r, np.inf),
    "negative_id": lambda x, r: _put(x, r, -1),
    "id_past_vocab": lambda x, r: _put(x, r, VOCAB + int(r.integers(0, 10_000))),
    "float_ids": lambda x, r: x.astype(np.float32),
}
APPLIES = {
    "trailing_axis": FLOAT_FIELDS + ID_FIELDS,
    "drop_row": FLOAT_FIELDS + ("completion_tokens",),
    "extra_column": FLOAT_FIELDS,
    "nan": FLOAT_FIELDS,
    "inf": FLOAT_FIELDS,
    "negative_id": ID_FIELDS,
    "id_past_vocab": ID_FIELDS,
    "float_ids": ID_FIELDS,
}


def _put(x: np.ndarray, rng: np.random.Generator, value: float) -> np.ndarray:
    x = x.copy()
    x.flat[int(rng.integers(0, x.size))] = value
    return x


@st.composite
def batches(draw):
    """A well-formed batch, or one with a single field corrupted: (fields, the field corrupted or None)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    batch = good_batch(rng)
    if draw(st.booleans()):
        batch["ref_logps"] = None
    kind = draw(st.sampled_from([None, *CORRUPTIONS]))
    if kind is None:
        return batch, None
    field = draw(st.sampled_from([f for f in APPLIES[kind] if batch[f] is not None]))
    batch[field] = CORRUPTIONS[kind](batch[field], rng)
    return batch, field


@settings(max_examples=150, deadline=None)
@given(batches())
def test_property_a_malformed_batch_never_reaches_the_model(case):
    """Every corrupted batch is refused with an error that names the corrupted field, before any
    device work; every well-formed one passes."""
    batch, field = case
    try:
        TrainBatch(**batch).validate(VOCAB)
    except (ConfigError, TypeError) as err:
        assert field is not None, f"a well-formed batch was refused: {err}"
        assert f"TrainBatch.{field}" in str(err), (field, str(err))
    else:
        assert field is None, f"TrainBatch accepted a corrupted {field}"


# ------------------------------------------------------------------ every entry point: types


def _plan(**knobs):
    from rlcluster_lab.planner import plan_cluster

    return plan_cluster(**knobs)


NUMPY_NUMBERS = [
    (Scenario, {"sync_chunk_bytes": np.int64(16384)}),
    (Scenario, {"lora_rank": np.int32(4), "max_tokens": np.int64(8), "kv_cache_size": np.int64(64)}),
    (Scenario, {"seed": np.uint8(3), "temperature": np.float32(0.5), "lora": np.bool_(True)}),
    (RolloutConfig, {"max_tokens_to_generate": np.int64(8), "kv_cache_size": np.int16(64), "seed": np.int64(1)}),
    (RolloutConfig, {"temperature": np.float32(0.5), "rollout_vllm_tensor_parallel_size": np.int64(2)}),
    (
        RolloutConfig,
        {"rollout_sglang_jax_max_lora_rank": np.int64(4), "rollout_sglang_jax_lora_scaling": np.float32(1)},
    ),
    (TrainingConfig, {"learning_rate": np.float32(1e-3), "beta": np.float16(0.1), "epsilon": np.float32(0.2)}),
    (
        TrainingConfig,
        {"mini_batch_size": np.int64(4), "train_micro_batch_size": np.int64(2), "num_iterations": np.int8(2)},
    ),
    (LearnerConfig, {"steps": np.int64(2), "prompts_per_step": np.int32(2), "group_size": np.int64(4)}),
]


@pytest.mark.parametrize("make, knobs", NUMPY_NUMBERS, ids=lambda x: getattr(x, "__name__", None))
def test_numpy_numbers_are_taken_as_plain_numbers(make, knobs):
    made = make(**knobs)
    for name, value in knobs.items():
        got = getattr(made, name)
        assert type(got) is type(value.item()) and got == value.item(), (name, got)
    json.dumps(dataclasses.asdict(made))  # what a report does with it


def test_a_plan_of_numpy_numbers_is_json():
    plan = _plan(sync_chunk_bytes=np.int64(4096), vllm_tensor_parallel_size=np.int64(2), engine="vllm")
    json.dumps(plan.to_json())
    assert len(json.loads(json.dumps(_plan(devices_per_host=np.int64(4)).to_json()))["topology"]["hosts"]) == 2


def _tiny():
    return init_model("tiny", seed=0)


def _lab(devices):
    from rlcluster_lab.lab.widget.placement_lab import PlacementLab

    return PlacementLab(devices=devices, rehearse=False)


# (what is called, the argument it is given, the error, the words the message must have)
FOREIGN = [
    (lambda: Scenario(max_tokens="8"), ConfigError, "max_tokens must be an int, got str"),
    (lambda: Scenario(lora="no"), ConfigError, "lora must be True or False, got str 'no'"),
    (lambda: Scenario(with_reward=1), ConfigError, "with_reward must be True or False, got int"),
    (lambda: Scenario(temperature="hot"), ConfigError, "temperature must be a number, got str"),
    (lambda: Scenario(lora_rank=2.5), ConfigError, "lora_rank must be an int, got float"),
    (lambda: RolloutConfig(rollout_sglang_jax_max_lora_rank="4"), ConfigError, "rollout_sglang_jax_max_lora_rank"),
    (lambda: RolloutConfig(rollout_sglang_jax_lora_scaling="1"), ConfigError, "rollout_sglang_jax_lora_scaling"),
    (lambda: RolloutConfig(rollout_vllm_model_version=3), ConfigError, "rollout_vllm_model_version must be a str"),
    (lambda: LearnerConfig(steps="3"), ConfigError, "steps must be an int, got str"),
    (lambda: LearnerConfig(group_size=2.5), ConfigError, "group_size must be an int, got float"),
    (lambda: build_cluster("colocated"), TypeError, "scenario must be a Scenario .* got str"),
    (lambda: build_cluster(None), TypeError, "scenario must be a Scenario .* got NoneType"),
    (lambda: build_cluster(Scenario(), devices=8), TypeError, "devices must be a list of JAX devices .*got int"),
    (lambda: build_cluster(Scenario(), devices="cpu"), TypeError, "devices must be a list of JAX devices .*got str"),
    (lambda: build_cluster(Scenario(), devices=[0, 1]), TypeError, "devices must hold JAX devices, got int"),
    (lambda: build_cluster(Scenario(), devices=[]), ValueError, "devices is empty"),
    (lambda: build_cluster(Scenario(), devices=jax.devices()[:1] * 2), ValueError, "devices lists a device twice"),
    (lambda: _lab(5), TypeError, "devices must be a list of JAX devices .*got int"),
    (lambda: _lab([]), ValueError, "devices is empty"),
    (lambda: memory_report(None), TypeError, "memory_report takes a constructed cluster .* got NoneType"),
    (lambda: placement_report(None), TypeError, "cluster must be the lab's RLCluster .* got NoneType"),
    (lambda: GRPOLearner(None), TypeError, "cluster must be an RLCluster .* got NoneType"),
    (lambda: init_model(64), TypeError, "config must be a ModelConfig or a preset name .* got int"),
    (lambda: init_model("tiny", seed="1"), ConfigError, "seed must be an int, got str"),
    (lambda: with_lora(None, 4), TypeError, "base must be a TransformerLM .* got NoneType"),
    (lambda: with_lora(_tiny(), "4"), ConfigError, r"rank \(the LoRA rank\) must be an int >= 1, got str"),
    (lambda: _plan(lora_rank="4"), ConfigError, "lora_rank must be an int, got str"),
    (lambda: _plan(memory_per_device="80GB"), ValueError, "memory per device must be a positive number, got '80GB'"),
    (lambda: _plan(workload=16), TypeError, "workload must be a Workload .* got int"),
]


@pytest.mark.parametrize(
    "call, error, words", FOREIGN, ids=[w.split(" ")[0] + f"-{i}" for i, (_, _, w) in enumerate(FOREIGN)]
)
def test_a_foreign_argument_is_refused_naming_it_and_what_it_takes(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_cluster_config_takes_numpy_numbers_and_refuses_what_is_no_rollout_config():
    from rlcluster_lab import ClusterConfig, RLCluster, layout_meshes

    meshes = layout_meshes("colocated")
    assert type(ClusterConfig(role_to_mesh=meshes, sync_chunk_bytes=np.int64(64)).sync_chunk_bytes) is int
    with pytest.raises(ConfigError, match="offload_to_cpu must be True or False, got str"):
        ClusterConfig(role_to_mesh=meshes, offload_to_cpu="yes")
    # P6 decides what a rollout config is, when the cluster is made (None is refused there too).
    for value in (5, {Mode.TRAIN: "greedy"}):
        config = ClusterConfig(role_to_mesh=meshes, rollout_config=value)
        with pytest.raises(ConfigError, match="rollout_config must be a RolloutConfig or a dict from Mode to"):
            RLCluster(actor=init_model("tiny"), cluster_config=config)


@pytest.mark.parametrize("value", [None, 42, "x"])
def test_tunix_inspect_names_what_it_takes(value):
    pytest.importorskip("tunix")
    from rlcluster_lab import tunix as rt

    with pytest.raises(TypeError, match=f"rl_cluster must be Tunix's RLCluster .* got {type(value).__name__}"):
        rt.inspect(value)


@pytest.mark.parametrize("value", ["colocated", None, {}])
def test_tunix_side_by_side_names_what_it_takes(value):
    pytest.importorskip("tunix")
    from rlcluster_lab import tunix as rt

    with pytest.raises(TypeError, match=f"scenario must be a Scenario .* got {type(value).__name__}"):
        rt.side_by_side(value)


@pytest.mark.cluster
def test_tunix_inspect_of_the_labs_own_cluster_says_what_reads_it(cluster):
    pytest.importorskip("tunix")
    from rlcluster_lab import tunix as rt

    with pytest.raises(TypeError, match="got RLCluster .*the lab's own: read it with rlcluster_lab.placement_report"):
        rt.inspect(cluster)


@pytest.mark.cluster
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_generation_steps": -1}, "max_generation_steps must be an int >= 1, got -1"),
        ({"max_generation_steps": 2.5}, "max_generation_steps must be an int >= 1, got float"),
        ({"micro_batch_size": "2"}, "micro_batch_size must be an int >= 1, got str"),
        ({"mode": "training"}, "unknown rollout mode 'training'"),
    ],
)
def test_cluster_generate_names_the_argument_passed(cluster, kwargs, words):
    with pytest.raises(ConfigError, match=words) as refused:
        cluster.generate(["hi"], **kwargs)
    assert "max_tokens_to_generate" not in str(refused.value)


@pytest.mark.cluster
def test_cluster_methods_refuse_foreign_arguments_by_name(cluster):
    batch = good_batch()
    with pytest.raises(TypeError, match="prompt_tokens must be a \\(batch, length\\) array of token ids, got NoneType"):
        cluster.get_ref_per_token_logps(None, batch["completion_tokens"])
    with pytest.raises(ValueError, match="unknown role 5"):
        cluster.rules_for(5)
    with pytest.raises(TypeError, match="sync must be the SyncReport .* got 5"):
        placement_report(cluster, sync=5)
    with pytest.raises(TypeError, match="config must be a LearnerConfig, got int"):
        GRPOLearner(cluster, 5)


@pytest.mark.cluster
def test_a_numpy_chunk_size_makes_a_json_report():
    cluster = build_cluster(Scenario(layout="reshaped", sync_chunk_bytes=np.int64(16384), max_tokens=4))
    report = placement_report(cluster, sync=cluster.sync_weights()).to_json()
    assert json.loads(json.dumps(report))["sync"]["transient_peak"]["chunk_bytes"] == 16384
