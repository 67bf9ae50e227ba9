"""P13's handover reads the handed-over tree and sets the rollout's Variables through the engine's
variable index (``engines.base._VariableIndex``), which keeps what it worked out between syncs: where
each path sits in the handed-over tree, which source Variables may be read raw. Checked here over
drawn trees: the values it reads and sets are those Flax's own ``get_value``/``set_value`` give,
hooks and all, whatever changed since the last read."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import errors as flax_errors
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcluster_lab.engines.base import _VariableIndex


class _Doubled(nnx.Param):
    """A parameter of a type that transforms its value (Flax's way): never to be read or set raw."""

    def get_value(self, **kwargs):
        return super().get_value(**kwargs) * 2

    def set_value(self, value, **kwargs):
        super().set_value(value + 0.5, **kwargs)


class _Model(nnx.Module):
    def __init__(self, names: list[str], hooked: set[str], seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.parts = nnx.Dict(
            {
                n: (_Doubled if n in hooked else nnx.Param)(jnp.asarray(rng.normal(size=(2, 3)), jnp.float32))
                for n in names
            }
        )


def _expected(index: _VariableIndex, params: nnx.State) -> list[np.ndarray]:
    """Each of the index's paths read the plain Flax way: the tree's own Variable, ``get_value``."""
    flat = dict(nnx.to_flat_state(params))
    return [np.asarray(flat[k].get_value()) for k in index.keys]


NAMES = st.lists(st.sampled_from(["a", "b", "c", "k", "q", "z"]), min_size=1, max_size=6, unique=True)


@settings(max_examples=25, deadline=None)
@given(names=NAMES, data=st.data())
def test_p13_the_index_reads_a_tree_as_flax_does_across_changed_variables_and_paths(names, data):
    hooked = set(data.draw(st.lists(st.sampled_from(names), unique=True), label="hooked"))
    rollout = _Model(names, set(), 0)
    index = _VariableIndex.of(rollout, nnx.state(rollout, nnx.Param))
    source = _Model(names, hooked, 1)
    for step in range(3):
        params = nnx.state(source, nnx.Param)
        got = index.read(params)
        assert [np.asarray(x).tolist() for x in got] == [x.tolist() for x in _expected(index, params)]
        # Next read: the same paths with some Variables swapped for hooked or plain ones (the
        # index must not read them as the ones it met before), or the same Variables with new arrays.
        swap = set(data.draw(st.lists(st.sampled_from(names), unique=True), label=f"swapped {step}"))
        hooked ^= swap
        fresh = _Model(names, hooked, step + 2)
        for n in names:
            if n in swap:
                source.parts[n] = fresh.parts[n]
            else:
                source.parts[n].set_raw_value(source.parts[n].get_raw_value() + 1)
    # A tree of other paths is refused with the paths that differ, and the index reads on after.
    other = _Model([*names[1:], "extra"], set(), 3)
    with pytest.raises(ValueError, match=rf"missing: \['parts/{names[0]}'\], unexpected: \['parts/extra'\]"):
        index.read(nnx.state(other, nnx.Param))
    params = nnx.state(source, nnx.Param)
    assert [np.asarray(x).tolist() for x in index.read(params)] == [x.tolist() for x in _expected(index, params)]


def test_p13_the_index_sets_a_concrete_array_in_place_and_a_tracer_only_through_flax_check():
    model = _Model(["a", "b"], {"b"}, 0)
    index = _VariableIndex.of(model, nnx.state(model, nnx.Param))
    new = jnp.full((2, 3), 7.0)
    for j in range(len(index.keys)):
        index.set(j, new)
    assert model.parts["a"].get_raw_value() is new  # plain: the very array
    np.testing.assert_array_equal(model.parts["b"].get_value(), 15.0)  # its own set and get: (7 + 0.5) * 2
    a = index.keys.index(("parts", "a"))

    @jax.jit
    def leak(x):
        index.set(a, x)  # a tracer into a Variable made outside the trace: Flax refuses it
        return x

    with pytest.raises(flax_errors.TraceContextError):
        leak(new)
    assert model.parts["a"].get_raw_value() is new
