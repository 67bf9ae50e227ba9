"""The chip's own figures (notebook 06): measured on an accelerator when there is one, else the
stored figures of a chip run labelled with their chip, date and commit, else measured on one CPU
device and labelled so."""

from __future__ import annotations

import jax
import pytest
from flax import nnx

from rlcluster_lab.lab.experiments import chip

ROWS = (
    {"operation": chip.SYNC, "bytes": 3 * 2**20, "ms": 6.0, "GB/s": 0.52},
    {"operation": chip.ANCHOR, "bytes": 3 * 2**20, "ms": 30.0, "GB/s": 0.1},
    {"operation": chip.FLOOR, "bytes": 3 * 2**20, "ms": 2.0, "GB/s": 1.57},
    {"operation": chip.PROGRAM, "bytes": 3 * 2**20, "ms": 0.5, "GB/s": 6.29},
)


def _figures(**kw) -> chip.ChipFigures:
    base = dict(device="TPU v5 lite chip 0", model_size="large", date="2026-12-01", commit="abc1234", live=True)
    return chip.ChipFigures(**{**base, "rows": ROWS, **kw})


def test_a_stored_chip_run_reads_back_and_names_its_chip_date_and_commit(tmp_path, monkeypatch):
    path = tmp_path / "chip.json"
    path.write_text(__import__("json").dumps(_figures().to_json()))
    monkeypatch.setattr(chip, "STORED", path)
    figures = chip.chip_figures([])  # no accelerator: the stored run, not a measurement
    assert not figures.live and figures.rows == ROWS and figures.commit == "abc1234"
    assert figures.source == (
        "stored: measured on TPU v5 lite chip 0 on 2026-12-01, commit abc1234 (this process has no accelerator)"
    )
    assert figures.table().splitlines()[0] == f"large preset, {figures.source}"
    # The summary's ratio and sizes are the rows' own.
    assert figures.summary() == (
        "The sync took 6.0 ms, 3.0x one device_put of the same 3.0 MiB (2.0 ms) and 12.0x one compiled copy "
        "(0.5 ms); the anchor's re-pin of 3.0 MiB to pinned host, timed apart, took 30.0 ms."
    )
    # A run stored before the compiled copy was measured has no such row, and says nothing of it.
    older = _figures(rows=ROWS[:3])
    assert "compiled" not in older.summary() and older.summary().startswith("The sync took 6.0 ms, 3.0x")


def test_an_accelerator_is_measured_now_not_read_from_the_stored_run(monkeypatch):
    device = object()
    calls = []
    monkeypatch.setattr(chip, "measure", lambda d, size: calls.append((d, size)) or _figures())
    assert chip.chip_figures([device, object()], "small").live
    assert calls == [(device, "small")]


def test_the_preset_measured_by_default_is_large_on_a_chip_and_small_on_a_cpu(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(chip, "measure", lambda d, size: calls.append((d, size)) or _figures())
    monkeypatch.setattr(chip, "STORED", tmp_path / "absent.json")
    device = object()
    chip.chip_figures([device])
    chip.chip_figures([])
    assert calls == [(device, "large"), (jax.devices("cpu")[0], "small")]


@pytest.mark.cluster
def test_without_an_accelerator_or_a_stored_run_one_cpu_device_is_measured_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(chip, "STORED", tmp_path / "absent.json")
    seen = []
    real = chip.measure
    monkeypatch.setattr(chip, "measure", lambda d, size: seen.append(d) or real(d, size))
    figures = chip.chip_figures([], "tiny")
    cpu = jax.devices("cpu")[0]
    assert seen == [cpu] and figures.live and figures.device == "1 CPU device"
    assert "no accelerator here and no chip run stored" in figures.source
    from rlcluster_lab.app.scenario import Scenario, build_cluster

    cluster = build_cluster(Scenario(layout="reshaped", engine="vllm", model_size="tiny"), devices=[cpu])
    params = sum(x.nbytes for x in jax.tree.leaves(nnx.state(cluster.actor_model, nnx.Param)))
    report = cluster.sync_weights()
    # The rollout keeps weights of its own on the second mesh: the sync is a real copy of every byte.
    actor = {x.unsafe_buffer_pointer() for x in jax.tree.leaves(nnx.state(cluster.actor_model, nnx.Param))}
    assert not actor & {x.unsafe_buffer_pointer() for x in cluster.rollout.held_values((nnx.Param,))}
    assert figures.row(chip.SYNC)["bytes"] == report.synced_bytes == params == figures.row(chip.FLOOR)["bytes"]
    assert figures.row(chip.PROGRAM)["bytes"] == params
    assert figures.row(chip.ANCHOR)["bytes"] == report.anchor_bytes > 0
    assert all(row["ms"] > 0 for row in figures.rows)


def test_the_floor_is_a_real_copy_even_onto_the_same_device():
    # Onto an identical sharding a plain device_put hands back the same buffers: no floor at all.
    # The floor's (measure.sync.sync_floor, where the sync made new buffers) copies.
    leaves = [jax.numpy.arange(n, dtype=jax.numpy.float32) + 1 for n in (3, 1024, 5000)]
    shardings = [x.sharding for x in leaves]
    pointers = {x.unsafe_buffer_pointer() for x in leaves}
    assert pointers == {y.unsafe_buffer_pointer() for y in jax.device_put(leaves, shardings)}
    copied = jax.device_put(leaves, shardings, may_alias=False)
    assert not pointers & {y.unsafe_buffer_pointer() for y in copied}
    assert all((x == y).all() and y.sharding == x.sharding for x, y in zip(leaves, copied))
