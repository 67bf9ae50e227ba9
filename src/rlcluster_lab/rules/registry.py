"""How a rule is declared: once, beside its functions, with everything the lab says about it.

A rule's id, title, the flow figure's question and answers, and its tests are one ``rule(...)``
call in the module of its functions, each of which registers with ``@P3.function``. The
catalogue and ``docs/rules.md``, the flow figure and ``show_rule`` all read these declarations.
A declaration also says where the reference takes the rule: ``Locator``s (a function of Tunix's
``rl_cluster.py`` and a statement pattern) that ``show_rule`` resolves in the installed file; no
line of the reference is stored here. JAX-free.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# Each declared rule by id, in the order declared; ``rules.catalogue`` puts them in order.
_DECLARED: dict[str, Rule] = {}


@dataclasses.dataclass(frozen=True)
class Answer:
    """One answer the flow figure draws for a rule's question: the value a decision records
    (its branch's value) and how the figure writes it."""

    value: str
    label: str


@dataclasses.dataclass(frozen=True)
class ReferenceFile:
    """The file of the reference the rules follow, in a released version of its package."""

    distribution: str  # the package's name on PyPI
    version: str  # the release the rules follow (pyproject.toml's [tunix] extra pins the same one)
    module: str  # the module, as imported
    repository: str  # where its source is published; releases are tagged ``v<version>``

    @property
    def path(self) -> str:
        """The file's path in the package's repository (and under site-packages)."""
        return self.module.replace(".", "/") + ".py"

    @property
    def url(self) -> str:
        """The file at the pinned release's tag."""
        return f"{self.repository}/blob/v{self.version}/{self.path}"

    @property
    def install_hint(self) -> str:
        """How to install the lab's extra that brings the pinned release."""
        return (
            f"install the lab's tunix extra: pip install -e \".[tunix]\" from the lab's folder "
            f"(or pip install {self.distribution}=={self.version}); about 0.8 GB of further packages"
        )


REFERENCE = ReferenceFile("google-tunix", "0.1.7", "tunix.rl.rl_cluster", "https://github.com/google/tunix")


@dataclasses.dataclass(frozen=True)
class Locator:
    """Where the reference takes a rule, found by syntax in ``REFERENCE``'s file, never by line."""

    function: str  # a dotted function or class of the module ("RLCluster.sync_weights"); an alias is followed
    statement: str = ""  # "" for the whole function (a class: its line), else an ast class name ("If", "Assign")
    uses: tuple[str, ...] = ()  # names, attributes, strings or operators ("==") the statement's head all mentions
    every: bool = False  # every such statement, in the file's order; else the first
    what: str = ""  # what the lines do, in the lab's words


@dataclasses.dataclass(frozen=True, eq=False)
class Rule:
    """One rule: its id, a title, the flow figure's question and answers, where it is tested,
    and the functions that implement it (registered with ``@rule.function``)."""

    rule: str  # "P1" to "P15" or "L1" to "L4"
    title: str  # a few words, the heading in docs/rules.md
    tests: tuple[str, ...]  # test files, or "file::pattern" for the tests of one file whose names match
    question: str = ""  # what the flow figure asks; "{role}" is filled in for a per-role row (P5)
    answers: tuple[Answer, ...] = ()  # the answers the flow figure draws, in order
    note: str = ""  # for a rule with no function of its own, what holds it
    reference: tuple[Locator, ...] = ()  # where REFERENCE's file takes the rule, in its order (none: no lines)
    _functions: list[Callable[..., object]] = dataclasses.field(default_factory=list, init=False, repr=False)

    @property
    def functions(self) -> tuple[Callable[..., object], ...]:
        """The functions that implement the rule, in the order they were registered."""
        return tuple(self._functions)

    def function(self, fn: F) -> F:
        """Register ``fn`` as one of this rule's functions; returned unchanged, so a test can still replace it."""
        self._functions.append(fn)
        return fn

    def values(self) -> tuple[str, ...]:
        """The answers' values, in order: a flow row's options."""
        return tuple(a.value for a in self.answers)

    def labels(self) -> dict[str, str]:
        """Answer value -> how the figure writes it."""
        return {a.value: a.label for a in self.answers}


_ID = re.compile(r"[PL][1-9][0-9]*")


def rule(
    rule_id: str,
    title: str,
    *,
    tests: tuple[str, ...],
    question: str = "",
    answers: Mapping[enum.Enum | str, str] | None = None,
    note: str = "",
    reference: tuple[Locator, ...] = (),
) -> Rule:
    """Declare a rule, once: ``rule_id``, ``title``, ``tests``, ``question``, ``note`` and ``reference``
    as ``Rule``'s attributes; ``answers``: branch (or plain value) -> its label in the flow figure, in
    the order drawn. Returns the ``Rule``, whose ``function`` method registers its functions; a
    malformed id, an id declared twice or a rule with no tests is a ``ValueError``."""
    if not _ID.fullmatch(rule_id):
        raise ValueError(f"rule id {rule_id!r} is not P<n> or L<n>; name a rule like 'P3' or 'L1'")
    if rule_id in _DECLARED:
        raise ValueError(f"rule {rule_id} is declared twice; declare it once, beside its first function")
    if not tests:
        raise ValueError(f"rule {rule_id} names no tests; give the test files (or file::pattern) that hold it")
    drawn = tuple(
        Answer(k.value if isinstance(k, enum.Enum) else str(k), label) for k, label in (answers or {}).items()
    )
    declared = _DECLARED[rule_id] = Rule(rule_id, title, tuple(tests), question, drawn, note, tuple(reference))
    return declared


def declared() -> tuple[Rule, ...]:
    """Every rule declared so far, in the order declared (import ``rules.catalogue`` for all)."""
    return tuple(_DECLARED.values())
