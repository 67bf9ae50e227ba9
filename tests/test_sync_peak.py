"""P13, L3, L4: a sync's transient peak per device, measured and planned, in one piece and in chunks."""

from __future__ import annotations

import json
import warnings

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcluster_lab import Role, Scenario, build_cluster
from rlcluster_lab.cli.main import main
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import describe
from rlcluster_lab.core.meshes import fitting_shapes, layout_meshes, make_mesh
from rlcluster_lab.model import get_model_config
from rlcluster_lab.placement import phases
from rlcluster_lab.placement.chunks import chunk_leaves
from rlcluster_lab.planner.plan import plan_cluster, plan_scenario

pytestmark = pytest.mark.cluster  # most tests here build a cluster

LAYOUTS = ("colocated", "reshaped", "split")
ENGINES = ("vanilla", "vllm", "sglang_jax")
# The chunk size of each matrix case: a few chunks each (every chunk is a program to compile).
CHUNKS = {False: 176 << 10, True: 12 << 10}  # the full tree (421 KB) in 3 chunks, the LoRA adapters (32 KB) in 3
CHUNK = CHUNKS[False]
SMALL_CHUNK = 1 << 20  # the small model's (6.2 MB) in 6: a leaf of 1.5 MB (every layer's MLP kernel) alone
# What a plan and a measurement must both say (the method and, for a plan, the other orders aside).
SAME = (
    "by_device",
    "max_bytes",
    "max_device",
    "phase_at_peak",
    "after",
    "chunks",
    "chunk_bytes",
    "largest_chunk_bytes",
    "order",
    "phases",
)


@pytest.fixture(scope="module")
def peaks():
    """The plan's transient peak (with the reshard programs compiled for their temporaries) and
    the first sync's measured one, per scenario: each cluster built once per module."""
    results: dict[Scenario, tuple[dict, dict]] = {}

    def planned_and_measured(scenario: Scenario) -> tuple[dict, dict]:
        if scenario not in results:
            planned = plan_scenario(scenario, sync_programs=True).to_json()["sync"]["transient_peak"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cluster = build_cluster(scenario)
            results[scenario] = (planned, cluster.sync_weights().to_json()["transient_peak"])
        return results[scenario]

    return planned_and_measured


def _scenario(layout: str, lora: bool, engine: str, chunk: int | None, size: str = "tiny") -> Scenario:
    return Scenario(layout=layout, lora=lora, engine=engine, model_size=size, sync_chunk_bytes=chunk)


@pytest.mark.parametrize("chunked", [False, True], ids=["one-piece", "chunks"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_l4_planned_sync_peak_equals_the_measured_one(layout, lora, engine, chunked, peaks):
    planned, measured = peaks(_scenario(layout, lora, engine, CHUNKS[lora] if chunked else None))
    assert measured["chunks"] == (3 if chunked else 1)
    for key in SAME:
        assert planned[key] == measured[key], key
    assert measured["method"]["arrays"].startswith("measured")
    assert planned["method"]["arrays"].startswith("computed from shapes")


@pytest.mark.parametrize("chunk", [None, SMALL_CHUNK], ids=["one-piece", "chunks"])
def test_l4_planned_sync_peak_equals_the_measured_one_for_a_small_reshaped_full_sync(chunk, peaks):
    planned, measured = peaks(_scenario("reshaped", False, "vanilla", chunk, "small"))
    for key in SAME:
        assert planned[key] == measured[key], key


@st.composite
def _buildable(draw):
    """A scenario the lab can build, with a rollout mesh of its own over any devices in any order
    (one device included), and the sync's knobs drawn too."""
    count = draw(st.sampled_from([8, 4, 2, 1]))
    ids = draw(st.permutations(range(8)))[:count]
    shape = draw(st.sampled_from(fitting_shapes(count, get_model_config("tiny"))))
    lora = draw(st.booleans())
    knobs = {
        "layout": draw(st.sampled_from(LAYOUTS)),
        "lora": lora,
        "lora_rank": draw(st.sampled_from([2, 4, 8, 16])),
        "engine": draw(st.sampled_from(ENGINES)),
        "reshard": draw(st.sampled_from(["xla", "minimal"])),
        "rollout_dtype": draw(st.sampled_from([None, "bfloat16"])),
        "offload": draw(st.booleans()),
        "sync_chunk_bytes": draw(st.sampled_from([None, 4 << 10, 16 << 10, 160 << 10])),
    }
    custom = draw(st.booleans())
    return Scenario(**knobs), (tuple(ids), shape) if custom else None


# Eight drawn scenarios: each builds a cluster and syncs it, about 5 s on two cores.
@settings(deadline=None, derandomize=True, max_examples=8)
@given(_buildable())
def test_l4_planned_sync_peak_equals_the_measured_one_for_any_buildable_scenario(case):
    """Planned = measured, key for key, over scenarios beyond the standard ones: custom rollout
    meshes over any device subset and order (one device too), both reshard strategies, LoRA
    ranks, rollout dtypes, chunk sizes, offload, every engine; and for a later sync too."""
    scenario, custom = case
    r2m = None
    if custom is not None:
        ids, shape = custom
        r2m = layout_meshes(scenario.layout)
        r2m[Role.ROLLOUT] = make_mesh([jax.devices()[i] for i in ids], shape)
    planned = plan_scenario(scenario, sync_programs=True, role_to_mesh=r2m).to_json()["sync"]["transient_peak"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = build_cluster(scenario, role_to_mesh=r2m)
    first = cluster.sync_weights().to_json()["transient_peak"]
    later = cluster.sync_weights().to_json()["transient_peak"]
    for key in SAME:
        assert planned[key] == first[key], key
        assert planned[key] == later[key], key


def test_p13_chunks_lower_the_measured_peak_of_a_small_reshaped_full_sync(peaks):
    _, whole = peaks(_scenario("reshaped", False, "vanilla", None, "small"))
    _, chunked = peaks(_scenario("reshaped", False, "vanilla", SMALL_CHUNK, "small"))
    assert chunked["chunks"] > 1 and whole["chunks"] == 1
    # A chunk holds whole leaves, and a leaf of the layer stack holds every layer's weight (the
    # small model's largest, an MLP kernel, is 1.5 MB of its 6.2 MB): the peak falls below a third.
    assert chunked["max_bytes"]["device"] < whole["max_bytes"]["device"] / 3
    # The anchor re-pin is not chunked, and writes over the old anchor's buffers (P8): no pinned-host peak either way.
    assert "pinned_host" not in chunked["max_bytes"] and "pinned_host" not in whole["max_bytes"]


def test_l3_a_reshaped_sync_peaks_with_its_new_arrays_and_the_programs_temporaries(peaks):
    _, m = peaks(_scenario("reshaped", False, "vanilla", None))
    at = next(p for p in m["phases"] if p["name"] == "reshard" and p["temporaries"])
    new = at["terms"]["0"][phases.RESHARDED]
    assert new > 0 and at["temporaries"]["0"] > 0
    assert m["by_device"]["0"]["device"] == new + at["temporaries"]["0"]
    # In one piece the old arrays stay until the end (kept for a rollback): nothing is
    # released at the commit, all of it at the end, where the sync leaves what it found.
    commit = next(p for p in m["phases"] if p["name"] == "commit")
    assert "released" not in commit["terms"].get("0", {})
    assert m["after"] == {}


def test_l3_chunks_release_each_chunks_old_arrays_before_the_next(peaks):
    _, m = peaks(_scenario("reshaped", False, "vanilla", CHUNK))
    commits = [p for p in m["phases"] if p["name"] == "commit"]
    assert len(commits) == m["chunks"] > 1
    # Each commit leaves what the chunk made, minus what it replaced: no more than before it.
    assert all(p["arrays"].get("0", {}).get("device", 0) <= 0 for p in commits)
    assert all(p["terms"].get("0", {}).get("released", 0) < 0 for p in commits)
    assert m["after"] == {}


def test_l3_a_colocated_shared_sync_holds_nothing_new_on_device(peaks):
    _, m = peaks(_scenario("colocated", False, "vanilla", None))
    assert all("device" not in kinds for kinds in m["by_device"].values())
    # The anchor re-pin writes over the old anchor's buffers (P8): a new anchor, as many pinned bytes released.
    repin = next(p for p in m["phases"] if p["name"] == "anchor re-pin")
    assert m["by_device"] == {} and repin["terms"]
    for terms in repin["terms"].values():
        assert terms[phases.ANCHOR] == -terms[phases.term_in(phases.RELEASED, "pinned_host")] > 0


@pytest.mark.parametrize(
    "knobs",
    [
        {"layout": "reshaped", "offload": True},
        {"layout": "split", "lora": True, "offload": True, "engine": "vllm"},
    ],
    ids=["reshaped", "split-vllm-lora"],
)
def test_p14_an_offloaded_sync_stages_each_chunk_on_device_and_writes_pinned_host(knobs, peaks):
    scenario = Scenario(**knobs, sync_chunk_bytes=CHUNKS[bool(knobs.get("lora"))])
    planned, measured = peaks(scenario)
    for key in SAME:
        assert planned[key] == measured[key], key
    device = measured["max_device"]
    at = next(p for p in measured["phases"] if p["chunk"] and p["name"] == "reshard")
    # On device at the peak: the actor's chunk brought from pinned host, and the rollout's new arrays.
    assert phases.STAGED in at["terms"][device]
    assert any(p["terms"].get(d, {}).get(phases.MEMORY_KIND) for p in measured["phases"] for d in p["terms"])
    assert measured["after"] == {}


@pytest.mark.parametrize(
    "knobs,higher",
    [
        # Last, the anchor is written over the old one (P8); first, it needs buffers of its own.
        ({"layout": "reshaped"}, ["anchor re-pinned first"]),
        ({"layout": "reshaped", "sync_chunk_bytes": CHUNK}, ["anchor re-pinned first"]),
        ({"layout": "split", "lora": True}, ["anchor re-pinned first"]),
        ({"layout": "reshaped", "offload": True}, ["rollout brought to device whole"]),
        (
            {"layout": "colocated", "engine": "vllm", "offload": True, "sync_chunk_bytes": CHUNK},
            ["rollout brought to device whole"],
        ),
    ],
)
def test_p13_p14_the_clusters_sync_order_has_the_lowest_planned_peak(knobs, higher):
    orders = plan_scenario(Scenario(**knobs)).to_json()["sync"]["transient_peak"]["orders"]
    ours = orders.pop("the cluster's")
    assert orders and ("rollout brought to device whole" in orders) == bool(knobs.get("offload"))
    for name, other in orders.items():
        assert other["max_total_bytes"] >= ours["max_total_bytes"]
        for kind, n in ours["max_bytes"].items():
            assert other["max_bytes"].get(kind, 0) >= n
        # Under offload the anchor keeps the actor's pinned buffers: re-pinning it first costs nothing.
        assert (other["max_total_bytes"] > ours["max_total_bytes"]) == (name in higher), name


def test_l4_70b_what_if_counts_the_sync_peak_in_its_fit_and_chunks_lower_it():
    def busiest_sync(plan):
        syncs = [b.phases.get("sync", {}) for b in plan.per_device]
        return max(sum(s.values()) for s in syncs)

    whole = plan_cluster("llama3-70b", "gpu-8", layout="split")
    chunked = plan_cluster("llama3-70b", "gpu-8", layout="split", sync_chunk_bytes=1 << 30)
    peak = whole.sync["transient_peak"]
    assert busiest_sync(whole) == peak["max_bytes"]["device"] > 0
    assert busiest_sync(chunked) == chunked.sync["transient_peak"]["max_bytes"]["device"] < busiest_sync(whole)
    assert "not included" in peak["method"]["program_temporaries"]  # not compiled for 8 H100s here
    assert whole.fits["with_sync_peak"]["max_device_bytes"] >= peak["max_bytes"]["device"]


def test_p13_chunks_are_consecutive_leaves_within_the_limit():
    assert chunk_leaves([3, 3, 3, 10, 1], 6) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert chunk_leaves([3, 3], None) == [range(0, 2)]
    assert chunk_leaves([], 5) == []


def test_cli_report_sync_json_gives_the_peak_per_device_and_its_maximum(capsys):
    argv = ["report", "--layout", "reshaped", "--sync", "--json", "--sync-chunk-bytes", str(CHUNK)]
    assert main(argv) == 0
    peak = json.loads(capsys.readouterr().out)["sync"]["transient_peak"]
    assert peak["chunks"] > 1 and peak["chunk_bytes"] == CHUNK
    assert peak["max_bytes"]["device"] == max(k.get("device", 0) for k in peak["by_device"].values())
    assert set(peak["method"]) == {"arrays", "program_temporaries", "allocator"}


def test_sync_chunk_bytes_refusal_names_the_flag_and_the_widget(capsys):
    with pytest.raises(ConfigError) as info:
        Scenario(sync_chunk_bytes=0)
    assert "--sync-chunk-bytes" in describe(info.value, "cli")
    assert "'sync chunks (P13)'" in describe(info.value, "lab")
    assert main(["report", "--sync-chunk-bytes", "0"]) == 2
    assert "--sync-chunk-bytes" in capsys.readouterr().err
