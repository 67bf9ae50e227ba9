"""Each batch program's planned bytes beside XLA's own memory analysis (L4).

The lab's own sampler, log-prob program and optimizer step, for one of its models on one
device, are lowered over abstract arrays (``jax.ShapeDtypeStruct``s placed on that device: the
model's state, its optimizer state as ``init_optimizer_state`` lays it out, the batch) through
the code a cluster runs, and compiled; nothing is allocated or run. XLA's figure is
``compiled.memory_analysis()``: arguments + outputs + temporaries - aliased. The planner's is
the one ``model.fits`` checks before the program is compiled, from the same arrays. The tests
hold the two within 10% of each other on XLA:CPU; ``benchmarks/memory_check.py`` prints them on
any backend.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlcluster_lab.core.config import TrainingConfig
from rlcluster_lab.core.model_config import ModelConfig
from rlcluster_lab.model import abstract_model
from rlcluster_lab.model.fits import arguments, model_program
from rlcluster_lab.model.logps import LOGPS, model_compiler_options
from rlcluster_lab.model.memory import ProgramBytes, generate_program, logps_program
from rlcluster_lab.model.sampling import lowered_generate
from rlcluster_lab.training.step import abstract_optimizer_state, train_step, update_figure

PROGRAMS = ("generate", "log-probs", "train step")


@dataclasses.dataclass(frozen=True)
class Compared:
    """One program: the planner's figure and XLA's (``memory_analysis``, bytes on the device)."""

    program: str
    planned: ProgramBytes
    xla: dict[str, int]
    compile_seconds: float

    @property
    def xla_bytes(self) -> int:
        x = self.xla
        return x["argument"] + x["output"] + x["temp"] - x["alias"]

    @property
    def ratio(self) -> float:
        """The planner's figure over XLA's."""
        return self.planned.total / self.xla_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "planned_bytes": self.planned.total,
            "xla_bytes": self.xla_bytes,
            "ratio": round(self.ratio, 4),
            "planned": self.planned.to_json(),
            "xla": self.xla,
            "compile_seconds": round(self.compile_seconds, 3),
        }


def compare(
    program: str,
    config: ModelConfig,
    rows: int,
    prompt: int,
    completion: int,
    *,
    slots: int = 128,
    lora_rank: int = 0,
    device: Any = None,
) -> Compared:
    """``program`` (one of ``PROGRAMS``) of ``config``'s model (with LoRA adapters of
    ``lora_rank``) over ``rows`` rows of ``prompt`` + ``completion`` tokens (the sampler: a cache
    of ``slots``) on ``device`` (default: the first of the default backend), planned and compiled."""
    if program not in PROGRAMS:
        raise ValueError(f"program must be one of {', '.join(PROGRAMS)}, got {program!r}")
    placed = NamedSharding(Mesh(np.asarray([device or jax.devices()[0]]), ("x",)), PartitionSpec())

    def on_device(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=placed)

    model = abstract_model(config, lora_rank)
    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda x: on_device(x.shape, x.dtype), state)
    tokens, ids = on_device((rows, prompt), np.int32), on_device((rows, completion), np.int32)
    if program == "log-probs":
        figure = model_program(logps_program, config, state, rows, prompt, completion)
        args: Any = (state, tokens, ids)
        lowered = LOGPS.jitted(model_compiler_options(graphdef, state)).lower(graphdef, *args, 0, np.float32(1.0))
    elif program == "generate":
        figure = model_program(generate_program, config, state, rows, prompt, completion, slots)
        args = (state, tokens)
        lowered = lowered_generate(
            graphdef, state, tokens, max_new_tokens=completion, cache_size=slots, eos_id=1, pad_id=0
        )
    else:
        tx = TrainingConfig().actor_optimizer()
        graphdef, trainable, frozen = nnx.split(model, nnx.LoRAParam if lora_rank else nnx.Param, ...)
        trainable, frozen = (jax.tree.map(lambda x: on_device(x.shape, x.dtype), t) for t in (trainable, frozen))
        floats = {k: on_device((rows, completion), np.float32) for k in ("old_logps", "ref_logps")}
        batch = {"prompt_tokens": tokens, "completion_tokens": ids, "advantages": on_device((rows,), np.float32)}
        args = (trainable, frozen, abstract_optimizer_state(tx, trainable, placed.mesh), batch | floats)
        figure = update_figure(graphdef, args, 1)
        lowered = train_step(graphdef, tx, *args, np.float32(1.0), pad_id=0, beta=0.04, epsilon=0.2, lower=True)
    resident, host = arguments(args)
    planned = figure(max(resident.values(), default=0) + host)
    xla, seconds = xla_memory(lowered)
    return Compared(program, planned, xla, seconds)


def xla_memory(lowered: Any) -> tuple[dict[str, int], float]:
    """A lowered program compiled: XLA's ``memory_analysis()`` by term (bytes per device:
    argument, output, temp, alias, generated_code), and the seconds compiling took."""
    start = time.perf_counter()
    analysis = lowered.compile().memory_analysis()
    seconds = time.perf_counter() - start
    terms = ("argument", "output", "temp", "alias", "generated_code")
    return {k: int(getattr(analysis, f"{k}_size_in_bytes")) for k in terms}, seconds
