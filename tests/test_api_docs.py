"""docs/api.md is generated from the installed package (scripts/gen_api.py) and current:
a public signature, default or docstring that changes without the page fails here, with
the command that brings the page up to date."""

import inspect
import sys
from pathlib import Path

import stoker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gen_api  # noqa: E402


def test_the_api_page_is_current():
    page = gen_api.PAGE.read_text(encoding="utf-8")
    text = gen_api.generate()
    if page != text:
        import difflib

        diff = "\n".join(list(difflib.unified_diff(page.splitlines(), text.splitlines(),
                                                   "docs/api.md", "generated", lineterm="",
                                                   n=1))[:60])
        raise AssertionError(
            "docs/api.md is not current with the public API. Reinstall stoker "
            f"(pip install --no-build-isolation .), then run `{gen_api.COMMAND}`.\n{diff}")


def test_every_public_name_and_parameter_is_on_the_page():
    page = gen_api.PAGE.read_text(encoding="utf-8")
    for module, names in (("stoker", stoker.__all__), ("stoker.ops", stoker.ops.__all__)):
        for name in names:
            if name in gen_api.SKIP.get(module, ()):
                continue
            assert f"### {module}.{name}\n" in page, f"{module}.{name} is not on docs/api.md"
    assert "stoker.ops.RandomResizedCrop(size, scale=(0.08, 1.0), ratio=" in page
    loader = page.split("### stoker.Loader\n", 1)[1].split("\n### ", 1)[0]
    signature = loader.split("```text\n", 1)[1].split("\n\n", 1)[0]
    for p in inspect.signature(stoker.Loader.__init__).parameters.values():
        if p.name == "self":
            continue
        shown = p.name if p.default is p.empty else f"{p.name}={gen_api._default(p.default)}"
        shown = {p.VAR_KEYWORD: "**", p.VAR_POSITIONAL: "*"}.get(p.kind, "") + shown
        assert f"    {shown},\n" in signature, (shown, signature)


def test_a_changed_default_makes_the_page_stale(monkeypatch):
    """What the check is for: a default changed in the code and not on the page."""
    original = stoker.ops.RandomResizedCrop.__init__

    def changed(self, size, scale=(0.25, 1.0), ratio=(3 / 4, 4 / 3)):
        original(self, size, scale, ratio)

    changed.__doc__ = original.__doc__
    monkeypatch.setattr(stoker.ops.RandomResizedCrop, "__init__", changed)
    assert gen_api.generate() != gen_api.PAGE.read_text(encoding="utf-8")
    assert "scale=(0.25, 1.0)" in gen_api.generate()
