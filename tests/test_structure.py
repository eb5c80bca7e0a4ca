"""The package's structure: the import graph of stoker's Python modules has no circle,
imports inside functions included, and none either once the imports for type checkers
(under `if TYPE_CHECKING:`) are counted; no module imports
another package's private (`_name`) names but the ones listed; and no source file is over
600 lines but the one documented kernel file."""

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "python" / "stoker"
# The one file allowed over 600 lines: the colour kernels, one function per op family
# with their SIMD variants side by side (csrc/README.md).
LONG_OK = {"csrc/augment/color_ops.cpp"}


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


# Type-only import circles that remain, each with why: a module here imports the other
# under TYPE_CHECKING only, for annotations. New ones fail the test; none remain.
TYPE_ONLY_KNOWN: dict = {}
# Private names imported across a package boundary that remain, each with why.
PRIVATE_KNOWN: dict = {}


def _imports(path: Path, name: str, type_only: bool = False) -> set:
    """stoker modules `path` imports, at any depth (function bodies too); with
    `type_only`, those imported for type checkers (under `if TYPE_CHECKING:`) too."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):  # names for type checkers only are no imports
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and \
                not type_only:
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("stoker")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("stoker"):
                continue
            for a in node.names:  # `from . import x` names a module when x is one
                sub = f"{mod}.{a.name}"
                out.add(sub if _exists(sub) else mod)
    return out


def _exists(module: str) -> bool:
    rel = Path(*module.split("."))
    return (PKG.parent / rel).with_suffix(".py").exists() or \
        (PKG.parent / rel / "__init__.py").exists()


def _private_imports(path: Path, name: str) -> set:
    """(module, name) of each private name `path` imports from another package."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")
            mod = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module
                                                                 else []))
        else:
            mod = node.module or ""
        if not mod.startswith("stoker") or not _exists(mod):
            continue
        owner = mod if (PKG.parent / Path(*mod.split(".")) / "__init__.py").exists() else \
            mod.rsplit(".", 1)[0]
        for a in node.names:
            private = a.name.startswith("_") and not a.name.startswith("__")
            module = _exists(f"{mod}.{a.name}") or a.name == "_core"  # (the extension)
            if private and not module and owner != package:
                out.add((mod, a.name))
    return out


def test_the_import_graph_has_no_circle():
    _no_circle(type_only=False, known={})


def test_no_type_only_import_circle_but_the_known_ones():
    _no_circle(type_only=True, known=TYPE_ONLY_KNOWN)
    for a, b in TYPE_ONLY_KNOWN:  # each known one is still there (else: remove it)
        path = _path(a)
        assert b in _imports(path, a, type_only=True) - _imports(path, a), (a, b)


def test_no_private_name_imported_across_packages_but_the_known_ones():
    found = set()
    for path in PKG.rglob("*.py"):
        found |= _private_imports(path, _module(path))
    assert found <= set(PRIVATE_KNOWN), sorted(found - set(PRIVATE_KNOWN))
    assert set(PRIVATE_KNOWN) <= found, sorted(set(PRIVATE_KNOWN) - found)  # stale entries


def _path(module: str) -> Path:
    rel = PKG.parent / Path(*module.split("."))
    return rel / "__init__.py" if (rel / "__init__.py").exists() else rel.with_suffix(".py")


def _no_circle(type_only: bool, known: dict) -> None:
    graph = {}
    for path in PKG.rglob("*.py"):
        name = _module(path)
        graph[name] = {m for m in _imports(path, name, type_only) if m != name and _exists(m)
                       and (name, m) not in known}
    # a package's __init__ importing its own submodules is how Python loads them, not a
    # circle of meaning: edges from a package to its children are left out
    for name in graph:
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


def test_no_source_file_is_over_600_lines():
    long = []
    for top in ("python/stoker", "csrc"):
        for dirpath, _, files in os.walk(ROOT / top):
            for f in files:
                if f.endswith((".py", ".cpp", ".h")):
                    path = Path(dirpath) / f
                    rel = str(path.relative_to(ROOT))
                    n = len(path.read_text().splitlines())
                    if n > 600 and rel not in LONG_OK:
                        long.append(f"{rel}: {n}")
    assert not long, long


def _kinds() -> set:
    """The kinds of dataset (``Source.kind`` of stoker/_sources/), read from their modules."""
    out = set()
    for path in (PKG / "_sources").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for st in node.body:
                    if isinstance(st, ast.Assign) and any(
                            isinstance(t, ast.Name) and t.id == "kind" for t in st.targets) \
                            and isinstance(st.value, ast.Constant) and st.value.value:
                        out.add(st.value.value)
    return out


def _strings(node: ast.AST) -> set:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e) for e in node.elts)) if node.elts else set()
    return set()


def test_no_module_outside_the_sources_branches_on_the_kind_of_dataset():
    """NOTE [ Sources ] in stoker/_sources/__init__.py: outside stoker/_sources/, nothing
    compares a plan's source (or a source's kind) to the name of a kind: what a branch
    needs to know is an attribute or a method of the source."""
    kinds = _kinds()
    assert {"records", "map-style", "iterable", "tokens", "mixture", "token mixture"} <= kinds
    found = []
    for path in PKG.rglob("*.py"):
        if (PKG / "_sources") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            named = any(isinstance(s, ast.Attribute) and s.attr in ("source", "kind")
                        for s in sides)
            if named and set().union(*(_strings(s) for s in sides)) & kinds:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found
