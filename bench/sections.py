"""docs/benchmarks.md holds one section per benchmark; each run replaces only its own."""

from __future__ import annotations

import re
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


_SECTION = re.compile(r"<!-- bench:([\w-]+) -->.*?<!-- /bench:\1 -->", re.S)


def every_section(path: Path) -> list[str]:
    """Every benchmark's section in the file, markers included, in their order: what a run
    that rewrites the rest of the file keeps."""
    text = path.read_text() if path.exists() else ""
    return [match[0] for match in _SECTION.finditer(text)]
