"""Writes docs/api.md, the API reference, from the installed stoker's docstrings.

    python scripts/gen_api.py            # rewrite docs/api.md
    python scripts/gen_api.py --check    # exit 1, with a diff, if docs/api.md is not current

It documents every name of ``stoker.__all__`` and of ``stoker.ops``, ``stoker.convert`` and
``stoker.remote`` (their ``__all__``): each class with its constructor's parameters and
defaults, its public methods and properties, and the docstrings as written. Signatures are
shown without type annotations (parameters, defaults, ``*``, ``**``), so the page reads the
same on every Python. tests/test_api_docs.py fails when the page differs from what this
script writes: after changing a public signature or docstring, reinstall stoker
(``pip install --no-build-isolation .``) and run this script.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"
COMMAND = "python scripts/gen_api.py"

# The sections of the page: (module, [(group title, names)]). The group whose list is empty
# takes the names of the module's __all__ that no group lists, so a new public name is never
# left out. stoker.remote documents what users call (its __all__ also lists the parts the
# loader uses).
GROUPS: Dict[str, List[Tuple[str, List[str]]]] = {
    "stoker": [
        ("Loading", ["Loader", "Dataset", "TokenDataset", "Mix"]),
        ("Writing", ["ShardWriter", "WriterLockError"]),
        ("Field types", ["image", "scalar", "ndarray", "tokens", "blob", "boxes", "keypoints",
                         "Field", "Image", "Scalar", "NDArray", "Tokens", "Blob", "Boxes",
                         "KeyPoints"]),
        ("Errors", ["Error", "DataError", "DecodeError", "CudaError"]),
        ("Other", []),
    ],
    "stoker.ops": [("Image ops", []), ("Batch ops", ["BatchOp", "MixUp", "CutMix"])],
    "stoker.convert": [("Converters", [])],
    "stoker.remote": [("Remote datasets", ["Retry", "RemoteError", "NoRoomError",
                                           "open_source"])],
}
ONLY_LISTED = {"stoker.remote"}
SKIP = {"stoker": {"__version__", "ops"}}  # a value that changes each release; a section

HEADER = f"""\
# API reference

Every public name of `stoker`, `stoker.ops` and `stoker.convert`, and what users call of
`stoker.remote`: parameters, their defaults and docstrings. This page is generated from
the installed package by `{COMMAND}`; the tests fail when it is not current (after
changing a public signature or docstring: `pip install --no-build-isolation .`, then
`{COMMAND}`). Guides with examples that run: [the README](../README.md),
[quickstart](quickstart.md), [troubleshooting](troubleshooting.md).
"""


def _public_names(module: Any) -> List[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    return [n for n in names if n not in SKIP.get(module.__name__, ())]


def _param(p: inspect.Parameter, names: Dict[int, str]) -> str:
    text = p.name
    if p.kind is p.VAR_POSITIONAL:
        text = "*" + text
    elif p.kind is p.VAR_KEYWORD:
        text = "**" + text
    if p.default is not p.empty:
        text += "=" + _default(p.default, names)
    return text


def _default(value: Any, names: Optional[Dict[int, str]] = None) -> str:
    if inspect.isclass(value) or inspect.isfunction(value):
        return f"{value.__module__}.{value.__qualname__}"
    text = repr(value)
    if " object at 0x" in text:  # a sentinel such as _UNSET = object(): its name, stably
        name = (names or {}).get(id(value))
        return f"<{name.strip('_').lower()}>" if name else f"<{type(value).__name__}>"
    return text


def signature(name: str, obj: Callable[..., Any], drop_self: bool = False) -> Optional[str]:
    """``name(a, b=1, *, c=None)`` without annotations, one parameter a line when long."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    func = getattr(obj, "__func__", obj)
    names = {id(v): k for k, v in getattr(func, "__globals__", {}).items()}
    if drop_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    parts: List[str] = []
    star = False
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            star = True
        parts.append(_param(p, names))
        nxt = params[i + 1] if i + 1 < len(params) else None
        if p.kind is p.POSITIONAL_ONLY and (nxt is None or nxt.kind is not p.POSITIONAL_ONLY):
            parts.append("/")
    one_line = f"{name}({', '.join(parts)})"
    if len(one_line) <= 92:
        return one_line
    return f"{name}(\n" + "".join(f"    {p},\n" for p in parts) + ")"


def _doc(obj: Any) -> str:
    doc = obj.__doc__ if isinstance(getattr(obj, "__doc__", None), str) else None
    return inspect.cleandoc(doc) if doc else ""


def _fence(text: str) -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text.rstrip()}\n{fence}\n"


def _own_members(cls: type) -> List[Tuple[str, Any]]:
    """The public methods and properties a class defines itself, in definition order; not
    those that only override a base's (documented with the base)."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_") or any(hasattr(b, name) for b in cls.__bases__):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property) or inspect.isfunction(value) or \
                inspect.isroutine(value):
            out.append((name, value))
    return out


def _is_exception(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, BaseException)


def document(qualname: str, obj: Any) -> str:
    """The Markdown of one public name: a heading, its signature and docstring, then (for
    a class) its own methods and properties."""
    out = [f"### {qualname}\n"]
    if inspect.isclass(obj):
        bases = [b for b in obj.__bases__ if b is not object]
        head = None if _is_exception(obj) else signature(qualname, obj.__init__, drop_self=True)
        if head is None:
            head = f"class {qualname}"
        if bases:
            head += "\n" + "bases: " + ", ".join(_base_name(b) for b in bases)
        doc = _doc(obj) if obj.__doc__ != (bases[0].__doc__ if bases else None) else ""
        out.append(_fence(head + ("\n\n" + doc if doc else "")))
        if _is_exception(obj):
            return "\n".join(out)
        for name, member in _own_members(obj):
            if isinstance(member, property):
                body = f"{qualname}.{name}  (property)"
                doc = _doc(member)
            else:
                body = signature(f"{qualname}.{name}", member, drop_self=True) or \
                    f"{qualname}.{name}(...)"
                doc = _doc(member)
            out.append(f"#### {qualname}.{name}\n")
            out.append(_fence(body + ("\n\n" + doc if doc else "")))
        return "\n".join(out)
    if callable(obj):
        head = signature(qualname, obj) or f"{qualname}(...)"
        doc = _doc(obj)
        out.append(_fence(head + ("\n\n" + doc if doc else "")))
        return "\n".join(out)
    out.append(_fence(f"{qualname} = {_default(obj)}"))
    return "\n".join(out)


def _base_name(cls: type) -> str:
    module = cls.__module__
    if module == "builtins":
        return cls.__qualname__
    if module.startswith("stoker"):  # by the name users import it under
        for public in ("stoker", "stoker.ops", "stoker.remote", "stoker.convert"):
            if getattr(importlib.import_module(public), cls.__name__, None) is cls:
                return f"{public}.{cls.__name__}"
    return f"{module}.{cls.__qualname__}"


class _Anchors:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes, and
    ``-1``, ``-2`` ... after a repeated one (``stoker.image`` and ``stoker.Image``)."""

    def __init__(self) -> None:
        self.seen: Dict[str, int] = {}

    def add(self, title: str) -> str:
        base = "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")
        n = self.seen.get(base, 0)
        self.seen[base] = n + 1
        return base if n == 0 else f"{base}-{n}"


def generate() -> str:
    anchors = _Anchors()
    anchors.add("API reference")
    plan = []  # (module name, module, [(group title, [names])])
    for module_name, groups in GROUPS.items():
        module = importlib.import_module(module_name)
        names = _public_names(module)
        listed = {n for _, group in groups for n in group}
        rest = [] if module_name in ONLY_LISTED else [n for n in names if n not in listed]
        catch_all = next((i for i, (_, g) in enumerate(groups) if not g), len(groups) - 1)
        resolved = []
        for i, (title, group) in enumerate(groups):
            members = [n for n in group if n in names] + (rest if i == catch_all else [])
            if members:
                resolved.append((title, members))
        plan.append((module_name, module, resolved))
    # every heading's anchor, in page order (the link lists come before the headings)
    section_anchor = {}
    name_anchor = {}
    for module_name, module, resolved in plan:
        section_anchor[module_name] = anchors.add(module_name)
        for _, members in resolved:
            for n in members:
                obj = getattr(module, n)
                name_anchor[module_name, n] = anchors.add(f"{module_name}.{n}")
                if inspect.isclass(obj) and not _is_exception(obj):
                    for m, _ in _own_members(obj):
                        anchors.add(f"{module_name}.{n}.{m}")
    sections = []
    for module_name, module, resolved in plan:
        body = [f"## {module_name}\n"]
        first = _doc(module).split("\n\n")[0]
        if first:
            body.append(" ".join(first.split()) + "\n")
        for title, members in resolved:
            body.append(f"**{title}:** " + ", ".join(
                f"[{n}](#{name_anchor[module_name, n]})" for n in members) + "\n")
        for _, members in resolved:
            for n in members:
                body.append(document(f"{module_name}.{n}", getattr(module, n)))
        sections.append("\n".join(body))
    contents = " · ".join(f"[{m}](#{section_anchor[m]})" for m, _, _ in plan)
    return HEADER + "\n" + contents + "\n\n" + "\n".join(sections)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="compare with docs/api.md instead of writing it; exit 1 if it differs")
    args = p.parse_args(argv)
    text = generate()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current == text:
            return 0
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(), "docs/api.md",
                                    "generated", lineterm="", n=1)
        sys.stdout.write("\n".join(list(diff)[:80]) + "\n")
        print(f"docs/api.md is not current: run `{COMMAND}`", file=sys.stderr)
        return 1
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
