"""docs/benchmarks.md holds one section per benchmark (bench/sections.py): the run that rewrites
the rest of the file (``make bench``) keeps every other benchmark's section, as it stands."""

from __future__ import annotations

from pathlib import Path

from bench.sections import every_section, replace_section


def test_every_section_is_found_in_its_order_markers_included(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nthe warm path's tables\n")
    replace_section(doc, "swaps", "## Swap economics\n\n| a | b |")
    replace_section(doc, "host-cache", "## Swaps from RAM")
    replace_section(doc, "swaps", "## Swap economics, again")  # replaced where it stands

    found = every_section(doc)

    assert found == [
        "<!-- bench:swaps -->\n## Swap economics, again\n<!-- /bench:swaps -->",
        "<!-- bench:host-cache -->\n## Swaps from RAM\n<!-- /bench:host-cache -->",
    ]
    assert every_section(tmp_path / "none.md") == []
