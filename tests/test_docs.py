"""Every code block of README.md and docs/*.md runs as a user would run it, and every link
between the pages leads somewhere.

Pages are found by name (README.md, docs/*.md), so a new page is tested without any change
here. A block is run by the kind its fence names:

* ```` ```python ````: saved as a file and run with ``python FILE`` (a subprocess, under a
  timeout) in a new empty folder;
* ```` ```bash ```` (or ``sh``): saved and run with ``bash -e FILE`` likewise, with this
  environment's ``python`` and ``stoker`` first on ``PATH``;
* ```` ```text ````: output, a layout or a command synopsis: never run;
* any other fence, or one without a name: an error (name what it is).

**Data.** A block makes the data it reads, or says in its first lines, visibly, what it
reads and the command that writes it, which is what the test runs first::

    # Reads data/train, a dataset of JPEGs: stoker example-data images data/train

(`stoker example-data KIND PATH ...`, python/stoker/example_data.py; a bash block simply
runs the command). Every block runs in an empty folder, so a block that reads data it
neither makes nor names fails here. README's blocks also run one after the other in one
folder, as a reader going down the page runs them, and so do the blocks of a page that has
`follows` steps.

An HTML comment right before the fence says how to run a block, in words after
``stoker-docs:`` (several comments, or several words in one, add up)::

    <!-- stoker-docs: reference: WHY -->        not run: an API that needs a service (an S3
                                                bucket, a cluster); WHY in words
    <!-- stoker-docs: continues -->             appended to the page's previous runnable
                                                block: the two run as one script
    <!-- stoker-docs: follows -->               a step that uses what the page's earlier
                                                blocks wrote (a walk-through, in any
                                                language): run only with them, in order
    <!-- stoker-docs: torchrun=N -->            run by torchrun with N processes on this host
    <!-- stoker-docs: gpu -->                   run only where torch sees a CUDA device
    <!-- stoker-docs: timeout=S -->             seconds allowed (default 180)
    <!-- stoker-docs: run-by tests/FILE.py -->  run by that test (which must name the page),
                                                e.g. under Lightning or accelerate

A comment is hidden on a rendered page, so a Python block that does not run as it is
(reference, run-by, gpu, torchrun) starts with a comment line that tells the reader what it
needs (a GPU, torchrun, a bucket), and every Python block parses.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

# each block a subprocess with its own timeout (pyproject: 120 s a test)
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
RUNNABLE = {"python": "py", "bash": "sh", "sh": "sh"}
DEFAULT_TIMEOUT = 180
_MARK = re.compile(r"^\s*<!--\s*stoker-docs:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
# `stoker example-data KIND PATH [KIND PATH ...]` in a comment; the pairs end at a
# character that is no part of a path (a backquote, a semicolon, a parenthesis)
_DATA_COMMAND = re.compile(r"stoker example-data((?:\s+[\w-]+\s+[\w./-]+)+)")


def pages() -> List[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


@dataclass
class Block:
    page: Path
    line: int                      # of the opening fence, 1-based
    lang: str
    code: str
    words: List[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def option(self, name: str) -> Optional[str]:
        for w in self.words:
            if w == name:
                return ""
            if w.startswith(name + "="):
                return w.split("=", 1)[1]
        return None

    @property
    def data_commands(self) -> List[List[str]]:
        """The `stoker example-data KIND PATH ...` commands that the leading comment lines
        of a Python block name, each whole on its line, as a reader copies it (a bash block
        runs its own)."""
        if self.lang != "python":
            return []
        return [["stoker", "example-data", *m.group(1).split()]
                for line in self.first_comment.split("\n")
                for m in _DATA_COMMAND.finditer(line)]

    @property
    def first_comment(self) -> str:
        """The leading comment lines of the code, one a line: what a reader sees first."""
        lines = []
        for line in self.code.splitlines():
            if not line.startswith("#"):
                break
            lines.append(line.lstrip("# ").strip())
        return "\n".join(lines)

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE and "reference" not in self.words and \
            self.run_by is None

    @property
    def run_by(self) -> Optional[str]:
        if "run-by" in self.words:
            i = self.words.index("run-by")
            return self.words[i + 1] if i + 1 < len(self.words) else ""
        return None


def blocks(page: Path) -> List[Block]:
    """The fenced blocks of a page, with the stoker-docs words of the comments right
    before each; a block marked `continues` is joined to the page's previous runnable one."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: List[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3)
        j = i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(fence)}\s*$", lines[j]):
            j += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:j]]
        words: List[str] = []
        k = i - 1
        while k >= 0 and _MARK.match(lines[k]):
            text = _MARK.match(lines[k]).group(1)
            if text.startswith("reference:"):  # "reference: why", the reason in words
                text = "reference " + text[len("reference:"):]
            words = text.split() + words
            k -= 1
        out.append(Block(page, i + 1, lang, "\n".join(body) + "\n", words))
        i = j + 1
    joined: List[Block] = []
    for b in out:
        if "continues" in b.words:
            prev = next((p for p in reversed(joined) if p.runnable), None)
            assert prev is not None, f"{b.where}: 'continues', but no runnable block before"
            assert prev.lang == b.lang, f"{b.where}: continues a {prev.lang} block"
            prev.code += "\n" + b.code
            prev.words += [w for w in b.words if w != "continues"]
            continue
        joined.append(b)
    return joined


ALL = [b for p in pages() for b in blocks(p)]


def _word_problems(b: Block) -> List[str]:
    if "reference" in b.words:  # the words after it say why
        return [] if b.words[-1] != "reference" else [f"{b.where}: say why after reference:"]
    problems, words, i = [], b.words, 0
    while i < len(words):
        w = words[i]
        if w == "needs":
            problems.append(f"{b.where}: 'needs' is hidden on the page: name the data and "
                            "its `stoker example-data KIND PATH` in the block's first line")
            i += 1
            continue
        if w == "run-by":
            i += 2
            continue
        if w not in ("continues", "follows", "gpu") and \
                w.split("=", 1)[0] not in ("torchrun", "timeout"):
            problems.append(f"{b.where}: unknown stoker-docs word {w!r}")
        i += 1
    return problems


def test_every_block_is_run_or_marked():
    """Nothing is skipped unless the page says why: each block is runnable, output
    (```text), or marked reference / run-by; every word of a marker is known."""
    from stoker.example_data import KINDS

    problems = []
    for b in ALL:
        if b.lang not in RUNNABLE and b.lang != "text":
            problems.append(f"{b.where}: fence {b.lang or '(none)'!r}: name it python, bash or "
                            "text (output, layouts, synopses)")
        problems += _word_problems(b)
        for command in b.data_commands:
            kinds = command[2::2]
            if len(command) % 2 or any(k not in KINDS for k in kinds):
                problems.append(f"{b.where}: {' '.join(command)}: not KIND PATH pairs of "
                                f"the kinds {', '.join(KINDS)}")
        if b.run_by is not None:
            test = ROOT / b.run_by
            if not test.is_file() or b.page.name not in test.read_text():
                problems.append(f"{b.where}: run-by {b.run_by!r} is not a test that names "
                                f"{b.page.name}")
    assert problems == [], "\n".join(problems)
    assert sum(b.runnable for b in ALL) >= 10  # the finder finds the blocks


# What the first comment of a block that does not run as it is must mention, by marker.
_VISIBLE = {"gpu": ("GPU", "CUDA"), "torchrun": ("torchrun",)}


def test_what_a_block_needs_is_visible():
    """The markers are hidden on a rendered page: a Python block that does not run as it
    is (reference, run-by, gpu, torchrun) starts with a comment saying what it needs, and
    one for a GPU or torchrun says so by name."""
    problems = []
    for b in ALL:
        if b.lang != "python":
            continue
        marked = [w for w in ("reference", "gpu") if w in b.words]
        marked += ["run-by"] if b.run_by is not None else []
        marked += ["torchrun"] if b.option("torchrun") is not None else []
        if not marked:
            continue
        note = b.first_comment
        if not note:
            problems.append(f"{b.where}: {', '.join(marked)}: start the block with a comment "
                            "that says what it needs to run")
            continue
        for w in marked:
            if w in _VISIBLE and not any(k.lower() in note.lower() for k in _VISIBLE[w]):
                problems.append(f"{b.where}: {w}: its first comment should say so "
                                f"({' or '.join(_VISIBLE[w])}): {note[:80]!r}")
    assert problems == [], "\n".join(problems)


def test_python_blocks_parse():
    """Every ```python block is Python (a signature list or a fragment is ```text)."""
    problems = []
    for b in ALL:
        if b.lang == "python":
            try:
                compile(b.code, b.where, "exec")
            except SyntaxError as e:
                problems.append(f"{b.where}: line {e.lineno}: {e.msg}")
    assert problems == [], "\n".join(problems)


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)  # the installed stoker, as a user has it
    return env


@functools.lru_cache(maxsize=None)
def _cuda() -> bool:
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                       capture_output=True, text=True, timeout=120)
    return r.stdout.strip() == "True"


RUN = [b for b in ALL if b.runnable]
ALONE = [b for b in RUN if "follows" not in b.words]
# Pages read top to bottom: their blocks also run one after the other in one folder.
IN_ORDER = sorted({b.page for b in RUN if "follows" in b.words} | {ROOT / "README.md"})


def _run(cmd: List[str], cwd: Path, timeout: float, what: str) -> None:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                           timeout=timeout, env=_env(), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-3000:]
        err = (e.stderr or b"")[-3000:]
        pytest.fail(f"{what}: `{shlex.join(cmd)}` did not finish in {timeout:g} s\n"
                    f"stdout: {out!r}\nstderr: {err!r}")
    assert r.returncode == 0, (f"{what}: `{shlex.join(cmd)}` exited {r.returncode}\n"
                               f"--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-5000:]}")


def run_block(block: Block, folder: Path) -> None:
    """Runs the example-data commands the block names, then the block, in `folder`."""
    for command in block.data_commands:
        _run(command, folder, 120, block.where)
    ext = RUNNABLE[block.lang]
    script = folder / f"{block.page.stem}_{block.line}.{ext}"
    script.write_text(block.code, encoding="utf-8")
    if ext == "sh":
        cmd = ["bash", "-e", script.name]
    elif block.option("torchrun") is not None:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={block.option('torchrun') or 2}", script.name]
    else:
        cmd = [sys.executable, script.name]
    _run(cmd, folder, float(block.option("timeout") or DEFAULT_TIMEOUT), block.where)


@pytest.mark.parametrize("block", ALONE, ids=[b.where for b in ALONE])
def test_block_runs(block, tmp_path):
    if block.option("gpu") is not None and not _cuda():
        pytest.skip("a GPU block: runs where torch sees a CUDA device")
    run_block(block, tmp_path)


@pytest.mark.parametrize("page", IN_ORDER, ids=[p.name for p in IN_ORDER])
def test_page_runs_in_order(page, tmp_path):
    """A reader going down the page runs its blocks one after the other in one folder: no
    block may step on the data of another, and a `follows` step finds what it needs."""
    blocks_in_order = [b for b in RUN if b.page == page and
                       (b.option("gpu") is None or _cuda())]
    assert len(blocks_in_order) >= 3
    for b in blocks_in_order:
        run_block(b, tmp_path)


# -- links ----------------------------------------------------------------------------------

_LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")
_PATH_REF = re.compile(r"`([\w./-]+\.md)`")


def _anchors(page: Path) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes, and a
    repeated one numbered (``-1``, ``-2``...). Headings inside code blocks are none."""
    out: Dict[str, int] = {}
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            in_code = not in_code
        m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            text = re.sub(r"[`*]", "", m.group(1)).strip().lower()
            base = re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))
            n = out.get(base, 0)
            out[base] = n + 1
            if n:
                out[f"{base}-{n}"] = 1
    return set(out)


def _links():
    for page in pages():
        text = page.read_text(encoding="utf-8")
        in_code = False
        for n, line in enumerate(text.splitlines(), 1):
            if _FENCE.match(line):
                in_code = not in_code
            if in_code:
                continue
            for m in _LINK.finditer(line):
                yield page, n, m.group(2)


def test_links_lead_somewhere():
    """Every relative link of the pages names a file that exists, and a #heading that
    exists in it."""
    bad = []
    count = 0
    for page, n, target in _links():
        if re.match(r"^[a-z]+:", target):
            continue  # https://..., mailto:
        count += 1
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{page.relative_to(ROOT)}:{n}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{page.relative_to(ROOT)}:{n}: {target}: no heading #{anchor} in "
                       f"{dest.name}")
    assert bad == [], "\n".join(bad)
    assert count >= 10  # the pages do link to each other


def test_references_to_other_pages_are_links():
    """A page named in running text is a link a reader can follow, not a path in
    backquotes."""
    bad = []
    for page in pages():
        in_code = False
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if _FENCE.match(line):
                in_code = not in_code
            if in_code:
                continue
            unlinked = _LINK.sub("", line)
            for m in _PATH_REF.finditer(unlinked):
                bad.append(f"{page.relative_to(ROOT)}:{n}: `{m.group(1)}`")
    assert bad == [], "make these Markdown links:\n" + "\n".join(bad)


def test_ci_runs_the_readme_test_command():
    """.ci/run and scripts/test-fast.sh run the README's test command as written."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("Run the tests:", 1)[1]
    command = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).strip()
    assert command in (ROOT / ".ci" / "run").read_text()
    pytest_part = command.split("&&")[-1].strip()
    assert pytest_part.startswith("python -m pytest")
    assert pytest_part in (ROOT / "scripts" / "test-fast.sh").read_text()
