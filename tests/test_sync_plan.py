"""P13: a sync is planned once (``engines.base.SyncPlan``) and planned again only when a layout or
a knob it depends on changes; a failure with a plan in hand rolls back as before."""

from __future__ import annotations

import dataclasses
import re
import warnings

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec
from test_fault_injection import _fail_on_commit, _raise

from rlcluster_lab import Role, Scenario, TrainBatch, build_cluster
from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.engines.base import SyncPlan
from rlcluster_lab.measure import sync as measure_sync
from rlcluster_lab.placement import events
from rlcluster_lab.placement import reshard as reshard_module
from rlcluster_lab.placement.reshard import Batch

pytestmark = pytest.mark.cluster  # every sync here is a live cluster's

BYTES = ("synced_bytes", "moved_cross_device_bytes", "copied_same_device_bytes", "reused_bytes")
BYTES += ("relayed_cross_device_bytes", "minimum_cross_device_bytes", "anchor_bytes")


def _counted(mp: pytest.MonkeyPatch) -> dict[str, int]:
    """How many plans were built and how many routes worked out, from here on."""
    counts = {"plans": 0, "routes": 0, "ledgers": 0}
    build, route, ledger = SyncPlan.build, reshard_module.route, measure_sync.sync_ledger

    def counted_ledger(*args, **kwargs):
        counts["ledgers"] += 1
        return ledger(*args, **kwargs)

    def counted_build(*args, **kwargs):
        counts["plans"] += 1
        return build(*args, **kwargs)

    def counted_route(*args, **kwargs):
        counts["routes"] += 1
        return route(*args, **kwargs)

    mp.setattr(measure_sync, "sync_ledger", counted_ledger)
    mp.setattr(SyncPlan, "build", counted_build)
    mp.setattr(reshard_module, "route", counted_route)
    return counts


def _kind(cluster):
    return nnx.LoRAParam if cluster.trainable_is_lora else nnx.Param


def _values(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _holds_the_actors(cluster) -> bool:
    kind = _kind(cluster)
    held, actor = nnx.state(cluster.rollout.model(), kind), nnx.state(cluster.actor_model, kind)
    return all(np.array_equal(a, b.astype(a.dtype)) for a, b in zip(_values(held), _values(actor), strict=True))


def _bytes(report) -> dict[str, int]:
    return {k: getattr(report, k) for k in BYTES}


def _step(cluster) -> None:
    """One optimizer step, so that the next sync has new weights to hand over."""
    out = cluster.generate(["abc", "hello world", "x", "rl"])
    p, comp = out.left_padded_prompt_tokens, out.tokens
    anchor = np.asarray(cluster.per_token_logps(Role.ACTOR, p, comp))
    cluster.update_actor(TrainBatch(p, comp, np.array([1.0, -1.0, 1.0, -1.0], np.float32), anchor))


@st.composite
def _scenarios(draw):
    lora = draw(st.booleans())
    return Scenario(
        layout=draw(st.sampled_from(["colocated", "reshaped", "split"])),
        lora=lora,
        engine=draw(st.sampled_from(["vanilla", "vllm", "sglang_jax"])),
        reshard=draw(st.sampled_from(["xla", "minimal"])),
        rollout_dtype=draw(st.sampled_from([None, "bfloat16"])),
        offload=draw(st.booleans()),
        sync_chunk_bytes=draw(st.sampled_from([None, 4 << 10, 16 << 10])),
    )


@settings(deadline=None, derandomize=True, max_examples=3)
@given(_scenarios())
def test_p13_a_sync_is_planned_once_and_again_only_when_a_layout_or_knob_changes(scenario):
    """Over drawn layouts, LoRA, engines, strategies, dtypes, offload and chunk sizes: the second
    and third syncs build no plan, work out no route and no ledger, and measure the same bytes; a new chunk
    size, a new strategy and a new rollout layout each build one plan, and every sync leaves the
    rollout holding the actor's weights."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = build_cluster(scenario)
    with pytest.MonkeyPatch.context() as mp:
        counts = _counted(mp)
        first = cluster.sync_weights()
        assert counts["plans"] == 1
        routes, ledgers = counts["routes"], counts["ledgers"]
        later = [cluster.sync_weights() for _ in range(2)]
        # The same plan: no plan, route or ledger worked out again, and the same bytes measured.
        assert counts == {"plans": 1, "routes": routes, "ledgers": ledgers}
        assert all(_bytes(r) == _bytes(first) and r.leaves == first.leaves for r in later)
        assert _holds_the_actors(cluster)

        chunk = 8 << 10 if scenario.sync_chunk_bytes is None else None
        cluster.state.config = dataclasses.replace(cluster.state.config, sync_chunk_bytes=chunk)
        cluster.sync_weights()
        cluster.sync_weights()
        assert counts["plans"] == 2

        other = "minimal" if cluster.rollout.reshard == "xla" else "xla"
        cluster.rollout.reshard = other
        cluster.sync_weights()
        cluster.sync_weights()
        assert counts["plans"] == 3

        # A new rollout layout: every synced leaf replicated over the rollout's own devices.
        engine, kind = cluster.rollout, _kind(cluster)
        held = engine.held_targets((kind,))
        replicated = {
            k: NamedSharding(t.sharding.mesh, PartitionSpec(), memory_kind=t.sharding.memory_kind)
            for k, t in held.items()
        }
        values = dict(zip(held, engine.held_values((kind,))))
        engine.assign({k: jax.device_put(values[k], replicated[k]) for k in held}, (kind,))
        del values
        _step(cluster)
        cluster.sync_weights()
        assert counts["plans"] == 4
        assert _holds_the_actors(cluster)
        assert all(t.sharding == replicated[k] for k, t in engine.held_targets((kind,)).items())


@pytest.mark.parametrize("chunk", [None, 16 << 10])
@pytest.mark.parametrize("layout, lora", [("reshaped", False), ("split", True)])
def test_p13_a_sync_failing_with_its_plan_in_hand_rolls_back_and_the_next_reuses_the_plan(layout, lora, chunk):
    """The plan is built by the first sync; the second fails part-way (in chunks: at the second
    chunk's commit, after the first chunk was committed; in one piece: in its reshard): the
    rollout keeps the first sync's weights, the anchor and the step count stay, and the third
    sync succeeds with the same plan."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = build_cluster(Scenario(layout=layout, lora=lora, sync_chunk_bytes=chunk))
    cluster.sync_weights()
    _step(cluster)
    kind = _kind(cluster)
    rollout, anchor = _values(nnx.state(cluster.rollout.model(), kind)), cluster.pinned_anchor_state
    with pytest.MonkeyPatch.context() as mp:
        counts = _counted(mp)
        with mp.context() as fault:
            if chunk is None:
                fault.setattr(Batch, "run", _raise(RuntimeError))
            else:
                fault.setattr(events, "emit", _fail_on_commit(2, RuntimeError))
            with pytest.raises(RuntimeError, match="fault") as info:
                cluster.sync_weights()
        assert "did not finish" in "".join(info.value.__notes__)
        assert all(map(np.array_equal, _values(nnx.state(cluster.rollout.model(), kind)), rollout))
        assert cluster.pinned_anchor_state is anchor and cluster.global_steps == 1
        cluster.sync_weights()
        assert counts["plans"] == 0 and cluster.global_steps == 2
        assert _holds_the_actors(cluster)


@pytest.mark.parametrize("layout, lora, chunk", [("reshaped", False, 16 << 10), ("split", True, None)])
def test_l3_a_sync_walks_its_transient_peak_only_when_asked(layout, lora, chunk):
    """``sync_weights(peak=False)`` (a learner's syncs) walks no peak and measures the same bytes;
    by default (the lab, ``report --sync``) the peak is there."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = build_cluster(Scenario(layout=layout, lora=lora, sync_chunk_bytes=chunk))
    watched = cluster.sync_weights()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(measure_sync, "PeakWalk", lambda *a: pytest.fail("a peak walk nobody asked for"))
        unwatched = cluster.sync_weights(peak=False)
    assert watched.peak is not None and unwatched.peak is None
    assert _bytes(unwatched) == _bytes(watched) and unwatched.seconds > 0


@settings(deadline=None, derandomize=True, max_examples=4)
@given(_scenarios())
@example(Scenario(layout="split", reshard="minimal"))
@example(Scenario(layout="split", lora=True, rollout_dtype="bfloat16"))
@example(Scenario(layout="reshaped", engine="vllm"))
def test_l3_the_reports_plan_names_every_leaf_once_and_the_pairs_and_bytes_that_crossed(scenario):
    """Over drawn layouts, engines, strategies, dtypes, offload and chunk sizes: the plan the report
    prints (``Route.lines``) gives each handed-over leaf one way of changing layout, is the same
    on a later sync, and where no compiled program moves data its device pairs and their bytes
    are exactly the logged cross-device copies'."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = build_cluster(scenario)
    cluster.sync_weights()
    rep = cluster.sync_weights()
    assert cluster.sync_weights().plan == rep.plan
    ways = ("kept:", "re-labelled", "copied within devices", "laid out anew", " from devices ", "shard by shard")
    changed = sum(int(re.search(r"(\d+) lea", line)[1]) for line in rep.plan if any(w in line for w in ways))
    assert changed == (len(rep.leaves) if rep.plan else 0)
    if not rep.plan:  # the rollout holds the actor's own arrays: nothing was resharded
        assert rep.reused_bytes == rep.synced_bytes
    if not any("program" in line for line in rep.plan):
        per: dict[tuple[int, int], int] = {}
        for t in rep.transfers:
            per[t.src_device, t.dst_device] = per.get((t.src_device, t.dst_device), 0) + t.nbytes
        planned = re.findall(r"(\d+)->(\d+) ([\d.]+ \w+)", " ".join(rep.plan))
        said = {(int(a), int(b)) for a, b, _ in planned}
        # A line lists at most 8 pairs; in chunks each chunk's line sums its own.
        assert said == set(per) or (said < set(per) and "more pairs" in " ".join(rep.plan))
        if not any(line.startswith("chunk") or "more pairs" in line for line in rep.plan):
            assert dict(((int(a), int(b)), n) for a, b, n in planned) == {k: fmt_bytes(v) for k, v in per.items()}


@pytest.mark.parametrize("layout", ["reshaped", "split"])
def test_l3_a_syncs_floor_is_one_device_put_and_one_compiled_copy_of_the_same_tree(layout):
    """``sync_floor`` times the handed-over leaves put into the rollout's shardings outside the sync:
    one device_put, and one compiled copy where one program can take both device sets (not split)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = build_cluster(Scenario(layout=layout, lora=True))
    floor = measure_sync.sync_floor(cluster, cluster.sync_weights(), repeats=1)
    assert floor["device_put"] > 0
    assert (floor["compiled copy"] is None) == (layout == "split")
    assert floor["compiled copy"] is None or floor["compiled copy"] > 0
