"""The built docs site in a real browser (headless Chromium, as the explorer's test
drives it): the home page, a tutorial page and the language switch, the maths KaTeX
renders from the site's own files (and nothing loaded from another host), the Korean
search, and a tutorial downloaded as a notebook.

The site is built with `mkdocs build --strict` (tests/docs/test_docs_site.py's
fixture) and served over HTTP from a thread. The screenshots go to pytest's temporary
directory, or to the directory AIAYN_DOCS_SCREENSHOTS names; the committed
`docs/assets/site-home.png`, `site-tutorial.png` and `site-tutorial-ko.png` were taken so:

    AIAYN_DOCS_SCREENSHOTS=docs/assets .venv/bin/python -m pytest -q -p no:xdist \\
        tests/browser/test_docs_browser.py

The tutorial screenshots are of tutorial 2, in English and in Korean
(`docs/assets/site-tutorial-ko.png`: Hangul needs a font, Debian's `fonts-nanum`,
which `make browser` installs with Chromium); `site-tutorial1-ko-maths.png` shows
tutorial 1's equation 1 rendered, `site-search-ko.png` the Korean site's search for
"어텐션", `site-notebook-download.png` the notebook link of tutorial 1.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

try:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pytestmark (the explorer test's) skips, naming the install line
    By = WebDriverWait = None
from test_docs_site import ROOT, site  # noqa: F401 (the built site, a fixture)
from test_explorer_browser import WAIT_S, browser, pytestmark  # noqa: F401 (fixture, skips)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:  # noqa: F811 (the imported fixture)
    """The built site over HTTP on a free loopback port; its base URL."""
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("AIAYN_DOCS_SCREENSHOTS")
    return Path(chosen) if chosen else tmp_path_factory.mktemp("docs-screenshots")


TUTORIAL = "tutorials/02-multi-head-attention/"  # code, a table, a figure of the heads


def open_page(browser, url: str) -> None:  # noqa: F811
    browser.get(url)
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def test_the_home_page_renders_with_its_navigation_and_a_language_switch(
    browser,  # noqa: F811
    served,
    screenshots,
):
    open_page(browser, served)
    assert browser.find_element(By.TAG_NAME, "h1").text == "aiayn"
    tabs = browser.find_element(By.CSS_SELECTOR, "nav.md-nav--primary").text
    for section in ("How-to guides", "Reference", "Explanation"):
        assert section in tabs
    # Material's stylesheet applied: the header bar is coloured, not the browser's default.
    header = browser.find_element(By.CSS_SELECTOR, "header.md-header")
    assert header.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "")
    korean = browser.find_elements(By.CSS_SELECTOR, "a[hreflang='ko']")
    assert korean, "no link to the Korean site"
    browser.save_screenshot(str(screenshots / "site-home.png"))
    open_page(browser, korean[0].get_attribute("href"))
    assert "트랜스포머" in browser.find_element(By.TAG_NAME, "article").text


def test_a_tutorial_page_renders_its_code_tables_and_figure_in_both_languages(
    browser,  # noqa: F811
    served,
    screenshots,
):
    for prefix, name, words in (("", "site-tutorial.png", "Multi-head attention"),
                                ("ko/", "site-tutorial-ko.png", "직접 구현하기")):  # fmt: skip
        open_page(browser, served + prefix + TUTORIAL)
        article = browser.find_element(By.TAG_NAME, "article")
        assert words in article.find_element(By.CSS_SELECTOR, "h1").text
        assert article.find_elements(By.CSS_SELECTOR, "pre code")
        figures = article.find_elements(By.CSS_SELECTOR, "img")
        assert figures, "the heads' figure is missing"
        for image in figures:  # loaded, not a broken-image box
            assert browser.execute_script("return arguments[0].naturalWidth", image) > 0
        browser.save_screenshot(str(screenshots / name))


def resources_from_elsewhere(browser, origin: str) -> list[str]:  # noqa: F811
    """Every resource the open page loaded (scripts, styles, fonts, images, the search
    index and its worker) whose URL is not on `origin`."""
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name).concat([location.href])"
    )
    return [url for url in loaded if not url.startswith(origin)]


def test_the_maths_renders_from_the_site_s_own_katex_and_nothing_comes_from_elsewhere(
    browser,  # noqa: F811
    served,
    screenshots,
):
    open_page(browser, served + "ko/tutorials/01-attention-by-hand/")
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "article .katex-display .katex-html")
    )
    equation = browser.find_element(By.CSS_SELECTOR, "article .katex-display")
    assert "Attention" in equation.text and "softmax" in equation.text
    assert "(1)" in equation.text  # the paper's equation number, as a tag
    # KaTeX's own font drew it (a font that failed to load leaves the fallback's width)
    assert browser.execute_script("return document.fonts.check('16px KaTeX_Main')")
    # an output block says so, in the page's language; an exercise's solution is folded
    output = browser.find_element(By.CSS_SELECTOR, "article .language-output")
    label = browser.execute_script(
        "return getComputedStyle(arguments[0], '::before').content", output
    )
    assert label == '"출력"'
    solutions = browser.find_elements(By.CSS_SELECTOR, "article details.success")
    assert len(solutions) >= 2 and not any(s.get_attribute("open") for s in solutions)
    assert not solutions[0].find_element(By.CSS_SELECTOR, "pre").is_displayed()
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", equation)
    WebDriverWait(browser, WAIT_S).until(  # the header has switched to the page's title
        lambda d: d.find_elements(By.CSS_SELECTOR, ".md-header__title--active")
    )
    browser.save_screenshot(str(screenshots / "site-tutorial1-ko-maths.png"))
    assert resources_from_elsewhere(browser, served) == []
    for page in ("", "ko/", "reference/api/", "tutorials/06-beam-search/"):
        open_page(browser, served + page)
        assert resources_from_elsewhere(browser, served) == [], page


def test_the_korean_search_finds_the_korean_tutorials_first(
    browser,  # noqa: F811
    served,
    screenshots,
):
    open_page(browser, served + "ko/")
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.click()  # the header's search box (a wide window shows it)
    box.send_keys("어텐션")
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".md-search-result__item")
    )
    links = [
        a.get_attribute("href")
        for a in browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item > a")
    ]
    # Korean pages only (the Korean site's index), tutorials first, tutorial 1 among them
    # (its title says 어텐션 now; it used to come 18th of 19).
    assert all(link.startswith(served + "ko/") for link in links), links
    assert all(link.startswith(served + "ko/tutorials/") for link in links[:3]), links[:4]
    assert any("/01-attention-by-hand/" in link for link in links[:3]), links[:4]
    titles = browser.find_element(By.CSS_SELECTOR, ".md-search-result__list").text
    assert "스케일드 닷-프로덕트 어텐션" in titles
    browser.save_screenshot(str(screenshots / "site-search-ko.png"))


def test_a_tutorial_downloads_as_a_notebook_that_holds_its_code(
    browser,  # noqa: F811
    served,
    screenshots,
    tmp_path,
):
    import nbformat

    browser.execute_cdp_cmd(
        "Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)}
    )
    open_page(browser, served + "ko/tutorials/01-attention-by-hand/")
    link = browser.find_element(By.CSS_SELECTOR, "article a.notebook-download")
    assert "노트북으로 내려받기" in link.text
    browser.execute_script(
        "arguments[0].style.outline = '3px solid #e91e63'; window.scrollTo(0, 0)", link
    )
    browser.save_screenshot(str(screenshots / "site-notebook-download.png"))
    link.click()
    path = tmp_path / "01-attention-by-hand.ipynb"
    WebDriverWait(browser, WAIT_S).until(lambda d: path.is_file() and path.stat().st_size > 0)
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    assert code and code[0].startswith("import math")
    assert any("어텐션" in cell.source for cell in notebook.cells if cell.cell_type == "markdown")
