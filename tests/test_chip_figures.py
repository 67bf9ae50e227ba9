"""The chip's own figures (notebook 06): measured on the accelerator when there is one, else the
stored figures of a chip run, labelled with the chip, date and commit they come from."""

from __future__ import annotations

import json

import jax
import pytest
from flax import nnx

from rlcluster_lab.lab import chip_figures as chip


def test_without_an_accelerator_the_stored_chip_run_is_shown_and_says_so():
    figures = chip.chip_figures([])
    assert not figures.live
    # The committed figures come from a chip, with the date and commit they were measured at.
    assert "TPU" in figures.device and figures.date and figures.commit
    assert figures.source.startswith(f"stored: measured on {figures.device} on {figures.date}, commit ")
    operations = [row["operation"] for row in figures.rows]
    assert operations[:2] == ["sync_weights to a second mesh on the chip", "one jax.device_put of the same tree"]
    assert all(row["bytes"] > 0 and row["ms"] > 0 for row in figures.rows)
    # The sync and the device_put move the same tree: the floor is of the same bytes.
    assert figures.rows[0]["bytes"] == figures.rows[1]["bytes"]
    assert figures.table().splitlines()[0] == f"{figures.model_size} preset, {figures.source}"


@pytest.mark.cluster
def test_an_accelerator_is_measured_now_and_the_run_reads_back(tmp_path, monkeypatch):
    device = jax.devices("cpu")[0]  # stands in for the chip: the same calls, on one device
    built = []
    real = chip.measure

    def measure(d, size="large", commit=None):
        built.append((d, size))
        return real(d, "tiny", commit="abc1234")

    monkeypatch.setattr(chip, "measure", measure)
    figures = chip.chip_figures([device], "large")
    assert built == [(device, "large")] and figures.live
    assert figures.source.startswith(f"measured now on {figures.device}")
    assert figures.device.endswith(f"chip {device.id}")
    from rlcluster_lab.app.scenario import Scenario, build_cluster

    tree = nnx.state(build_cluster(Scenario(model_size="tiny"), devices=[device]).actor_model, nnx.Param)
    assert {row["bytes"] for row in figures.rows} == {sum(x.nbytes for x in jax.tree.leaves(tree))}
    path = tmp_path / "chip.json"
    path.write_text(json.dumps(figures.to_json()))
    again = chip.stored(path)
    assert not again.live and again.rows == figures.rows and again.commit == "abc1234"
