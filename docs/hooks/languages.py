"""A MkDocs hook: each language of the site searches its own pages, and a page that
falls back to English in the Korean site says so.

mkdocs-static-i18n builds the Korean site into `ko/` after the English one and leaves
ONE search index, `search/search_index.json`, that every page loads (with mkdocs-material
9.8 and mkdocs-static-i18n 1.3 it ends up holding the `ko/` pages only). This hook keeps
each build's own index (the search plugin's entries, one list per language) and writes
after the last build:

- `search/search_index.json`: the English site's pages;
- `ko/search/search_index.json`: the Korean site's pages, their `ko/` prefix dropped (a
  page without a Korean version is there too, as the English page `ko/` serves).

In both, the tutorials' entries are boosted (`TUTORIAL_BOOST`).

Material finds its index at `<base>/search/search_index.json`, `base` taken from the
page's `__config`; a Korean page's `base` is moved down into `ko/`, so its search box
loads the Korean index and its results link into `ko/`.

A page the Korean site serves from an English file (no `page.ko.md`) opens with a
notice in Korean (`FALLBACK_NOTICE`), above the English text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.plugins import event_priority

KOREAN = "ko"
FALLBACK_NOTICE = (
    '!!! info "이 페이지는 영어로만 있습니다"\n'
    "    아직 한국어로 옮기지 않은 페이지라 영어 원문을 보여 드립니다. 메뉴와 다른\n"
    "    페이지는 한국어로 이어집니다. 용어는 [용어집]({glossary})을 보세요.\n\n"
)
# The tutorials are a learner's path: a word they use finds them before the reference
# (Material's per-page `search: boost`, set here for every tutorial).
TUTORIAL_BOOST = 2.0
CONFIG = re.compile(r'(<script id="__config" type="application/json">)(.*?)(</script>)', re.S)


_INDEXES: dict[str, object] = {}  # language -> the search plugin's index of that build
_DOCS: dict[str, list[dict]] = {}  # language -> the entries its index is written with


def _language(config) -> str | None:
    """The language being built (mkdocs-static-i18n builds one after the other)."""
    plugin = config.plugins.get("i18n")
    return getattr(plugin, "current_language", None)


def _search(config):
    return config.plugins.get("material/search") or config.plugins.get("search")


@event_priority(-200)  # after the search plugin has indexed the page
def on_page_context(context, page, config, nav):
    search = _search(config)
    if search is not None and _language(config):
        _INDEXES[_language(config)] = search.search_index
    return context


def on_page_markdown(markdown, page, config, files):
    """Put the Korean notice on top of an English page served under /ko/."""
    if _language(config) != KOREAN or getattr(page.file, "locale", KOREAN) == KOREAN:
        return markdown
    depth = page.file.src_uri.count("/")
    glossary = "../" * depth + "reference/glossary.md"
    return FALLBACK_NOTICE.format(glossary=glossary) + markdown


def on_post_page(output, page, config):
    """A Korean page's search loads the Korean index: its `base` moves into ko/."""
    if _language(config) != KOREAN or not page.url.startswith(f"{KOREAN}/"):
        return output

    def moved(match: re.Match) -> str:
        app = json.loads(match.group(2))
        app["base"] = f"{app['base']}/{KOREAN}/"  # a folder: URLs resolve inside it
        return match.group(1) + json.dumps(app) + match.group(3)

    return CONFIG.sub(moved, output, count=1)


def language_docs(entries: list[dict], language: str) -> list[dict]:
    """The entries of one language's pages, their locations relative to its root
    (`ko/` dropped); the English site's are those outside `ko/`."""
    korean = [entry for entry in entries if entry["location"].startswith(f"{KOREAN}/")]
    if language != KOREAN:
        return [entry for entry in entries if not entry["location"].startswith(f"{KOREAN}/")]
    return [{**entry, "location": entry["location"][len(KOREAN) + 1 :]} for entry in korean]


def page_of(entry: dict) -> str:
    return entry["location"].split("#")[0]


def korean_site_docs(korean: list[dict], english: list[dict]) -> list[dict]:
    """The Korean pages, then the English pages that have no Korean version (the Korean
    site serves them at the same place)."""
    translated = {page_of(entry) for entry in korean}
    return korean + [entry for entry in english if page_of(entry) not in translated]


def on_pre_build(config):
    if _language(config) != KOREAN:  # the first build of `mkdocs build` or of a reload
        _INDEXES.clear()
        _DOCS.clear()


@event_priority(-200)  # after the search plugin and mkdocs-static-i18n (-100)
def on_post_build(config):
    """Write each language's index. Called at the end of the Korean build (both
    builds' entries whole: kept in `_DOCS`) and again at the very end, after
    mkdocs-static-i18n has written its merged index over the English one."""
    site = Path(config.site_dir)
    written = site / "search" / "search_index.json"
    if not written.is_file():
        return
    if not _DOCS and {"en", KOREAN} <= _INDEXES.keys():
        english = language_docs(_INDEXES["en"].entries, "en")
        _DOCS["en"] = english
        _DOCS[KOREAN] = korean_site_docs(language_docs(_INDEXES[KOREAN].entries, KOREAN), english)
    if not _DOCS:
        return
    search_config = json.loads(written.read_text(encoding="utf-8"))["config"]
    for docs in _DOCS.values():
        for entry in docs:
            if entry["location"].startswith("tutorials/"):
                entry.setdefault("boost", TUTORIAL_BOOST)
    for folder, docs in ((site, _DOCS["en"]), (site / KOREAN, _DOCS[KOREAN])):
        path = folder / "search" / "search_index.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": search_config, "docs": docs}), encoding="utf-8")
