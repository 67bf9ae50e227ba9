"""Sampler: agreement with forward log-probs, greedy determinism, EOS, errors."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.limits import LIMIT_ENV, TooLargeError
from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES, MESH_AXES
from rlcluster_lab.core.options import MIN_TEMPERATURE, RolloutConfig
from rlcluster_lab.model import init_model, logps_from_state, sampling
from rlcluster_lab.model.sampling import PROMPT_BUCKET, SampleOutput, sample
from rlcluster_lab.model.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
PROMPTS = ["hello", "a", "the quick brown fox", "xyz", "1+1=", "", "zz", "abcdefgh"]


@pytest.fixture(scope="module")
def split_model():
    return nnx.split(init_model("tiny", seed=0))


def _sample(graphdef, state, temperature, seed=0, **kw):
    args = dict(
        max_new_tokens=16, temperature=temperature, cache_size=48, seed=seed, eos_id=TOK.eos_id, pad_id=TOK.pad_id
    )
    args.update(kw)
    return sample(graphdef, state, TOK, PROMPTS, **args)


def _check_logps(graphdef, state, out, temperature, atol=1e-4):
    expected = logps_from_state(graphdef, state, out.prompt_tokens, out.tokens, TOK.pad_id, temperature)
    np.testing.assert_allclose(out.logprobs, np.asarray(expected), atol=atol)


def test_output_shapes(split_model):
    out = _sample(*split_model, 1.0)
    assert isinstance(out, SampleOutput)
    assert out.tokens.shape == (8, 16) and out.logprobs.shape == (8, 16)
    assert out.logprobs.dtype == np.float32
    # Prompts are left-padded to a multiple of PROMPT_BUCKET (one program serves nearby lengths).
    longest = len(TOK.encode(PROMPTS[2]))
    assert out.prompt_tokens.shape == (8, -(-longest // PROMPT_BUCKET) * PROMPT_BUCKET)
    assert len(out.text) == 8


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_forward(split_model, temperature):
    out = _sample(*split_model, temperature)
    _check_logps(*split_model, out, temperature)


def test_greedy_logprobs_match_forward(split_model):
    out = _sample(*split_model, 0.0)
    _check_logps(*split_model, out, 0.0)


def test_greedy_is_deterministic(split_model):
    a = _sample(*split_model, 0.0, seed=0)
    b = _sample(*split_model, 0.0, seed=5)
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_same_seed_same_samples(split_model):
    a = _sample(*split_model, 1.0, seed=3)
    b = _sample(*split_model, 1.0, seed=3)
    c = _sample(*split_model, 1.0, seed=4)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)


def test_eos_pads_the_rest(split_model):
    # Use a token greedy decoding is known to produce as the stop token.
    first = _sample(*split_model, 0.0)
    stop = int(first.tokens[0, 3])
    out = _sample(*split_model, 0.0, eos_id=stop)
    for row in out.tokens:
        hits = np.flatnonzero(row == stop)
        if hits.size:
            assert np.all(row[hits[0] + 1 :] == TOK.pad_id)
    assert stop in out.tokens[0, :4]  # row 0 really stopped early
    assert np.all(out.logprobs[out.tokens == TOK.pad_id] == 0)
    _check_logps(*split_model, out, 0.0)


def test_sharded_state_matches_unsharded(split_model):
    graphdef, state = split_model
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), MESH_AXES)
    with nnx.logical_axis_rules(DEFAULT_LOGICAL_AXIS_RULES):
        specs = nnx.get_partition_spec(state)
    sharded = jax.device_put(state, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
    a = _sample(graphdef, state, 0.0)
    b = _sample(graphdef, sharded, 0.0)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_empty_prompts_raise(split_model):
    with pytest.raises(ValueError, match="empty list of prompts"):
        sample(
            *split_model,
            TOK,
            [],
            max_new_tokens=4,
            temperature=1.0,
            cache_size=32,
            seed=0,
            eos_id=TOK.eos_id,
            pad_id=TOK.pad_id,
        )


def test_cache_too_small_raises(split_model):
    with pytest.raises(ValueError, match="raise cache_size"):
        _sample(*split_model, 1.0, cache_size=20)


def test_the_smallest_temperature_keeps_log_probs_finite_and_a_smaller_one_is_refused(split_model):
    """1e-40 is finite and positive, yet it flushes to 0 in float32: every log-prob was NaN."""
    out = _sample(*split_model, MIN_TEMPERATURE)
    assert np.isfinite(out.logprobs).all()
    scored = logps_from_state(*split_model, out.prompt_tokens, out.tokens, TOK.pad_id, MIN_TEMPERATURE)
    assert np.isfinite(np.asarray(scored)).all()
    for tiny in (1e-40, MIN_TEMPERATURE / 2):
        with pytest.raises(ConfigError, match="at least 1e-06 when not 0"):
            _sample(*split_model, tiny)
        with pytest.raises(ConfigError, match="at least 1e-06 when not 0"):
            RolloutConfig(temperature=tiny)


def test_generate_refuses_a_batch_whose_cache_cannot_fit_before_asking_xla(split_model, monkeypatch):
    """20,000 prompts under a 64 MiB limit reached XLA (8.4 GB peak); now refused from shapes."""
    monkeypatch.setenv(LIMIT_ENV, "64MiB")

    def must_not_run(*args, **kwargs):
        raise AssertionError("the sampler ran before its memory was checked")

    monkeypatch.setattr(sampling, "_run_generate", must_not_run)
    with pytest.raises(TooLargeError, match=r"generating for 20,000 prompts .* estimated from shapes"):
        sample(*split_model, TOK, ["abcdefgh"] * 20_000, max_new_tokens=8, temperature=1.0, cache_size=128, seed=0)
    # The estimate covers the cache twice over, the prefill's logits and the sampler's buffers.
    config = init_model("tiny").config
    kv = 2 * config.num_layers * 20_000 * 128 * config.num_kv_heads * config.head_dim * 4
    assert sampling.generate_bytes(config, 20_000, 16, 128, 8) > 2 * kv + 20_000 * 16 * config.vocab_size * 4
