"""Transformer model: sizes, sharding metadata, LoRA, cache and sharded forward."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES, MESH_AXES
from rlcluster_lab.core.options import LORA_TARGETS
from rlcluster_lab.core.states import model_split, model_state
from rlcluster_lab.model import (
    MODEL_SIZES,
    LoRALinear,
    forward_logps,
    get_model_config,
    init_cache,
    init_model,
    is_lora,
    logps_from_state,
    with_lora,
)

TINY = get_model_config("tiny")
PAD = 256


def _count(model, filt=nnx.Param):
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, filt)))


def _params(model):
    """(path, Variable) of every Param in the model, LoRAParam included."""
    return [(p, v) for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Param)]


def _mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), MESH_AXES)


def _shard(state, mesh):
    with nnx.logical_axis_rules(DEFAULT_LOGICAL_AXIS_RULES):
        specs = nnx.get_partition_spec(state)
    return jax.device_put(state, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))


def _batch(seed=0, b=4, p=6, c=5):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 256, (b, p)).astype(np.int32)
    completion = rng.integers(0, 256, (b, c)).astype(np.int32)
    prompt[0, :3] = PAD  # left padding
    prompt[1, :1] = PAD
    completion[0, 3:] = PAD  # right padding
    return prompt, completion


@pytest.fixture(scope="module")
def tiny():
    return init_model("tiny", seed=0)


def test_tiny_config_values():
    c = TINY
    assert (
        c.vocab_size,
        c.embed_dim,
        c.num_layers,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.mlp_dim,
        c.max_seq_len,
    ) == (264, 64, 2, 4, 2, 16, 128, 128)


@pytest.mark.parametrize("name", list(MODEL_SIZES))
def test_sharded_dims_divisible_by_8(name):
    c = MODEL_SIZES[name]
    for dim in (c.vocab_size, c.embed_dim, c.q_dim, c.kv_dim, c.mlp_dim):
        assert dim % 8 == 0


def test_preset_param_ranges():
    counts = {n: c.num_params for n, c in MODEL_SIZES.items()}
    assert 1e6 <= counts["small"] <= 2e6
    assert 8e6 <= counts["base"] <= 12e6
    assert 40e6 <= counts["large"] <= 60e6


def test_unknown_size_lists_known_ones():
    with pytest.raises(ValueError, match="tiny, small, base, large"):
        get_model_config("huge")


def test_config_rejects_bad_heads():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        dataclasses.replace(TINY, num_kv_heads=3)


def test_config_rejects_non_positive():
    with pytest.raises(ValueError, match="embed_dim"):
        dataclasses.replace(TINY, embed_dim=0)


@pytest.mark.parametrize("tie", [False, True])
def test_num_params_matches_model(tie):
    config = dataclasses.replace(TINY, tie_embeddings=tie)
    model = init_model(config)
    assert _count(model) == config.num_params


def test_lora_params_matches_model(tiny):
    lora = with_lora(tiny, 4, seed=1)
    assert _count(lora, nnx.LoRAParam) == TINY.lora_params(4)
    assert _count(lora, nnx.Param) == TINY.num_params + TINY.lora_params(4)


def test_lora_shapes_cover_the_projections_with_lora_adapts():
    # lora_shapes() writes each projection beside its shape; the adapted ones are core.model_config's.
    assert tuple(TINY.lora_shapes()) == LORA_TARGETS


def test_every_param_has_logical_sharding(tiny):
    lora = with_lora(tiny, 4, seed=1)
    for model in (tiny, lora):
        for path, var in _params(model):
            axes = var.get_metadata().get("out_sharding")
            assert axes is not None, path
            assert len(axes) == var.get_value().ndim, path


def test_partition_specs_use_only_mesh_axes(tiny):
    lora = with_lora(tiny, 4, seed=1)
    with nnx.logical_axis_rules(DEFAULT_LOGICAL_AXIS_RULES):
        specs = nnx.get_partition_spec(nnx.state(lora))
    used = set()
    for spec in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)):
        used.update(a for a in spec if a is not None)
    assert used == {"fsdp", "tp"}


def test_with_lora_shares_buffers(tiny):
    lora = with_lora(tiny, 4, seed=1)
    base_vars = dict(_params(tiny))
    shared = 0
    for path, var in _params(lora):
        if isinstance(var, nnx.LoRAParam):
            continue
        base_path = path
        base_var = base_vars[base_path]
        assert var is not base_var
        assert var.get_value() is base_var.get_value()
        ptrs = [s.data.unsafe_buffer_pointer() for s in var.get_value().addressable_shards]
        base_ptrs = [s.data.unsafe_buffer_pointer() for s in base_var.get_value().addressable_shards]
        assert ptrs == base_ptrs
        shared += 1
    assert shared == len(base_vars)


def test_with_lora_copy_base_makes_new_buffers(tiny):
    lora = with_lora(tiny, 4, seed=1, copy_base=True)
    base_vars = dict(_params(tiny))
    for path, var in _params(lora):
        if isinstance(var, nnx.LoRAParam):
            continue
        base_val = base_vars[path].get_value()
        val = var.get_value()
        assert val is not base_val
        assert val.unsafe_buffer_pointer() != base_val.unsafe_buffer_pointer()
        np.testing.assert_array_equal(np.asarray(val), np.asarray(base_val))


def test_with_lora_does_not_share_variables(tiny):
    lora = with_lora(tiny, 4, seed=1)
    before = tiny.blocks.attn.q.kernel.get_value()
    lora.blocks.attn.q.kernel.set_value(jnp.zeros_like(before))
    assert tiny.blocks.attn.q.kernel.get_value() is before


def test_with_lora_keeps_sharded_buffers():
    mesh = _mesh()
    graphdef, state = nnx.split(init_model("tiny"))
    base = nnx.merge(graphdef, _shard(state, mesh))
    lora = with_lora(base, 4, seed=1)
    a = lora.blocks.mlp.down.kernel.get_value()
    b = base.blocks.mlp.down.kernel.get_value()
    assert len(a.addressable_shards) == 8
    assert [s.data.unsafe_buffer_pointer() for s in a.addressable_shards] == [
        s.data.unsafe_buffer_pointer() for s in b.addressable_shards
    ]


def test_lora_output_equals_base_at_init(tiny):
    lora = with_lora(tiny, 4, seed=1)
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)
    pos = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (2, 8))
    np.testing.assert_array_equal(np.asarray(lora(tokens, pos)[0]), np.asarray(tiny(tokens, pos)[0]))


def test_lora_alpha_scales_adapter_term(tiny):
    x = jax.random.normal(jax.random.key(0), (3, TINY.embed_dim))
    deltas = []
    for alpha in (4.0, 8.0):
        lora = with_lora(tiny, 4, seed=1, alpha=alpha)
        layer = lora.blocks.mlp.up
        layer.lora_b.set_value(jnp.ones_like(layer.lora_b.get_value()))
        deltas.append(layer(x) - x @ layer.kernel.get_value())
    np.testing.assert_allclose(np.asarray(deltas[1]), 2 * np.asarray(deltas[0]), rtol=1e-5)


def test_lora_filter_selects_adapters(tiny):
    lora = with_lora(tiny, 4, seed=1)
    adapters = jax.tree.leaves(nnx.state(lora, nnx.LoRAParam))
    assert len(adapters) == 14  # two per adapted projection, every layer in one stacked array
    assert all(a.shape[0] == TINY.num_layers for a in adapters)
    assert is_lora(lora) and not is_lora(tiny)
    q = lora.blocks.attn.q
    assert isinstance(q, LoRALinear) and isinstance(q.kernel, nnx.Param)
    assert not isinstance(q.kernel, nnx.LoRAParam)
    assert q.lora_a.get_metadata()["out_sharding"] == (None, "embed", None)
    assert q.lora_b.get_metadata()["out_sharding"] == (None, None, "q_heads")


def test_bfloat16_model_runs():
    model = init_model(dataclasses.replace(TINY, param_dtype="bfloat16"))
    assert model.blocks.attn.q.kernel.get_value().dtype == jnp.bfloat16
    prompt, completion = _batch()
    logps = logps_from_state(*nnx.split(model), prompt, completion, PAD)
    assert logps.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logps)))


def test_forward_logps_zero_at_padding_and_negative_elsewhere(tiny):
    prompt, completion = _batch()
    logps = np.asarray(forward_logps(tiny, prompt, completion, PAD))
    assert logps.shape == completion.shape
    assert np.all(logps[completion == PAD] == 0)
    assert np.all(logps[completion != PAD] < 0)


def test_forward_logps_ignores_left_padding(tiny):
    prompt, completion = _batch()
    row = forward_logps(tiny, prompt[:1], completion[:1], PAD)
    unpadded = forward_logps(tiny, prompt[:1, 3:], completion[:1], PAD)
    np.testing.assert_allclose(np.asarray(row), np.asarray(unpadded), atol=1e-5)


def test_logps_from_state_matches_eager(tiny):
    prompt, completion = _batch()
    graphdef, state = nnx.split(tiny)
    expected = forward_logps(tiny, prompt, completion, PAD, 0.7)
    got = logps_from_state(graphdef, state, prompt, completion, PAD, 0.7)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5)


def test_sharded_forward_equals_unsharded(tiny):
    prompt, completion = _batch()
    graphdef, state = nnx.split(with_lora(tiny, 4, seed=2))
    expected = logps_from_state(graphdef, state, prompt, completion, PAD)
    sharded = _shard(state, _mesh())
    kernel = sharded["blocks"]["attn"]["q"]["kernel"].get_value()
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tp")  # the layer axis unsharded
    got = logps_from_state(graphdef, sharded, prompt, completion, PAD)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5)


def test_cached_decode_equals_full_forward(tiny):
    tokens = jax.random.randint(jax.random.key(3), (2, 10), 0, 256, dtype=jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(10, dtype=jnp.int32), (2, 10))
    full, none_cache = tiny(tokens, pos)
    assert none_cache is None
    call = nnx.jit(lambda m, t, p, c: m(t, p, cache=c))
    cache = init_cache(TINY, 2, 16)
    prefill, cache = call(tiny, tokens[:, :6], pos[:, :6], cache)
    steps = [prefill]
    for t in range(6, 10):
        out, cache = call(tiny, tokens[:, t : t + 1], pos[:, t : t + 1], cache)
        steps.append(out)
    assert int(cache.index) == 10
    np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, axis=1)), np.asarray(full), atol=1e-4)


# --- model_state: nnx.state without a walk while the Variables stay --------------------------


def _pairs(state):
    return [(tuple(k), v) for k, v in nnx.to_flat_state(state)]


def _same_as_nnx_state(model, *filters):
    got, want = model_state(model, *filters), nnx.state(model, *filters)
    got, want = (got, want) if filters and len(filters) > 1 else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        gp, wp = _pairs(g), _pairs(w)
        assert [k for k, _ in gp] == [k for k, _ in wp]
        assert all(a is b for (_, a), (_, b) in zip(gp, wp))


@pytest.mark.parametrize("lora", [False, True])
def test_model_state_is_nnx_state_through_new_values_and_changed_structure(lora):
    """The same paths and the very same Variables as nnx.state, with any filters, after new values
    in the same Variables (kept walk), a Variable replaced, one added and one removed (new walk)."""
    model = init_model("tiny", seed=0)
    if lora:
        model = with_lora(model, 2, seed=1)
    filters = [(), (nnx.Param,), (nnx.LoRAParam,), (nnx.Not(nnx.LoRAParam),), (nnx.LoRAParam, ...)]
    for f in filters:
        _same_as_nnx_state(model, *f)
    # New values in the same Variables (a training step): the remembered walk holds.
    nnx.update(model, jax.tree.map(lambda x: x + 1, nnx.state(model)))
    for f in filters:
        _same_as_nnx_state(model, *f)
    kernel = model.blocks.attn.q.kernel
    model.blocks.attn.q.kernel = nnx.Param(kernel.get_value())  # the same array, a new Variable
    _same_as_nnx_state(model)
    model.blocks.attn.extra = nnx.Param(jnp.zeros(3))  # a Variable added
    _same_as_nnx_state(model)
    del model.blocks.attn.extra  # and removed
    _same_as_nnx_state(model)


def test_model_state_of_a_module_holding_one_variable_twice_walks_each_time():
    """One Variable in two places: nnx.state lists it once, the pytree twice; model_state follows nnx.state."""
    model = init_model("tiny", seed=0)
    model.blocks.attn.o.kernel = model.blocks.attn.q.kernel
    _same_as_nnx_state(model)
    _same_as_nnx_state(model)


def _same_as_nnx_split(model, *filters):
    got, want = model_split(model, *filters), nnx.split(model, *filters)
    assert len(got) == len(want) and got[0] == want[0]
    for g, w in zip(got[1:], want[1:], strict=True):
        gp, wp = _pairs(g), _pairs(w)
        assert [k for k, _ in gp] == [k for k, _ in wp]
        assert all(a is b for (_, a), (_, b) in zip(gp, wp))
    return got[0]


@pytest.mark.parametrize("lora", [False, True])
def test_model_split_is_nnx_split_and_keeps_its_graphdef_while_the_variables_stay(lora):
    """The graphdef and states of nnx.split with any filters; the very same graphdef object call
    after call, through new values in the same Variables; a new one (equal to nnx.split's) once a
    Variable is replaced, added or removed."""
    model = init_model("tiny", seed=3)
    if lora:
        model = with_lora(model, 2, seed=1)
    filters = [(), (nnx.Param,), (nnx.LoRAParam, ...), (nnx.Not(nnx.LoRAParam), ...)]
    first = _same_as_nnx_split(model)
    for f in filters:
        assert _same_as_nnx_split(model, *f) is first
    nnx.update(model, jax.tree.map(lambda x: x * 2, nnx.state(model)))
    assert _same_as_nnx_split(model, nnx.Param, ...) is first
    model.blocks.mlp.extra = nnx.Param(jnp.ones(2))
    added = _same_as_nnx_split(model)
    assert added is not first and added != first
    del model.blocks.mlp.extra
    assert _same_as_nnx_split(model) == first


def test_the_models_config_is_found_again_without_hashing_its_graph(monkeypatch):
    """Hashing a graphdef walks the whole module graph: a graphdef seen before is known by
    identity, so the per-call lookups (vocabulary, compiler options) hash nothing."""
    from flax.nnx import graphlib

    from rlcluster_lab.model.logps import model_config_of

    config = dataclasses.replace(TINY, num_layers=3)
    graphdef, state = model_split(init_model(config, seed=1))
    assert model_config_of(graphdef, state) == config
    hashed = []
    real_hash = graphlib.GraphDef.__hash__
    monkeypatch.setattr(graphlib.GraphDef, "__hash__", lambda self: hashed.append(1) or real_hash(self))
    for _ in range(3):
        assert model_config_of(graphdef, state) == config
        assert model_split(init_model(config, seed=1))[0] == graphdef  # a new model: its own graphdef
    assert model_config_of(*model_split(init_model(TINY))) == TINY
    hashed.clear()
    assert model_config_of(graphdef, state) == config
    assert hashed == []


@pytest.mark.parametrize("seed", range(4))
def test_the_kv_cache_bytes_are_one_figure_for_the_cache_the_planner_and_the_sampler(seed):
    """``ModelConfig.kv_cache_bytes`` is the size of ``init_cache``'s arrays, and the planner's
    per-device figure splits exactly that over kv heads, over drawn shapes and dtypes."""
    from rlcluster_lab.model.sampling import generate_bytes
    from rlcluster_lab.planner.step_memory import Split, kv_cache_bytes

    rng = np.random.default_rng(seed)
    kv_heads, rows_ways, heads_ways = (int(rng.choice([1, 2, 4])) for _ in range(3))
    config = dataclasses.replace(
        TINY,
        num_layers=int(rng.integers(1, 5)),
        num_kv_heads=kv_heads * heads_ways,
        num_heads=kv_heads * heads_ways * int(rng.integers(1, 3)),
        head_dim=2 * int(rng.integers(1, 17)),
        param_dtype=str(rng.choice(["float32", "bfloat16"])),
    )
    rows, slots = rows_ways * int(rng.integers(1, 6)), int(rng.integers(1, 300))
    cache = jax.eval_shape(lambda: init_cache(config, rows, slots))
    held = sum(x.size * x.dtype.itemsize for x in (cache.k, cache.v))
    assert config.kv_cache_bytes(rows, slots) == held == kv_cache_bytes(config, rows, slots)
    split = Split(kv_heads=heads_ways)  # every row on each device (``Split``), its share of the kv heads
    assert kv_cache_bytes(config, rows, slots, split) * heads_ways == held
    # The sampler's peak holds the cache twice (the old and the new one of a decode step).
    assert generate_bytes(config, rows, 1, slots, 1) > 2 * held


@pytest.mark.parametrize("seed", range(6))
def test_the_mask_as_a_bias_gives_bit_for_bit_what_selecting_the_fill_did(seed):
    # Drawn scores (scaled up to large magnitudes too) and masks, fully masked rows among them:
    # adding mask_bias must equal selecting the most negative float where a key is not seen.
    from rlcluster_lab.model.transformer import mask_bias

    rng = np.random.default_rng(seed)
    shape = (3, 2, 2, 7, 9)
    scores = jnp.asarray(rng.normal(size=shape) * 10.0 ** rng.integers(0, 6), jnp.float32)
    mask = rng.random((3, 7, 9)) < rng.random()
    mask[0, 0] = False  # a padding query: every key masked
    mask = jnp.asarray(mask)
    selected = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    added = scores + mask_bias(mask)[:, None, None]
    assert np.array_equal(np.asarray(selected), np.asarray(added))
    probs = jax.nn.softmax(added, axis=-1)
    assert np.array_equal(np.asarray(jax.nn.softmax(selected, axis=-1)), np.asarray(probs))
    assert np.isfinite(np.asarray(probs)).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_projection_barriers_keep_every_value_and_sit_once_in_the_scanned_layer(seed, monkeypatch):
    # The barriers only keep XLA from fusing a projection with the rotary arithmetic (a compile-
    # time matter on TPUs): the logits and gradients must be bit for bit those without them, and
    # the scan's one layer body holds one per projection, whatever the depth.
    rng = np.random.default_rng(seed)
    config = dataclasses.replace(TINY, num_layers=int(rng.integers(1, 5)))
    model = init_model(config, seed=seed)
    if rng.integers(0, 2):
        model = with_lora(model, int(rng.integers(1, 5)), seed=seed)
    b, t = int(rng.integers(1, 4)), int(rng.integers(2, 12))
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (b, t)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))

    def logits_and_grads(m):
        loss = lambda m: m(tokens, positions)[0].astype(jnp.float32).sum()  # noqa: E731
        value, grads = nnx.value_and_grad(loss)(m)
        return m(tokens, positions)[0], value, grads

    def run():
        out = jax.jit(logits_and_grads)(model)
        return jax.tree.map(np.asarray, (out[0], out[1], nnx.state(out[2])))

    lowered = jax.jit(lambda m: m(tokens, positions)[0]).lower(model).as_text()
    assert lowered.count("stablehlo.optimization_barrier") == 3
    with_barriers = run()
    monkeypatch.setattr(jax.lax, "optimization_barrier", lambda x: x)
    without = run()
    assert jax.tree.structure(with_barriers) == jax.tree.structure(without)
    for a, b_ in zip(jax.tree.leaves(with_barriers), jax.tree.leaves(without), strict=True):
        np.testing.assert_array_equal(a, b_)
