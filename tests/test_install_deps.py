"""scripts/install-deps.sh, run against stand-in tools on PATH: a compiler that finds the
headers listed in a file, package managers that record their arguments and add what they
install, and a Python whose missing build tools are listed in a file (one test runs the real
Python's check)."""

import importlib.metadata
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "install-deps.sh"
BASH = shutil.which("bash")
FFMPEG = ["libavformat/avformat.h", "libavcodec/avcodec.h", "libswscale/swscale.h",
          "libswresample/swresample.h"]
HEADERS = ["jpeglib.h", "png.h", "xxhash.h"] + FFMPEG
PACKAGES = {  # header -> package, per package manager
    "apt-get": {"jpeglib.h": "libjpeg-dev", "png.h": "libpng-dev", "xxhash.h": "libxxhash-dev",
                **{h: h.split("/")[0] + "-dev" for h in FFMPEG}},
    "dnf": {"jpeglib.h": "libjpeg-turbo-devel", "png.h": "libpng-devel",
            "xxhash.h": "xxhash-devel", **{h: "ffmpeg-free-devel" for h in FFMPEG}},
    "apk": {"jpeglib.h": "libjpeg-turbo-dev", "png.h": "libpng-dev", "xxhash.h": "xxhash-dev",
            **{h: "ffmpeg-dev" for h in FFMPEG}},
}

# A preprocessor that succeeds when the last #include of its input is in $FOUND.
FAKE_CC = """#!{bash}
header=$(grep -o '<[^>]*>' | tail -n 1 | tr -d '<>')
grep -qx "$header" "$FOUND"
"""
# A package manager: records its arguments; installing adds the headers of what it got.
FAKE_PM = """#!{bash}
echo "{name} $*" >> "$LOG"
echo "RAN {name} $*"
for arg in "$@"; do
  case "$arg" in
{cases}
  esac
done
"""
# python: `python -` prints the missing build tools ($PYMISSING); `-m pip install` records
# and installs them; `-c` prints a prefix.
FAKE_PYTHON = """#!{bash}
case "$1" in
  -) cat > /dev/null; cat "$PYMISSING" ;;
  -c) echo /fake/prefix ;;
  -m) shift 3; echo "pip install $*" >> "$LOG"; echo "RAN pip"; : > "$PYMISSING" ;;
esac
"""
FAKE_SUDO = """#!{bash}
echo "sudo $1" >> "$LOG"
[ "$1" = -n ] && shift
exec "$@"
"""


def fake_pm(name):
    provides = {}  # package -> the headers it installs (ffmpeg-dev: several)
    for header, pkg in PACKAGES["dnf" if name == "yum" else name].items():
        provides.setdefault(pkg, []).append(header)
    cases = "\n".join(f"    {pkg}) printf '%s\\n' {' '.join(hs)} >> \"$FOUND\" ;;"
                      for pkg, hs in provides.items())
    return FAKE_PM.replace("{name}", name).replace("{cases}", cases)


def tools(tmp_path, uid, found, pm="apt-get", with_sudo=False, py_missing=()):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"cc": FAKE_CC, "id": f"#!{{bash}}\necho {uid}\n", "python": FAKE_PYTHON}
    if pm:
        scripts[pm] = fake_pm(pm)
    if with_sudo:
        scripts["sudo"] = FAKE_SUDO
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text.replace("{bash}", BASH))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "found").write_text("".join(h + "\n" for h in found))
    (tmp_path / "pymissing").write_text("".join(p + "\n" for p in py_missing))
    # these come from the system; nothing else from it is on PATH
    for name in ("grep", "tr", "tail", "cat"):
        os.symlink(shutil.which(name), bin_dir / name)
    return {"PATH": str(bin_dir), "CC": "cc", "PYTHON": str(bin_dir / "python"),
            "FOUND": str(tmp_path / "found"), "PYMISSING": str(tmp_path / "pymissing"),
            "LOG": str(tmp_path / "log")}


def run(env, *args):
    r = subprocess.run([BASH, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)  # no terminal, as in CI
    log = Path(env["LOG"])
    return r, log.read_text().splitlines() if log.exists() else []


def installs(log):
    """The package lists of the install commands in the log, in order."""
    out = []
    for line in log:
        words = line.split()
        verb = next((v for v in ("install", "add") if v in words[1:]), None)
        if verb is not None:
            out.append([w for w in words[words.index(verb, 1) + 1:] if not w.startswith("-")])
    return out


pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def test_nothing_to_do_when_everything_is_there(tmp_path):
    r, log = run(tools(tmp_path, uid=1000, found=HEADERS))
    assert r.returncode == 0, r.stderr
    assert "headers found" in r.stdout and "found for" in r.stdout
    assert log == []  # no root needed, nothing installed, no apt-get update either


@pytest.mark.parametrize("found", [[], ["jpeglib.h"], ["png.h", "xxhash.h"],
                                   ["jpeglib.h", "xxhash.h"], ["jpeglib.h", "png.h", "xxhash.h"],
                                   ["jpeglib.h", "png.h", "xxhash.h", FFMPEG[0]]])
def test_installs_only_the_missing_packages(tmp_path, found):
    missing = [h for h in HEADERS if h not in found]
    r, log = run(tools(tmp_path, uid=0, found=found))
    assert r.returncode == 0, r.stderr
    want = list(dict.fromkeys(PACKAGES["apt-get"][h] for h in missing))
    assert installs(log) == [want]  # one install, of exactly these: nothing already there
    assert not any(line.startswith("sudo") for line in log)
    # says what it installs before doing it
    said = r.stdout.index(f"installing with apt-get: {' '.join(want)}")
    assert said < r.stdout.index("RAN apt-get")
    assert f"missing {' '.join(missing)}" in r.stdout


@pytest.mark.parametrize("pm", ["dnf", "yum", "apk"])
def test_other_package_managers_get_their_names(tmp_path, pm):
    r, log = run(tools(tmp_path, uid=0, found=["jpeglib.h", "xxhash.h"], pm=pm))
    assert r.returncode == 0, r.stderr
    names = PACKAGES["dnf" if pm == "yum" else pm]
    # FFmpeg's four headers come from one package there: named once
    assert installs(log) == [[names["png.h"], names[FFMPEG[0]]]]


def test_uses_sudo_when_not_root(tmp_path):
    r, log = run(tools(tmp_path, uid=1000, found=["png.h", *FFMPEG], with_sudo=True))
    assert r.returncode == 0, r.stderr
    # apt-get update and install, through sudo -n: without a terminal it must not wait
    # for a password
    assert log.count("sudo -n") == 2
    assert installs(log) == [["libjpeg-dev", "libxxhash-dev"]]


def test_installs_only_the_missing_python_build_tools(tmp_path):
    r, log = run(tools(tmp_path, uid=1000, found=HEADERS, py_missing=["pybind11>=2.12", "ninja"]))
    assert r.returncode == 0, r.stderr
    assert installs(log) == [["pybind11>=2.12", "ninja"]]
    assert r.stdout.index("installing into /fake/prefix: pybind11>=2.12 ninja") < \
        r.stdout.index("RAN pip")


def test_check_says_what_is_missing_and_installs_nothing(tmp_path):
    env = tools(tmp_path, uid=0, found=["png.h", *FFMPEG], py_missing=["cmake>=3.18"])
    r, log = run(env, "--check")
    assert r.returncode == 1 and log == []
    assert "would install with apt-get: libjpeg-dev libxxhash-dev" in r.stdout
    assert "would install into /fake/prefix: cmake>=3.18" in r.stdout
    (tmp_path / "found").write_text("".join(h + "\n" for h in HEADERS))
    (tmp_path / "pymissing").write_text("")
    r, log = run(env, "--check")
    assert r.returncode == 0 and log == [] and "nothing missing" in r.stdout


@pytest.mark.parametrize("cmake_version, cmake_missing", [("3.17.5", True), ("3.28.1", False)])
def test_real_python_check_of_the_build_tools(tmp_path, cmake_version, cmake_missing):
    env = tools(tmp_path, uid=1000, found=HEADERS)
    env["PYTHON"] = sys.executable
    for name, out in (("cmake", f"cmake version {cmake_version}"), ("ninja", "1.11.1")):
        path = tmp_path / "bin" / name
        path.write_text(f"#!{BASH}\necho '{out}'\n")
        path.chmod(0o755)
    r, log = run(env, "--check")
    want = []
    for name, low in (("scikit-build-core", (0, 10)), ("pybind11", (2, 12))):
        try:
            have = tuple(int(p) for p in re.findall(r"\d+", importlib.metadata.version(name))[:2])
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have is None or have < low:
            want.append(f"{name}>={low[0]}.{low[1]}")
    if cmake_missing:
        want.append("cmake>=3.18")
    assert log == [] and r.returncode == (1 if want else 0), r.stdout + r.stderr
    if want:
        assert f": {' '.join(want)}\n" in r.stdout
    else:
        assert "nothing missing" in r.stdout


def test_refuses_unknown_arguments(tmp_path):
    r, log = run(tools(tmp_path, uid=0, found=HEADERS), "--yes")
    assert r.returncode == 2 and "usage" in r.stderr and log == []


@pytest.mark.parametrize("uid, pm, message", [
    (1000, "apt-get", "not root and no sudo"),
    (0, None, "no known package manager"),
])
def test_clear_failures(tmp_path, uid, pm, message):
    r, log = run(tools(tmp_path, uid=uid, found=["png.h"], pm=pm))
    assert r.returncode == 1 and message in r.stderr and log == []


def test_fails_when_the_install_does_not_provide_the_headers(tmp_path):
    env = tools(tmp_path, uid=0, found=[])
    (tmp_path / "bin" / "apt-get").write_text(f"#!{BASH}\nexit 0\n")
    r, _ = run(env)
    assert r.returncode == 1 and "still not found" in r.stderr
