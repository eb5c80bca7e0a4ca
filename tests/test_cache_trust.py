"""The decoded cache on a machine other users share (NOTE [ Cache trust ] in
csrc/cache/decoded_cache.cpp, docs/cache.md "Who can see the cache"): a file or folder
another user could have made or can open is never joined, a damaged header or entry is
left for a private cache, never a signal and never wrong pixels; each time the batches are
the uncached loader's. With a second local user (root creates one) the attacker's steps
run as that user."""

import gc
import os
import shutil
import stat
import uuid
import warnings

import pytest
import stoker
from conftest import as_user, second_user
from stoker import _core, ops
from test_cache import epoch, same, write_images

TF = {"image": [ops.RandomResizedCrop(32), ops.RandomHorizontalFlip()]}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_images(tmp_path_factory.mktemp("trust") / "ds", n=22)


@pytest.fixture
def shm(monkeypatch):
    """A folder like /dev/shm (mode 1777: anyone makes files, only their owner removes
    them) for this test's caches."""
    path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp",
                        f"stoker-trust-{uuid.uuid4().hex[:12]}")
    os.makedirs(path)
    os.chmod(path, 0o1777)
    monkeypatch.setenv("STOKER_CACHE_DIR", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def loader(ds, **kw):
    return stoker.Loader(ds, batch_size=8, shuffle=True, seed=5, num_threads=2, transforms=TF,
                         stall_warning=None, **kw)


def cached(ds, **kw):
    return loader(ds, cache="decoded", cache_size="24MB", **kw)


@pytest.fixture(scope="module")
def want(images):
    """The uncached loader's first two epochs."""
    ld = loader(images)
    return [epoch(ld, e) for e in range(2)]


def cache_path(ds):
    """Where a cache of `ds` (cached()'s arguments) lives: learnt from a loader, which
    removes the file as it goes."""
    ld = cached(ds)
    path = ld.stats()["cache"]["path"]
    assert path
    del ld
    gc.collect()
    assert not os.path.exists(path)
    return path


def read_u64(path, at):
    with open(path, "rb") as f:
        f.seek(at)
        return int.from_bytes(f.read(8), "little")


def write_at(path, at, data):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, at)
    finally:
        os.close(fd)


def whiten_pixels(path, data, end):
    """Sets every pixel of every entry of the cache file at `path` to 255 (entries from
    `data` to `end`, handed out back to back: a 64-byte head with the size, then the rows,
    rounded up to 64 bytes), leaving the heads as they are."""
    with open(path, "r+b") as f:
        at = data
        while at + 64 <= end:
            f.seek(at + 8)
            w, h = (int.from_bytes(f.read(4), "little", signed=True) for _ in range(2))
            if w <= 0 or h <= 0:
                break
            f.seek(at + 64)
            f.write(b"\xff" * (w * h * 3))
            at += (64 + w * h * 3 + 63) // 64 * 64


def test_a_file_others_could_open_is_never_joined(images, shm, want):
    """A file at the cache's path with group/other bits, or of another uid, or with a
    second link: never joined, said once; the batches are the uncached loader's and the
    planted file is left as it was."""
    path = cache_path(images)
    size = 24 * 10**6
    with open(path, "wb") as f:
        f.truncate(size)
    os.chmod(path, 0o666)
    with pytest.warns(RuntimeWarning, match="mode 0666.*never joined") as said:
        ld = cached(images)
        again = cached(images)  # the same reason: not said a second time
    assert sum("not shared" in str(w.message) for w in said) == 1
    s = ld.stats()["cache"]
    assert not s["shared"] and "mode 0666" in s["fallback"]
    assert all(same(w, epoch(ld, e)) for e, w in enumerate(want))
    assert same(want[0], epoch(again, 0))
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o666 and st.st_size == size and st.st_blocks == 0
    del ld, again
    os.chmod(path, 0o600)
    os.chown(path, 65534, 65534)  # root can make a file of another uid's
    with pytest.warns(RuntimeWarning, match="belongs to uid 65534"):
        ld = cached(images)
    assert not ld.stats()["cache"]["shared"] and same(want[0], epoch(ld, 0))
    del ld
    os.chown(path, os.geteuid(), os.getegid())
    os.link(path, path + "-second-name")
    with pytest.warns(RuntimeWarning, match="2 links"):
        ld = cached(images)
    assert not ld.stats()["cache"]["shared"]


def test_a_folder_others_could_use_is_never_used(images, shm, want):
    """The user's cache folder with group/other bits, or a link in its place: never used;
    the batches are the uncached loader's."""
    folder = _core.DecodedCache.private_dir(shm)
    os.mkdir(folder)
    os.chmod(folder, 0o755)
    with pytest.warns(RuntimeWarning, match="mode 0755"):
        ld = cached(images)
    assert not ld.stats()["cache"]["shared"] and same(want[0], epoch(ld, 0))
    assert os.listdir(folder) == []
    del ld
    os.rmdir(folder)
    elsewhere = os.path.join(shm, "elsewhere")
    os.mkdir(elsewhere, 0o700)
    os.symlink(elsewhere, folder)
    with pytest.warns(RuntimeWarning, match="not a folder"):
        ld = cached(images)
    assert not ld.stats()["cache"]["shared"] and os.listdir(elsewhere) == []


def test_another_user_can_neither_plant_nor_open_the_cache(images, shm, want):
    """As a second local user: planting the user's cache folder first (mode 0777, a
    cache file in it with mode 0666) gets the job a private cache, never the planted file;
    once the job's cache exists, the other user can neither list, read, truncate nor add
    to it."""
    other = second_user()
    folder = _core.DecodedCache.private_dir(shm)
    path = cache_path(images)  # (the file is gone with its loader)
    os.rmdir(folder)
    name = os.path.basename(path)
    planted = as_user(other, ["sh", "-c", f"mkdir -m 0777 {folder} && "
                                         f"head -c 1000 /dev/zero > {path} && chmod 0666 {path}"])
    assert planted.returncode == 0, planted.stderr
    with pytest.warns(RuntimeWarning, match=f"belongs to uid {other[0]}"):
        ld = cached(images)
    s = ld.stats()["cache"]
    assert not s["shared"] and all(same(w, epoch(ld, e)) for e, w in enumerate(want))
    assert os.path.getsize(path) == 1000 and os.stat(path).st_uid == other[0]
    del ld
    gc.collect()
    as_user(other, ["rm", "-rf", folder])
    assert not os.path.exists(folder)
    # The job first: its folder is 0700, its file 0600; nothing of it is the other's.
    ld = cached(images)
    epoch(ld, 0)
    assert ld.stats()["cache"]["shared"] and ld.stats()["cache"]["path"] == path
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    for attack in (f"ls {folder}", f"cat {path} > /dev/null", f": > {path}",
                   f"touch {folder}/{name}-x", f"truncate -s 0 {path}",
                   f"rm -f {path}", f"mv {folder} {shm}/moved"):
        r = as_user(other, ["sh", "-c", attack])
        assert r.returncode != 0, (attack, r.stdout)
    assert os.path.getsize(path) == 24 * 10**6
    assert same(want[1], epoch(ld, 1)) and ld.stats()["cache"]["hits"] > 0


def test_a_header_with_wrong_offsets_gives_a_private_cache(images, shm, want):
    """A cache file whose header points anywhere else than this cache's layout (its words'
    offset here) is never mapped by that header: a process joining it keeps a private
    cache, and one that had it mapped goes on with its own offsets; no signal, the uncached
    batches everywhere."""
    holder = cached(images)
    epoch(holder, 0)
    path = holder.stats()["cache"]["path"]
    write_at(path, 56, (1 << 40).to_bytes(8, "little"))  # Header::words_offset
    with pytest.warns(RuntimeWarning, match="damaged header"):
        joiner = cached(images)
    assert not joiner.stats()["cache"]["shared"]
    assert all(same(w, epoch(joiner, e)) for e, w in enumerate(want))
    assert same(want[1], epoch(holder, 1)) and holder.stats()["cache"]["shared"]


def test_pixels_changed_in_shared_memory_are_never_served(images, shm, want):
    """Every cached image's pixels whitened in the shared file (a stray write, or another
    process of the user gone wrong): a process reading them checks each entry's checksum
    the first time (every time with verify="always"), leaves the shared cache at the
    first mismatch (said once), and its batches are the uncached loader's."""
    writer = cached(images, verify="always")
    epoch(writer, 0)
    s = writer.stats()["cache"]
    assert s["images"] == len(images)
    path = s["path"]
    data = _core.DecodedCache.index_bytes(s["slots"], 4)
    whiten_pixels(path, data, s["bytes"])
    reader = cached(images)  # joins the whitened cache: checks each entry on its first read
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = [epoch(reader, e) for e in range(2)]
        assert all(same(w, g) for w, g in zip(want, got, strict=True))
        assert all(same(w, epoch(writer, e)) for e, w in enumerate(want))
    left = [str(w.message) for w in said if "no longer reads the shared" in str(w.message)]
    assert len(left) == 2 and all("checksum" in m for m in left), left  # once per loader
    for ld in (reader, writer):
        s = ld.stats()["cache"]
        assert not s["shared"] and s["abandoned"] and s["corrupt"] >= 1
