"""The remote shard cache is its user's own (NOTE [ Private cache directory ] in
stoker/remote/private.py): its directory mode 0700, its files 0600; a directory other users
could write to (or own) is never used (a private one instead, said once); a file in it that
is not the user's is removed, never used. The epochs are the local dataset's each time."""

import os
import shutil
import stat
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import stoker
from conftest import as_user, second_user
from remote_servers import GatedServer

N = 80


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(url, the local dataset) of a dataset of a few shards served over HTTP."""
    www = tmp_path_factory.mktemp("www")
    with stoker.ShardWriter(www / "ds", {"x": stoker.ndarray("int32", (4,)),
                                         "label": stoker.scalar("int64")},
                            shard_size="600B") as w:
        for i in range(N):
            w.write({"x": np.full(4, i, np.int32), "label": i})
    server = GatedServer(str(www))
    server.open_gate()
    yield f"{server.url}/ds", stoker.Dataset(www / "ds")
    server.stop()


def labels(ds):
    return sorted(x for b in stoker.Loader(ds, batch_size=8, num_threads=1)
                  for x in b["label"].tolist())


def files_under(folder):
    return [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]


def test_the_shard_cache_is_its_users_own(served, tmp_path):
    url, _ = served
    cache = tmp_path / "made"
    ds = stoker.Dataset(url, cache_dir=cache)
    assert labels(ds) == list(range(N))
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    for sub in ("objects", "locks", "tmp", "holders"):
        assert stat.S_IMODE(os.stat(cache / sub).st_mode) == 0o700
    made = files_under(cache)
    assert made and all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in made), made
    # A directory of the user's that others could only read (made with umask 022): 0700.
    older = tmp_path / "older"
    older.mkdir(mode=0o755)
    os.chmod(older, 0o755)
    assert labels(stoker.Dataset(url, cache_dir=older)) == list(range(N))
    assert stat.S_IMODE(os.stat(older).st_mode) == 0o700


def test_a_cache_dir_others_can_write_to_is_never_used(served, tmp_path):
    url, _ = served
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.warns(RuntimeWarning, match="has mode 0777") as said:
        a = stoker.Dataset(url, cache_dir=shared)
        b = stoker.Dataset(url, cache_dir=shared)  # the same reason: said once
    assert sum("is not used" in str(w.message) for w in said) == 1
    assert labels(a) == labels(b) == list(range(N))
    assert files_under(shared) == [] and os.listdir(shared) == []
    own = a.remote.cache.cache_dir
    assert own != str(shared) and stat.S_IMODE(os.stat(own).st_mode) == 0o700


def test_files_in_the_cache_that_are_not_the_users_are_never_used(served, tmp_path):
    """A lock and a shard of another uid's (root can make them) in the user's cache
    directory: removed and made anew; the epoch is the local one."""
    if os.geteuid() != 0:
        pytest.skip("making a file of another uid's needs root")
    url, local = served
    cache = tmp_path / "cache"
    ds = stoker.Dataset(url, cache_dir=cache)
    assert labels(ds) == list(range(N))
    objects = sorted(os.listdir(cache / "objects"))
    ds.remote.close()
    del ds
    # Shard 0: its object and its lock another uid's; shard 2: no object, its lock a link.
    lock = cache / "locks" / (objects[0][:-4] + ".lock")
    for p in (cache / "objects" / objects[0], lock):
        with open(p, "wb") as f:
            f.write(b"\0" * 64)
        os.chown(p, 65534, 65534)
        os.chmod(p, 0o666)
    os.remove(cache / "objects" / objects[2])
    link = cache / "locks" / (objects[2][:-4] + ".lock")
    link.unlink(missing_ok=True)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not a lock")
    os.symlink(target, link)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: the directory is the user's own
        again = stoker.Dataset(url, cache_dir=cache)
    assert labels(again) == list(range(N))
    for p in (cache / "objects" / objects[0], lock, cache / "objects" / objects[2], link):
        st = os.lstat(p)
        assert st.st_uid == os.geteuid() and stat.S_ISREG(st.st_mode), p
        assert stat.S_IMODE(st.st_mode) == 0o600
    assert target.read_bytes() == b"not a lock"


def test_another_user_can_neither_plant_nor_read_the_cache(served, request):
    """As a second local user: a cache directory made first by them (mode 0777) is never
    used; the user's own cannot be listed, read or added to by them."""
    other = second_user()
    url, _ = served
    base = Path(tempfile.mkdtemp(prefix="stoker-scratch-"))  # a shared scratch folder
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    os.chmod(base, 0o1777)
    theirs = base / "cache"
    r = as_user(other, ["sh", "-c", f"mkdir -m 0777 {theirs} && mkdir -m 0777 {theirs}/locks"])
    assert r.returncode == 0, r.stderr
    with pytest.warns(RuntimeWarning, match=f"belongs to uid {other[0]}"):
        ds = stoker.Dataset(url, cache_dir=theirs)
    assert labels(ds) == list(range(N)) and os.listdir(theirs / "locks") == []
    mine = base / "mine"
    ds = stoker.Dataset(url, cache_dir=mine)
    assert labels(ds) == list(range(N))
    shard = next(iter(files_under(mine / "objects")))
    for attack in (f"ls {mine}", f"cat {shard} > /dev/null", f"touch {mine}/objects/x",
                   f"rm -rf {mine}/objects"):
        r = as_user(other, ["sh", "-c", attack])
        assert r.returncode != 0, attack
