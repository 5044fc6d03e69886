"""Shared fixtures for the data tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from sword_fixture import MARKUP_EN, MARKUP_ES, chapter_verses, write_ztext_module


@pytest.fixture(scope="session")
def sword_root(tmp_path_factory) -> Path:
    """A SWORD data path with tiny English (WEB, KJV) and Spanish (RV1909) modules.

    Genesis has 50 chapters of 3 verses (so the chapter split has valid chapter 0
    and test chapter 48); Genesis 1:1-3 and John 3:16 carry real OSIS markup; a few
    verses are empty on one side.
    """
    root = tmp_path_factory.mktemp("sword")
    plain = chapter_verses(50, 3)
    english = {ref: en for ref, (en, _) in plain.items()}
    spanish = {ref: es for ref, (_, es) in plain.items()}
    english.update(MARKUP_EN)
    spanish.update(MARKUP_ES)
    english[("Genesis", 2, 3)] = '<div type="x-milestone" subType="x-preverse" sID="pv9"/>'
    spanish[("Genesis", 3, 1)] = ""
    write_ztext_module(root, "engWEB2015eb", "en", english)
    write_ztext_module(root, "engKJV2006eb", "en", english)
    write_ztext_module(root, "spaRV1909eb", "es", spanish)
    return root
