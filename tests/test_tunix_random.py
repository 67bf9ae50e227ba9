"""Tunix's own RLCluster beside the lab's on random configurations, not only the twelve standard ones.

Each configuration (a seeded random list, the same on every run) puts the roles on 2-4 distinct
meshes: random device subsets of 8, 4, 2 or 1 devices in ascending, reversed, interleaved or
shuffled order, each in a shape that fits the tiny model (``fitting_shapes``), so meshes may be
equal, disjoint, the same devices in another shape or order, or partly overlapping. The knobs
vary too: LoRA on or off (ranks 2-16, over the reference's backbone or a copy of it), offload,
the vanilla and vllm engines (vllm through the stand-in, as in ``tests/test_tunix.py``), a
reward and a critic. ``side_by_side`` builds both clusters on the same meshes; every decision,
memory figure and shared buffer must agree, or differ only by a documented difference whose own
check observed it in those two clusters.

Every second configuration also runs one weight sync on each side (P13, L3), to keep the CI time
small. Measured on the 2-core machine: the builds are the cost (each configuration's shardings are
new, so its programs are compiled); syncing every configuration added about an eighth, every
second about half of that. The 40 configurations took about 2 minutes (docs/tunix.md).
"""

from __future__ import annotations

import dataclasses
import random

import jax
import pytest

from rlcluster_lab import Role, Scenario
from rlcluster_lab import tunix as rt
from rlcluster_lab.core.meshes import fitting_shapes, make_mesh
from rlcluster_lab.model import get_model_config

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*with mesh.*context manager has been deprecated:DeprecationWarning"),
    pytest.mark.cluster,  # both clusters, built side by side
]
needs_tunix = pytest.mark.skipif(not rt.available(), reason=f"Tunix is not installed: {rt.INSTALL_HINT}")

COUNT = 40
SYNC_EVERY = 2
ORDERS = ("ascending", "reversed", "interleaved", "shuffled")


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """One mesh on paper: device ids in mesh order and its (fsdp, tp) shape."""

    ids: tuple[int, ...]
    shape: tuple[int, int]

    def build(self) -> jax.sharding.Mesh:
        devices = {d.id: d for d in jax.devices()}
        return make_mesh([devices[i] for i in self.ids], self.shape)

    def __str__(self) -> str:
        return f"{''.join(map(str, self.ids))}@{self.shape[0]}x{self.shape[1]}"


@dataclasses.dataclass(frozen=True)
class Config:
    """A scenario's knobs and each role's mesh."""

    scenario: Scenario
    meshes: tuple[tuple[Role, MeshSpec], ...]
    sync: bool

    def role_to_mesh(self) -> dict[Role, jax.sharding.Mesh]:
        return {role: spec.build() for role, spec in self.meshes}

    def __str__(self) -> str:
        s = self.scenario
        knobs = [f"lora{s.lora_rank}" + ("-copy" if s.lora_separate_base else "") if s.lora else "full", s.engine]
        knobs += ["offload"] * s.offload + ["reward"] * s.with_reward + ["critic"] * s.with_critic
        knobs += ["sync"] * self.sync
        return "-".join(knobs) + ":" + ",".join(f"{r.value[:3]}={m}" for r, m in self.meshes)


def _order(rng: random.Random, ids: list[int]) -> tuple[int, ...]:
    ids = sorted(ids)
    how = rng.choice(ORDERS)
    if how == "reversed":
        ids.reverse()
    elif how == "interleaved":
        ids = ids[::2] + ids[1::2]
    elif how == "shuffled":
        rng.shuffle(ids)
    return tuple(ids)


def _mesh(rng: random.Random) -> MeshSpec:
    count = rng.choice([8, 4, 2, 1])
    shape = rng.choice(fitting_shapes(count, get_model_config("tiny")))
    return MeshSpec(_order(rng, rng.sample(range(8), count)), shape)


def random_configs(seed: int, count: int) -> list[Config]:
    """``count`` configurations drawn from ``seed``: the roles on 2-4 distinct meshes, the knobs at random."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        lora = rng.random() < 0.5
        scenario = Scenario(
            lora=lora,
            lora_rank=rng.choice([2, 4, 8, 16]),
            lora_separate_base=lora and rng.random() < 0.25,
            engine=rng.choice(["vanilla", "vllm"]),
            offload=rng.random() < 0.3,
            with_reward=rng.random() < 0.3,
            with_critic=rng.random() < 0.3,
        )
        roles = [Role.ACTOR, Role.ROLLOUT, Role.REFERENCE]
        roles += [Role.REWARD] * scenario.with_reward + [Role.CRITIC] * scenario.with_critic
        pool: list[MeshSpec] = []
        while len(pool) < min(rng.choice([2, 3, 4]), len(roles)):
            spec = _mesh(rng)
            if spec not in pool:
                pool.append(spec)
        # Every mesh of the pool is some role's; the other roles take one of them at random.
        order = rng.sample(roles, len(roles))
        chosen = {role: pool[j] if j < len(pool) else rng.choice(pool) for j, role in enumerate(order)}
        meshes = tuple((role, chosen[role]) for role in roles)
        out.append(Config(scenario, meshes, sync=i % SYNC_EVERY == 0))
    return out


CONFIGS = random_configs(seed=20260107, count=COUNT)


def test_the_configurations_cover_what_they_claim():
    """Mesh counts 2-4, every device order and count, LoRA ranks, both engines, offload, reward, critic."""
    distinct = {len({m for _, m in c.meshes}) for c in CONFIGS}
    specs = [m for c in CONFIGS for _, m in c.meshes]
    scenarios = [c.scenario for c in CONFIGS]
    assert distinct == {2, 3, 4}
    assert {len(m.ids) for m in specs} == {1, 2, 4, 8}
    tiny = get_model_config("tiny")
    assert {m.shape for m in specs} == {shape for n in (8, 4, 2, 1) for shape in fitting_shapes(n, tiny)}
    ordered = [(m.ids, tuple(sorted(m.ids))) for m in specs if len(m.ids) > 2]
    assert any(ids == up[::-1] for ids, up in ordered)  # reversed
    assert any(ids == up[::2] + up[1::2] for ids, up in ordered)  # interleaved
    assert any(ids not in (up, up[::-1], up[::2] + up[1::2]) for ids, up in ordered)  # shuffled
    assert {s.lora_rank for s in scenarios if s.lora} == {2, 4, 8, 16}
    assert {s.engine for s in scenarios} == {"vanilla", "vllm"}
    for knob in ("lora", "offload", "with_reward", "with_critic", "lora_separate_base"):
        assert {getattr(s, knob) for s in scenarios} == {True, False}, knob
    assert sum(c.sync for c in CONFIGS) == COUNT // SYNC_EVERY


@needs_tunix
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_every_decision_and_figure_agrees_or_differs_only_by_an_observed_difference(config):
    result = rt.side_by_side(config.scenario, role_to_mesh=config.role_to_mesh(), sync=config.sync)
    assert not result.unexplained, f"{config}\n" + result.table()
    observed = {d.id for d in result.differences if d.observed}
    assert {r.difference for r in result.differing} <= observed
