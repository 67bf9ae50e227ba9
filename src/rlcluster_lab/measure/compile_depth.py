"""What depth costs to compile: one log-prob program of the lab's model at two depths, its layers
applied by the lab's scan and as a Python loop over the same stacked weights (how Tunix's own
models run theirs: every layer's code in the program, which grows with depth). Measured in this
process: a fresh ``jax.jit`` each, compiled with the lab's options, the persistent cache unused."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlcluster_lab.core.compile_cache import count_compilations, uncached
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.model_config import ModelConfig, get_model_config
from rlcluster_lab.core.precision import traced_at, traced_precision
from rlcluster_lab.model import init_model
from rlcluster_lab.model.logps import forward_logps, model_compiler_options
from rlcluster_lab.model.transformer import TransformerLM

SOURCE = (
    "measured in this process: one log-prob program per row, traced and lowered by a fresh jax.jit "
    "(trace), compiled by XLA with the lab's compiler options (compile), the persistent cache not "
    "used; lines: of the lowered program's text (StableHLO)"
)


class LayersInALoop(TransformerLM):
    """The lab's model with its layers applied as a Python loop over the same stacked weights."""

    def layers(self, x, positions, bias, cache, index):
        graphdef, state = nnx.split(self.blocks)
        keys, values = [], []
        for i in range(self.config.num_layers):
            params = jax.tree.map(lambda w, i=i: w[i], state)
            kv = None if cache is None else (cache[0][i], cache[1][i])
            x, new_kv = nnx.merge(graphdef, params)(x, positions, bias, kv, index)
            if new_kv is not None:
                keys.append(new_kv[0])
                values.append(new_kv[1])
        return x, (jnp.stack(keys), jnp.stack(values)) if cache is not None else None


@dataclasses.dataclass(frozen=True)
class DepthRow:
    """One program: the model's depth, how its layers were applied, and what it cost."""

    depth: int  # layers
    how: str  # "scan" (the lab's) or "loop" (a Python loop over the layers)
    program_lines: int  # lines of the lowered program's text: deterministic
    trace_seconds: float  # measured: tracing and lowering
    compile_seconds: float  # measured: XLA compiling


@dataclasses.dataclass(frozen=True)
class DepthReport:
    """The rows, the largest loop-versus-scan log-prob difference per depth, and the figures' source."""

    rows: tuple[DepthRow, ...]
    max_difference: dict[int, float]  # depth -> max |loop - scan| over the log-probs
    source: str = SOURCE

    def row(self, depth: int, how: str) -> DepthRow:
        """The row of ``depth`` layers applied ``how``."""
        for r in self.rows:
            if r.depth == depth and r.how == how:
                return r
        raise KeyError(f"no row for {depth} layers by {how!r}; rows: {[(r.depth, r.how) for r in self.rows]}")

    def table(self) -> list[dict[str, Any]]:
        """The rows as table rows (``lab.experiments.runs.format_table``)."""
        return [
            {
                "layers": r.depth,
                "applied by": r.how,
                "program lines": r.program_lines,
                "trace s": round(r.trace_seconds, 2),
                "compile s": round(r.compile_seconds, 2),
                "max |loop - scan|": f"{self.max_difference[r.depth]:.1e}",
            }
            for r in self.rows
        ]

    def sentence(self) -> str:
        """What the rows say, from the shallowest depth to the deepest."""
        low, high = min(r.depth for r in self.rows), max(r.depth for r in self.rows)
        parts = []
        for how, what in (("loop", "as a Python loop"), ("scan", "by the scan")):
            a, b = self.row(low, how), self.row(high, how)
            ta, tb = a.trace_seconds + a.compile_seconds, b.trace_seconds + b.compile_seconds
            size = (
                f"stayed at {a.program_lines:,} lines"
                if a.program_lines == b.program_lines
                else f"went from {a.program_lines:,} to {b.program_lines:,} lines "
                f"({b.program_lines / a.program_lines:.1f}x)"
            )
            parts.append(f"{what}, the program {size} and trace + compile went from {ta:.2f} s to {tb:.2f} s")
        loop, scan = self.row(high, "loop"), self.row(high, "scan")
        ratio = (loop.trace_seconds + loop.compile_seconds) / (scan.trace_seconds + scan.compile_seconds)
        return (
            f"From {low} to {high} layers, with the layers applied {parts[0]}; applied {parts[1]}. "
            f"At {high} layers the loop costs {ratio:.1f}x the scan to trace and compile, for the same "
            f"log-probs (largest difference {max(self.max_difference.values()):.1e})."
        )


def _measure(graphdef: nnx.GraphDef, state: nnx.State, prompt: jax.Array, completion: jax.Array, pad_id: int):
    """(lowered lines, trace seconds, compile seconds, log-probs) of a fresh program."""

    def logps(state, prompt, completion):  # a new function object: no in-memory cache hit
        return forward_logps(nnx.merge(graphdef, state), prompt, completion, pad_id)

    # At the log-prob programs' precision here (core.precision), as the lab's own would be.
    jitted = jax.jit(
        traced_at(logps, traced_precision("log-probs")), compiler_options=model_compiler_options(graphdef, state)
    )
    with uncached(), count_compilations() as built:
        start = time.perf_counter()
        lowered = jitted.lower(state, prompt, completion)
        text = lowered.as_text()
        traced = time.perf_counter()
        compiled = lowered.compile()
        done = time.perf_counter()
    if any(from_disk for _, _, from_disk in built):
        raise RuntimeError("a measured program was read from the persistent cache, not compiled: no figure from it")
    return len(text.splitlines()), traced - start, done - traced, np.asarray(compiled(state, prompt, completion))


def depth_compile_costs(
    config: ModelConfig | str = "tiny",
    depths: Sequence[int] = (2, 12),
    *,
    batch: int = 2,
    prompt_len: int = 8,
    completion_len: int = 8,
    seed: int = 0,
    repeats: int = 3,
) -> DepthReport:
    """Measure one log-prob program of ``config`` at each depth in ``depths``, its layers applied by
    the scan and by a loop; each built ``repeats`` times afresh, keeping the fastest trace and compile.

    Raises:
        ConfigError: fewer than two depths, a depth below 1, or fewer than one repeat."""
    config = get_model_config(config) if isinstance(config, str) else config
    depths = tuple(int(d) for d in depths)
    if len(set(depths)) < 2 or min(depths) < 1:
        raise ConfigError(f"depths must be at least two different layer counts of 1 or more, got {depths}")
    if repeats < 1:
        raise ConfigError(f"repeats must be 1 or more (builds of each program), got {repeats}")
    rng = np.random.default_rng(seed)
    prompt = jnp.asarray(rng.integers(1, config.vocab_size, (batch, prompt_len)), jnp.int32)
    completion = jnp.asarray(rng.integers(1, config.vocab_size, (batch, completion_len)), jnp.int32)
    rows, differences = [], {}
    for depth in depths:
        deep = dataclasses.replace(config, num_layers=depth)
        graphdef, state = nnx.split(init_model(deep, seed=seed))
        loop_graphdef, _ = nnx.split(nnx.eval_shape(lambda deep=deep: LayersInALoop(deep, rngs=nnx.Rngs(0))))
        if not rows:
            # Once, unrecorded: a process's first trace also pays for what JAX sets up once.
            _measure(graphdef, state, prompt, completion, pad_id=0)
        out = {}
        for how, gd in (("scan", graphdef), ("loop", loop_graphdef)):
            builds = [_measure(gd, state, prompt, completion, pad_id=0) for _ in range(repeats)]
            lines, _, _, out[how] = builds[0]
            trace_s, compile_s = min(b[1] for b in builds), min(b[2] for b in builds)
            rows.append(DepthRow(depth, how, lines, trace_s, compile_s))
        differences[depth] = float(np.max(np.abs(out["loop"] - out["scan"])))
    return DepthReport(tuple(rows), differences)
