"""Saving a model to a folder and loading it back, so a role can be given as a path.

A checkpoint is ``config.json`` (model kind, size, LoRA rank) plus ``params.npz`` (every
variable, keyed by its path). It is data from outside, so ``load`` allocates nothing on a
file's word: ``config.json`` is parsed and every field checked; the bytes its dimensions imply
are refused by ``core.limits.check_fits`` when they cannot fit; the structure is built on paper
(shapes only); the zip's member names, declared sizes and ``.npy`` headers are checked against
it before any data is decompressed; the data is read into arrays of the expected size and
checked finite, and only then is the model built.

``save`` refuses what ``load`` would refuse, and replaces a checkpoint atomically
(``model.atomic``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.limits import check_fits
from rlcluster_lab.core.model_config import NUMERIC_RANGES, check_lora_scale, layer_stack_at, numeric_problem
from rlcluster_lab.core.options import DTYPES
from rlcluster_lab.model.atomic import replace_folder
from rlcluster_lab.model.init import abstract_model, materialize
from rlcluster_lab.model.lora import LoRALinear, is_lora
from rlcluster_lab.model.scoring import ScoreModel, abstract_score_model
from rlcluster_lab.model.transformer import INT_FIELDS, ModelConfig

FORMAT = "rlcluster-lab/1"
KINDS: tuple[str, ...] = ("lm", "score")

# A config.json ``save`` writes is under a kilobyte: anything this large is refused before it is parsed.
MAX_CONFIG_BYTES = 1 << 20
# NumPy's own bound on an .npy header (``read_array_header_*``'s default), plus the magic
# string, the version and the header-length field (at most 12 bytes for format 2.0).
MAX_NPY_HEADER = 10000
_NPY_PREAMBLE = 12
# Decompressed into the destination this many bytes at a time (never a ``bytes`` copy of a whole member).
_CHUNK = 16 << 20

_RESAVE = "re-save the model with rlcluster_lab.model.checkpoint.save(model, path)"
_REQUIRED_FIELDS = ("name", *INT_FIELDS)
_MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig))
_TOP_KEYS = ("format", "kind", "config", "lora_rank", "lora_scale")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """What a checkpoint's ``config.json`` says, every field checked."""

    path: Path  # the config.json it was read from
    kind: str  # "lm" (a TransformerLM) or "score" (a ScoreModel)
    config: ModelConfig  # the model's dimensions and dtype
    lora_rank: int  # the adapters' rank; 0 for a model without adapters
    lora_scale: float  # the adapters' scale (1.0 without adapters)

    @property
    def param_bytes(self) -> int:
        """Bytes of every parameter, from the config's dimensions alone (nothing traced)."""
        c = self.config
        count = c.num_params + (c.lora_params(self.lora_rank) if self.lora_rank else 0)
        if self.kind == "score":
            count += c.embed_dim + 1  # the scalar head's kernel and bias
        return count * np.dtype(c.dtype).itemsize


def save(model: nnx.Module, path: str | os.PathLike) -> Path:
    """Write ``model`` (a TransformerLM, LoRA or not, or a ScoreModel) under ``path``, atomically;
    saves to one folder are serialized.

    Raises:
        ConfigError: the model holds what ``load`` would refuse; nothing was written.
        FileExistsError: ``path`` is a symbolic link, a file, or a folder holding other files than
            a checkpoint's (``save`` replaces the whole folder).
        OSError: the write failed; a checkpoint already at ``path`` is untouched.
    """
    folder = Path(path)
    kind = "score" if isinstance(model, ScoreModel) else "lm"
    rank, scale = _lora_settings(model)
    meta = {"format": FORMAT, "kind": kind, "config": dataclasses.asdict(model.config), "lora_rank": rank}
    if rank:
        meta["lora_scale"] = scale
    flat = {k: np.asarray(v) for k, v in _flat_state(model).items()}
    # The checks load makes, before anything is written.
    try:
        ck = _check_meta(folder / "config.json", json.loads(json.dumps(meta)))
    except ConfigError as err:
        raise ConfigError(f"save refused {folder}: the checkpoint would not load: {err}") from None
    _check_saved_params(ck, folder, flat)
    replace_folder(
        folder,
        {
            "config.json": lambda f: f.write(json.dumps(meta, indent=2).encode()),
            "params.npz": lambda f: np.savez(f, **flat),
        },
    )
    return folder


def _check_saved_params(ck: CheckpointConfig, folder: Path, flat: dict[str, np.ndarray]) -> None:
    """The model's parameters against what its config describes, and finite, as ``load`` checks them."""
    expected = _flat_state(_build_structure(ck))
    if set(flat) != set(expected):
        missing, extra = sorted(set(expected) - set(flat)), sorted(set(flat) - set(expected))
        raise ConfigError(
            f"save refused {folder}: the model's parameters do not match its config (missing {missing[:3]}, "
            f"unexpected {extra[:3]}); save a TransformerLM (with or without LoRA) or a ScoreModel"
        )
    for name, values in flat.items():
        spec = expected[name]
        if tuple(values.shape) != tuple(spec.shape) or np.dtype(values.dtype) != np.dtype(spec.dtype):
            raise ConfigError(
                f"save refused {folder}: parameter {name!r} has shape {tuple(values.shape)} and dtype "
                f"{values.dtype}, but its config needs {tuple(spec.shape)} and {np.dtype(spec.dtype)} (every "
                "parameter in the config's param_dtype); the checkpoint would not load"
            )
        bad, where = _non_finite(values)
        if bad:
            raise ConfigError(
                f"save refused {folder}: parameter {name!r} holds {bad:,} non-finite value(s) (NaN or inf), the "
                f"first at index {where}; load refuses such a checkpoint: save the model from a state before "
                "its values diverged"
            )


def load(path: str | os.PathLike) -> nnx.Module:
    """Read a model written by ``save`` onto the default device; a failed load allocates nothing.

    Raises:
        FileNotFoundError: no ``config.json`` or no ``params.npz`` under ``path``.
        ConfigError: a malformed ``config.json``, or a ``params.npz`` that does not match it (the
            message names the file, the member and what was expected).
        TooLargeError: the parameters the config implies cannot fit in host memory.
    """
    ck = read_config(path)
    model = _structure(ck)
    arrays = _read_params(ck, _flat_state(model))
    graphdef, state = nnx.split(model)
    paths = flatten_dict(nnx.to_pure_dict(state))
    return materialize(graphdef, state, unflatten_dict({p: arrays[_key(p)] for p in paths}))


def abstract_checkpoint(path: str | os.PathLike) -> nnx.Module:
    """The model a checkpoint holds, as shapes only, from its ``config.json`` alone (what the cluster
    compares with the actor before any weights are read).

    Raises:
        FileNotFoundError: no ``config.json`` under ``path``.
        ConfigError: a malformed ``config.json``.
        TooLargeError: the parameters it implies cannot fit in host memory.
    """
    return _structure(read_config(path))


def read_config(path: str | os.PathLike) -> CheckpointConfig:
    """Parse and check the ``config.json`` of the checkpoint folder ``path``: a ``FileNotFoundError``
    without one, a ``ConfigError`` naming the key and the expected form for one ``save`` did not write."""
    folder = Path(path)
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(
            f"no model checkpoint at {folder} (expected {cfg_file}); write one with "
            "rlcluster_lab.model.checkpoint.save(model, path) or pass the model itself"
        )
    size = cfg_file.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{cfg_file} is {size:,} bytes; a checkpoint's config.json is a small JSON object (under "
            f"{MAX_CONFIG_BYTES:,} bytes) with keys {', '.join(_TOP_KEYS)}; {_RESAVE}"
        )
    try:
        meta = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError, huge ints
        raise ConfigError(
            f"{cfg_file} is not valid JSON ({err}); expected the JSON object written by save(); {_RESAVE}"
        ) from err
    except OSError as err:
        raise ConfigError(f"{cfg_file} cannot be read ({err}); {_RESAVE}") from err
    return _check_meta(cfg_file, meta)


def _check_meta(cfg_file: Path, meta: Any) -> CheckpointConfig:
    """A parsed ``config.json`` checked key by key (``load`` reads it; ``save`` checks what it writes)."""
    if not isinstance(meta, dict):
        raise ConfigError(f"{cfg_file} holds a JSON {type(meta).__name__}; expected an object with keys {_TOP_KEYS}")
    unknown = sorted(set(meta) - set(_TOP_KEYS))
    if unknown:
        raise ConfigError(f"{cfg_file}: unknown key(s) {unknown}; a checkpoint's config.json has keys {_TOP_KEYS}")
    for key in ("format", "kind", "config"):
        if key not in meta:
            raise ConfigError(f"{cfg_file}: missing key {key!r}; {_RESAVE}")
    if meta["format"] != FORMAT:
        raise ConfigError(
            f"{cfg_file} is not an rlcluster-lab checkpoint: key 'format' is {_show(meta['format'])}, "
            f"expected {FORMAT!r}; {_RESAVE}"
        )
    kind = meta["kind"]
    if not isinstance(kind, str) or kind not in KINDS:
        raise ConfigError(f"{cfg_file}: key 'kind' must be one of {KINDS}, got {_show(kind)}")
    rank = 0 if meta.get("lora_rank") is None else meta["lora_rank"]
    if not _is_int(rank) or rank < 0:
        raise ConfigError(f"{cfg_file}: key 'lora_rank' must be an integer >= 0 (0: no adapters), got {_show(rank)}")
    if rank and kind == "score":
        raise ConfigError(f"{cfg_file}: key 'lora_rank' must be 0 for kind 'score' (a score model has no adapters)")
    scale = meta.get("lora_scale", 1.0)
    try:
        scale = check_lora_scale(scale, "key 'lora_scale'")
    except ValueError as err:
        raise ConfigError(f"{cfg_file}: {err}") from None
    config = _model_config(cfg_file, meta["config"])
    if rank > config.max_lora_rank:
        raise ConfigError(
            f"{cfg_file}: key 'lora_rank' is {rank}, above {config.max_lora_rank}, the largest rank that adds "
            f"capacity to this model's adapters (the smaller side of its largest adapted projection)"
        )
    return CheckpointConfig(cfg_file, kind, config, int(rank), float(scale))


def _model_config(cfg_file: Path, raw: Any) -> ModelConfig:
    """The ``config`` object of a config.json as a ``ModelConfig``, each field's type checked first."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{cfg_file}: key 'config' must be an object with the ModelConfig fields {_MODEL_FIELDS}, got {_show(raw)}"
        )
    unknown = sorted(set(raw) - set(_MODEL_FIELDS))
    if unknown:
        raise ConfigError(f"{cfg_file}: unknown key(s) {unknown} in 'config'; its keys are {_MODEL_FIELDS}")
    for field in _REQUIRED_FIELDS:
        if field not in raw:
            raise ConfigError(f"{cfg_file}: missing key 'config.{field}'; {_RESAVE}")
    if not isinstance(raw["name"], str):
        raise ConfigError(f"{cfg_file}: key 'config.name' must be a string, got {_show(raw['name'])}")
    for field in INT_FIELDS:
        value = raw[field]
        if not _is_int(value) or value <= 0:
            raise ConfigError(f"{cfg_file}: key 'config.{field}' must be a positive integer, got {_show(value)}")
    if "tie_embeddings" in raw and not isinstance(raw["tie_embeddings"], bool):
        raise ConfigError(
            f"{cfg_file}: key 'config.tie_embeddings' must be true or false, got {_show(raw['tie_embeddings'])}"
        )
    if "param_dtype" in raw and raw["param_dtype"] not in DTYPES:
        raise ConfigError(
            f"{cfg_file}: key 'config.param_dtype' must be one of {DTYPES}, got {_show(raw['param_dtype'])}"
        )
    for field in NUMERIC_RANGES:
        problem = numeric_problem(field, raw[field]) if field in raw else None
        if problem:
            raise ConfigError(f"{cfg_file}: key 'config.{field}' {problem}")
    try:
        return ModelConfig(**raw)
    except (ValueError, TypeError) as err:  # the relations between fields (heads, even head_dim)
        raise ConfigError(f"{cfg_file}: key 'config' does not describe a model: {err}; {_RESAVE}") from err


def _structure(ck: CheckpointConfig) -> nnx.Module:
    """The checkpoint's model on paper, after its bytes were found to fit (nothing allocated)."""
    # Twice the parameters: they are read into host arrays, then copied to the device.
    fix = f"check the dimensions in {ck.path} (a foreign or corrupted file?) or load it on a larger machine"
    check_fits(2 * ck.param_bytes, f"the checkpoint {ck.path.parent}", fix)
    # Building the structure costs time per layer, so the check above comes first; the one
    # below is the exact count, should the formula and the model drift.
    model = _build_structure(ck)
    exact = sum(_nbytes(v.shape, v.dtype) for v in _flat_state(model).values())
    check_fits(2 * exact, f"the checkpoint {ck.path.parent}", fix)
    return model


def _build_structure(ck: CheckpointConfig) -> nnx.Module:
    if ck.kind == "score":
        return abstract_score_model(ck.config)
    return abstract_model(ck.config, ck.lora_rank, ck.lora_scale)


def _layer_members(name: str, num_layers: int) -> list[str] | None:
    """A leaf of the layer stack as the members of a checkpoint saved while the layers were a
    list, one per layer (``blocks/<layer>/...``); None for any other leaf."""
    parts = tuple(name.split("/"))
    at = layer_stack_at(parts)
    return None if at is None else ["/".join((*parts[: at + 1], str(i), *parts[at + 1 :])) for i in range(num_layers)]


def _per_layer(expected: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The members of such a per-layer checkpoint (``_layer_members``), without the layer axis."""
    out: dict[str, Any] = {}
    for name, spec in expected.items():
        members, layer = _layer_members(name, num_layers), jax.ShapeDtypeStruct(spec.shape[1:], spec.dtype)
        out.update({name: spec} if members is None else dict.fromkeys(members, layer))
    return out


def _stacked(arrays: dict[str, np.ndarray], expected: dict[str, Any], num_layers: int) -> dict[str, np.ndarray]:
    """A per-layer checkpoint's arrays (``_per_layer``) as the layer stack's: each leaf's layers stacked."""
    out = {}
    for name in expected:
        members = _layer_members(name, num_layers)
        out[name] = arrays.pop(name) if members is None else np.stack([arrays.pop(m) for m in members])
    return out


def _read_params(ck: CheckpointConfig, expected: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every member of ``params.npz``, names, declared sizes and headers checked against ``expected``
    before any data is read. A checkpoint saved with one member per layer (``blocks/0/attn/...``) is
    read as such and its layers stacked into the layer stack's arrays."""
    npz = ck.path.parent / "params.npz"
    if not npz.is_file():
        raise FileNotFoundError(f"{npz} is missing: the checkpoint has a config.json but no parameters; {_RESAVE}")
    try:
        with zipfile.ZipFile(npz) as zf:
            infos = zf.infolist()
            per_layer = _per_layer(expected, ck.config.num_layers)
            names = {info.filename[:-4] for info in infos}
            layout = per_layer if names & (set(per_layer) - set(expected)) else expected
            _check_members(ck, npz, infos, layout)
            # Every header first, so that no data is decompressed from a file that fails later.
            specs = [(info, layout[info.filename[:-4]]) for info in infos]
            order = [_check_header(ck, npz, zf, info, spec) for info, spec in specs]
            arrays = {
                info.filename[:-4]: _read_member(npz, zf, info, spec, fortran)
                for (info, spec), fortran in zip(specs, order, strict=True)
            }
        return arrays if layout is expected else _stacked(arrays, expected, ck.config.num_layers)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError) as err:
        # RuntimeError: an encrypted member; NotImplementedError: an unknown compression.
        raise ConfigError(f"{npz} cannot be read ({type(err).__name__}: {err}); {_RESAVE}") from err


def _check_members(ck: CheckpointConfig, npz: Path, infos: list[zipfile.ZipInfo], expected: dict[str, Any]) -> None:
    """The zip's directory against the config: names, then declared sizes. No data is read."""
    names = [info.filename for info in infos]
    repeated = sorted(n for n, count in collections.Counter(names).items() if count > 1)
    if repeated:
        raise ConfigError(f"{npz}: member(s) {repeated[:3]} appear more than once; {_RESAVE}")
    want = {k + ".npy" for k in expected}
    missing, unexpected = sorted(want - set(names)), sorted(set(names) - want)
    if missing or unexpected:
        raise ConfigError(
            f"{npz} holds parameters that do not match its config.json ({ck.path}): "
            f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}); "
            f"expected one member '<path>.npy' per parameter of a {ck.kind!r} model "
            f"{ck.config.name!r} with LoRA rank {ck.lora_rank}; {_RESAVE}"
        )
    for info in infos:
        # Only an upper bound here: a member that declares less than the config needs is
        # refused once its header (a bounded read) says what it holds instead.
        spec = expected[info.filename[:-4]]
        data = _nbytes(spec.shape, spec.dtype)
        if info.file_size > data + _NPY_PREAMBLE + MAX_NPY_HEADER:
            raise ConfigError(
                f"{npz}: member {info.filename!r} declares {info.file_size:,} uncompressed bytes, but a "
                f"{np.dtype(spec.dtype)} array of shape {tuple(spec.shape)} (as {ck.path} needs) is {data:,} bytes "
                f"plus an .npy header of at most {_NPY_PREAMBLE + MAX_NPY_HEADER:,}; {_RESAVE}"
            )


def _check_header(ck: CheckpointConfig, npz: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, spec: Any) -> bool:
    """One member's .npy header (only it is decompressed) against ``spec``, and its declared size
    against both; returns whether the member is stored in Fortran order."""
    member = info.filename
    want_shape, want_dtype = tuple(spec.shape), np.dtype(spec.dtype)
    want_bytes = _nbytes(want_shape, want_dtype)
    with zf.open(info) as fp:
        try:
            version = np.lib.format.read_magic(fp)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f".npy format version {version} (save writes 1.0)")
            read_header = getattr(np.lib.format, f"read_array_header_{version[0]}_0")
            shape, fortran, dtype = read_header(fp, max_header_size=MAX_NPY_HEADER)
        except ValueError as err:
            raise ConfigError(f"{npz}: member {member!r} is not a readable .npy array ({err}); {_RESAVE}") from err
        header = fp.tell()
    if dtype.kind == "V" and want_dtype.kind == "V" and dtype.itemsize == want_dtype.itemsize and not dtype.names:
        # np.savez stores bfloat16 as raw 2-byte records; read them back as such.
        dtype = want_dtype
    if tuple(shape) != want_shape or dtype != want_dtype:
        raise ConfigError(
            f"{npz}: member {member!r} declares shape {tuple(shape)} and dtype {dtype} "
            f"({_nbytes(shape, dtype):,} bytes), but {ck.path} needs shape {want_shape} and dtype {want_dtype} "
            f"({want_bytes:,} bytes); {_RESAVE}"
        )
    if info.file_size != header + want_bytes:
        raise ConfigError(
            f"{npz}: member {member!r} declares {info.file_size:,} uncompressed bytes, but its "
            f"{header}-byte header and {want_bytes:,} bytes of data make {header + want_bytes:,}; {_RESAVE}"
        )
    return bool(fortran)


def _read_member(npz: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, spec: Any, fortran: bool) -> np.ndarray:
    """One member whose header was checked: its data, read into an array of the expected size."""
    member = info.filename
    shape, dtype = tuple(spec.shape), np.dtype(spec.dtype)
    # A Fortran-ordered member holds the transpose's rows: read those, and transpose back.
    out = np.empty(shape[::-1] if fortran else shape, dtype)
    with zf.open(info) as fp:
        fp.read(info.file_size - out.nbytes)  # the header, checked already
        view = memoryview(out.reshape(-1).view(np.uint8))
        pos = 0
        while pos < len(view):
            got = fp.readinto(view[pos : pos + _CHUNK])
            if not got:
                raise ConfigError(
                    f"{npz}: member {member!r} ends after {pos:,} of its {len(view):,} data bytes (truncated); "
                    f"{_RESAVE}"
                )
            pos += got
        if fp.read(1):  # also reaches the member's end, where zipfile checks its CRC
            raise ConfigError(f"{npz}: member {member!r} has data beyond its declared shape; {_RESAVE}")
    out = out.T if fortran else out
    # A model holding NaN or inf computes NaN log-probs and losses without a word.
    bad, where = _non_finite(out)
    if bad:
        raise ConfigError(
            f"{npz}: member {member!r} holds {bad:,} non-finite value(s) (NaN or inf), the first at index "
            f"{where}; a checkpoint's parameters must be finite: save the model from a state before its "
            "values diverged"
        )
    return out


def _non_finite(values: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """How many values are NaN or inf, and the index of the first (0 and () when none)."""
    if values.dtype.kind not in "fcV":
        return 0, ()
    flat = values.reshape(-1)
    step = _CHUNK // max(values.dtype.itemsize, 1)
    bad, first = 0, -1
    for start in range(0, flat.size, step):  # in chunks: the mask of a whole member would be large
        ok = np.isfinite(flat[start : start + step])
        count = ok.size - int(np.count_nonzero(ok))
        if count and first < 0:
            first = start + int(np.argmin(ok))
        bad += count
    return (bad, tuple(int(i) for i in np.unravel_index(first, values.shape))) if bad else (0, ())


def _nbytes(shape: Any, dtype: Any) -> int:
    return math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _flat_state(model: nnx.Module) -> dict[str, Any]:
    """Every variable of ``model`` by its path, ``"blocks/attn/q/kernel"`` (layer-stack leaves stacked)."""
    return {_key(p): v for p, v in flatten_dict(nnx.to_pure_dict(nnx.state(model))).items()}


def _key(path: tuple) -> str:
    """A variable's member name in ``params.npz``: its path joined by slashes."""
    return "/".join(map(str, path))


def _lora_settings(model: nnx.Module) -> tuple[int, float]:
    """The adapters' rank and scale (0 and 1.0 without adapters); every adapter must share them,
    as the checkpoint records one of each."""
    if not is_lora(model):
        return 0, 1.0
    found = {
        (int(node.lora_a.get_value().shape[-1]), float(node.scale))
        for _, node in nnx.iter_graph(model)
        if isinstance(node, LoRALinear)
    }
    if len(found) != 1:
        raise ConfigError(
            f"save: the model's adapters differ in (rank, scale): {sorted(found)[:3]}; a checkpoint records one "
            "rank and one scale for every adapter (build it with with_lora)"
        )
    return next(iter(found))
