"""The rule code the notebooks store is the code in ``src/`` now.

A ``show_rule(...)`` cell (``lab.rule_code.view``) stores a rule function's source without its
docstring and names where it starts ("rlcluster_lab/rules/sharing.py, line N"), in HTML and in
plain text. nbval runs those cells but does not compare their outputs (lax mode), so a change to
a rule's file (a docstring cut, a line added above the function) would leave the stored line
numbers and code behind unnoticed. Here each stored output is held to the file as it is: the
function it names starts (its ``def``) at the line it gives, and the code shown, in both
renderings, is that function's lines without its docstring. The expected code is read from the
file with ``ast``, not through ``show_rule``. Refresh the outputs as CONTRIBUTING.md says.
"""

from __future__ import annotations

import ast
import html
import json
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# How RuleCode renders where its function is: the caption of its HTML, the first line of its text.
HTML_HEAD = re.compile(r"<code>(?P<function>[\w.]+)</code> · (?P<path>[\w/]+\.py), line (?P<line>\d+)</div>")
TEXT_HEAD = re.compile(r"^# [A-Z]\d+ .*: (?P<function>[\w.]+)  \((?P<path>[\w/]+\.py), line (?P<line>\d+)\)$", re.M)
# Any output that names a place in a Python file the way show_rule does, in whatever form.
NAMES_A_LINE = re.compile(r"\.py, line \d+")
# A call of show_rule in a cell (not its import).
CALL = re.compile(r"^\s*(?:\w+\s*=\s*)?(?:print\()?show_rule\(", re.M)


def _joined(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def _outputs(path: Path) -> list[tuple[int, dict[str, str]]]:
    """Every stored output of every code cell: its cell's index and its texts by MIME type
    (a stream's text as ``text/plain``)."""
    found = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            texts = {mime: _joined(v) for mime, v in out.get("data", {}).items() if mime.startswith("text/")}
            if "text" in out:
                texts["text/plain"] = _joined(out["text"])
            found.append((i, texts))
    return found


def _calling_cells(path: Path) -> list[int]:
    cells = json.loads(path.read_text())["cells"]
    return [i for i, c in enumerate(cells) if c["cell_type"] == "code" and CALL.search(_joined(c["source"]))]


def _current(function: str, path: str) -> tuple[int, str]:
    """Where ``function`` (``module.qualname``) starts in ``path`` (relative to ``src/``) as the
    file is now, its ``def`` line, and its code from that line without its docstring, dedented."""
    module = path.removesuffix(".py").replace("/", ".")
    assert function.startswith(module + "."), f"{function} is not in {path}"
    text = (SRC / path).read_text()
    body: list[ast.stmt] = ast.parse(text).body
    node: ast.AST | None = None
    for name in function.removeprefix(module + ".").split("."):
        defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        node = next((n for n in body if isinstance(n, defs) and n.name == name), None)
        assert node is not None, f"{path} has no {function} now"
        body = node.body  # type: ignore[attr-defined]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), f"{function} is not a function"
    lines = text.splitlines(keepends=True)
    kept = list(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        kept = [n for n in kept if not first.lineno <= n <= (first.end_lineno or first.lineno)]
    return node.lineno, textwrap.dedent("".join(lines[n - 1] for n in kept))


def _code_in_html(page: str, after: int) -> str:
    """The code of the first highlighted block after position ``after``: its text, tags dropped
    and HTML unescaped (pygments' ``<pre>``, or the plain ``<pre>`` without pygments)."""
    block = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S).search(page, after)
    assert block is not None, "no code block after the caption"
    return html.unescape(re.sub(r"<[^>]+>", "", block.group(1)))


def _code_in_text(text: str, after: int) -> str:
    """The code below the heading line ending at ``after``: up to the blank line and the next
    ``# `` line at column 0 (the decision or Tunix's lines), which no function body holds."""
    rest = text[after:].removeprefix("\n")
    return rest.split("\n\n# ", 1)[0]


def _stored(path: Path) -> list[tuple[int, str, str, str, int, str]]:
    """Each place a stored output of ``path`` shows a rule function: cell index, rendering,
    function, file, line it names and the code it shows."""
    shown = []
    for i, texts in _outputs(path):
        page = texts.get("text/html", "")
        for m in HTML_HEAD.finditer(page):
            shown.append((i, "html", m["function"], m["path"], int(m["line"]), _code_in_html(page, m.end())))
        plain = texts.get("text/plain", "")
        for m in TEXT_HEAD.finditer(plain):
            shown.append((i, "text", m["function"], m["path"], int(m["line"]), _code_in_text(plain, m.end())))
        # A place named in another form (show_rule's rendering changed) must not go unchecked.
        heads = len(HTML_HEAD.findall(page)) + len(TEXT_HEAD.findall(plain))
        named = len(NAMES_A_LINE.findall(page)) + len(NAMES_A_LINE.findall(plain))
        assert named == heads, f"{path.name} cell {i} names a line of a file in a form this test does not read"
    return shown


WITH_RULES = [p for p in NOTEBOOKS if _calling_cells(p)]


def test_the_notebooks_show_rule_code():
    """The test below has something to read: the notebooks that explain the rules show them."""
    assert {p.name[:2] for p in WITH_RULES} >= {"01", "02", "03", "04", "05", "06"}


@pytest.mark.parametrize("path", WITH_RULES, ids=lambda p: p.stem)
def test_stored_rule_code_is_the_current_source(path):
    shown = _stored(path)
    # Every cell that calls show_rule for a rule with a function stores it in both renderings;
    # only a rule with no function of its own (P15) shows none.
    rendered = {i for i, *_ in shown}
    for i in _calling_cells(path):
        outputs = [t for j, t in _outputs(path) if j == i]
        if not any("no function of its own" in t.get("text/plain", "") for t in outputs):
            assert i in rendered, f"{path.name} cell {i} calls show_rule but stores no rule code"
    assert shown, f"{path.name} calls show_rule but stores no rule function's code"
    for i, how, function, file, line, code in shown:
        assert {h for j, h, f, *_ in shown if j == i and f == function} == {"html", "text"}
        now_line, now_code = _current(function, file)
        where = f"{path.name} cell {i} ({how}): {function}"
        assert line == now_line, f"{where} is stored at {file}, line {line}; it starts at line {now_line} now"
        expected = now_code if how == "html" else now_code.rstrip()
        assert code == expected, f"{where}: the code stored is not {file}'s now"
