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


# -- the docs cannot drift from the code ------------------------------------------------------
#
# What README.md, docs/*.md and the docstrings (docs/api.md is made of them) say about a
# parameter, its default or a behaviour is checked against the code here, for whatever
# parameters the signatures have today:
#   * every parameter of the classes users construct has an ``Args:`` entry in its
#     docstring, and every entry names a parameter;
#   * a default an entry states ("``"raise"`` (default)", "Default 0.2", "None, the
#     default") is the signature's;
#   * README's API summary shows each keyword at its default, and only real keywords;
#   * prose that gives `name=value` "(the default)", and docs/python.md's DataLoader
#     table, name parameters the code has, with the defaults it has;
#   * a DataLoader argument the docs say raises a TypeError does raise it, and the
#     attributes README says the loader answers are what it answers.

import ast  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

Field = stoker.Field
DOCUMENTED = {
    "stoker.Loader": stoker.Loader, "stoker.Dataset": stoker.Dataset,
    "stoker.ShardWriter": stoker.ShardWriter, "stoker.TokenDataset": stoker.TokenDataset,
    "stoker.Mix": stoker.Mix, "stoker.image": stoker.image, "stoker.scalar": stoker.scalar,
    "stoker.ndarray": stoker.ndarray, "stoker.tokens": stoker.tokens,
    "stoker.blob": stoker.blob, "stoker.boxes": stoker.boxes,
    "stoker.keypoints": stoker.keypoints, "stoker.video": stoker.video,
    "stoker.audio": stoker.audio, "stoker.RayService": stoker.RayService,
}
# each field type and the constructor users call, whose Args document it
FIELD_TYPES = {stoker.Image: stoker.image, stoker.Scalar: stoker.scalar,
               stoker.NDArray: stoker.ndarray, stoker.Tokens: stoker.tokens,
               stoker.Blob: stoker.blob, stoker.Boxes: stoker.boxes,
               stoker.KeyPoints: stoker.keypoints, stoker.Video: stoker.video,
               stoker.Audio: stoker.audio}
DOCS = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md")
                                     if p.name != "api.md")  # api.md: the docstrings


def _parameters(obj):
    """{name: inspect.Parameter} of a class's constructor or a function, self left out."""
    fn = obj.__init__ if inspect.isclass(obj) else obj
    return {n: p for n, p in inspect.signature(fn).parameters.items()
            if n not in ("self", "cls")}


def args_section(doc):
    """{name: text} of a Google-style ``Args:`` section; an entry ``a, b: ...`` documents
    both, ``**options: ...`` the keyword catch-all."""
    lines = inspect.cleandoc(doc or "").splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == "Args:")
    except StopIteration:
        return {}
    entries, indent, name = {}, None, None
    for ln in lines[start + 1:]:
        if not ln.strip():
            continue
        depth = len(ln) - len(ln.lstrip())
        if indent is None:
            indent = depth
        if depth < indent:
            break  # the section ended
        m = re.match(r"([\w*][\w*, ]*):(\s|$)", ln.strip()) if depth == indent else None
        if m:
            name = m.group(1)
            entries[name] = ln.strip()[m.end():]
        elif name is not None:
            entries[name] += " " + ln.strip()
    out = {}
    for names, text in entries.items():
        for n in names.split(","):
            out[n.strip().lstrip("*")] = text
    return out


_LITERAL = r"``[^`]+``|`[^`]+`|None|True|False|-?\d+(?:\.\d+)?(?:e-?\d+)?"
# "X (default", "X (the default", "X, the default", "default X", "Default: X",
# "defaults to X"; a literal followed by more of a phrase ("default 100 M",
# "default 0, 1, ...", "default 1/16 of RAM") is no claim of a value
_CLAIMS = [re.compile(rf"(?P<lit>{_LITERAL})\s*(?:\(\s*(?:the\s+)?|,\s*the\s+)default\b"),
           re.compile(rf"\b[Dd]efault(?:s to|:)?\s+(?P<lit>{_LITERAL})"
                      r"(?=\s*(?:[.;)]|$|:\s|,\s(?![\d.])|\s[-(]))")]


def default_claims(text):
    """The values a text states as a default, as Python values."""
    out = []
    for pattern in _CLAIMS:
        for m in pattern.finditer(" ".join(text.split())):
            try:
                out.append((m.group("lit"), ast.literal_eval(m.group("lit").strip("`"))))
            except (ValueError, SyntaxError):
                pass  # words, not a value
    return out


def _same(claimed, default):
    return claimed == default and isinstance(claimed, bool) == isinstance(default, bool) \
        and default is not inspect.Parameter.empty


def check_args(qualname, obj):
    """The problems of one docstring's Args against its signature, as lines."""
    params = _parameters(obj)
    entries = args_section(obj.__doc__)
    problems = [f"{qualname}: parameter {n!r} has no Args entry" for n in params
                if n not in entries]
    problems += [f"{qualname}: Args documents {n!r}, which is no parameter" for n in entries
                 if n not in params]
    for n, text in entries.items():
        if n in params:
            for shown, value in default_claims(text):
                if not _same(value, params[n].default):
                    problems.append(f"{qualname}: Args says {n}'s default is {shown}; the "
                                    f"signature's is {params[n].default!r}")
    return problems


@pytest.mark.parametrize("qualname", DOCUMENTED)
def test_every_parameter_has_an_args_entry_with_the_signatures_default(qualname):
    assert check_args(qualname, DOCUMENTED[qualname]) == []


@pytest.mark.parametrize("cls", FIELD_TYPES, ids=lambda c: c.__name__)
def test_each_field_type_takes_its_constructors_documented_parameters(cls):
    """A field type's parameters are its constructor's (``stoker.image`` for
    ``stoker.Image``), whose Args the test above checks."""
    function = FIELD_TYPES[cls]
    own = [] if cls.__init__ is Field.__init__ else \
        [(p.name, p.default) for p in _parameters(cls).values()]
    assert own == [(p.name, p.default) for p in _parameters(function).values()]


def test_the_checks_catch_drift(monkeypatch):
    """What the checks are for: a stale default, a parameter without an entry and an
    entry without a parameter each fail."""
    def fn(a, b="x", c=None):
        """Args:
            a: the first.
            b: ``"y"`` (default) or ``"z"``.
            d: gone.
        """
    assert sorted(check_args("fn", fn)) == [
        "fn: Args documents 'd', which is no parameter",
        "fn: Args says b's default is ``\"y\"``; the signature's is 'x'",
        "fn: parameter 'c' has no Args entry"]
    assert [v for _, v in default_claims("None (default) = tuned. Default 0.2. (default 0, "
                                         "1, ...), default 100 M, ``\"a\"``, the default")] \
        == [None, "a", 0.2]


# -- README's API summary ---------------------------------------------------------------------

def _readme_api_block():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## API\n", 1)[1]
    return section.split("```text\n", 1)[1].split("\n```", 1)[0]


def _calls(block):
    """(callee, [(keyword or None, source text of the value)]) of each call in the block,
    comments dropped, whatever lines it spans."""
    code = "\n".join(ln.split("#", 1)[0] for ln in block.splitlines())
    for m in re.finditer(r"([A-Za-z_][\w.]*)\(", code):
        depth, i = 1, m.end()
        while depth and i < len(code):
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        inner = code[m.end():i - 1]
        try:
            call = ast.parse(f"f({inner})", mode="eval").body
        except SyntaxError:
            continue
        yield m.group(1), [(k.arg, ast.get_source_segment(f"f({inner})", k.value))
                           for k in call.keywords]


RECEIVERS = {"ds": stoker.Dataset, "loader": stoker.Loader, "w": stoker.ShardWriter}


def _callee(name):
    head, *rest = name.split(".")
    obj = {"stoker": stoker, **RECEIVERS}.get(head)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj if rest and callable(obj) else None


def test_readme_api_summary_shows_each_keyword_at_its_default():
    """The summary says it shows "the names at a glance, with their defaults": each
    `name=value` of a call there is a parameter of the callee, at its default (``...`` and
    names stand for values of the reader's)."""
    checked, problems = 0, []
    for name, keywords in _calls(_readme_api_block()):
        callee = _callee(name)
        if callee is None:
            continue
        params = _parameters(callee)
        for kw, value in keywords:
            if kw is None:
                continue  # **kwargs
            if kw not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                problems.append(f"{name}({kw}=...): no such parameter")
                continue
            try:
                shown = ast.literal_eval(value)
            except ValueError:
                continue  # a name: the reader's value
            if shown is Ellipsis:
                continue
            checked += 1
            if kw in params and not _same(shown, params[kw].default):
                problems.append(f"{name}({kw}={value}): the default is "
                                f"{params[kw].default!r}")
    assert problems == [] and checked >= 30, (checked, problems)


# -- prose and tables ---------------------------------------------------------------------

def _public_callables():
    import stoker.convert
    import stoker.ops
    import stoker.remote

    out = dict(DOCUMENTED)
    for module in (stoker.ops, stoker.convert, stoker.remote):
        for n in module.__all__:
            obj = getattr(module, n)
            if callable(obj) and not (inspect.isclass(obj) and issubclass(obj, BaseException)):
                out[f"{module.__name__}.{n}"] = obj
    return out


def _prose(path):
    """A page's text outside its code blocks."""
    return re.sub(r"\n```.*?\n```", "\n", path.read_text(encoding="utf-8"), flags=re.S)


def test_the_defaults_the_pages_state_are_the_codes():
    """`name=value` (the default) in README.md and docs/*.md: a parameter of a public
    callable with that default."""
    defaults = {}
    for obj in _public_callables().values():
        try:
            for n, p in _parameters(obj).items():
                defaults.setdefault(n, []).append(p.default)
        except (TypeError, ValueError):
            pass
    chain = r"`\w+=[^`]+`(?:(?:,\s*|\s+and\s+|\s+or\s+)`\w+=[^`]+`)*"
    checked, problems = 0, []
    for page in DOCS:
        for m in re.finditer(rf"({chain})\s*\((?:the\s+)?defaults?\)", _prose(page)):
            for name, value in re.findall(r"`(\w+)=([^`]+)`", m.group(1)):
                checked += 1
                if name not in defaults:
                    problems.append(f"{page.name}: `{name}=`: no public callable has it")
                elif not any(_same(ast.literal_eval(value), d) for d in defaults[name]):
                    problems.append(f"{page.name}: `{name}={value}` (the default): the "
                                    f"code's is {' or '.join(map(repr, defaults[name]))}")
    assert problems == [] and checked >= 5, (checked, problems)


def test_the_dataloader_table_names_loaders_parameters_and_defaults():
    """docs/python.md's table of DataLoader's arguments: each is a parameter of
    DataLoader and of stoker.Loader, and a default it states is stoker.Loader's."""
    text = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    table = text.split("## From DataLoader to stoker, argument by argument", 1)[1]
    table = table.split("\n\n## ")[0]
    rows = re.findall(r"^\| `(\w+)(?:=([^`]+))?` \|([^|]*)\|(.*)\|$", table, flags=re.M)
    loader = _parameters(stoker.Loader)
    dataloader = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    assert [r[0] for r in rows] == [n for n in dataloader if n != "self"]
    for name, value, _, notes in rows:
        assert name in loader, name
        claims = ([ast.literal_eval(value)] if value else []) + \
            [v for _, v in default_claims(notes)]
        for claimed in claims:
            assert _same(claimed, loader[name].default), (name, claimed, loader[name].default)


# -- behaviours ---------------------------------------------------------------------------

def _sentences(text):
    """Sentences of a page's prose: paragraphs and table rows apart, then split at a full
    stop before a capital."""
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\|)", text):
        out += re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", " ".join(block.split()))
    return out


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    from conftest import write_dataset

    return write_dataset(tmp_path_factory.mktemp("api-docs") / "d", 8)


def test_dataloader_arguments_said_to_raise_typeerror_raise_it(small_dataset):
    """A page or docstring that says a DataLoader argument raises a TypeError: passing it
    (at DataLoader's own default) to stoker.Loader must raise one."""
    dataloader = {n: p.default for n, p in
                  inspect.signature(torch.utils.data.DataLoader.__init__).parameters.items()
                  if n not in ("self", "dataset")}
    texts = [(p.name, _prose(p)) for p in DOCS] + \
        [(q, o.__doc__ or "") for q, o in DOCUMENTED.items()]
    claims = 0
    for where, text in texts:
        for sentence in _sentences(text):
            if "TypeError" not in sentence or not re.search(r"\braises?\b|\bis a\b", sentence):
                continue
            for name in set(re.findall(r"`(\w+)`", sentence)) & set(dataloader):
                claims += 1
                try:
                    stoker.Loader(small_dataset, **{name: dataloader[name]}).close()
                except TypeError:
                    continue
                raise AssertionError(f"{where} says `{name}` raises a TypeError; stoker.Loader "
                                     f"accepts it: {sentence!r}")
    # and every DataLoader argument is one stoker.Loader takes
    assert set(dataloader) <= set(_parameters(stoker.Loader))


def test_the_attributes_readme_says_the_loader_answers(small_dataset):
    """README's sentence on the attributes a Loader answers: each `attr` given a value
    there (None, 0, False ...) is that value on a Loader made with the defaults."""
    sentence = next((s for s in _sentences(_prose(ROOT / "README.md"))
                     if "its attributes answer" in s), None)
    assert sentence, "README no longer says which attributes the loader answers"
    claims = re.findall(r"`(\w+)` (None|True|False|\d+)\b", sentence)
    with stoker.Loader(small_dataset) as loader:
        for attr, value in claims:
            assert getattr(loader, attr) == ast.literal_eval(value), (attr, value)
    given = re.findall(r"`(\w+)` the one given or None", sentence)
    assert len(claims) + len(given) >= 2, sentence
    # collate_fn: DataLoader's default over a torch dataset, None over a stoker dataset
    assert "`collate_fn` the one given, else DataLoader's default over a torch" in sentence
    with stoker.Loader(small_dataset) as loader:
        assert loader.collate_fn is None
    with stoker.Loader(torch.utils.data.TensorDataset(torch.arange(4))) as loader:
        assert loader.collate_fn is torch.utils.data.default_collate
    values = {"collate_fn": lambda samples: samples,
              "batch_sampler": torch.utils.data.BatchSampler(range(8), 3, False),
              "sampler": torch.utils.data.SequentialSampler(range(8)),
              "worker_init_fn": lambda worker: None}
    assert set(given) <= set(values), sentence
    for attr in given:
        with stoker.Loader(small_dataset) as loader:
            assert getattr(loader, attr) is None, attr
        # worker_init_fn runs in the Python stage's workers: map= makes one (NOTE [ No
        # argument ignored ] in stoker/_dropin.py)
        stage = {"map": lambda s, rng: s} if attr == "worker_init_fn" else {}
        with stoker.Loader(small_dataset, **{attr: values[attr]}, **stage) as loader:
            assert getattr(loader, attr) is values[attr], attr
