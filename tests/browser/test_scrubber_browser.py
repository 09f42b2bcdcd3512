"""One real browser: `streamlit run app.py` + headless Chromium (Playwright), scrubbing tau on the Explore page.

Skipped only when /usr/bin/chromium (Debian's chromium package) or playwright
is missing. Uses the tiny test model unless AAE_MODEL is set.

Explore's tau views are one ``st.components.v2`` component (``ui/scrubber.py``):
the browser holds every grid tau's views and repaints on each slider event;
only a release reaches the server. The tests read what it painted from its
root's data attributes (``.aae``: data-tau, data-kind, data-shown,
data-answer, data-pmax, data-entropy, data-map-sum, data-ready, data-paints)
and compare the painted numbers with ``core.runs.engine.run`` in this process, on
the same model, document and settings (CPU float32: the same numbers).

No fixed waits: every step waits until Streamlit has *settled* (see
:func:`settle`: no running-man status widget, no stale element, every plotly
chart drawn, the state held for longer than Streamlit's 500 ms status delay)
and an expected text is on the page, or until the scrubber painted an
expected frame (:func:`press`: a log of every paint, so a frame shown for a
moment, like the nearest grid frame before the exact one, is not missed). One
generous deadline bounds a whole test (:class:`Deadline`, 10 min by default,
``AAE_BROWSER_BUDGET_S``); each wait gets what is left of it, so a busy
machine makes the test slower, not red.

To open a URL and wait for the app (e.g. a query-parameter check)::

    open_settled(page, f"{server}/?tau=0.7", deadline, marker="Answer:", scope=SCRUBBER)

Screenshots for the README: set AAE_SCREENSHOTS to a folder (e.g.
``AAE_SCREENSHOTS=assets/screenshots AAE_MODEL=<bundled model folder>``) and
the test also opens every page and saves ``<page>.png`` there.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from core.values.choice import Choice
from support.browser import (  # noqa: E402
    GRID,
    ROOT,
    SCRUBBER,
    TAU_SLIDER,
    assert_frame_is_the_pass,
    go,
    link,
    map_layer,
    open_settled,
    press,
    screenshots,
    scrubber,
    serving,
    set_tau,
    settle,
    url_tau,
    wait_grid,
    wait_painted,
)


def test_scrubbing_the_grid_paints_the_servers_frames(server, page, deadline, engine_at, tmp_path):
    """PageDown from 1.00 to 0.30 and PageUp back: every grid tau paints its own frame (answer, meters, map) with
    no server round trip, the same frame both ways, and at 0.70 and 0.50 the numbers of this process's pass."""
    open_settled(page, link(server, tau=1.0), deadline, marker="Answer:", scope=SCRUBBER)
    first = scrubber(page, deadline)
    assert (first["tau"], first["kind"], first["shown"]) == ("1.00", "grid", "1.00"), first
    assert "512 tokens" in page.locator(SCRUBBER).inner_text(timeout=deadline.ms())
    wait_grid(page, deadline)

    down = {"1.00": scrubber(page, deadline)}
    for tau in GRID[1:]:
        down[tau] = press(page, "PageDown", {"tau": tau, "kind": "grid"}, deadline)
        assert down[tau]["shown"] == tau and down[tau]["ready"] == "15/15", down[tau]
    page.screenshot(path=str(tmp_path / "explore_tau_0.3.png"), timeout=deadline.ms())
    assert (tmp_path / "explore_tau_0.3.png").stat().st_size > 10_000
    up = {}
    for tau in GRID[-2::-1]:
        up[tau] = press(page, "PageUp", {"tau": tau, "kind": "grid"}, deadline)

    fields = ("answer", "pmax", "entropy", "mapSum")
    for tau in GRID[:-1]:  # a frame is what it is, whichever way the slider came
        assert [up[tau][f] for f in fields] == [down[tau][f] for f in fields], (tau, up[tau], down[tau])
    pmax = [float(down[t]["pmax"]) for t in GRID]
    entropy = [float(down[t]["entropy"]) for t in GRID]
    assert len(set(pmax)) == len(GRID) and len(set(entropy)) == len(GRID), (pmax, entropy)  # the meters move
    assert pmax[-1] > pmax[0] and entropy[-1] < entropy[0], (pmax, entropy)  # a smaller tau sharpens attention
    assert len({down[t]["mapSum"] for t in GRID}) > 1, [down[t]["mapSum"] for t in GRID]  # the map changes
    card = page.locator('.aae .card[data-side="chosen"]').inner_text(timeout=deadline.ms())
    assert f"Answer: {down['1.00']['answer'] or '(empty)'}" in card, card  # the card shows the frame's answer

    # The painted numbers are the server's passes: equal to this process's at two grid taus (Pmax, H, answer), and
    # the answer follows the pass at both ends too (the tiny random model writes '' at every tau: its decoder
    # ends at once; a trained model's answer changes along the grid, and equality covers that as well).
    layer, head = map_layer(page, deadline)
    for tau in ("0.70", "0.50"):
        assert_frame_is_the_pass(down[tau], engine_at(float(tau), layer, head), f"grid tau {tau}")
    for tau in ("1.00", "0.30"):
        assert down[tau]["answer"] == engine_at(float(tau), layer, head).answer, (tau, down[tau])

    shots = os.environ.get("AAE_SCREENSHOTS")
    if shots:
        screenshots(page, server, Path(shots) if Path(shots).is_absolute() else ROOT / shots, deadline)


def _finishes_a_run(message) -> bool:
    """Whether a websocket message from the server is Streamlit's ``script_finished`` (the end of a run)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    try:
        return isinstance(message, bytes) and ForwardMsg.FromString(message).WhichOneof("type") == "script_finished"
    except Exception:  # not one ForwardMsg
        return False


def test_a_grid_frame_lost_on_the_wire_is_sent_again(server, page, deadline):
    """Streamlit drops the messages a run queued when a newer run starts, so a grid frame the server handed over may
    never reach the browser (and the server cannot know). Here that happens on the websocket, as Streamlit does it:
    the first delta that carries frames is dropped together with the rest of its run (up to and with its
    ``script_finished``: the browser never learns that run ended, as with a run a newer one replaced), and the next
    run (a poll, or the key press below) arrives as usual. The browser finds the gap in that run's list of held
    frames, asks for everything, and the grid still completes and paints every frame (before the fix, the grid
    stopped short for good: 'k/15', the server idle).

    Dropping the element message alone is not what Streamlit does: the run then finishes in the browser, which
    removes the scrubber as an element that run did not draw. A 2,048-token document keeps the grid filling over
    several polls, so a delta with frames goes by on any machine."""
    dropped: list[int] = []
    state = {"dropping": False}

    def route(ws) -> None:
        upstream = ws.connect_to_server()
        ws.on_message(upstream.send)

        def down(message) -> None:
            if state["dropping"]:
                state["dropping"] = not _finishes_a_run(message)
                return
            if not dropped and isinstance(message, bytes) and b'"delta":true' in message and b'"frames":{"' in message:
                dropped.append(len(message))
                state["dropping"] = not _finishes_a_run(message)
                return
            ws.send(message)

        upstream.on_message(down)

    page.route_web_socket(re.compile(r".*/_stcore/stream"), route)
    open_settled(page, link(server, tau=1.0, seed=11, tokens=2048), deadline, marker="Answer:", scope=SCRUBBER)
    wait_grid(page, deadline)
    assert dropped, "no delta with frames went by: the test did not drop anything"
    for tau in GRID[1:]:
        got = press(page, "PageDown", {"tau": tau, "kind": "grid"}, deadline)
        assert got["shown"] == tau, got


def test_an_off_grid_tau_shows_the_nearest_frame_then_the_exact_one(server, page, deadline, engine_at):
    """ArrowLeft from 0.70: the nearest grid frame (0.70) at once, marked "nearest"; after the release the
    server's exact pass of 0.69 replaces it, with this process's numbers, and the URL carries tau=0.69."""
    open_settled(page, link(server, tau=0.7), deadline, marker="Answer:", scope=SCRUBBER)
    at70 = scrubber(page, deadline)
    assert (at70["tau"], at70["kind"]) == ("0.70", "grid"), at70
    near = press(page, "ArrowLeft", {"tau": "0.69", "kind": "nearest"}, deadline)
    assert near["shown"] == "0.70" and near["pmax"] == at70["pmax"] and near["answer"] == at70["answer"], (near, at70)
    exact = wait_painted(page, {"tau": "0.69", "kind": "exact"}, deadline)
    assert exact["shown"] == "0.69", exact
    page.wait_for_function("() => new URLSearchParams(location.search).get('tau') === '0.69'", timeout=deadline.ms())
    settle(page, deadline)
    layer, head = map_layer(page, deadline)
    assert_frame_is_the_pass(exact, engine_at(0.69, layer, head), "exact tau 0.69")
    assert exact["pmax"] != at70["pmax"], (exact, at70)
    assert scrubber(page, deadline)["kind"] == "exact"  # and it stays


def test_a_link_reopens_the_view_and_back_and_navigation_work(server, page, deadline):
    """A shared link opens exactly its view (in a fresh session); a released tau is written to the address bar,
    the browser's back button returns to the previous tau, and a trip to Calibrate and back keeps it."""
    open_settled(page, link(server, tau=0.7), deadline, marker="Answer:", scope=SCRUBBER)
    shown = scrubber(page, deadline)
    assert (shown["tau"], shown["kind"]) == ("0.70", "grid"), shown
    assert float(page.locator(TAU_SLIDER).input_value(timeout=deadline.ms())) == 0.70
    assert "512 tokens" in page.locator(SCRUBBER).inner_text(timeout=deadline.ms())
    assert "512" in page.locator(".st-key-doc_tokens input").first.input_value(timeout=deadline.ms())
    # one step, one release (one rerun, one history entry)
    set_tau(page, 0.69, deadline)
    assert "depth=30" in page.evaluate("() => location.search")
    page.go_back(timeout=deadline.ms())
    page.wait_for_function("() => new URLSearchParams(location.search).get('tau') === '0.70'", timeout=deadline.ms())
    wait_painted(page, {"tau": "0.70", "kind": "grid"}, deadline)
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    assert float(page.locator(TAU_SLIDER).input_value(timeout=deadline.ms())) == 0.70

    go(page, "Calibrate", deadline)
    go(page, "Explore", deadline)
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    back = scrubber(page, deadline)
    assert (back["tau"], back["kind"]) == ("0.70", "grid"), back
    assert url_tau(page) == "0.70"


# --- a rotary masked-LM model (issue 38) --------------------------------------------------


@pytest.fixture(scope="module")
def rope_server(model_ref, tmp_path_factory):
    """A second `streamlit run app.py`, opening a tiny random ModernBERT masked LM (L_tr 64) through AAE_MODEL: the
    cosine variant (s = 16), so one server shows both axes of its slider, tau and CosScale s."""
    from conftest import build_tiny_rope

    folder = str(build_tiny_rope(tmp_path_factory.mktemp("browser-rope"), train_length=64, cosine=16.0))
    with serving(folder) as url:
        yield url, folder


def test_a_rope_model_opens_and_tau_moves_its_masked_token_card(rope_server, page, deadline):
    """The RoPE model in a real browser: Explore paints the masked tokens' card, PageDown moves tau along the grid,
    and the painted accuracy and perplexity are core.experiments.mlm's own score of the same document at that tau."""
    import math

    from core.experiments import mlm
    from core.models import load

    url, folder = rope_server
    open_settled(
        page, f"{url}/?tokens=128&seed=2&method=fixed&tau=1.0", deadline, marker="masked tokens:", scope=SCRUBBER
    )
    first = scrubber(page, deadline)
    assert (first["tau"], first["kind"]) == ("1.00", "grid"), first
    painted = {"1.00": first}
    for tau in GRID[1:5]:
        painted[tau] = press(page, "PageDown", {"tau": tau, "kind": "grid"}, deadline)
    loaded = load(folder, device="cpu")
    _, seq = mlm.sequence(loaded, 128, seed=2)
    for tau in ("1.00", "0.80"):
        s = mlm.score(loaded, [seq], Choice.of(tau=float(tau)))
        assert float(painted[tau]["accuracy"]) == pytest.approx(s.correct / s.masked), (tau, painted[tau])
        assert float(painted[tau]["mlmPerplexity"]) == pytest.approx(math.exp(s.nll / s.masked), rel=1e-4), tau
    assert float(painted["0.80"]["pmax"]) > float(painted["1.00"]["pmax"])  # a smaller tau sharpens attention
    card = page.locator('.aae .card[data-side="chosen"]').inner_text(timeout=deadline.ms())
    assert "masked tokens: accuracy" in card and "→" in card, card


def test_a_cosine_rope_models_slider_moves_cosscale(rope_server, page, deadline):
    """The same model's slider switched to CosScale s: PageDown moves s along its grid in the browser, and the
    painted masked-token numbers are core.experiments.mlm's own score of the document at that s (tau = 1)."""
    import math

    from core.experiments import mlm
    from core.models import load

    url, folder = rope_server
    loaded = load(folder, device="cpu")
    open_settled(
        page, f"{url}/?tokens=128&seed=3&method=fixed&tau=1.0", deadline, marker="masked tokens:", scope=SCRUBBER
    )
    page.get_by_test_id("stRadioGroup").get_by_text("CosScale s", exact=True).click(timeout=deadline.ms())
    here = wait_painted(page, {"tau": "16.00", "kind": "grid"}, deadline)  # the slider now holds the trained s
    wait_grid(page, deadline)
    page.locator(TAU_SLIDER).focus(timeout=deadline.ms())
    page.keyboard.press("PageDown")
    while True:  # the slider moved off the trained s: the frame painted is the one at the value it shows
        lower = scrubber(page, deadline)
        if lower["tau"] != "16.00" and lower["shown"] not in ("", "16.00"):
            break
        page.wait_for_timeout(100)
    s = float(lower["shown"])
    _, seq = mlm.sequence(loaded, 128, seed=3)
    for painted, scale in ((here, 16.0), (lower, s)):
        got = mlm.score(loaded, [seq], Choice.of(tau=1.0, cosine_scale=scale))
        assert float(painted["accuracy"]) == pytest.approx(got.correct / got.masked), (scale, painted)
        assert float(painted["mlmPerplexity"]) == pytest.approx(math.exp(got.nll / got.masked), rel=1e-4), scale
    assert float(lower["pmax"]) < float(here["pmax"])  # a smaller s flattens the softmax of s * cos(q, k)
