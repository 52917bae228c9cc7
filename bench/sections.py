"""docs/benchmarks.md holds one section per benchmark; each run replaces only its own."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, name: str, content: str) -> None:
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{content.strip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def section(path: Path, name: str) -> str:
    """The named section as it stands, markers included, or nothing."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = path.read_text() if path.exists() else ""
    if begin not in text or end not in text:
        return ""
    return begin + text.split(begin, 1)[1].split(end, 1)[0] + end
