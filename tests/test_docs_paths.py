"""Every ``flaudit.``-dotted path the docs cite names something a reader can import (#39 item 5).

The pages read are README.md, docs/*.md and the service's OpenAPI text (what ``/docs`` shows:
field and route descriptions). A path resolves when its longest importable prefix is a module
and the rest are attributes of it, as ``flaudit.auditor.claims.summarize`` is.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from flaudit.clients.record_flower import CONFIG_KEY, PLAN_KEY
from flaudit.service.app import create_app
from flaudit.service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]

#: A dotted ``flaudit`` name not inside a longer one (``sqlite:///.flaudit/...`` is no citation).
CITED = re.compile(r"(?<![\w.])flaudit(?:\.[A-Za-z_]\w*)+")

#: File names the docs mention that look like dotted paths (the database, the env file, the token).
FILE_NAMES = {"flaudit.db", "flaudit.env", "flaudit.token"}
#: Keys of a Flower Message's RecordDict the record-level audit uses (docs/flower.md).
MESSAGE_KEYS = {PLAN_KEY, CONFIG_KEY}


def resolves(path: str) -> bool:
    """Import the longest module prefix of ``path``; getattr the rest."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for name in parts[split:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def cited_paths(text: str) -> set[str]:
    return {m.group(0) for m in CITED.finditer(text)} - FILE_NAMES - MESSAGE_KEYS


def pages() -> dict[str, str]:
    out = {
        str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
        for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    }
    out["OpenAPI"] = json.dumps(create_app(Settings(start_runner=False)).openapi())
    return out


PAGES = pages()


def test_the_pages_cite_paths():
    # the scan finds what it is meant to find (else the test below would pass on nothing)
    assert "flaudit.auditor.claims.summarize" in cited_paths(PAGES["OpenAPI"])
    assert sum(len(cited_paths(text)) for text in PAGES.values()) > 20


def test_resolves_tells_real_paths_from_missing_ones():
    assert resolves("flaudit.auditor.claims.summarize")
    assert resolves("flaudit.auditor.claims.known_rounds.KnownRoundsStatistic.rounds")
    assert not resolves("flaudit.auditor.estimators.summarize")
    assert not resolves("flaudit.auditor.no_such_module.thing")


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_cited_flaudit_path_resolves(page):
    missing = sorted(path for path in cited_paths(PAGES[page]) if not resolves(path))
    assert not missing, f"{page} cites paths that do not import: {', '.join(missing)}"
