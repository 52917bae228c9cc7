"""Every file and section the package's code and the docs point to exists, and none points to
SPEC's sections: a module moved or a section renamed fails here, not in front of a reader."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "swapgate"
# The repository's own top folders: a path that starts with one is read from the root.
TOP = ("swapgate", "docs", "tests", "testbed", "bench")
# Paths in other projects, named where swapgate follows what they say.
ELSEWHERE = {"docs/features/sleep_mode.md"}  # vLLM's sleep mode
# A file's path: words, slashes and dashes ending in .py or .md, not inside a longer path or URL.
PATH = re.compile(r"(?<![\w/.-])(\w[\w/-]*\.(?:py|md))(?![\w/])")
# A section of a doc by its name: ``docs/operations.md, "Activity"`` (a comment may wrap it).
SECTION = re.compile(r'(docs/[\w-]+\.md),?\s+(?:#\s*)?"([^"]+)"')
# A SPEC section (§5, SPEC 4.2); ``metavar="SPEC"`` is a command line's placeholder, not one.
SPEC = re.compile(r"§|\bSPEC\b(?!\")")


def _folders() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}


def _sources() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"])


def _missing(path: Path, text: str, folders: set[str]) -> list[str]:
    """The paths ``text`` (the file ``path``) names that lead nowhere: one from a top folder is
    read from the root, one from a package folder (``control/…``) from ``swapgate/``; in code,
    a bare name (``steps.py``) is a module beside it, or a file at the root. Bare names in the
    docs are left alone: they name tests and other projects' files by their names."""
    missing = []
    for found in PATH.findall(text):
        first = found.split("/")[0]
        if found in ELSEWHERE:
            continue
        if first in TOP:
            places = [ROOT]
        elif "/" in found and first in folders:
            places = [PACKAGE]
        elif "/" not in found and path.suffix == ".py":
            places = [path.parent, ROOT]
        else:
            continue
        if not any((place / found).exists() for place in places):
            missing.append(found)
    return missing


def test_every_path_the_code_and_the_docs_name_exists() -> None:
    folders = _folders()
    gone = {}
    for path in _sources():
        missing = _missing(path, path.read_text(), folders)
        if missing:
            gone[str(path.relative_to(ROOT))] = missing
    assert gone == {}


def test_a_path_that_does_not_exist_is_found() -> None:
    """The check above can fail: a moved module, named each way, is caught."""
    folders = _folders()
    module = PACKAGE / "policy" / "retry.py"
    text = (
        "(``Attempts`` in swapgate/control/routing/attempts.py; docs/nowhere.md, "
        "control/memory/kv.py and, beside it, swaps.py) but swapgate/policy/retry.py, "
        "docs/architecture.md, backoff.py, README.md and vLLM's docs/features/sleep_mode.md are"
    )
    assert _missing(module, text, folders) == [
        "swapgate/control/routing/attempts.py",
        "docs/nowhere.md",
        "control/memory/kv.py",
        "swaps.py",
    ]


@cache
def _sections(doc: str) -> list[str]:
    """What a pointer may name in ``doc``: its headings, the bold words that lead a paragraph or
    an item, and the keys of its tables (``eviction``), in lower case without markup; nothing
    for a doc that does not exist (the paths' test names it)."""
    path = ROOT / doc
    if not path.exists():
        return []
    text = path.read_text()
    names = [
        *re.findall(r"^#+ (.*)$", text, re.M),
        *re.findall(r"\*\*([^*]+?)\*\*", text),
        *re.findall(r"^\| `([^`]+)` \|", text, re.M),
    ]
    return [re.sub(r"[`*]", "", name).lower() for name in names]


def _unnamed(text: str) -> list[str]:
    """The sections ``text`` points to that their doc does not have: a pointer names a section
    by its name's beginning ("Failover" for "Failover: one retry rule")."""
    unnamed = []
    for doc, section in SECTION.findall(text):
        name = re.sub(r"\s*\n\s*(#\s*)?", " ", section).lower().rstrip(".")
        if not any(known.startswith(name) for known in _sections(doc)):
            unnamed.append(f"{doc}, {section!r}")
    return unnamed


def test_every_section_the_code_and_the_docs_point_to_exists() -> None:
    gone = {}
    for path in _sources():
        unnamed = _unnamed(path.read_text())
        if unnamed:
            gone[str(path.relative_to(ROOT))] = unnamed
    assert gone == {}


def test_a_section_that_does_not_exist_is_found() -> None:
    text = """(docs/architecture.md, "Failover"; docs/kv-keep.md, "Files"; docs/operations.md,
    "The dashboard")
    # its rows (docs/operations.md, "Activity: every
    # request explains itself"; docs/configuration.md, "Gone"; docs/nowhere.md, "Here")"""
    assert _unnamed(text) == [
        "docs/kv-keep.md, 'Files'",
        "docs/configuration.md, 'Gone'",
        "docs/nowhere.md, 'Here'",
    ]


def test_no_code_or_doc_points_to_spec_sections() -> None:
    """Code comments point to the repository's docs, never to SPEC's sections."""
    cited = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if SPEC.search(line)
    ]
    assert cited == []
    assert SPEC.search("until its first body byte (§5)")
    assert SPEC.search("as SPEC 4.2 says")
    assert not SPEC.search('metavar="SPEC",')
