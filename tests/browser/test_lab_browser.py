"""The placement lab in a real browser, on a 1600 x 1000 screen.

JupyterLab runs on localhost with a token; Debian's headless Chromium, driven
by Playwright's Python API, opens notebook 07 in a 1600 x 1000 window, runs all
cells from the Run menu, brings the lab to the top of the notebook, toggles
LoRA, switches the layout to ``reshaped``, presses Construct, then Sync
weights. After each action it checks, on the page as drawn, that the buttons
and the view of that action (the decision flow, then the sync) are inside the
visible part of the notebook with no scrolling, and that the view changed. No
knob's label or choice is cut off. It saves a screenshot of the lab after the
reshaped construction (``RL_LAB_SCREENSHOT=docs/lab.png`` writes the README's;
``make screenshot``).

Outside CI the test is skipped when Chromium is absent; in CI (``CI`` set)
it must run, so a missing browser fails it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_server import JupyterLab

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
except ImportError:  # reported by _chromium() below
    sync_playwright = None

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "07_placement_lab.ipynb"
# Without the background-networking flags Chromium tries to reach the network
# at start, and a closed network refuses it.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BUILD_TIMEOUT_MS = 300_000  # the kernel's first cluster build compiles its programs

pytestmark = pytest.mark.cluster  # a JupyterLab server and a kernel that builds clusters, in subprocesses


def _chromium() -> str:
    """Debian's Chromium (never a browser downloaded by Playwright)."""
    path = os.environ.get("CHROMIUM") or shutil.which("chromium")
    missing = []
    if not path:
        missing.append("Debian's chromium is not installed (apt-get install -y chromium)")
    if sync_playwright is None:
        missing.append("the playwright package is not installed (pip install -e '.[test]')")
    if missing:
        why = "; ".join(missing) + ": the real-browser test needs it"
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the browser test, but {why}")
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def chromium() -> str:
    return _chromium()


@pytest.fixture(scope="module")
def lab_server(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterLab]:
    server = JupyterLab(tmp_path_factory.mktemp("jupyter"), [NOTEBOOK])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _text(page, name: str) -> str:
    return page.locator(f".rl-lab .rl-{name}").first.inner_text()


def _image(page, panel: str) -> str:
    return page.locator(f".rl-lab .rl-panel-{panel} img").first.get_attribute("src") or ""


VIEWPORT = {"width": 1600, "height": 1000}
BUTTONS = [f".rl-lab button.rl-{name}" for name in ("construct", "sync", "step")]


def test_lab_panel_fits_a_1600x1000_screen_in_a_real_browser(
    chromium: str, lab_server: JupyterLab, tmp_path: Path
) -> None:
    shot = Path(os.environ.get("RL_LAB_SCREENSHOT") or tmp_path / "lab.png")
    timings: dict[str, float] = {}
    start = time.monotonic()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(lab_server.notebook_url(NOTEBOOK.name))
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
            _accept_kernel_dialog(page)
            # Cells sent while the kernel is still starting can be dropped.
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
            timings["open"] = time.monotonic() - start
            # Fold the file browser away: the notebook gets the whole width.
            open_tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
            if open_tab.count():
                open_tab.first.click()

            _run_all_cells(page)
            page.wait_for_selector(".rl-lab .rl-panel-flow img", timeout=BUILD_TIMEOUT_MS)
            _wait_idle(page)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=BUILD_TIMEOUT_MS)
            timings["run all"] = time.monotonic() - start
            # Bring the lab to the top of the notebook once, as a reader scrolls to it; from here
            # on nothing scrolls.
            page.locator(".rl-lab").evaluate("e => e.scrollIntoView({block: 'start'})")
            scrolled = _scroll_top(page)
            assert _current_tab(page) == "Decision flow"
            _assert_in_view(page, [*BUTTONS, ".rl-lab .rl-panel-flow img"])
            assert _cut_off(page) == [], "labels or choices cut off"

            _show_tab(page, "Summary")
            before_text = _text(page, "sharing")
            before = {panel: _image(page, panel) for panel in ("flow", "grid")}
            assert "rollout branch (P3): shared" in _text(page, "summary")

            page.locator(".rl-lab .rl-lora input[type=checkbox]").check()
            page.locator(".rl-lab .rl-layout select").select_option(label="reshaped")
            page.locator(".rl-lab button.rl-construct").click()
            page.wait_for_function(
                "before => { const i = document.querySelector('.rl-lab .rl-panel-flow img');"
                " return i && i.getAttribute('src') !== before; }",
                arg=before["flow"],
                timeout=BUILD_TIMEOUT_MS,
            )
            _wait_idle(page)
            timings["rebuild"] = time.monotonic() - start

            # Construct shows its decisions: the flow's tab, in view beside the buttons.
            assert _current_tab(page) == "Decision flow"
            _assert_in_view(page, [*BUTTONS, ".rl-lab .rl-panel-flow img"])
            assert _scroll_top(page) == scrolled, "the notebook scrolled"
            assert page.locator(".rl-lab .rl-error").is_hidden()
            assert "changed since the last construction" in _text(page, "changes")
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.locator(".rl-lab").screenshot(path=str(shot))

            # P1: same chips as (8, 1) is another mesh; P2: LoRA links the reference.
            _show_tab(page, "Summary")
            summary = _text(page, "summary")
            assert "rollout branch (P3): second_copy" in summary and "LoRA actor" in summary
            assert "actor\treference" in _text(page, "sharing")
            assert _text(page, "sharing") != before_text
            for panel, image in before.items():
                assert _image(page, panel).startswith("data:image/svg+xml")
                assert _image(page, panel) != image, f"the {panel} image did not change"

            # A sync shows what moved (P13: a second copy, so bytes are copied): its tab, in view.
            page.locator(".rl-lab button.rl-sync").click()
            page.wait_for_selector(".rl-lab .rl-panel-sync img", timeout=BUILD_TIMEOUT_MS)
            _wait_idle(page)
            timings["sync"] = time.monotonic() - start
            assert _current_tab(page) == "Weight sync"
            _assert_in_view(page, [*BUTTONS, ".rl-lab .rl-panel-sync img"])
            assert _scroll_top(page) == scrolled, "the notebook scrolled"
            page.locator(".rl-lab").screenshot(path=str(tmp_path / "lab-sync.png"))
            print(f"after Sync weights: {tmp_path / 'lab-sync.png'}")
        except Exception:
            _report_failure(page, lab_server, tmp_path)
            raise
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    print("browser test timings (s, cumulative):", {k: round(v, 1) for k, v in timings.items()})


# The part of the window the notebook shows: its scrolling area, inside the window.
_VISIBLE = """() => {
  const outer = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');
  const v = outer ? outer.getBoundingClientRect() : {top: 0, bottom: innerHeight, left: 0, right: innerWidth};
  return {top: Math.max(0, v.top), bottom: Math.min(innerHeight, v.bottom),
          left: Math.max(0, v.left), right: Math.min(innerWidth, v.right)};
}"""


def _assert_in_view(page, selectors: list[str]) -> None:
    """Each element is drawn (not empty) and wholly inside the visible part of the notebook."""
    visible = page.evaluate(_VISIBLE)
    for selector in selectors:
        box = page.locator(selector).first.bounding_box()
        assert box is not None and box["width"] > 0 and box["height"] > 0, f"{selector} is not drawn"
        inside = (
            box["y"] >= visible["top"] - 0.5
            and box["y"] + box["height"] <= visible["bottom"] + 0.5
            and box["x"] >= visible["left"] - 0.5
            and box["x"] + box["width"] <= visible["right"] + 0.5
        )
        assert inside, f"{selector} at {box} is not inside the visible notebook {visible}"


def _scroll_top(page) -> float:
    return page.evaluate(
        "() => { const o = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');"
        " return o ? o.scrollTop : scrollY; }"
    )


def _current_tab(page) -> str:
    return page.locator(".rl-lab .rl-views .lm-TabBar-tab.lm-mod-current").inner_text().strip()


def _show_tab(page, title: str) -> None:
    page.locator(".rl-lab .rl-views .lm-TabBar-tab", has_text=title).click()
    page.wait_for_function(
        "t => { const c = document.querySelector('.rl-lab .rl-views .lm-TabBar-tab.lm-mod-current');"
        " return c && c.innerText.trim() === t; }",
        arg=title,
    )


# Every label, button and tab title of the lab shown whole (no ellipsis), and every choice of
# every dropdown narrower than the room its select has for text.
_CUT_OFF = """() => {
  const cut = [];
  let checked = 0;
  const shown = e => e.offsetParent !== null;
  for (const e of document.querySelectorAll(
      '.rl-lab .rl-controls .widget-label, .rl-lab .rl-controls .widget-label-basic span, '
      + '.rl-lab .rl-controls button, .rl-lab .rl-views .lm-TabBar-tabLabel')) {
    if (!shown(e)) continue;
    checked += 1;
    if (e.scrollWidth > e.clientWidth + 1) cut.push(e.innerText);
  }
  const ctx = document.createElement('canvas').getContext('2d');
  for (const s of document.querySelectorAll('.rl-lab .rl-controls select')) {
    if (!shown(s)) continue;
    const st = getComputedStyle(s);
    ctx.font = `${st.fontWeight} ${st.fontSize} ${st.fontFamily}`;
    const room = s.clientWidth - parseFloat(st.paddingLeft) - parseFloat(st.paddingRight);
    for (const o of s.options) {
      checked += 1;
      const w = ctx.measureText(o.text).width;
      if (w > room) cut.push(`${o.text} (${Math.round(w)} px > ${Math.round(room)} px)`);
    }
  }
  return {checked, cut};
}"""


def _cut_off(page) -> list[str]:
    """What is cut off (empty when nothing is); fails when it found too little to check."""
    found = page.evaluate(_CUT_OFF)
    # 13 knobs, 3 buttons, 6 tab titles, and the choices of 6 dropdowns.
    assert found["checked"] >= 30, f"only {found['checked']} labels and choices found to check"
    return found["cut"]


def _accept_kernel_dialog(page) -> None:
    """JupyterLab may ask which kernel to start (it depends on its saved state); take Python 3."""
    dialog = page.locator(".jp-Dialog")
    with contextlib.suppress(PlaywrightTimeout):
        dialog.wait_for(state="visible", timeout=5_000)
        if "Select Kernel" in dialog.inner_text():
            dialog.get_by_role("button", name="Select", exact=True).click()
            dialog.wait_for(state="hidden", timeout=10_000)


def _run_all_cells(page, tries: int = 3) -> None:
    """Run > Run All Cells, as a person would, again if nothing started.

    Right after the kernel reports idle, JupyterLab can still drop an
    execution request (the cells keep an empty ``[ ]`` prompt); a cell that
    was sent shows ``[*]`` at once, so a retry never runs a cell twice.
    """
    for _ in range(tries):
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        try:
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                ".some(p => /\\[(\\*|\\d+)\\]/.test(p.innerText))",
                timeout=20_000,
            )
            return
        except PlaywrightTimeout:
            print("Run All Cells started no cell; trying again")
    raise AssertionError(f"Run All Cells started no cell in {tries} tries")


def _report_failure(page, server: JupyterLab, folder: Path) -> None:
    """What the page and the server showed, printed with the failure."""
    with contextlib.suppress(Exception):
        page.screenshot(path=str(folder / "failure.png"))
        print(f"page screenshot: {folder / 'failure.png'}")
    with contextlib.suppress(Exception):
        print("cell outputs:", page.locator(".jp-OutputArea-output").all_inner_texts())
    print("jupyter log (tail):", server.log.read_text()[-3000:])


def _wait_idle(page) -> None:
    """Until the lab's status says it is no longer busy (it is set last after drawing)."""
    page.wait_for_function(
        "() => { const s = document.querySelector('.rl-lab .rl-status');"
        " return s && s.innerText.trim() !== '' && !s.innerText.includes('busy'); }",
        timeout=BUILD_TIMEOUT_MS,
    )
