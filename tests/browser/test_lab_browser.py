"""The placement lab in a real browser.

JupyterLab runs on localhost with a token; Debian's headless Chromium, driven
by Playwright's Python API, opens notebook 07, runs all cells from the Run
menu, toggles LoRA, switches the layout to ``reshaped``, presses Construct and
checks that the rendered panel changed: the sharing map text and the
decision-flow and device-grid images. It saves a screenshot of the lab
(``RL_LAB_SCREENSHOT=docs/lab.png`` writes the README's; ``make screenshot``).

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
    return page.locator(f".rl-lab .rl-{name}").inner_text()


def _image(page, panel: str) -> str:
    return page.locator(f".rl-lab .rl-panel-{panel} img").get_attribute("src") or ""


def test_lab_panel_changes_in_a_real_browser(chromium: str, lab_server: JupyterLab, tmp_path: Path) -> None:
    shot = Path(os.environ.get("RL_LAB_SCREENSHOT") or tmp_path / "lab.png")
    timings: dict[str, float] = {}
    start = time.monotonic()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            # Wide enough for the panels to sit two by two in the screenshot.
            page = browser.new_page(viewport={"width": 2000, "height": 2400})
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
            timings["run all"] = time.monotonic() - start
            before_text = _text(page, "sharing")
            before = {panel: _image(page, panel) for panel in ("flow", "grid")}
            assert "rollout branch (P3): shared" in _text(page, "summary")

            page.locator(".rl-lab .rl-lora input[type=checkbox]").check()
            page.locator(".rl-lab .rl-layout select").select_option(label="reshaped")
            page.locator(".rl-lab button.rl-construct").click()
            page.wait_for_function(
                "before => { const s = document.querySelector('.rl-lab .rl-sharing');"
                " return s && s.innerText !== before; }",
                arg=before_text,
                timeout=BUILD_TIMEOUT_MS,
            )
            _wait_idle(page)
            timings["rebuild"] = time.monotonic() - start

            # P1: same chips as (8, 1) is another mesh; P2: LoRA links the reference.
            summary = _text(page, "summary")
            assert "rollout branch (P3): second_copy" in summary and "LoRA actor" in summary
            assert "actor\treference" in _text(page, "sharing")
            assert page.locator(".rl-lab .rl-error").is_hidden()
            for panel, image in before.items():
                assert _image(page, panel).startswith("data:image/svg+xml")
                assert _image(page, panel) != image, f"the {panel} image did not change"

            # A sync fills the last panel (P13: a second copy, so bytes are copied).
            page.locator(".rl-lab button.rl-sync").click()
            page.wait_for_selector(".rl-lab .rl-panel-sync img", timeout=BUILD_TIMEOUT_MS)
            _wait_idle(page)
            timings["sync"] = time.monotonic() - start

            shot.parent.mkdir(parents=True, exist_ok=True)
            page.locator(".rl-lab").screenshot(path=str(shot))
        except Exception:
            _report_failure(page, lab_server, tmp_path)
            raise
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    print("browser test timings (s, cumulative):", {k: round(v, 1) for k, v in timings.items()})


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
