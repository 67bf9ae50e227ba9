"""The mover's event stream (placement.events): one context variable, listeners, the ledger described once."""

import pathlib

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rlcluster_lab.core.meshes import make_mesh
from rlcluster_lab.measure.sync import TransferLog
from rlcluster_lab.placement import events, programs, xla
from rlcluster_lab.placement.reshard import reshard_many

PLACEMENT = pathlib.Path(__file__).parents[1] / "src" / "rlcluster_lab" / "placement"


class Heard(list):
    """Every event of ``kinds`` it heard, in order."""

    def __init__(self, *kinds):
        super().__init__()
        self.kinds = frozenset(kinds)

    on = list.append


def _batch():
    mesh = make_mesh(jax.devices(), (2, 4))
    x = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), NamedSharding(mesh, P("fsdp", None)))
    return x, NamedSharding(mesh, P(None, "tp"))


def test_the_mover_keeps_no_setting_in_context_but_its_listeners():
    """The strategy and the chunk size are arguments; the one context variable is the listeners'."""
    found = {p.name: p.read_text().count("ContextVar(") for p in PLACEMENT.glob("*.py")}
    assert {name: n for name, n in found.items() if n} == {"events.py": 1}


def test_an_unknown_strategy_is_refused_where_it_enters():
    x, dst = _batch()
    with pytest.raises(ValueError, match="unknown reshard strategy 'fast'; use one of xla, minimal"):
        reshard_many([x], [dst], strategy="fast")


def test_a_repeated_batch_is_described_once_and_replayed(monkeypatch):
    """A steady sync does not describe its copies again: the second run of a batch emits the
    first run's ledger (less the news that a program was built) without reading the program's
    flows; the peak walk's events come from every run."""
    programs.clear_programs()
    x, dst = _batch()
    described = []
    log_flows = xla._log_flows
    monkeypatch.setattr(xla, "_log_flows", lambda *a: described.append(1) or log_flows(*a))
    runs = []
    for _ in range(2):
        log, walk = TransferLog(), Heard(events.Made, events.Phase)
        with events.listening(log, walk):
            reshard_many([x], [dst], labels=["w"])
        runs.append((log, walk))
    assert described == [1]
    (first, walk1), (second, walk2) = runs
    assert first.transfers and first.transfers == second.transfers and first.strategies == second.strategies
    assert (first.compiled or first.loaded) and not (second.compiled or second.loaded)
    assert [type(e) for e in walk1] == [type(e) for e in walk2] and any(isinstance(e, events.Phase) for e in walk1)


def test_nobody_listening_nothing_is_described(monkeypatch):
    """Without a listener the mover reads no program's flows (``wants`` guards the work)."""
    programs.clear_programs()
    x, dst = _batch()
    monkeypatch.setattr(xla, "_log_flows", lambda *a: pytest.fail("described with nobody listening"))
    (y,) = reshard_many([x], [dst])
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert not events.wants(events.Transfer)


def test_listeners_nest_and_instead_takes_kinds_from_the_outer_ones():
    outer, inner, ledger = Heard(events.Phase, events.Ran), Heard(events.Phase), Heard(events.Ran)
    with events.listening(outer):
        with events.listening(inner):
            events.emit(events.Phase("a"))
        with events.listening(ledger, instead=frozenset({events.Ran})):
            events.emit(events.Ran("xla"))
            assert events.wants(events.Phase) and events.wants(events.Ran)
    assert outer == [events.Phase("a")] and inner == [events.Phase("a")] and ledger == [events.Ran("xla")]
    assert not events.wants(events.Phase)
