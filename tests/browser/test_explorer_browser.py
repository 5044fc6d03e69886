"""The explorer in a real browser: headless Chromium driven by Selenium, against a
running `aiayn serve` and against the `aiayn attention --html` file opened from disk.

Nothing is downloaded: the browser and its driver are Debian's (`chromium`,
`chromium-driver`), and Selenium is given the driver's path, so Selenium Manager
never runs. Without them the tests skip, naming the install line.

The served page's screenshots are kept: in pytest's temporary directory, or in the
directory AIAYN_EXPLORER_SCREENSHOTS names. AIAYN_EXPLORER_RUN serves another run
than the tiny random one (the docs' screenshots come from the quickstart model so).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from aiayn.cli import app
from infer_helpers import make_run

INSTALL = "apt-get install -y chromium chromium-driver && pip install 'selenium>=4.20'"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        webdriver is None or CHROMIUM is None or CHROMEDRIVER is None,
        reason=f"needs headless Chromium, its driver and Selenium: {INSTALL}",
    ),
]

SENTENCE = "And God said, Let there be light: and there was light."
WAIT_S = 60  # a shared 2-core machine can be slow to start a server or decode


# ----- fixtures: a model, a browser, a server -----------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("AIAYN_EXPLORER_RUN")
    return Path(chosen) if chosen else make_run(tmp_path_factory.mktemp("browser"), max_len=64)


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("AIAYN_EXPLORER_SCREENSHOTS")
    return Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1500,1400",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def server(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`aiayn serve RUN` as a subprocess on a free loopback port; its base URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    command = [sys.executable, "-m", "aiayn.cli", "serve", str(run), "--port", str(port)]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"aiayn serve exited {process.returncode}: {log.read_text()}")
            try:
                if _get(f"{base}/ready")[0] == 200:
                    break
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                pytest.fail(f"aiayn serve not ready after {WAIT_S} s: {log.read_text()}")
            time.sleep(0.2)
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ----- what the page shows ------------------------------------------------------------

# Distinct colours among the canvas's pixels (capped): 1 for a blank canvas.
_COLOURS = """
const canvas = arguments[0];
const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
const seen = new Set();
for (let i = 0; i < data.length && seen.size < 50; i += 4) {
  seen.add(`${data[i]},${data[i + 1]},${data[i + 2]},${data[i + 3]}`);
}
return seen.size;
"""


def _texts(browser: Any, selector: str) -> list[str]:
    # textContent, not .text: a label rotated or clipped by CSS is still the token
    return [
        e.get_attribute("textContent") for e in browser.find_elements(By.CSS_SELECTOR, selector)
    ]


def _open_head(browser: Any, kind: str, layer: int, head: int) -> Any:
    """Open one head's enlarged view from its thumbnail; the enlarged canvas."""
    browser.find_element(By.CSS_SELECTOR, f'.tabs button[data-kind="{kind}"]').click()
    browser.find_element(
        By.CSS_SELECTOR, f'.thumb[data-layer="{layer}"][data-head="{head}"]'
    ).click()
    WebDriverWait(browser, WAIT_S).until(lambda b: b.find_element(By.ID, "detail").is_displayed())
    return browser.find_element(By.ID, "detail-canvas")


def _check_head(browser: Any, payload: dict[str, Any], kind: str, layer: int, head: int) -> None:
    """The enlarged head shows its kind's tokens on its axes and a map that is not blank,
    whose strongest cell is where the payload's largest weight is."""
    canvas = _open_head(browser, kind, layer, head)
    part = payload["attention"][kind]
    tokens = {"source": payload["source_tokens"], "target": payload["target_tokens"]}
    assert _texts(browser, "#detail-queries li") == tokens[part["queries"]]
    assert _texts(browser, "#detail-keys li") == tokens[part["keys"]]
    title = browser.find_element(By.ID, "detail-title").text
    assert f"layer {layer}" in title and f"head {head}" in title
    assert browser.execute_script(_COLOURS, canvas) > 1, "the enlarged map is blank"
    rows = part["weights"][layer][head]
    n_query, n_key = len(rows), len(rows[0])
    width, height = canvas.get_attribute("width"), canvas.get_attribute("height")
    cell = int(width) // n_key
    assert (int(width), int(height)) == (n_key * cell, n_query * cell)
    # hover the cell of the largest weight: the readout names its tokens and weight
    q, k = max(
        ((q, k) for q in range(n_query) for k in range(n_key)), key=lambda i: rows[i[0]][i[1]]
    )
    offset_x = (k + 0.5) * cell - int(width) / 2  # Selenium 4 offsets from the centre
    offset_y = (q + 0.5) * cell - int(height) / 2
    ActionChains(browser).move_to_element_with_offset(canvas, offset_x, offset_y).perform()
    readout = browser.find_element(By.ID, "detail-readout").text
    queries, keys = tokens[part["queries"]], tokens[part["keys"]]
    assert readout == f"{queries[q]} → {keys[k]}: {rows[q][k]:.3f}"


def _close_head(browser: Any) -> None:
    browser.find_element(By.ID, "detail-close").click()
    assert not browser.find_element(By.ID, "detail").is_displayed()


def _thumbnails_drawn(browser: Any, payload: dict[str, Any], kind: str) -> None:
    weights = payload["attention"][kind]["weights"]
    thumbs = browser.find_elements(By.CSS_SELECTOR, ".thumb canvas")
    assert len(thumbs) == len(weights) * len(weights[0])
    assert all(browser.execute_script(_COLOURS, t) > 1 for t in thumbs[:4])


def _open_served(browser: Any, server: str) -> None:
    """Load the served page and wait for GET /info's answer, which sets beam and alpha."""
    browser.get(f"{server}/")
    WebDriverWait(browser, WAIT_S).until(lambda b: "attention explorer" in b.title)
    WebDriverWait(browser, WAIT_S).until(
        lambda b: b.find_element(By.ID, "model-info").get_attribute("textContent")
    )


def _severe_console_errors(browser: Any) -> list[str]:
    """The console's errors since the last call (reading the log empties it)."""
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


# ----- the tests -------------------------------------------------------------------


def test_served_explorer_translates_and_shows_heads(
    browser: Any, server: str, screenshots: Path
) -> None:
    _severe_console_errors(browser)  # forget earlier pages' messages
    _open_served(browser, server)
    box = browser.find_element(By.ID, "source-text")
    box.clear()
    box.send_keys(SENTENCE)
    beam = browser.find_element(By.ID, "beam")
    beam.clear()
    beam.send_keys("3")
    alpha = float(browser.find_element(By.ID, "alpha").get_attribute("value"))
    browser.find_element(By.ID, "translate-button").click()
    WebDriverWait(browser, WAIT_S).until(
        lambda b: (
            b.find_element(By.ID, "result").is_displayed()
            or "error" in b.find_element(By.ID, "status").get_attribute("class")
        )
    )
    assert browser.find_element(By.ID, "result").is_displayed(), browser.find_element(
        By.ID, "status"
    ).text

    answer = _post_json(
        f"{server}/v1/translate", {"text": SENTENCE, "beam": 3, "alpha": alpha, "attention": True}
    )
    (translated,) = answer["translations"]
    shown = browser.find_element(By.ID, "translation").get_attribute("textContent")
    assert shown == translated["translation"]
    payload = translated["attention"]

    _thumbnails_drawn(browser, payload, "encoder")
    n_layers = len(payload["attention"]["cross"]["weights"])
    _check_head(browser, payload, "cross", n_layers - 1, 1)
    browser.save_screenshot(str(screenshots / "explorer-head.png"))
    _close_head(browser)

    # the head view of the last layer: hover a target token, it is marked and the
    # thumbnails of that layer are outlined
    browser.find_element(By.CSS_SELECTOR, "#layer-buttons .chip:last-child").click()
    tokens = browser.find_elements(By.CSS_SELECTOR, "#query-tokens li")
    assert _texts(browser, "#query-tokens li") == payload["target_tokens"]
    token = tokens[min(3, len(tokens) - 1)]
    ActionChains(browser).move_to_element(token).perform()
    assert "focus" in token.get_attribute("class")
    current = browser.find_elements(By.CSS_SELECTOR, ".thumb.current")
    assert {int(t.get_attribute("data-layer")) for t in current} == {n_layers - 1}
    assert len(current) == len(payload["attention"]["cross"]["weights"][0])
    browser.save_screenshot(str(screenshots / "explorer.png"))
    assert _severe_console_errors(browser) == []


def test_served_explorer_reports_a_refused_request(browser: Any, server: str) -> None:
    _severe_console_errors(browser)  # forget earlier pages' messages
    _open_served(browser, server)
    browser.find_element(By.ID, "source-text").send_keys(SENTENCE)
    beam = browser.find_element(By.ID, "beam")
    beam.clear()
    beam.send_keys("0")  # the server refuses beam 0 with a JSON error
    browser.execute_script("document.getElementById('beam').removeAttribute('min')")
    browser.find_element(By.ID, "translate-button").click()
    status = browser.find_element(By.ID, "status")
    WebDriverWait(browser, WAIT_S).until(lambda b: "error" in status.get_attribute("class"))
    assert status.text.startswith("Could not translate: 422")
    assert not browser.find_element(By.ID, "result").is_displayed()


def _exported_payload(page: Path) -> dict[str, Any]:
    """The payload embedded in an `aiayn attention --html` page."""
    text = page.read_text(encoding="utf-8")
    start = text.index('id="aiayn-data">') + len('id="aiayn-data">')
    return json.loads(text[start : text.index("</script>", start)])


def test_html_export_opens_offline(browser: Any, run: Path, tmp_path: Path) -> None:
    page = tmp_path / "explorer.html"
    result = CliRunner().invoke(app, ["attention", str(run), SENTENCE, "--html", str(page)])
    assert result.exit_code == 0, result.output
    payload = _exported_payload(page)

    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd(
        "Network.emulateNetworkConditions",
        {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    try:
        _severe_console_errors(browser)  # forget earlier pages' messages
        browser.get(page.as_uri())
        shown = browser.find_element(By.ID, "translation").get_attribute("textContent")
        assert shown == payload["translation"]
        assert browser.find_element(By.ID, "source-text").get_attribute("value") == SENTENCE
        # it fetched nothing: no resource besides the page itself
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
        _thumbnails_drawn(browser, payload, "encoder")
        _check_head(browser, payload, "encoder", 0, 0)
        _close_head(browser)
        _check_head(browser, payload, "decoder", 0, 1)
        assert _severe_console_errors(browser) == []
    finally:
        browser.execute_cdp_cmd(
            "Network.emulateNetworkConditions",
            {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
        )


def _synthetic_heads_json(run: Path) -> Path:
    """RUN/heads/heads.json as `aiayn heads` writes it, each number telling its head apart."""
    from aiayn.analysis.heads import HEADS_FILE
    from aiayn.apps.translate import Translator

    cfg = Translator.load(run).model.cfg
    layers = {"encoder": cfg.n_encoder_layers, "decoder": cfg.n_decoder_layers}
    layers["cross"] = cfg.n_decoder_layers
    records = [
        {"kind": kind, "layer": layer, "head": head, "entropy": 1 + layer + head / 10,
         "confidence": 0.5, "ablation": 0.1234 + layer + head / 100, "gradient": 0.0042}
        for kind in layers
        for layer in range(layers[kind])
        for head in range(cfg.n_heads)
    ]  # fmt: skip
    path = run / HEADS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"sentences": 200, "heads": records}), encoding="utf-8")
    return path


def test_html_export_shows_corpus_numbers_and_the_logit_lens(
    browser: Any, tmp_path: Path, screenshots: Path
) -> None:
    run = make_run(tmp_path / "run", max_len=64)  # its own: AIAYN_EXPLORER_RUN stays untouched
    _synthetic_heads_json(run)
    page = tmp_path / "explorer.html"
    result = CliRunner().invoke(app, ["attention", str(run), SENTENCE, "--html", str(page)])
    assert result.exit_code == 0, result.output
    payload = _exported_payload(page)
    _severe_console_errors(browser)  # forget earlier pages' messages
    browser.get(page.as_uri())

    # a head's numbers over the corpus, beside this sentence's
    layer, head = 1, 2
    _open_head(browser, "cross", layer, head)
    corpus = browser.find_element(By.ID, "detail-corpus-box")
    assert corpus.is_displayed()
    shown = dict(
        zip(_texts(browser, "#detail-corpus dt"), _texts(browser, "#detail-corpus dd"), strict=True)
    )
    record = payload["attention"]["cross"]["corpus"][layer][head]
    assert shown["ablation (importance)"] == f"{record['ablation']:.4f} nats/token"
    assert shown["entropy"] == f"{record['entropy']:.3f} nats"
    assert record["ablation"] == pytest.approx(0.1234 + layer + head / 100)
    sentence = _texts(browser, "#detail-metrics dt")
    assert "entropy" in sentence  # this sentence's numbers stay
    browser.save_screenshot(str(screenshots / "explorer-corpus.png"))
    _close_head(browser)

    # the logit lens: the last layer on top, the embedding at the bottom
    browser.find_element(By.ID, "lens-tab").click()
    assert browser.find_element(By.ID, "lens-view").is_displayed()
    assert not browser.find_element(By.CSS_SELECTOR, ".panels").is_displayed()
    lens = payload["lens"]
    rows = browser.find_elements(By.CSS_SELECTOR, "#lens-grid tbody tr")
    assert [r.find_element(By.TAG_NAME, "th").text for r in rows] == lens["layers"][::-1]
    for row, top in zip(rows, lens["top"][::-1], strict=True):
        cells = row.find_elements(By.TAG_NAME, "td")
        assert [c.get_attribute("textContent") for c in cells] == top
    assert _texts(browser, "#lens-grid tfoot th")[1:] == lens["inputs"]
    assert _texts(browser, "#lens-grid thead th")[1:] == lens["targets"]
    browser.save_screenshot(str(screenshots / "explorer-lens.png"))
    assert _severe_console_errors(browser) == []


def test_induction_page_shows_each_score_on_its_colour(
    browser: Any, screenshots: Path, tmp_path: Path
) -> None:
    """`aiayn induction --html` for a GPT: every head's three scores as the browser
    draws them, each number the library's score and each cell viridis at that score."""
    import torch
    from matplotlib import colormaps

    from aiayn import ModelConfig
    from aiayn.analysis.induction import repeated_random_tokens, score_model
    from aiayn.apps.explorer.induction import write_induction_html
    from aiayn.models.decoder_only import DecoderOnly

    torch.manual_seed(0)
    shape = {"d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 24, "n_layers": 2}
    gpt = DecoderOnly(ModelConfig.gpt(vocab_size=40, dropout=0.0, **shape)).eval()
    scores = score_model(gpt, repeated_random_tokens(40, 6, 3, 0, (0, 1, 2, 3), bos_id=1))
    page = write_induction_html(scores, tmp_path / "induction.html", run="a random GPT")
    browser.get(page.as_uri())
    ranges = {"induction": (0.0, 1.0), "previous_token": (0.0, 1.0), "copying": (-1.0, 1.0)}
    for name, grid in scores.grids().items():
        rows = browser.find_elements(By.CSS_SELECTOR, f"#{name} tr")[1:]  # under the heads
        assert [r.find_element(By.TAG_NAME, "th").text for r in rows] == ["layer 0", "layer 1"]
        low, high = ranges[name]
        for row, values in zip(rows, grid.tolist(), strict=True):
            cells = row.find_elements(By.TAG_NAME, "td")
            assert [c.text for c in cells] == [f"{v:.3f}" for v in values]
            for cell, value in zip(cells, values, strict=True):
                r, g, b, _ = colormaps["viridis"]((value - low) / (high - low))
                want = f"rgba({round(255 * r)}, {round(255 * g)}, {round(255 * b)}, 1)"
                assert cell.value_of_css_property("background-color") == want
    browser.save_screenshot(str(screenshots / "induction.png"))
    assert _severe_console_errors(browser) == []
