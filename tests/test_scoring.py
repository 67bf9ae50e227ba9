"""Reward and value models: scores per token and per sequence, padding, sharding."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from rlcluster_lab.core.meshes import make_mesh
from rlcluster_lab.model import get_model_config
from rlcluster_lab.model.scoring import ScoreModel, init_score_model, scores_from_state
from rlcluster_lab.model.tokenizer import PAD_ID
from rlcluster_lab.placement.place import place_model

PAD = PAD_ID
B, P, C = 4, 6, 5


@pytest.fixture(scope="module")
def model():
    return init_score_model("tiny", seed=0)


@pytest.fixture(scope="module")
def split(model):
    return nnx.split(model)


def _batch(seed=0):
    """Prompts left-padded, completions right-padded (row 3 has no padding)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 256, (B, P)).astype(np.int32)
    completion = rng.integers(0, 256, (B, C)).astype(np.int32)
    prompt[0, :3] = PAD
    prompt[1, :1] = PAD
    completion[0, 3:] = PAD
    completion[1, 1:] = PAD
    completion[2, 4:] = PAD
    return prompt, completion


def _scores(split, prompt, completion, per_token):
    graphdef, state = split
    return np.asarray(scores_from_state(graphdef, state, prompt, completion, PAD, per_token=per_token))


def test_score_model_has_backbone_and_scalar_head(model):
    assert isinstance(model, ScoreModel)
    assert model.config == get_model_config("tiny")
    assert model.score_head.kernel.get_value().shape == (model.config.embed_dim, 1)


def test_per_token_shape_and_dtype(split):
    prompt, completion = _batch()
    out = _scores(split, prompt, completion, per_token=True)
    assert out.shape == (B, C)
    assert out.dtype == np.float32


def test_per_token_zero_at_pad_completion_positions(split):
    prompt, completion = _batch()
    out = _scores(split, prompt, completion, per_token=True)
    pad = completion == PAD
    assert pad.any()
    assert np.all(out[pad] == 0.0)
    # Real positions carry the head's outputs, not zeros.
    assert np.all(out[~pad] != 0.0)


def test_per_sequence_shape(split):
    prompt, completion = _batch()
    assert _scores(split, prompt, completion, per_token=False).shape == (B,)


def test_per_sequence_equals_per_token_at_last_real_token(split):
    prompt, completion = _batch()
    per_token = _scores(split, prompt, completion, per_token=True)
    per_seq = _scores(split, prompt, completion, per_token=False)
    last = (completion != PAD).sum(axis=1) - 1
    assert list(last) == [2, 0, 3, 4]
    np.testing.assert_array_equal(per_seq, per_token[np.arange(B), last])


def test_per_sequence_all_pad_completion_scores_zero(split):
    prompt, completion = _batch()
    completion[2, :] = PAD
    assert _scores(split, prompt, completion, per_token=False)[2] == 0.0


def test_prompt_left_padding_does_not_change_scores(split):
    prompt, completion = _batch()
    padded = np.concatenate([np.full((B, 4), PAD, np.int32), prompt], axis=1)
    for per_token in (True, False):
        np.testing.assert_allclose(
            _scores(split, padded, completion, per_token),
            _scores(split, prompt, completion, per_token),
            rtol=1e-5,
            atol=1e-5,
        )


def test_per_token_values_are_causal(split):
    prompt, completion = _batch()
    changed = completion.copy()
    changed[3, 2] = (changed[3, 2] + 1) % 256
    a = _scores(split, prompt, completion, per_token=True)
    b = _scores(split, prompt, changed, per_token=True)
    np.testing.assert_allclose(b[3, :2], a[3, :2], rtol=1e-6, atol=1e-6)
    assert not np.allclose(b[3, 2:], a[3, 2:])
    np.testing.assert_array_equal(b[:3], a[:3])


def test_scores_depend_on_the_state(split):
    prompt, completion = _batch()
    other = nnx.split(init_score_model("tiny", seed=1))
    assert not np.allclose(_scores(other, prompt, completion, True), _scores(split, prompt, completion, True))


@pytest.fixture(scope="module")
def sharded(model):
    mesh = make_mesh(jax.devices(), (2, 4))
    placed = place_model(model, mesh)
    return mesh, nnx.split(placed)


def test_sharded_state_is_on_the_mesh_and_split(sharded):
    mesh, (_, state) = sharded
    leaves = jax.tree.leaves(state)
    assert all(isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh for x in leaves)
    # At least one leaf is really cut into pieces, not only replicated.
    assert any(not x.sharding.is_fully_replicated for x in leaves)


@pytest.mark.parametrize("per_token", [True, False])
def test_sharded_state_scores_equal_unsharded(split, sharded, per_token):
    prompt, completion = _batch()
    _, sharded_split = sharded
    np.testing.assert_allclose(
        _scores(sharded_split, prompt, completion, per_token),
        _scores(split, prompt, completion, per_token),
        rtol=1e-5,
        atol=1e-5,
    )
