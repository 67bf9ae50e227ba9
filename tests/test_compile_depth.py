"""What depth costs to compile (measure.compile_depth): the loop's program grows with the
layers, the scan's does not, both give the same log-probs, and the sentence reads the rows."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from rlcluster_lab.core.compile_cache import count_compilations, flush_cache_writes, uncached
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.measure.compile_depth import DepthReport, DepthRow, depth_compile_costs


@pytest.mark.parametrize("seed", [0, 1])
def test_the_loops_program_grows_with_depth_and_the_scans_does_not(seed):
    rng = np.random.default_rng(seed)
    shallow, deep = 1 + int(rng.integers(0, 2)), 6 + int(rng.integers(0, 4))
    report = depth_compile_costs(
        "tiny",
        (shallow, deep),
        batch=int(rng.integers(1, 4)),
        prompt_len=int(rng.integers(3, 9)),
        completion_len=int(rng.integers(2, 7)),
        seed=seed,
        repeats=1,
    )
    assert [(r.depth, r.how) for r in report.rows] == [
        (shallow, "scan"),
        (shallow, "loop"),
        (deep, "scan"),
        (deep, "loop"),
    ]
    # Line counts of the lowered text: deterministic. The scan's holds one layer whatever the
    # depth; the loop's holds every layer, so each added layer adds code.
    assert report.row(deep, "scan").program_lines == report.row(shallow, "scan").program_lines
    loop_growth = report.row(deep, "loop").program_lines - report.row(shallow, "loop").program_lines
    per_layer = loop_growth / (deep - shallow)
    assert per_layer > 50, report.rows
    assert report.row(deep, "loop").program_lines > 2 * report.row(deep, "scan").program_lines
    # The same weights, the same math: the same log-probs.
    assert set(report.max_difference) == {shallow, deep}
    assert max(report.max_difference.values()) < 1e-5
    assert all(r.trace_seconds > 0 and r.compile_seconds > 0 for r in report.rows)


def _report(loop_lines: int = 2025, loop_seconds: float = 0.5) -> DepthReport:
    rows = (
        DepthRow(2, "scan", 393, 0.05, 0.10),
        DepthRow(2, "loop", 505, 0.10, 0.10),
        DepthRow(12, "scan", 393, 0.05, 0.15),
        DepthRow(12, "loop", loop_lines, 0.20, loop_seconds),
    )
    return DepthReport(rows, {2: 0.0, 12: 2e-7})


def test_the_sentence_is_read_from_the_rows():
    sentence = _report().sentence()
    assert sentence.startswith("From 2 to 12 layers")
    assert "from 505 to 2,025 lines (4.0x)" in sentence and "the program stayed at 393 lines" in sentence
    assert "0.20 s to 0.70 s" in sentence and "0.15 s to 0.20 s" in sentence
    assert "the loop costs 3.5x the scan" in sentence and "2.0e-07" in sentence
    assert "from 505 to 3,030 lines (6.0x)" in _report(loop_lines=3030).sentence()
    assert "the loop costs 5.5x the scan" in _report(loop_seconds=0.9).sentence()
    grown = dataclasses.replace(
        _report(), rows=(*_report().rows[:2], DepthRow(12, "scan", 400, 0.05, 0.15), _report().rows[3])
    )
    assert "from 393 to 400 lines (1.0x)" in grown.sentence()
    other = dataclasses.replace(
        _report(), rows=tuple(dataclasses.replace(r, depth=r.depth * 2) for r in _report().rows)
    )
    assert other.sentence().startswith("From 4 to 24 layers") and "At 24 layers" in other.sentence()
    with pytest.raises(KeyError, match="no row for 12 layers"):
        other.row(12, "scan")


def test_fewer_than_two_depths_are_refused():
    with pytest.raises(ConfigError, match="at least two different layer counts"):
        depth_compile_costs("tiny", (4, 4))
    with pytest.raises(ConfigError, match="at least two different layer counts"):
        depth_compile_costs("tiny", (0, 4))
    with pytest.raises(ConfigError, match="repeats must be 1 or more"):
        depth_compile_costs("tiny", (2, 4), repeats=0)


def test_uncached_compiles_what_the_persistent_cache_holds_and_leaves_other_threads_reading_it():
    """The test run has a persistent cache (conftest): a program written to it is read back by a
    fresh jit, but compiled by XLA inside ``uncached``, while another thread still reads it."""
    import jax
    import jax.numpy as jnp

    assert jax.config.jax_compilation_cache_dir
    x = jnp.arange(7.0)

    def fresh():  # a new function object each time: JAX's in-memory cache cannot answer
        return jax.jit(lambda a: jnp.cumsum(jnp.sin(a) * 3.25) - 0.5)

    def built(jitted) -> list[bool]:
        with count_compilations() as found:
            jitted.lower(x).compile()
        return [from_disk for _, _, from_disk in found]

    built(fresh())
    flush_cache_writes()
    assert built(fresh()) == [True]
    with uncached():
        assert built(fresh()) == [False]
        beside: list[list[bool]] = []
        thread = threading.Thread(target=lambda: beside.append(built(fresh())))
        thread.start()
        thread.join()
    assert beside == [[True]]
    assert built(fresh()) == [True]
