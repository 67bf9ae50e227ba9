"""The reference's own lines for a rule (L1), read from the installed Tunix at run time.

Each rule declares ``Locator``s (``rules.registry``): a function of Tunix's ``rl_cluster.py``
and a pattern for a statement in it. ``locate`` resolves one with ``ast`` against the file's
text, so lines another release moved are still found, and a function or statement that is
gone is named. ``reference_code(rule)`` reads the installed file (found with ``find_spec``,
nothing imported); without Tunix it says which lines of which release to open, with a link.
Nothing of Tunix is stored in the lab. ``show_rule(..., reference=True)`` (``lab.rule_code.view``)
shows these lines beside the rule's own code.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import importlib.metadata
import importlib.util
import pathlib
import re
import textwrap
from collections.abc import Iterator, Sequence

from rlcluster_lab.rules.catalogue import find_rule
from rlcluster_lab.rules.registry import REFERENCE, Locator, Rule

CAPTION = "font:12px sans-serif;color:#444"


@dataclasses.dataclass(frozen=True)
class ReferenceSpan:
    """Lines of the reference's file: the function they are in, their numbers, the lines as
    read (dedented) and what they do."""

    function: str
    first: int
    last: int
    source: str
    what: str = ""

    @property
    def where(self) -> str:
        lines = f"line {self.first}" if self.first == self.last else f"lines {self.first}-{self.last}"
        return f"{self.function}, {lines}" + (f": {self.what}" if self.what else "")

    def numbered(self) -> str:
        return "\n".join(f"{n:>5}  {line}" for n, line in enumerate(self.source.splitlines(), self.first))


@dataclasses.dataclass(frozen=True)
class ReferenceCode:
    """The reference's own lines for a rule, read from the installed package; where they cannot
    be shown, ``note`` says why and which lines of which release to open."""

    rule: str
    version: str | None  # the installed release; None when Tunix is not installed
    file: str  # the installed file, or the file's path in the reference's repository
    spans: tuple[ReferenceSpan, ...] = ()
    note: str = ""

    @property
    def heading(self) -> str:
        if self.version is None:
            return f"Tunix's own lines ({REFERENCE.path})"
        pinned = "" if self.version == REFERENCE.version else f"; the rules follow {REFERENCE.version}"
        return f"Tunix's own lines: {REFERENCE.distribution} {self.version}, {REFERENCE.path}{pinned}"

    def text(self) -> str:
        lines = [f"# {self.heading}"]
        if self.note:
            lines.append(f"# {self.note}")
        for span in self.spans:
            lines += [f"# {span.where}", span.numbered()]
        return "\n".join(lines)

    __str__ = text

    def _repr_html_(self) -> str:
        out = [f"<div style='{CAPTION}'><b>{html.escape(self.heading)}</b></div>"]
        if self.note:
            link = f"<a href='{REFERENCE.url}' target='_blank'>{REFERENCE.url}</a>"
            note = inline_html(self.note).replace(html.escape(REFERENCE.url), link)
            out.append(f"<div style='{CAPTION}'>{note}</div>")
        for span in self.spans:
            out.append(f"<div style='{CAPTION};margin-top:4px'>{inline_html(span.where)}</div>")
            out.append(highlight(span.source, span.first))
        return "".join(out)


def inline_html(text: str) -> str:
    """Text for HTML, with its `backticked` names as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def highlight(source: str, first_line: int | None = None) -> str:
    """Highlighted HTML of Python source; numbered from ``first_line`` when one is given."""
    try:
        from pygments import highlight as pygmentize
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer
    except ImportError:  # pygments comes with the lab's extras; plain text without it
        if first_line is not None:
            source = "\n".join(f"{n:>5}  {line}" for n, line in enumerate(source.splitlines(), first_line))
        return f"<pre>{html.escape(source)}</pre>"
    numbers = {} if first_line is None else {"linenos": "inline", "linenostart": first_line}
    return pygmentize(source, PythonLexer(), HtmlFormatter(noclasses=True, style="default", **numbers))


# What an operator in a statement's head is called in a ``Locator``'s ``uses``.
_OPERATORS: dict[type, str] = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.And: "and",
    ast.Or: "or",
    ast.Not: "not",
}
# The fields that hold a compound statement's blocks; the rest is its head.
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _mentions(stmt: ast.stmt) -> set[str]:
    """What a statement's head mentions (an ``if``'s condition, not its branches): names,
    attribute names, keyword names, string constants and operators."""
    found: set[str] = set()
    for field, value in ast.iter_fields(stmt):
        if field in _BLOCKS:
            continue
        for part in value if isinstance(value, list) else [value]:
            for node in ast.walk(part) if isinstance(part, ast.AST) else ():
                if isinstance(node, ast.Name):
                    found.add(node.id)
                elif isinstance(node, ast.Attribute):
                    found.add(node.attr)
                elif isinstance(node, ast.keyword) and node.arg:
                    found.add(node.arg)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.add(node.value)
                elif type(node) in _OPERATORS:
                    found.add(_OPERATORS[type(node)])
    return found


def _statements(body: Sequence[ast.stmt], parent: ast.AST | None = None) -> Iterator[tuple[ast.stmt, int]]:
    """Every statement in ``body`` and in its blocks, in the file's order, with the line its
    lines start at: the first statement of an ``if`` starts at the condition it runs under."""
    for stmt in body:
        under_condition = isinstance(parent, ast.If) and stmt is parent.body[0]
        yield stmt, parent.lineno if under_condition else stmt.lineno
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(stmt, field, None) or [], stmt)
        for clause in [*getattr(stmt, "handlers", []), *getattr(stmt, "cases", [])]:
            yield from _statements(clause.body, clause)


def _resolve(tree: ast.Module, dotted: str) -> tuple[ast.AST, list[ast.stmt]]:
    """The function or class at ``dotted`` (``"RLCluster.sync_weights"``), and the module-level
    aliases (``RLCluster = RLEngine``) followed to reach it."""
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    aliases: list[ast.stmt] = []
    parts = dotted.split(".")
    for depth, name in enumerate(parts):
        node = next((n for n in body if isinstance(n, _DEFS) and n.name == name), None)
        if node is None and depth == 0:
            assigns = [n for n in body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name)]
            alias = next((n for n in assigns if any(isinstance(t, ast.Name) and t.id == name for t in n.targets)), None)
            if alias is not None:
                aliases.append(alias)
                target = alias.value.id  # type: ignore[attr-defined]
                node = next((n for n in body if isinstance(n, _DEFS) and n.name == target), None)
        if node is None:
            raise LookupError(f"{'.'.join(parts[:depth]) or 'the module'} has no {name}")
        body = node.body  # type: ignore[attr-defined]
    return node, aliases


def locate(locator: Locator, source: str) -> tuple[ReferenceSpan, ...]:
    """The lines of ``source`` (the reference file's text) that ``locator`` names.

    Raises:
        LookupError: no such function or class, or no statement of that kind mentioning
            everything in ``locator.uses``, saying which.
        ValueError: ``locator.statement`` is not a kind of statement of Python's ``ast``.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    node, aliases = _resolve(tree, locator.function)
    if not locator.statement:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])  # type: ignore[attr-defined]
        # A function whole; a class by its ``class`` line(s) alone.
        last = node.body[0].lineno - 1 if isinstance(node, ast.ClassDef) else node.end_lineno  # type: ignore[attr-defined]
        found = [(first, max(first, last or first))]
        if "." not in locator.function:  # the class itself: the alias that names it too
            found += [(a.lineno, a.end_lineno or a.lineno) for a in aliases]
    else:
        kind = getattr(ast, locator.statement, None)
        if not (isinstance(kind, type) and issubclass(kind, ast.stmt)):
            raise ValueError(f"{locator.statement!r} is not a statement of Python's ast (e.g. 'If', 'Assign')")
        found = [
            (first, stmt.end_lineno or stmt.lineno)
            for stmt, first in _statements(node.body)  # type: ignore[attr-defined]
            if isinstance(stmt, kind) and set(locator.uses) <= _mentions(stmt)
        ]
        if not found:
            uses = f" mentioning {', '.join(locator.uses)}" if locator.uses else ""
            raise LookupError(f"{locator.function} has no `{locator.statement}` statement{uses}")
        found = found if locator.every else found[:1]
    return tuple(
        ReferenceSpan(locator.function, a, b, textwrap.dedent("".join(lines[a - 1 : b])), locator.what)
        for a, b in sorted(found)
    )


def _installed_reference() -> tuple[pathlib.Path, str] | None:
    """The installed reference file and its release, or None when its package is not installed.
    Nothing is imported: ``find_spec`` of the top-level package only finds its folder."""
    top, *inner = REFERENCE.module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(next(iter(spec.submodule_search_locations)), *inner[:-1], inner[-1] + ".py")
    try:
        version = importlib.metadata.version(REFERENCE.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = "of unknown version"
    return path, version


def _where_to_open(entry: Rule) -> str:
    """Which lines of which release to open for a rule, without the file at hand."""
    whats: dict[str, list[str]] = {}
    for loc in entry.reference:
        whats.setdefault(loc.function, []).extend([loc.what] if loc.what else [])
    places = "; ".join(name + (f" ({'; '.join(said)})" if said else "") for name, said in whats.items())
    return f"In {REFERENCE.distribution} {REFERENCE.version}, open {REFERENCE.path} at {places}: {REFERENCE.url}"


def reference_code(rule: str) -> ReferenceCode:
    """The reference's own lines for ``rule``, read from the installed Tunix at run time.

    Never raises for a missing package or a changed file: the result's ``note`` then says what
    is missing and which lines of the pinned release to open (with a link).

    Raises:
        ValueError: an unknown rule.
    """
    entry = find_rule(rule)
    if not entry.reference:
        added = ", one of what the lab adds to see and measure the rules" if rule.startswith("L") else ""
        note = f"Tunix's {REFERENCE.path} has no lines for {rule}{added}."
        return ReferenceCode(rule, None, REFERENCE.path, note=note)
    installed = _installed_reference()
    if installed is None:
        note = (
            f"Tunix is not installed here, so its lines cannot be shown. {_where_to_open(entry)}. "
            f"To see them here, {REFERENCE.install_hint}."
        )
        return ReferenceCode(rule, None, REFERENCE.path, note=note)
    path, version = installed
    try:
        text = path.read_text()
    except OSError as exc:
        note = (
            f"The installed {REFERENCE.distribution} {version} has no readable {path} ({exc}). {_where_to_open(entry)}."
        )
        return ReferenceCode(rule, version, str(path), note=note)
    spans: list[ReferenceSpan] = []
    missing: list[str] = []
    for locator in entry.reference:
        try:
            spans += locate(locator, text)
        except LookupError as exc:  # another release moved or renamed what the locator names
            missing.append(str(exc))
    note = f"In the installed {version}, {'; '.join(missing)}. {_where_to_open(entry)}." if missing else ""
    return ReferenceCode(rule, version, str(path), tuple(spans), note)
