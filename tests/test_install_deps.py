"""scripts/install-deps.sh, run against stand-in tools on PATH: a compiler that finds the
headers listed in a file, and a package manager that records its arguments and adds them."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "install-deps.sh"
BASH = shutil.which("bash")

# A preprocessor that succeeds when the last #include of its input is in $FOUND.
FAKE_CC = """#!{bash}
header=$(grep -o '<[^>]*>' | tail -n 1 | tr -d '<>')
grep -qx "$header" "$FOUND"
"""
# apt-get: records its arguments; `install` makes every header present.
FAKE_APT = """#!{bash}
echo "apt-get $*" >> "$LOG"
if [[ " $* " == *" install "* ]]; then
  printf 'jpeglib.h\\npng.h\\nxxhash.h\\n' > "$FOUND"
fi
"""
FAKE_SUDO = """#!{bash}
echo "sudo $1" >> "$LOG"
[ "$1" = -n ] && shift
exec "$@"
"""


def tools(tmp_path, uid, found, with_apt=True, with_sudo=False):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"cc": FAKE_CC, "id": f"#!{{bash}}\necho {uid}\n"}
    if with_apt:
        scripts["apt-get"] = FAKE_APT
    if with_sudo:
        scripts["sudo"] = FAKE_SUDO
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text.format(bash=BASH))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "found").write_text("".join(h + "\n" for h in found))
    # grep, tr and tail come from the system; nothing else from it is on PATH
    for name in ("grep", "tr", "tail"):
        os.symlink(shutil.which(name), bin_dir / name)
    env = {"PATH": str(bin_dir), "CC": "cc", "FOUND": str(tmp_path / "found"),
           "LOG": str(tmp_path / "log")}
    return env


def run(env):
    r = subprocess.run([BASH, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)  # no terminal, as in CI
    log = Path(env["LOG"])
    return r, log.read_text().splitlines() if log.exists() else []


pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def test_nothing_to_do_when_every_header_is_found(tmp_path):
    env = tools(tmp_path, uid=1000, found=["jpeglib.h", "png.h", "xxhash.h"])
    r, log = run(env)
    assert r.returncode == 0, r.stderr
    assert "nothing to do" in r.stdout and log == []  # no root needed, nothing installed


def test_installs_what_is_missing_as_root(tmp_path):
    env = tools(tmp_path, uid=0, found=["jpeglib.h"])
    r, log = run(env)
    assert r.returncode == 0, r.stderr
    assert "missing png.h xxhash.h" in r.stdout
    install = [line for line in log if " install " in f" {line} "]
    assert len(install) == 1 and not any(line.startswith("sudo") for line in log)
    assert all(p in install[0].split() for p in ("libjpeg-dev", "libpng-dev", "libxxhash-dev"))


def test_uses_sudo_when_not_root(tmp_path):
    env = tools(tmp_path, uid=1000, found=[], with_sudo=True)
    r, log = run(env)
    assert r.returncode == 0, r.stderr
    # apt-get update and install, through sudo -n: without a terminal it must not wait
    # for a password
    assert log.count("sudo -n") == 2


@pytest.mark.parametrize("uid, with_apt, message", [
    (1000, True, "not root and no sudo"),
    (0, False, "no known package manager"),
])
def test_clear_failures(tmp_path, uid, with_apt, message):
    r, _ = run(tools(tmp_path, uid=uid, found=["png.h"], with_apt=with_apt))
    assert r.returncode == 1 and message in r.stderr


def test_fails_when_the_install_does_not_provide_the_headers(tmp_path):
    env = tools(tmp_path, uid=0, found=[])
    (tmp_path / "bin" / "apt-get").write_text(f"#!{BASH}\nexit 0\n")
    r, _ = run(env)
    assert r.returncode == 1 and "still not found" in r.stderr
