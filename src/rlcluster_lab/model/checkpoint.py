"""Saving a model to a folder and loading it back, so a role can be given as a path.

A checkpoint is ``config.json`` (model kind, size, LoRA rank) plus
``params.npz`` (every variable, keyed by its path). Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict

from rlcluster_lab.model.init import abstract_model, materialize
from rlcluster_lab.model.lora import is_lora
from rlcluster_lab.model.transformer import ModelConfig

FORMAT = "rlcluster-lab/1"


def save(model: nnx.Module, path: str | os.PathLike) -> Path:
    """Write ``model`` (a TransformerLM, LoRA or not, or a ScoreModel) under ``path``."""
    from rlcluster_lab.model.scoring import ScoreModel

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    kind = "score" if isinstance(model, ScoreModel) else "lm"
    rank = _lora_rank(model)
    meta = {"format": FORMAT, "kind": kind, "config": dataclasses.asdict(model.config), "lora_rank": rank}
    if rank:
        meta["lora_scale"] = float(_first_lora(model).scale)
    (folder / "config.json").write_text(json.dumps(meta, indent=2))
    flat = {_key(p): np.asarray(v) for p, v in flatten_dict(nnx.to_pure_dict(nnx.state(model))).items()}
    np.savez(folder / "params.npz", **flat)
    return folder


def load(path: str | os.PathLike) -> nnx.Module:
    """Read a model written by ``save``; it comes back on the default device."""
    from rlcluster_lab.model.scoring import abstract_score_model

    folder = Path(path)
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(
            f"no model checkpoint at {folder} (expected {cfg_file}); write one with "
            "rlcluster_lab.model.checkpoint.save(model, path) or pass the model itself"
        )
    meta = json.loads(cfg_file.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{cfg_file} is not an rlcluster-lab checkpoint (format {meta.get('format')!r})")
    config = ModelConfig(**meta["config"])
    # The model's structure on paper: nothing is allocated until the file's members match it.
    if meta["kind"] == "score":
        model: nnx.Module = abstract_score_model(config)
    else:
        model = abstract_model(config, int(meta.get("lora_rank") or 0), float(meta.get("lora_scale", 1.0)))
    try:
        with np.load(folder / "params.npz") as data:
            arrays = {k: data[k] for k in data.files}
    except (ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{folder / 'params.npz'} cannot be read ({err}); re-save the model") from err
    state = nnx.state(model)
    paths = flatten_dict(nnx.to_pure_dict(state))
    expected = {_key(p): v for p, v in paths.items()}
    if set(expected) != set(arrays):
        raise ValueError(f"{folder} holds parameters that do not match its config.json; re-save the model")
    for key, want in expected.items():
        got = arrays[key]
        if got.dtype.kind == "V" and got.dtype.itemsize == np.dtype(want.dtype).itemsize:
            # np.savez stores bfloat16 as raw 2-byte records; read them back as such.
            got = arrays[key] = got.view(want.dtype)
        if got.shape != tuple(want.shape) or got.dtype != want.dtype:
            raise ValueError(
                f"{folder}: parameter {key} has shape {got.shape} and dtype {got.dtype}, but its "
                f"config.json needs {tuple(want.shape)} and {want.dtype}; re-save the model"
            )
    graphdef, state = nnx.split(model)
    return materialize(graphdef, state, unflatten_dict({p: arrays[_key(p)] for p in paths}))


def _key(path: tuple) -> str:
    return "/".join(map(str, path))


def _first_lora(model: nnx.Module) -> Any:
    from rlcluster_lab.model.lora import LoRALinear

    for _, node in nnx.iter_graph(model):
        if isinstance(node, LoRALinear):
            return node
    raise ValueError("model has no LoRA layer")


def _lora_rank(model: nnx.Module) -> int:
    if not is_lora(model):
        return 0
    return int(_first_lora(model).lora_a.get_value().shape[1])
