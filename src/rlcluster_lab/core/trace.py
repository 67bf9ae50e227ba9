"""The decision trace (L1): every branch the cluster takes, with what it saw."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

import numpy as np

V = TypeVar("V")


def jsonable(value: Any) -> Any:
    """Turn trace values (roles, meshes described as dicts, dtypes, numpy) into JSON types."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a rule's values, in field order
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


@dataclasses.dataclass(frozen=True)
class Decision(Generic[V]):
    """One branch a rule took: the rule id, what was tested, the inputs it read (``values``: the
    rule's frozen dataclass), a one-line outcome for people, and the branch figures read."""

    rule: str
    test: str
    values: V
    outcome: str
    branch: enum.Enum | None = None

    def to_json(self) -> dict[str, Any]:
        return jsonable(self)  # every field, the values and the branch as JSON types


def seen(decision: Mapping[str, Any], kind: type[V]) -> V:
    """A reported decision's values (``Decision.to_json``) as ``kind``, its rule's values dataclass.
    What a report from elsewhere lacks (Tunix's cluster observed, ``tunix.observe``) reads as None."""
    values = decision.get("values") or {}
    return kind(**{f.name: values.get(f.name) for f in dataclasses.fields(kind)})


class Trace:
    """An append-only list of decisions, in the order the cluster took them."""

    def __init__(self) -> None:
        self._decisions: list[Decision] = []

    def add(self, decision: Decision) -> Decision:
        """Append a decision a rule function returned."""
        self._decisions.append(decision)
        return decision

    def by_rule(self, rule: str) -> list[Decision]:
        return [d for d in self._decisions if d.rule == rule]

    def to_json(self) -> list[dict[str, Any]]:
        return [d.to_json() for d in self._decisions]

    def __iter__(self) -> Iterator[Decision]:
        return iter(list(self._decisions))

    def __len__(self) -> int:
        return len(self._decisions)

    def __getitem__(self, index: int) -> Decision:
        return self._decisions[index]

    def __repr__(self) -> str:
        lines = [f"{d.rule:>4}  {d.test}  ->  {d.outcome}" for d in self._decisions]
        return "Trace(\n  " + "\n  ".join(lines) + "\n)" if lines else "Trace()"
