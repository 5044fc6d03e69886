"""The docs site builds with `mkdocs build --strict`, and its generated pages are whole.

`--strict` turns every warning into a failure: a broken link or anchor, a page missing
from the nav, a docstring mkdocstrings cannot parse. The site is built once into a
temporary folder (about 10 s on 2 cores); the tests then read the built HTML.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
        ),
        "NO_MKDOCS_2_WARNING": "1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return out


def text_of(page: Path) -> str:
    """A built page's text, tags removed."""
    return re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_the_site_builds_strict_in_english_and_korean(site):
    assert (site / "index.html").is_file()
    korean = (site / "ko" / "index.html").read_text(encoding="utf-8")
    assert "빔 서치(beam search)" in korean and 'lang="ko"' in korean
    # A page without a .ko.md falls back to the English one on the Korean site.
    assert "Recipe fields" in text_of(site / "ko" / "reference" / "recipe" / "index.html")


def test_the_recipe_fields_page_lists_every_field_of_the_config_dataclasses(site):
    from aiayn.config import ModelConfig, TrainConfig
    from aiayn.training.recipe import DATA_KEYS

    page = text_of(site / "reference" / "recipe" / "index.html")
    for cls in (ModelConfig, TrainConfig):
        for field in dataclasses.fields(cls):
            assert f" {field.name} " in page, f"{cls.__name__}.{field.name}"
    for key in DATA_KEYS:
        assert f" {key} " in page, key
    # Descriptions come from the docstrings, not from the page's source.
    assert "warmup steps of the schedule (the paper: 4000)." in page
    assert "recipe-fields" not in page  # the marker was replaced


def test_the_cli_page_documents_every_command(site):
    import typer

    from aiayn.cli import app

    page = text_of(site / "reference" / "cli" / "index.html")
    command = typer.main.get_command(app)
    for name, sub in command.commands.items():
        assert f"aiayn {name}" in page, name
        for option in sub.params:
            for flag in option.opts:
                if flag.startswith("--"):
                    assert flag in page, f"aiayn {name} {flag}"


def test_the_api_reference_renders_the_public_api_from_its_docstrings_a_page_per_layer(site):
    pages = {p.parent.name: p.read_text("utf-8") for p in (site / "reference" / "api").glob("*/index.html")}  # fmt: skip
    assert set(pages) >= {"config", "nn", "models", "inference", "training", "apps"}
    for page, name in (("config", "aiayn.config.ModelConfig"),
                       ("nn", "aiayn.nn.attention.MultiHeadAttention"),
                       ("inference", "aiayn.inference.frozen.freeze"),
                       ("apps", "aiayn.apps.translate.Translator")):  # fmt: skip
        assert f'id="{name}"' in pages[page], name
    # a line of ModelConfig's docstring
    assert "dropout on attention weights (not in the paper: 0)." in text_of(
        site / "reference" / "api" / "config" / "index.html"
    )
    # Signatures in a code block of their own, not at heading size in the heading.
    assert re.search(r'class="[^"]*doc-signature', pages["nn"])
    heading = re.search(
        r'<h2 id="aiayn.nn.attention.MultiHeadAttention".*?</h2>', pages["nn"], re.S
    )
    assert heading and "d_model" not in heading.group(0)
    # The overview links to every layer's page.
    overview = (site / "reference" / "api" / "index.html").read_text("utf-8")
    for page in pages:
        assert f'href="{page}/"' in overview, page


def test_reading_comfort_previous_next_links_output_labels_and_a_wider_column(site):
    page = (site / "ko" / "tutorials" / "02-multi-head-attention" / "index.html").read_text("utf-8")
    assert 'class="md-footer__link md-footer__link--prev"' in page
    assert 'class="md-footer__link md-footer__link--next"' in page
    assert 'class="language-output highlight"' in page
    css = (site / "stylesheets" / "extra.css").read_text("utf-8")
    assert 'content: "Output"' in css and 'html[lang="ko"]' in css and 'content: "출력"' in css
    assert re.search(r"\.md-grid \{\s*max-width: 76rem", css)


def test_the_results_figures_are_part_of_the_site(site):
    for png in (ROOT / "benchmarks" / "results").glob("*.png"):
        assert (site / "assets" / "results" / png.name).read_bytes() == png.read_bytes()


def test_readme_links_lead_to_files_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert len(local) >= 10
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == []


def test_readme_stays_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 200


def search_docs(site: Path, language: str = "") -> list[dict]:
    return json.loads((site / language / "search" / "search_index.json").read_text("utf-8"))["docs"]


def test_each_language_searches_its_own_pages(site):
    english, korean = search_docs(site), search_docs(site, "ko")
    assert not [doc for doc in english if doc["location"].startswith("ko/")]
    titles = {doc["location"]: doc["title"] for doc in korean}
    # A Korean tutorial is found under its Korean title, not under its English one.
    assert titles["tutorials/06-beam-search/"] == "6. 빔 서치 직접 구현하고 aiayn과 비교하기"
    assert "6. Beam search, by hand and in aiayn" not in titles.values()
    # A page without a Korean version is searchable on the Korean site too (it serves it).
    assert "reference/cli/" in titles and (site / "ko" / "reference" / "cli").is_dir()
    # A Korean page's search box loads the Korean index: its base is the Korean site.
    html = (site / "ko" / "tutorials" / "06-beam-search" / "index.html").read_text("utf-8")
    config = json.loads(re.search(r'id="__config" type="application/json">(.*?)</script>',
                                  html, re.S).group(1))  # fmt: skip
    assert config["base"] == "../../../ko/"


def test_the_korean_site_says_which_pages_are_english_and_names_its_menus_in_korean(site):
    notice = "이 페이지는 영어로만 있습니다"
    assert notice in text_of(site / "ko" / "reference" / "recipe" / "index.html")
    assert notice in text_of(site / "ko" / "explanation" / "decoding-engine" / "index.html")
    assert notice not in text_of(site / "ko" / "explanation" / "efficient-attention" / "index.html")
    assert notice not in text_of(site / "ko" / "tutorials" / "06-beam-search" / "index.html")
    assert notice not in text_of(site / "reference" / "recipe" / "index.html")
    menu = text_of(site / "ko" / "index.html")
    for title in (
        "스케일드 닷-프로덕트 어텐션 직접 구현하기",
        "명령줄",
        "레시피 필드",
        "용어집",
        "속도",
    ):
        assert title in menu, title


def test_the_site_loads_nothing_from_other_hosts_and_renders_maths_with_its_own_katex(site):
    """Every script, stylesheet, image and font the built pages name is in the site
    (tests/browser/test_docs_browser.py checks what a browser actually loads)."""
    external = re.compile(
        r"""<(?:script|img|source|iframe)\b[^>]*\bsrc=["'](?:https?:)?//"""
        r"""|<link\b[^>]*\bhref=["'](?:https?:)?//|url\(["']?(?:https?:)?//"""
    )
    found = [
        f"{path.relative_to(site)}: {match.group(0)}"
        for path in [*site.rglob("*.html"), *site.rglob("*.css")]
        for match in external.finditer(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert found == []
    page = (site / "ko" / "tutorials" / "01-attention-by-hand" / "index.html").read_text("utf-8")
    assert 'class="arithmatex"' in page and "javascripts/katex/katex.min.js" in page
    assert (site / "javascripts" / "katex" / "fonts" / "KaTeX_Main-Regular.woff2").is_file()
