"""The package's modules import one way, in the layer order docs/architecture.md ("Layers") states, and without
circles: a module imports only modules of its own layer or of lower ones, and no module reaches itself through its
imports. Imports inside functions count; so do the Python-level imports of the Cython modules and their includes.

Each failure names the importing file and line. The checks run on a synthetic package too, so they are known to
catch what they are meant to catch.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

# the docs are not in a wheel: a check of the checkout
pytestmark = pytest.mark.lint

ROOT = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or Path(__file__).resolve().parents[1])
PACKAGE = "spockwire"


@dataclass(frozen=True)
class Import:
    """`importer` imports `target` (both dotted module names) at `where` ("file:line")."""

    importer: str
    target: str
    where: str


def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py and .pyx module under `package_dir` (a package's name -> its
    __init__.py)."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")) + sorted(package_dir.rglob("*.pyx")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


_CYTHON_FROM = re.compile(r"^\s*from\s+(\.*[\w.]*)\s+import\s+\(?\s*([\w\s,]+)")
_CYTHON_IMPORT = re.compile(r"^\s*import\s+([\w.]+)")
_CYTHON_INCLUDE = re.compile(r'^include\s+"([^"]+)"')


def _statements(path: Path) -> list[tuple[int, str, int, list[str], Path]]:
    """(line, module, relative level, names, file) of every import statement of a module's file; a Cython module's
    includes are read as part of it."""
    if path.suffix == ".py":
        out = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out += [(node.lineno, alias.name, 0, [], path) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                out.append((node.lineno, node.module or "", node.level, [a.name for a in node.names], path))
        return out
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if m := _CYTHON_INCLUDE.match(line):
            out += _statements(path.parent / m.group(1))
        elif m := _CYTHON_FROM.match(line):
            dots = len(m.group(1)) - len(m.group(1).lstrip("."))
            names = [n.strip() for n in m.group(2).split(",") if n.strip()]
            out.append((number, m.group(1)[dots:], dots, names, path))
        elif m := _CYTHON_IMPORT.match(line):
            out.append((number, m.group(1), 0, [], path))
    return out


def package_imports(package_dir: Path) -> tuple[dict[str, Path], list[Import]]:
    """The modules of a package and every import of one of them by another."""
    files = module_files(package_dir)
    root = package_dir.parent

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    imports = []
    for module, path in files.items():
        base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for line, name, level, names, file in _statements(path):
            if level:
                name = ".".join(base[:len(base) - level + 1] + ([name] if name else []))
            if name.split(".")[0] != package_dir.name:
                continue
            targets = {known(f"{name}.{n}") if f"{name}.{n}" in files else known(name) for n in names} or {known(name)}
            where = f"{file.relative_to(root)}:{line}"
            imports += [Import(module, t, where) for t in sorted(targets) if t and t != module]
    return files, imports


def read_layers(doc: Path, package: str = PACKAGE) -> list[tuple[str, ...]]:
    """The layers of the "## Layers" section of `doc`, lowest first: each a tuple of dotted names (a package covers
    its modules; the package itself, `spockwire`, only its __init__)."""
    text = doc.read_text()
    section = re.search(r"^## Layers\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, f"{doc} has no '## Layers' section"
    layers = []
    for line in section.group(1).splitlines():
        if m := re.match(r"^\d+\.\s+((?:`[\w.]+`(?:,\s*)?)+)", line):
            names = re.findall(r"`([\w.]+)`", m.group(1))
            layers.append(tuple(package if n == package else f"{package}.{n}" for n in names))
    assert layers, f"the '## Layers' section of {doc} lists no layers"
    return layers


def layer_of(module: str, layers: list[tuple[str, ...]], package: str) -> int | None:
    best = None
    for index, names in enumerate(layers):
        for name in names:
            if module == name or (name != package and module.startswith(name + ".")):
                if best is None or len(name) > best[1]:
                    best = (index, len(name))
    return None if best is None else best[0]


def layer_problems(files: dict[str, Path], imports: list[Import], layers: list[tuple[str, ...]],
                   package: str) -> list[str]:
    """A sentence for every module outside the layers and every import of a higher layer's module."""
    problems = [f"{module} ({path.name}) is in no layer of the order" for module, path in sorted(files.items())
                if layer_of(module, layers, package) is None]
    for imp in imports:
        low, high = layer_of(imp.importer, layers, package), layer_of(imp.target, layers, package)
        if low is not None and high is not None and high > low:
            problems.append(f"{imp.where}: {imp.importer} (layer {low + 1}: {', '.join(layers[low])}) imports "
                            f"{imp.target} (layer {high + 1}: {', '.join(layers[high])}), a higher layer")
    return problems


def import_cycles(imports: list[Import]) -> list[str]:
    """One sentence per circle of modules importing each other (each strongly connected group of the import
    graph), naming every import along one circle through it."""
    graph: dict[str, dict[str, str]] = {}
    for imp in imports:
        graph.setdefault(imp.importer, {}).setdefault(imp.target, imp.where)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:   # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    sentences = []
    for group in groups:
        members = set(group)
        start = min(group)
        # the shortest way back to `start` inside the group (breadth first)
        paths = {start: [start]}
        queue = [start]
        circle = None
        while queue and circle is None:
            node = queue.pop(0)
            for nxt in sorted(graph.get(node, {})):
                if nxt == start:
                    circle = paths[node] + [start]
                    break
                if nxt in members and nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
        steps = [f"{a} ({graph[a][b]})" for a, b in zip(circle, circle[1:])]
        sentences.append("import circle: " + " -> ".join(steps) + f" -> {start}")
    return sorted(sentences)


@pytest.fixture(scope="module")
def spockwire_imports():
    return package_imports(ROOT / PACKAGE)


def test_no_import_runs_up_the_layers(spockwire_imports):
    files, imports = spockwire_imports
    layers = read_layers(ROOT / "docs" / "architecture.md")
    problems = layer_problems(files, imports, layers, PACKAGE)
    assert not problems, "\n".join(problems)


def test_no_import_circles(spockwire_imports):
    _files, imports = spockwire_imports
    assert import_cycles(imports) == []


# --- the checks themselves, on a synthetic package ------------------------------------------------------------

SYNTHETIC = {
    "__init__.py": "from .top import main\n",
    "base.py": "X = 1\n",
    "mid/__init__.py": "",
    "mid/parse.py": "from ..base import X\n",
    "mid/_fast.pyx": 'from libc.stdint cimport int64_t\nfrom ..base import X\ninclude "_part.pxi"\n',
    "mid/_part.pxi": "from .parse import X as Y\n",
    "top.py": "import pkg.mid.parse\n\n\ndef main():\n    from . import base\n",
}
SYNTHETIC_DOC = "# x\n\n## Layers\n1. `base`\n2. `mid`\n3. `top`, `pkg`\n\n## Next\n1. `nothing`\n"


def _write(tmp_path: Path, changes: dict[str, str]) -> Path:
    for name, text in {**SYNTHETIC, **changes}.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "doc.md").write_text(SYNTHETIC_DOC)
    return tmp_path


@pytest.mark.parametrize("changes, layer_problem, circle", [
    ({}, None, None),
    # a relative import inside a function, up one layer (and so a circle)
    ({"base.py": "X = 1\n\n\ndef f():\n    from .mid import parse\n"},
     "pkg/base.py:5: pkg.base (layer 1: pkg.base) imports pkg.mid.parse (layer 2: pkg.mid), a higher layer",
     "import circle: pkg.base (pkg/base.py:5) -> pkg.mid.parse (pkg/mid/parse.py:1) -> pkg.base"),
    # an absolute import of the package itself from a lower layer, and a circle through three modules
    ({"mid/parse.py": "from ..base import X\nimport pkg\n"},
     "pkg/mid/parse.py:2: pkg.mid.parse (layer 2: pkg.mid) imports pkg (layer 3: pkg.top, pkg), a higher layer",
     "import circle: pkg (pkg/__init__.py:1) -> pkg.top (pkg/top.py:1) -> pkg.mid.parse (pkg/mid/parse.py:2) -> pkg"),
    # a Cython include importing up, and two modules of one layer importing each other
    ({"mid/_part.pxi": "from ..top import main\n", "base.py": "from . import extra\n",
      "extra.py": "from .base import *\n"},
     "pkg/mid/_part.pxi:1: pkg.mid._fast (layer 2: pkg.mid) imports pkg.top (layer 3: pkg.top, pkg), a higher layer",
     "import circle: pkg.base (pkg/base.py:1) -> pkg.extra (pkg/extra.py:1) -> pkg.base"),
], ids=["clean", "function-level", "package-and-circle", "include-and-pair"])
def test_the_checks_catch_what_they_should(tmp_path, changes, layer_problem, circle):
    root = _write(tmp_path, changes)
    files, imports = package_imports(root / "pkg")
    layers = read_layers(root / "doc.md", "pkg")
    assert layers == [("pkg.base",), ("pkg.mid",), ("pkg.top", "pkg")]
    problems = layer_problems(files, imports, layers, "pkg")
    if "extra.py" in changes:
        assert "pkg.extra (extra.py) is in no layer of the order" in problems
        problems.remove("pkg.extra (extra.py) is in no layer of the order")
    assert problems == ([layer_problem] if layer_problem else [])
    assert import_cycles(imports) == ([circle] if circle else [])
