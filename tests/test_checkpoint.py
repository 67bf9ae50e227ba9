"""Saving a model to a folder and loading it back (a role given as a path)."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx

from rlcluster_lab.model import LoRALinear, TransformerLM, get_model_config, init_model, is_lora, with_lora
from rlcluster_lab.model.checkpoint import load, save
from rlcluster_lab.model.scoring import ScoreModel, init_score_model


def _variables(model):
    """(path, Variable type, shape, dtype) for every variable, in graph order."""
    return [
        (path, type(v), v.get_value().shape, v.get_value().dtype)
        for path, v in nnx.iter_graph(model)
        if isinstance(v, nnx.Variable)
    ]


def _values(model):
    return {path: np.asarray(v.get_value()) for path, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)}


def _assert_same_model(a, b):
    assert type(a) is type(b)
    assert a.config == b.config
    assert _variables(a) == _variables(b)
    va, vb = _values(a), _values(b)
    assert va.keys() == vb.keys()
    for path in va:
        np.testing.assert_array_equal(va[path], vb[path], err_msg=str(path))


def _lora_model():
    model = with_lora(init_model("tiny", seed=3), 4, seed=1, alpha=8.0)
    # Non-zero adapters, so a load that left lora_b at its initial zeros would show.
    state = nnx.state(model, nnx.LoRAParam)
    state = jax.tree.map(lambda x: x + 0.5, state)
    nnx.update(model, state)
    return model


def test_round_trip_plain_model(tmp_path):
    model = init_model("tiny", seed=5)
    loaded = load(save(model, tmp_path / "plain"))
    assert isinstance(loaded, TransformerLM)
    assert not is_lora(loaded)
    _assert_same_model(model, loaded)


def test_round_trip_plain_model_differs_from_fresh_init(tmp_path):
    # The loaded values come from the file, not from the loader's own initialisation.
    model = init_model("tiny", seed=5)
    loaded = load(save(model, tmp_path / "plain"))
    fresh = _values(init_model("tiny", seed=0))
    got = _values(loaded)
    assert any(not np.array_equal(fresh[p], got[p]) for p in got)


def test_round_trip_lora_model_keeps_lora(tmp_path):
    model = _lora_model()
    loaded = load(save(model, tmp_path / "lora"))
    assert is_lora(loaded)
    _assert_same_model(model, loaded)


def test_round_trip_lora_model_keeps_rank_and_scale(tmp_path):
    model = _lora_model()
    loaded = load(save(model, tmp_path / "lora"))
    layers = [n for _, n in nnx.iter_graph(loaded) if isinstance(n, LoRALinear)]
    assert len(layers) == 7  # one per adapted projection, its adapters stacked over the layers
    assert {layer.lora_a.get_value().shape[0] for layer in layers} == {get_model_config("tiny").num_layers}
    assert {layer.lora_a.get_value().shape[-1] for layer in layers} == {4}
    assert {layer.scale for layer in layers} == {2.0}


def test_round_trip_lora_model_same_outputs(tmp_path):
    model = _lora_model()
    loaded = load(save(model, tmp_path / "lora"))
    tokens = np.arange(12, dtype=np.int32).reshape(2, 6)
    positions = np.tile(np.arange(6, dtype=np.int32), (2, 1))
    want, _ = model(tokens, positions)
    got, _ = loaded(tokens, positions)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_round_trip_score_model(tmp_path):
    model = init_score_model("tiny", seed=2)
    loaded = load(save(model, tmp_path / "score"))
    assert isinstance(loaded, ScoreModel)
    assert not is_lora(loaded)
    _assert_same_model(model, loaded)


def test_round_trip_bfloat16_model(tmp_path):
    cfg = dataclasses.replace(get_model_config("tiny"), param_dtype="bfloat16")
    model = init_model(cfg, seed=1)
    loaded = load(save(model, tmp_path / "bf16"))
    assert {dtype for *_, dtype in _variables(loaded)} == {np.dtype(jax.numpy.bfloat16)}
    _assert_same_model(model, loaded)


def test_save_writes_config_and_params(tmp_path):
    folder = save(_lora_model(), tmp_path / "x")
    meta = json.loads((folder / "config.json").read_text())
    assert meta["kind"] == "lm"
    assert meta["lora_rank"] == 4
    assert meta["config"]["name"] == "tiny"
    assert (folder / "params.npz").is_file()


def test_load_missing_folder_raises_helpful_file_not_found(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as err:
        load(missing)
    msg = str(err.value)
    assert str(missing) in msg
    assert "config.json" in msg
    assert "checkpoint.save" in msg


def test_load_params_with_missing_key_raises_value_error(tmp_path):
    folder = save(init_model("tiny"), tmp_path / "m")
    with np.load(folder / "params.npz") as data:
        arrays = {k: data[k] for k in data.files}
    arrays.pop(sorted(arrays)[0])
    np.savez(folder / "params.npz", **arrays)
    with pytest.raises(ValueError, match="do not match its config.json"):
        load(folder)


def test_load_params_with_wrong_shape_raises_value_error(tmp_path):
    folder = save(init_model("tiny"), tmp_path / "m")
    with np.load(folder / "params.npz") as data:
        arrays = {k: data[k] for k in data.files}
    key = sorted(arrays)[0]
    arrays[key] = arrays[key][:-1]
    np.savez(folder / "params.npz", **arrays)
    with pytest.raises(ValueError, match="shape"):
        load(folder)


def test_load_params_with_wrong_dtype_raises_value_error(tmp_path):
    folder = save(init_model("tiny"), tmp_path / "m")
    with np.load(folder / "params.npz") as data:
        arrays = {k: data[k] for k in data.files}
    key = sorted(arrays)[0]
    arrays[key] = arrays[key].astype(np.float16)
    np.savez(folder / "params.npz", **arrays)
    with pytest.raises(ValueError, match="float16"):
        load(folder)


def test_load_truncated_params_file_raises_value_error(tmp_path):
    folder = save(init_model("tiny"), tmp_path / "m")
    raw = (folder / "params.npz").read_bytes()
    (folder / "params.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="cannot be read"):
        load(folder)


def test_load_lora_config_with_plain_params_raises_value_error(tmp_path):
    plain = save(init_model("tiny"), tmp_path / "plain")
    lora = save(_lora_model(), tmp_path / "lora")
    (lora / "params.npz").write_bytes((plain / "params.npz").read_bytes())
    with pytest.raises(ValueError):
        load(lora)


def test_load_foreign_config_format_raises_value_error(tmp_path):
    folder = save(init_model("tiny"), tmp_path / "m")
    meta = json.loads((folder / "config.json").read_text())
    meta["format"] = "other/9"
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="not an rlcluster-lab checkpoint"):
        load(folder)


def _as_per_layer(folder, num_layers):
    """Rewrite a checkpoint's params.npz in the layout of a model whose layers were a list: one
    member per layer (``blocks/0/attn/q/kernel``), without the layer axis."""
    with np.load(folder / "params.npz") as npz:
        stacked = {name: npz[name] for name in npz.files}
    members = {}
    for name, value in stacked.items():
        parts = name.split("/")
        if "blocks" not in parts[:-1]:
            members[name] = value
            continue
        at = parts.index("blocks") + 1
        assert value.shape[0] == num_layers
        for layer in range(num_layers):
            members["/".join([*parts[:at], str(layer), *parts[at:]])] = value[layer]
    np.savez(folder / "params.npz", **members)
    return members


_PER_LAYER_MODELS = {
    "plain": lambda: init_model("tiny", seed=5),
    "lora": _lora_model,
    "score": lambda: init_score_model("tiny", seed=2),
    "bfloat16-3-layers": lambda: init_model(
        dataclasses.replace(get_model_config("tiny"), num_layers=3, param_dtype="bfloat16"), seed=4
    ),
}


@pytest.mark.parametrize("kind", list(_PER_LAYER_MODELS))
def test_a_checkpoint_saved_with_one_member_per_layer_loads_as_the_layer_stack(tmp_path, kind):
    model = _PER_LAYER_MODELS[kind]()
    folder = save(model, tmp_path / kind)
    num_layers = model.config.num_layers
    members = _as_per_layer(folder, num_layers)
    assert any(f"blocks/{num_layers - 1}/" in name for name in members)
    _assert_same_model(model, load(folder))


def test_a_per_layer_checkpoint_missing_a_layer_is_refused_naming_the_member(tmp_path):
    folder = save(init_model("tiny", seed=5), tmp_path / "old")
    members = _as_per_layer(folder, get_model_config("tiny").num_layers)
    del members["blocks/1/mlp/up/kernel"]
    np.savez(folder / "params.npz", **members)
    with pytest.raises(ValueError, match=r"1 missing \(e\.g\. \['blocks/1/mlp/up/kernel\.npy'\]\)"):
        load(folder)
