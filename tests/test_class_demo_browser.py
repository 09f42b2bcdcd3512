"""Issue 50 in a real browser: a class demo that never breaks.

One `streamlit run app.py` on the bundled models (no AAE_MODEL: the default is the bundled ``retrieval-t5``) and
headless Chromium (Playwright), 1400 x 1000 like a projector. Each test drives the page as a teacher would and
waits on Streamlit's own state (:func:`test_browser.settle`, which fails at once on an exception shown in the
page); one deadline bounds each test.

Skipped when /usr/bin/chromium or playwright is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_browser import (ARGS, CHROMIUM, SCRUBBER, TAU_SLIDER, Deadline, _LOG, _free_port, _wait_health,  # noqa: F401
                          page, scrubber, settle, wait_painted)

ROOT = Path(__file__).resolve().parents[1]
#: The four bundled models, by the Model box's labels (ui.choices.model_labels), in the order a class meets them.
MODELS = ("rope-mlm (RoPE masked LM)", "retrieval-t5-cos", "rope-mlm-cos (RoPE masked LM)", "retrieval-t5")
PAGES = ("Explore", "Calibrate", "Sweep", "Theory")
BUDGET_S = float(os.environ.get("AAE_BROWSER_BUDGET_S", "900"))
#: A folder for a screenshot of the page when a test fails (AAE_FAIL_SHOTS), to see where it stopped.
FAIL_SHOTS = os.environ.get("AAE_FAIL_SHOTS")


@pytest.fixture(scope="module")
def server():
    """The base URL of a `streamlit run app.py` on the bundled models (AAE_MODEL unset)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (Debian) to run the browser test")
    pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "AAE_MODEL"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.address", "127.0.0.1",
         "--server.port", str(port), "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def deadline() -> Deadline:
    return Deadline(BUDGET_S)


@pytest.fixture
def shot_on_failure(page, request):
    """Yield; on a failed test, save the page as <test>.png in AAE_FAIL_SHOTS (when set)."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if FAIL_SHOTS and (rep is None or rep.failed):
        Path(FAIL_SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(FAIL_SHOTS) / f"{request.node.name}.png"), full_page=True)


def _choose(page, key: str, label: str, deadline: Deadline, wait: bool = True) -> None:
    """Pick ``label`` in the selectbox of ``key`` as a person does (click, then the option)."""
    from playwright.sync_api import TimeoutError as PwTimeout

    box = page.locator(f".st-key-{key} input[role=combobox]").first
    box.click(timeout=deadline.ms())
    try:  # a click may only focus the box: then the arrow key opens its list
        page.locator('[role="option"]').first.wait_for(timeout=deadline.ms(3000))
    except PwTimeout:
        box.press("ArrowDown", timeout=deadline.ms())
    page.locator('[role="option"]').filter(has_text=label).first.click(timeout=deadline.ms())
    if wait:
        settle(page, deadline)


def _go(page, title: str, deadline: Deadline) -> None:
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first.click(timeout=deadline.ms())
    page.wait_for_selector(f'h1:has-text("{title}")', timeout=deadline.ms())
    settle(page, deadline)


def _open(page, url: str, deadline: Deadline) -> None:
    page.goto(url, wait_until="domcontentloaded", timeout=deadline.ms())
    page.wait_for_selector('h1:has-text("Explore")', timeout=deadline.ms())
    settle(page, deadline)


def _no_error(page, where: str) -> None:
    errors = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]')
    assert errors.count() == 0, (where, [errors.nth(i).inner_text()[:300] for i in range(errors.count())])


def test_switching_between_the_bundled_models_on_every_page(server, page, shot_on_failure):
    """Every bundled model on every page, switched in the sidebar as a teacher would: no exception, no error line;
    on Explore the scrubber is drawn for each model, also when the switch comes while the grid is still filling
    (defect 1: T5 -> RoPE raised a KeyError for ``ex_text_window`` on the scrubber's next poll)."""
    deadline = Deadline(BUDGET_S)
    _open(page, server, deadline)
    for title in PAGES:
        if title != "Explore":
            _go(page, title, deadline)
        for label in MODELS:
            print(title, label, f"{deadline.left():.0f} s left", flush=True)
            _choose(page, "model_choice", label, deadline)
            _no_error(page, f"{title}, {label}")
            if title == "Explore":
                marker = "masked tokens:" if "RoPE" in label else "Answer:"
                settle(page, deadline, marker=marker, scope=SCRUBBER)
                _no_error(page, f"{title}, {label}")
    # Mid-grid: a longer document's grid is still being computed when the family changes, both ways.
    _go(page, "Explore", deadline)
    for label in ("rope-mlm (RoPE masked LM)", "retrieval-t5", "rope-mlm-cos (RoPE masked LM)", "retrieval-t5-cos"):
        page.locator(".st-key-len_4x button").first.click(timeout=deadline.ms())
        page.locator(SCRUBBER).first.wait_for(timeout=deadline.ms())
        _choose(page, "model_choice", label, deadline, wait=False)
        settle(page, deadline, marker="masked tokens:" if "RoPE" in label else "Answer:", scope=SCRUBBER)
        _no_error(page, f"mid-grid, {label}")
