"""A checkpoint is untrusted input: ``load`` checks it before it allocates, and fails with one clear error.

Every adversarial file here is built by hand and small: a config.json with huge
dimensions, a zip whose member header claims a huge shape, a member with a
misleading name. Nothing in these tests allocates more than a few megabytes.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import resource
import shutil
import threading
import tracemalloc
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.traverse_util import flatten_dict

from rlcluster_lab import ClusterConfig, RLCluster, init_model, layout_meshes
from rlcluster_lab.cluster.validate import check_inputs
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.limits import LIMIT_ENV, TooLargeError
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.model import LoRALinear, checkpoint, with_lora
from rlcluster_lab.model.checkpoint import CheckpointConfig, abstract_checkpoint, load, read_config, save
from rlcluster_lab.model.scoring import init_score_model

EMBEDDING = "embed/embedding.npy"  # (264, 64) float32 in the tiny model
MB = 1 << 20


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One tiny checkpoint per module; each test works on its own copy."""
    return save(init_model("tiny", seed=4), tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture
def ckpt(saved, tmp_path):
    return shutil.copytree(saved, tmp_path / "ckpt")


def _meta(folder):
    return json.loads((folder / "config.json").read_text())


def _write_meta(folder, meta):
    (folder / "config.json").write_text(json.dumps(meta))


def _npy_header(shape, dtype="<f4", fortran=False) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": fortran, "shape": tuple(shape)})
    return buf.getvalue()


def _rewrite_npz(folder, replace=None, extra=()):
    """Rewrite params.npz member by member: ``replace`` maps a name to writer(fp), ``extra``
    appends (name, writer) pairs. Members are deflated, as np.savez_compressed writes them."""
    replace = dict(replace or {})
    npz = folder / "params.npz"
    with zipfile.ZipFile(npz) as src:
        members = [(info.filename, src.read(info)) for info in src.infolist()]
    with zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED) as dst:
        for name, raw in members:
            if name in replace:
                with dst.open(name, "w", force_zip64=True) as fp:
                    replace[name](fp)
            else:
                dst.writestr(name, raw)
        for name, writer in extra:
            with dst.open(name, "w", force_zip64=True) as fp:
                writer(fp)


def _zeros_after(header: bytes, nbytes: int):
    """A writer: ``header``, then ``nbytes`` zero bytes, streamed a megabyte at a time."""

    def write(fp):
        fp.write(header)
        chunk = bytes(MB)
        left = nbytes
        while left > 0:
            fp.write(chunk[: min(left, MB)])
            left -= MB

    return write


def _array_writer(values: np.ndarray):
    def write(fp):
        np.lib.format.write_array(fp, values, allow_pickle=False)

    return write


def _tiny_array(folder, name):
    with np.load(folder / "params.npz") as data:
        return data[name[: -len(".npy")]]


def _abstract_leaves(model):
    return flatten_dict(nnx.to_pure_dict(nnx.state(model)))


def _key(path):
    return "/".join(map(str, path))


def _load_peak_bytes(folder):
    """Run ``load(folder)`` under tracemalloc; return (the exception it raised or None, peak bytes)."""
    tracemalloc.start()
    try:
        load(folder)
        err = None
    except Exception as exc:  # noqa: BLE001  (returned to the test, which checks its type)
        err = exc
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return err, peak


# ---------------------------------------------------------------- 1: the config's size, before any init


@pytest.mark.parametrize(
    "change",
    [
        {"config": {"embed_dim": 1 << 20}},
        {"config": {"vocab_size": 1 << 30}},
        {"config": {"mlp_dim": 1 << 28}, "lora_rank": 64, "lora_scale": 1.0},
        {"kind": "score", "config": {"embed_dim": 1 << 20}},
    ],
)
def test_config_with_huge_dimensions_is_refused_before_anything_is_built(ckpt, monkeypatch, change):
    meta = _meta(ckpt)
    meta["config"].update(change.pop("config"))
    meta.update(change)
    _write_meta(ckpt, meta)
    monkeypatch.setenv(LIMIT_ENV, str(64 * MB))

    def must_not_run(*args, **kwargs):
        raise AssertionError("the model was built before its size was checked")

    # Neither the structure (traced) nor the values (materialized) may be made first.
    monkeypatch.setattr(checkpoint, "abstract_model", must_not_run)
    monkeypatch.setattr(checkpoint, "materialize", must_not_run)
    monkeypatch.setattr("rlcluster_lab.model.scoring.abstract_score_model", must_not_run)
    with pytest.raises(TooLargeError) as err:
        load(ckpt)
    assert str(ckpt) in str(err.value)
    assert "estimated from shapes" in str(err.value)


@pytest.mark.parametrize("variant", ["plain", "lora", "score", "bfloat16", "tied"])
def test_bytes_from_the_config_equal_the_structures_bytes(saved, tmp_path, variant):
    # The size check before tracing uses a formula; it must agree with the structure it guards.
    import dataclasses

    from rlcluster_lab.model import get_model_config

    cfg = get_model_config("tiny")
    ck = CheckpointConfig(tmp_path / "config.json", "lm", cfg, 0, 1.0)
    if variant == "lora":
        ck = dataclasses.replace(ck, lora_rank=4)
    elif variant == "score":
        ck = dataclasses.replace(ck, kind="score")
    elif variant == "bfloat16":
        ck = dataclasses.replace(ck, config=dataclasses.replace(cfg, param_dtype="bfloat16"))
    elif variant == "tied":
        ck = dataclasses.replace(ck, config=dataclasses.replace(cfg, tie_embeddings=True))
    model = checkpoint._structure(ck)
    leaves = flatten_dict(nnx.to_pure_dict(nnx.state(model))).values()
    assert ck.param_bytes == sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in leaves)


def test_a_checkpoint_that_fits_still_loads_under_a_limit(ckpt, monkeypatch):
    monkeypatch.setenv(LIMIT_ENV, str(8 * MB))  # the tiny model is about 0.3 MB
    model = load(ckpt)
    np.testing.assert_array_equal(np.asarray(model.embed.embedding.get_value()), _tiny_array(ckpt, EMBEDDING))


# ---------------------------------------------------------------- 2: zip members checked before their data is read


def test_unexpected_member_is_refused_before_any_data_is_decompressed(ckpt):
    # 16 MB of zeros deflate to a few kilobytes: a member must not be decompressed to find it is not wanted.
    size = 16 * MB
    _rewrite_npz(ckpt, extra=[("evil.npy", _zeros_after(_npy_header((size // 4,)), size))])
    assert (ckpt / "params.npz").stat().st_size < MB
    err, peak = _load_peak_bytes(ckpt)
    assert isinstance(err, ConfigError)
    assert "evil.npy" in str(err) and "unexpected" in str(err)
    assert peak < 4 * MB


def test_missing_member_is_named(ckpt):
    with zipfile.ZipFile(ckpt / "params.npz") as src:
        members = [(i.filename, src.read(i)) for i in src.infolist() if i.filename != EMBEDDING]
    with zipfile.ZipFile(ckpt / "params.npz", "w") as dst:
        for name, raw in members:
            dst.writestr(name, raw)
    with pytest.raises(ConfigError, match="1 missing") as err:
        load(ckpt)
    assert EMBEDDING in str(err.value)


def test_duplicate_member_name_is_refused(ckpt):
    # A zip may hold two members of one name; which one a reader takes is up to the reader.
    other = np.ones((264, 64), np.float32)
    with pytest.warns(UserWarning, match="Duplicate name"):
        _rewrite_npz(ckpt, extra=[(EMBEDDING, _array_writer(other))])
    with pytest.raises(ConfigError, match="more than once") as err:
        load(ckpt)
    assert EMBEDDING in str(err.value)


def test_member_declaring_more_bytes_than_its_shape_is_refused_before_decompressing(ckpt):
    # The right name and the right header, then 16 MB more than the shape holds.
    want = _tiny_array(ckpt, EMBEDDING)
    _rewrite_npz(ckpt, replace={EMBEDDING: _zeros_after(_npy_header(want.shape), want.nbytes + 16 * MB)})
    err, peak = _load_peak_bytes(ckpt)
    assert isinstance(err, ConfigError)
    msg = str(err)
    assert EMBEDDING in msg and "uncompressed bytes" in msg and f"{want.nbytes + 16 * MB + 128:,}" in msg
    assert peak < 4 * MB


def test_member_shorter_than_its_header_says_is_refused(ckpt):
    want = _tiny_array(ckpt, EMBEDDING)
    _rewrite_npz(ckpt, replace={EMBEDDING: _zeros_after(_npy_header(want.shape), want.nbytes - 4)})
    with pytest.raises(ConfigError, match="uncompressed bytes") as err:
        load(ckpt)
    assert EMBEDDING in str(err.value)


def test_member_that_is_not_npy_is_named(ckpt):
    _rewrite_npz(ckpt, replace={EMBEDDING: lambda fp: fp.write(b"PK not an array at all")})
    with pytest.raises(ConfigError, match="not a readable .npy array") as err:
        load(ckpt)
    assert EMBEDDING in str(err.value)


def test_a_bad_header_in_the_last_member_stops_the_load_before_any_data_is_read(ckpt):
    # A config whose embedding and head are 16 MB each, every member of the right name and
    # size (zeros, deflated), and the zip's last member declaring another shape.
    meta = _meta(ckpt)
    meta["config"]["vocab_size"] = 65536
    _write_meta(ckpt, meta)
    shapes = {_key(p) + ".npy": v.shape for p, v in _abstract_leaves(abstract_checkpoint(ckpt)).items()}
    names = sorted(shapes, key=lambda n: (n != EMBEDDING, n))  # the largest member first
    last = names[-1]
    with zipfile.ZipFile(ckpt / "params.npz", "w", zipfile.ZIP_DEFLATED) as zf:
        for name in names:
            shape = shapes[name] if name != last else (3, *shapes[name])
            with zf.open(name, "w", force_zip64=True) as fp:
                _zeros_after(_npy_header(shape), math.prod(shapes[name]) * 4)(fp)
    err, peak = _load_peak_bytes(ckpt)
    assert isinstance(err, ConfigError), repr(err)
    assert last in str(err)
    assert peak < 4 * MB


def test_fortran_ordered_member_loads_with_its_values(ckpt):
    want = _tiny_array(ckpt, EMBEDDING)
    _rewrite_npz(ckpt, replace={EMBEDDING: _array_writer(np.asfortranarray(want))})
    with zipfile.ZipFile(ckpt / "params.npz") as zf, zf.open(EMBEDDING) as fp:
        np.lib.format.read_magic(fp)
        assert np.lib.format.read_array_header_1_0(fp)[1]  # really stored Fortran-ordered
    model = load(ckpt)
    np.testing.assert_array_equal(np.asarray(model.embed.embedding.get_value()), want)


# ---------------------------------------------------------------- 3: a header's claim, checked against the config


def test_header_claiming_four_tebibytes_names_both_shapes(ckpt):
    _rewrite_npz(ckpt, replace={EMBEDDING: _zeros_after(_npy_header((1 << 20, 1 << 20)), 64)})
    err, peak = _load_peak_bytes(ckpt)
    assert isinstance(err, ConfigError), repr(err)
    msg = str(err)
    assert str(ckpt / "params.npz") in msg
    assert EMBEDDING in msg
    assert "(1048576, 1048576)" in msg and f"{4 << 40:,} bytes" in msg
    assert "(264, 64)" in msg and f"{264 * 64 * 4:,} bytes" in msg
    assert peak < 4 * MB


def test_header_with_a_narrower_dtype_names_both_dtypes(ckpt):
    want = _tiny_array(ckpt, EMBEDDING)
    _rewrite_npz(ckpt, replace={EMBEDDING: _array_writer(want.astype(np.float16))})
    with pytest.raises(ConfigError) as err:
        load(ckpt)
    assert "float16" in str(err.value) and "float32" in str(err.value) and EMBEDDING in str(err.value)


def test_member_with_a_wider_dtype_is_refused_on_its_declared_size(ckpt):
    # float64 data is larger than the float32 array the config needs: refused from the zip's directory.
    want = _tiny_array(ckpt, EMBEDDING)
    _rewrite_npz(ckpt, replace={EMBEDDING: _array_writer(want.astype(np.float64))})
    with pytest.raises(ConfigError, match="uncompressed bytes") as err:
        load(ckpt)
    assert "float32" in str(err.value) and "(264, 64)" in str(err.value) and EMBEDDING in str(err.value)


# ---------------------------------------------------------------- 4: a malformed config.json, one ConfigError


def _set(path, value):
    def change(meta):
        *parents, last = path.split(".")
        node = meta
        for p in parents:
            node = node[p]
        node[last] = value

    return change


def _drop(path):
    def change(meta):
        *parents, last = path.split(".")
        node = meta
        for p in parents:
            node = node[p]
        del node[last]

    return change


MALFORMED = {
    "not json": ("{not json", "JSON"),
    "a list": ("[1, 2]", "object"),
    "no format": (_drop("format"), "'format'"),
    "other format": (_set("format", "other/9"), "'format'"),
    "no kind": (_drop("kind"), "'kind'"),
    "unknown kind": (_set("kind", "policy"), "'kind'"),
    "no config": (_drop("config"), "'config'"),
    "config a list": (_set("config", [1, 2]), "'config'"),
    "missing dim": (_drop("config.embed_dim"), "config.embed_dim"),
    "string dim": (_set("config.embed_dim", "64"), "config.embed_dim"),
    "float dim": (_set("config.num_layers", 2.0), "config.num_layers"),
    "bool dim": (_set("config.num_heads", True), "config.num_heads"),
    "negative dim": (_set("config.vocab_size", -264), "config.vocab_size"),
    "zero dim": (_set("config.mlp_dim", 0), "config.mlp_dim"),
    "null dim": (_set("config.head_dim", None), "config.head_dim"),
    "heads not a multiple": (_set("config.num_heads", 3), "num_heads"),
    "odd head_dim": (_set("config.head_dim", 15), "head_dim"),
    "unknown dtype": (_set("config.param_dtype", "int8"), "config.param_dtype"),
    "negative eps": (_set("config.rms_eps", -1.0), "config.rms_eps"),
    "string rope": (_set("config.rope_base", "big"), "config.rope_base"),
    "string tie": (_set("config.tie_embeddings", "yes"), "config.tie_embeddings"),
    "unknown config key": (_set("config.n_layers", 2), "n_layers"),
    "unknown top key": (_set("extra", 1), "extra"),
    "negative rank": (_set("lora_rank", -1), "lora_rank"),
    "huge rank": (_set("lora_rank", 10**6), "lora_rank"),
    "string rank": (_set("lora_rank", "4"), "lora_rank"),
    "float rank": (_set("lora_rank", 2.5), "lora_rank"),
    "score with rank": (lambda m: m.update(kind="score", lora_rank=4), "lora_rank"),
    "string scale": (lambda m: m.update(lora_rank=4, lora_scale="x"), "lora_scale"),
    "nan scale": (lambda m: m.update(lora_rank=4, lora_scale=float("nan")), "lora_scale"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_config_raises_one_config_error_naming_path_and_key(ckpt, case):
    change, key = MALFORMED[case]
    if isinstance(change, str):
        (ckpt / "config.json").write_text(change)
    else:
        meta = _meta(ckpt)
        change(meta)
        _write_meta(ckpt, meta)
    with pytest.raises(ConfigError) as err:
        load(ckpt)
    msg = str(err.value)
    assert str(ckpt / "config.json") in msg
    assert key in msg


def test_oversized_config_json_is_refused_unparsed(ckpt):
    meta = json.dumps(_meta(ckpt))
    (ckpt / "config.json").write_text(meta[:-1] + " " * (2 * MB) + "}")
    with pytest.raises(ConfigError, match="bytes") as err:
        read_config(ckpt)
    assert str(ckpt / "config.json") in str(err.value)


# ---------------------------------------------------------------- 5: values must be finite


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused_and_nothing_is_left_on_device(ckpt, bad):
    values = _tiny_array(ckpt, EMBEDDING).copy()
    values[3, 5] = bad
    values[7, 0] = bad
    _rewrite_npz(ckpt, replace={EMBEDDING: _array_writer(values)})
    before = len(jax.live_arrays())
    with pytest.raises(ConfigError) as err:
        load(ckpt)
    msg = str(err.value)
    assert EMBEDDING in msg and "2 non-finite" in msg and "(3, 5)" in msg
    assert len(jax.live_arrays()) == before


def test_non_finite_bfloat16_values_are_refused(tmp_path):
    import dataclasses

    from rlcluster_lab.model import get_model_config

    cfg = dataclasses.replace(get_model_config("tiny"), param_dtype="bfloat16")
    folder = save(init_model(cfg, seed=1), tmp_path / "bf16")
    with np.load(folder / "params.npz") as data:
        raw = data["final_norm/scale"].view(jax.numpy.bfloat16).copy()
    raw[1] = np.nan
    _rewrite_npz(folder, replace={"final_norm/scale.npy": _array_writer(raw)})
    with pytest.raises(ConfigError, match="non-finite") as err:
        load(folder)
    assert "final_norm/scale.npy" in str(err.value)


# ---------------------------------------------------------------- 6: a path goes through the same-architecture check


def _refuse_weights(monkeypatch):
    def no_weights(path):
        raise AssertionError(f"weights of {path} were read before the architecture was checked")

    monkeypatch.setattr(checkpoint, "load", no_weights)


@pytest.mark.cluster
def test_reference_checkpoint_of_another_size_is_refused_before_its_weights_are_read(tmp_path, monkeypatch):
    ref = save(init_model("small"), tmp_path / "small_ref")
    _refuse_weights(monkeypatch)
    with pytest.raises(ConfigError, match="reference model's parameter tree does not match") as err:
        RLCluster(
            actor=init_model("tiny"),
            reference=ref,
            cluster_config=ClusterConfig(role_to_mesh=layout_meshes("colocated")),
        )
    assert str(ref) in str(err.value)


@pytest.mark.cluster
def test_critic_checkpoint_of_another_size_is_refused(tmp_path, monkeypatch):
    critic = save(init_score_model("small"), tmp_path / "small_critic")
    _refuse_weights(monkeypatch)
    with pytest.raises(ConfigError, match="critic model's parameter tree does not match") as err:
        RLCluster(
            actor=init_model("tiny"),
            critic=critic,
            cluster_config=ClusterConfig(role_to_mesh=layout_meshes("colocated")),
        )
    assert str(critic) in str(err.value)


@pytest.mark.cluster
def test_actor_checkpoint_against_a_reference_of_another_size_is_refused(saved, monkeypatch):
    _refuse_weights(monkeypatch)
    with pytest.raises(ConfigError, match="reference model's parameter tree does not match") as err:
        RLCluster(
            actor=saved,
            reference=init_model("small"),
            cluster_config=ClusterConfig(role_to_mesh=layout_meshes("colocated")),
        )
    assert str(saved) in str(err.value)


def test_same_size_checkpoints_pass_the_check_without_reading_weights(saved, tmp_path, monkeypatch):
    critic = save(init_score_model("tiny"), tmp_path / "critic")
    actor = with_lora(init_model("tiny"), 4)  # the adapters are not part of the comparison
    _refuse_weights(monkeypatch)
    config = ClusterConfig(role_to_mesh=layout_meshes("colocated"))
    check_inputs(config, actor, saved, None, critic, Trace())
    check_inputs(config, saved, saved, None, None, Trace())


def test_abstract_checkpoint_has_the_saved_structure_and_no_values(saved):
    model = abstract_checkpoint(saved)
    leaves = flatten_dict(nnx.to_pure_dict(nnx.state(model))).values()
    assert all(isinstance(v, jax.ShapeDtypeStruct) for v in leaves)
    assert model.config == read_config(saved).config


# ---------------------------------------------------------------- 7: saving never loses a checkpoint (issue 21)


def _embedding(folder):
    with np.load(folder / "params.npz") as data:
        return data["embed/embedding"].copy()


def _leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if ".saving-" in p.name)


@contextlib.contextmanager
def _file_size_limit(nbytes):
    """Writes past ``nbytes`` in any file fail with EFBIG, as on a full disk (Python ignores SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_save_over_a_full_disk_keeps_the_previous_checkpoint_whole(ckpt):
    old = _embedding(ckpt)
    with _file_size_limit(64 * 1024), pytest.raises(OSError):  # config.json fits, params.npz does not
        save(init_model("tiny", seed=9), ckpt)
    np.testing.assert_array_equal(np.asarray(load(ckpt).embed.embedding.get_value()), old)
    assert _leftovers(ckpt.parent) == []  # the unfinished new checkpoint was removed


def test_a_killed_save_leaves_the_previous_checkpoint_and_the_next_save_clears_its_folder(ckpt, monkeypatch):
    from rlcluster_lab.model import atomic

    old = _embedding(ckpt)
    # A SIGKILL while params.npz is written: no clean-up runs, the half-written folder stays.
    monkeypatch.setattr(atomic.shutil, "rmtree", lambda *a, **k: None)
    real_savez = np.savez

    def killed(fp, **arrays):
        fp.write(b"PK\x03\x04 half a zip")
        raise SystemExit("killed")

    monkeypatch.setattr(np, "savez", killed)
    with pytest.raises(SystemExit):
        save(init_model("tiny", seed=9), ckpt)
    assert len(_leftovers(ckpt.parent)) == 1
    np.testing.assert_array_equal(np.asarray(load(ckpt).embed.embedding.get_value()), old)
    monkeypatch.undo()
    assert np.savez is real_savez
    new = init_model("tiny", seed=9)
    save(new, ckpt)
    assert _leftovers(ckpt.parent) == []
    np.testing.assert_array_equal(_embedding(ckpt), np.asarray(new.embed.embedding.get_value()))


def test_concurrent_saves_to_one_path_are_serialized_and_the_old_checkpoint_stays_readable(ckpt, monkeypatch):
    """Two threads save to one folder: the second waits for the first; while the first is writing,
    the folder still holds the previous checkpoint, whole; the last save wins."""
    from rlcluster_lab.model import atomic

    old = _embedding(ckpt)
    first, second = init_model("tiny", seed=11), init_model("tiny", seed=12)
    writing, release, second_waits = threading.Event(), threading.Event(), threading.Event()
    active, overlaps, seen_during_write = [], [], []
    real_savez, real_wait = np.savez, atomic._wait_for_lock

    def slow_savez(fp, **arrays):
        active.append(1)
        overlaps.append(len(active))
        if not writing.is_set():  # the first save pauses in the middle of its write
            writing.set()
            assert release.wait(60)
        real_savez(fp, **arrays)
        active.pop()

    def waiting(fd):
        second_waits.set()
        real_wait(fd)

    monkeypatch.setattr(np, "savez", slow_savez)
    monkeypatch.setattr(atomic, "_wait_for_lock", waiting)
    errors = []

    def run(model):
        try:
            save(model, ckpt)
        except Exception as exc:  # noqa: BLE001  (checked below)
            errors.append(exc)

    t1 = threading.Thread(target=run, args=(first,))
    t1.start()
    assert writing.wait(60)
    seen_during_write.append(_embedding(ckpt))  # mid-save: still the previous checkpoint
    t2 = threading.Thread(target=run, args=(second,))
    t2.start()
    assert second_waits.wait(60)  # blocked on the first save's lock, not writing beside it
    release.set()
    t1.join(60)
    t2.join(60)
    assert errors == [] and max(overlaps) == 1
    np.testing.assert_array_equal(seen_during_write[0], old)
    np.testing.assert_array_equal(_embedding(ckpt), np.asarray(second.embed.embedding.get_value()))
    assert _leftovers(ckpt.parent) == []


# ---------------------------------------------------------------- 8: no write through a planted link (issue 21)


def test_save_never_writes_through_a_planted_params_link(ckpt, tmp_path):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    (ckpt / "params.npz").unlink()
    (ckpt / "params.npz").symlink_to(victim)
    model = init_model("tiny", seed=13)
    save(model, ckpt)
    assert victim.read_bytes() == b"precious"
    assert not (ckpt / "params.npz").is_symlink()
    np.testing.assert_array_equal(
        np.asarray(load(ckpt).embed.embedding.get_value()), np.asarray(model.embed.embedding.get_value())
    )


@pytest.mark.parametrize("case", ["folder is a link", "folder holds other files", "path is a file"])
def test_save_refuses_to_replace_what_is_not_a_checkpoint_folder(saved, tmp_path, case):
    target = tmp_path / "target"
    if case == "folder is a link":
        shutil.copytree(saved, tmp_path / "elsewhere")
        target.symlink_to(tmp_path / "elsewhere")
    elif case == "folder holds other files":
        target.mkdir()
        (target / "notes.txt").write_text("mine")
    else:
        target.write_text("a file")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(FileExistsError, match=str(target)):
        save(init_model("tiny"), target)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


# ---------------------------------------------------------------- 9: save refuses what load refuses (issue 21)


def test_save_refuses_a_model_holding_a_nan_and_writes_nothing(tmp_path):
    model = init_model("tiny", seed=2)
    kernel = model.blocks.mlp.up.kernel
    kernel.set_value(kernel.get_value().at[1, 1, 2].set(jnp.nan))
    with pytest.raises(ConfigError, match=r"blocks/mlp/up/kernel.*1 non-finite.*\(1, 1, 2\)"):
        save(model, tmp_path / "nan")
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_adapters_whose_scale_load_would_refuse(tmp_path):
    model = with_lora(init_model("tiny"), 4)
    for _, node in nnx.iter_graph(model):
        if isinstance(node, LoRALinear):
            object.__setattr__(node, "scale", 1e38)
    with pytest.raises(ConfigError, match="lora_scale"):
        save(model, tmp_path / "scaled")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 10: numerics that keep the forward finite (issue 21)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"config": {"rope_base": 1e-300}}, "config.rope_base"),
        ({"config": {"rope_base": 1.0}}, "config.rope_base"),
        ({"config": {"rms_eps": 1e-300}}, "config.rms_eps"),
        ({"config": {"param_dtype": "float64"}}, "config.param_dtype"),
        ({"lora_rank": 4, "lora_scale": 1e38}, "lora_scale"),
    ],
)
def test_numerics_that_give_nan_log_probs_are_refused_at_load(ckpt, change, key):
    meta = _meta(ckpt)
    meta["config"].update(change.pop("config", {}))
    meta.update(change)
    _write_meta(ckpt, meta)
    with pytest.raises(ConfigError, match=re.escape(key)) as err:
        read_config(ckpt)
    assert str(ckpt / "config.json") in str(err.value)


# ---------------------------------------------------------------- 11: work bounded before building (issue 21)


def test_a_million_layers_are_refused_before_any_structure_is_built(ckpt, monkeypatch):
    meta = _meta(ckpt)
    meta["config"].update(num_layers=10**6, vocab_size=8, embed_dim=8, num_heads=2, num_kv_heads=1, head_dim=4)
    meta["config"].update(mlp_dim=8)
    _write_meta(ckpt, meta)

    def must_not_run(*args, **kwargs):
        raise AssertionError("the structure was built before the layer count was checked")

    monkeypatch.setattr(checkpoint, "abstract_model", must_not_run)
    with pytest.raises(ConfigError, match=r"num_layers is 1,000,000; at most 1,024"):
        load(ckpt)


def test_structure_building_traces_one_layer_whatever_the_layer_count(monkeypatch):
    """One block is traced for the whole layer stack, whatever its depth (counted, not timed)."""
    import dataclasses

    from rlcluster_lab.model import get_model_config, transformer

    built = []
    real_init = transformer.Block.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(transformer.Block, "__init__", counting)
    deep = dataclasses.replace(get_model_config("tiny"), name="tiny-60-layers", num_layers=60)
    model = checkpoint.abstract_model(deep)
    assert len(built) == 1
    shapes = {_key(p): v.shape for p, v in _abstract_leaves(model).items()}
    assert shapes["blocks/mlp/down/kernel"] == (60, 128, 64) and len(shapes) == 9 + 3


class _CountingName(str):
    """A member name that counts its comparisons (str's hash, so set lookups work as usual)."""

    compared = 0

    def __eq__(self, other):
        _CountingName.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_the_duplicate_member_check_is_linear_in_the_member_count(saved):
    """60,001 members with one name repeated took 46 s to refuse: count the comparisons instead."""
    ck = read_config(saved)
    expected = {_key(p): v for p, v in _abstract_leaves(checkpoint._structure(ck)).items()}
    count = 4001
    infos = [zipfile.ZipInfo(_CountingName(f"m{i}.npy")) for i in range(count - 1)]
    infos.append(zipfile.ZipInfo(_CountingName("m7.npy")))
    _CountingName.compared = 0
    with pytest.raises(ConfigError, match=r"\['m7.npy'\] appear more than once"):
        checkpoint._check_members(ck, saved / "params.npz", infos, expected)
    assert _CountingName.compared < 10 * count
