"""The package's imports point one way, in the order docs/architecture.md writes: a folder
imports only the folders below it (and the top-level modules), and those only ``data/`` and
each other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "swapgate"
SHARED = {
    "errors",
    "metrics",
    "loop_metrics",
    "live_gauges",
    "tasks",
    "tracing",
}  # at the top of the package, used by all


def _written_order() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    line = re.search(r"\(`tools` → (.*?);", text, re.S)
    assert line, "docs/architecture.md no longer writes the folders' order"
    return ["tools", *re.findall(r"`(\w+)`", line.group(1))]


def _written_rooms() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    line = re.search(r"in this\s+order \((`loops` → .*?)\)", text, re.S)
    assert line, "docs/architecture.md no longer writes the control rooms' order"
    return re.findall(r"`(\w+)`", line.group(1))


def _imports(path: Path, depth: int = 1) -> set[str]:
    """The parts of ``swapgate`` that ``path`` imports, ``depth`` names down (1: the folders;
    2: below ``control``, its rooms)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        parts = [n.split(".") for n in names if n.startswith("swapgate.")]
        found.update(".".join(p[1 : depth + 1]) for p in parts if len(p) > depth)
    return found


def _home(path: Path) -> str:
    part = path.relative_to(PACKAGE).parts[0]
    return part.removesuffix(".py")


def test_every_import_points_down_the_written_order() -> None:
    order = _written_order()
    against = []
    for path in PACKAGE.rglob("*.py"):
        home = _home(path)
        if home in ("__init__", "__main__", "sim"):  # the simulator stands apart
            continue
        for other in _imports(path) - {home, "sim"}:
            if home in SHARED:
                allowed = other == "data" or other in SHARED
            else:
                assert home in order, f"{home}/ is not in docs/architecture.md's order"
                allowed = other in SHARED or order.index(other) > order.index(home)
            if not allowed:
                against.append(f"{path.relative_to(ROOT)} imports swapgate.{other}")
    assert against == []


def test_only_the_tools_start_the_simulator_or_the_testbed() -> None:
    for path in PACKAGE.rglob("*.py"):
        home = _home(path)
        if home not in ("tools", "sim"):
            assert "sim" not in _imports(path), path
        if home != "tools":
            assert "testbed" not in path.read_text(), path


def test_the_testbed_takes_only_the_os_primitives_from_the_package() -> None:
    """The engine demo (tools/) imports testbed/; testbed/ importing tools/ back would close
    a circle, so it takes what it needs from the lowest layer that has it."""
    taken = set()
    for path in (ROOT / "testbed").glob("*.py"):
        for line in path.read_text().splitlines():
            if line.startswith(("from swapgate", "import swapgate")):
                taken.add(line.split()[1])
    assert taken == {"swapgate.drivers.children"}


def test_the_control_rooms_import_down_their_written_order() -> None:
    rooms = _written_rooms()
    control = PACKAGE / "control"
    against = []
    for path in control.rglob("*.py"):
        parts = path.relative_to(control).parts
        if len(parts) == 1:
            continue  # control/__init__.py
        home = parts[0]
        assert home in rooms, f"control/{home}/ is not in docs/architecture.md's order"
        for other in _imports(path, depth=2):
            folder, _, room = other.partition(".")
            if folder != "control" or room in ("", home):
                continue
            if room not in rooms or rooms.index(room) < rooms.index(home):
                against.append(f"{path.relative_to(ROOT)} imports swapgate.{other}")
    assert against == []


def test_no_folder_holds_more_than_twelve_modules() -> None:
    crowded = {}
    for folder in [PACKAGE, *PACKAGE.rglob("*")]:
        if folder.is_dir() and folder.name != "__pycache__":
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > 12:
                crowded[str(folder.relative_to(ROOT))] = len(modules)
    assert crowded == {}


def test_no_class_has_more_than_twenty_methods() -> None:
    """A class past twenty methods does more than one job (docs/architecture.md): split it."""
    large = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [
                    b for b in node.body if isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                if len(methods) > 20:
                    large[f"{path.relative_to(ROOT)}:{node.name}"] = len(methods)
    assert large == {}


def test_no_function_is_longer_than_sixty_lines() -> None:
    """A function past sixty lines hides a concept that wants a name (docs/architecture.md)."""
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 60:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert long == {}


def _tabled_modules() -> set[str]:
    """The modules docs/architecture.md's "Modules" table names: a path, or a file name after
    a path in the same cell (a sibling), or a folder (``sim/``: all of it)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if "/" in name:
                folder = name.rsplit("/", 1)[0]
                named.add(name)
            elif name.endswith(".py"):
                named.add(f"{folder}/{name}" if folder else name)
    return named


def test_every_module_is_in_the_architecture_docs_modules_table() -> None:
    """A newcomer finds every file from docs/architecture.md alone: a module left out of its
    table is one nobody is told of."""
    named = _tabled_modules()
    folders = tuple(n for n in named if n.endswith("/"))
    missing = sorted(
        module
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
        if (module := str(path.relative_to(PACKAGE))) not in named
        and not module.startswith(folders)
    )
    assert missing == [], f"add them to docs/architecture.md's Modules table: {missing}"


def _module_graph() -> dict[str, set[str]]:
    """Every module of the package, testbed/ and bench/, and the modules of those it imports
    anywhere in it (at the top, in a function, or for type checking alone)."""
    modules = {}
    for base in ("swapgate", "testbed", "bench"):
        for path in (ROOT / base).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                named = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {other for other in named if other in modules and other != name}
    return graph


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _module_graph()
    circles = []
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            if name == start:
                circles.append(start)
                break
            if name not in seen:
                seen.add(name)
                todo.extend(graph[name])
    assert circles == []
