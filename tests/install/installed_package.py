"""stoker as a user gets it: the wheel from scripts/build-wheel.sh, installed into a fresh
virtual environment. `.ci/run` copies this file to a directory outside the source tree and
runs it there with pytest, so only the installed package can be imported. It is not part of
`pytest tests` (its name does not start with test_): a source install has no stoker.libs.
"""

import io
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import PIL.Image
import stoker
import torch
from stoker import _core

PKG = Path(stoker.__file__).resolve().parent
LIBS = PKG.parent / "stoker.libs"
CORE = Path(_core.__file__).resolve()
# What the extension may take from the system: glibc, libstdc++ and libgcc.
SYSTEM = {"linux-vdso", "ld-linux-x86-64", "ld-linux-aarch64", "libc", "libm", "libstdc++",
          "libgcc_s", "libpthread", "libdl", "librt"}


def ldd(path):
    """{soname: resolved path or None} of everything `path` loads (the loader's view)."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)(?: => (\S+| *not found))?", line)
        name, where = m.group(1), m.group(2)
        if where is None:  # "linux-vdso.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
            libs[Path(name).name] = name
        else:
            libs[name] = None if "not found" in where else where
    return libs


def stem(soname):
    return soname.split(".so")[0]


def test_imported_from_the_installed_wheel():
    site = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    assert PKG.parent in site, f"stoker imported from {PKG}, not from {site}"
    assert (PKG / "py.typed").is_file()
    assert (PKG / "_core.pyi").is_file()
    # the test-only entry points (tests/ext/, stoker._testing) stay out of the wheel
    assert not list(PKG.glob("_testing*")), sorted(PKG.glob("_testing*"))


def test_version_everywhere():
    assert _core.__version__ == stoker.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", stoker.__version__)
    script = Path(sys.executable).parent / "stoker"
    for cmd in ([str(script), "--version"], [sys.executable, "-m", "stoker", "--version"]):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        assert out.startswith(f"stoker {stoker.__version__} (image codecs: libjpeg-turbo "), out
        assert "libpng" in out and "warning" not in out


def test_extension_needs_only_glibc_libstdcxx_libgcc_and_the_bundled_libs():
    bundled = sorted(p.name for p in LIBS.iterdir())
    assert [stem(n).split("-")[0] for n in bundled] == ["libjpeg", "libpng16", "libz"], bundled
    for binary in [CORE, *(LIBS / n for n in bundled)]:
        for name, where in ldd(binary).items():
            assert where is not None, f"{binary.name} needs {name}, which is not found"
            if stem(name).split("-")[0] in ("libjpeg", "libpng16", "libz"):
                assert Path(where).resolve().parent == LIBS, f"{binary.name}: {name} => {where}"
            else:
                assert stem(name) in SYSTEM, f"{binary.name} needs {name} ({where})"


def encoded(fmt, arr):
    buf = io.BytesIO()
    PIL.Image.fromarray(arr).save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def test_jpeg_and_png_decode_through_the_loader(tmp_path):
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:48, 0:64]
    smooth = np.stack([128 + 90 * np.sin(x / 7 + c) * np.cos(y / 5 - c) for c in range(3)], -1)
    photo = np.clip(smooth + rng.normal(0, 4, smooth.shape), 0, 255).astype(np.uint8)
    images = [encoded("JPEG", photo), encoded("PNG", photo)]
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(tmp_path / "ds", fields) as w:
        for i, data in enumerate(images):
            w.write({"image": data, "label": i})
    loader = stoker.Loader(stoker.Dataset(tmp_path / "ds"), batch_size=2, num_threads=2)
    (batch,) = list(loader)
    assert batch["label"].tolist() == [0, 1]
    assert batch["image"].dtype == torch.uint8 and tuple(batch["image"].shape) == (2, 3, 48, 64)
    jpeg, png = batch["image"].permute(0, 2, 3, 1).numpy()  # NCHW, channels_last memory
    want_jpeg = np.asarray(PIL.Image.open(io.BytesIO(images[0])).convert("RGB"))
    assert np.abs(jpeg.astype(int) - want_jpeg).max() <= 1  # both libjpeg-turbo, same IDCT
    assert np.array_equal(png, photo)  # PNG is lossless
    # the single-image path, with an op
    crop = _core.decode_image(images[1], stoker.ops._specs([stoker.ops.CenterCrop(16)]))
    assert np.array_equal(crop, photo[16:32, 24:40])


def test_codecs_in_use_are_the_bundled_ones():
    assert _core.image_size(encoded("PNG", np.zeros((4, 6, 3), np.uint8))) == (4, 6)
    maps = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
            if line.count(" ") >= 5 and "/" in line}
    ours = {Path(p).name for p in maps if Path(p).parent == LIBS}
    assert {stem(n).split("-")[0] for n in ours} == {"libjpeg", "libpng16", "libz"}, ours
    system_codecs = [p for p in maps if re.search(r"/lib(jpeg|png)[^/]*$", p)
                     and p.startswith(("/usr/", "/lib"))]
    assert system_codecs == [], system_codecs


def test_demo_runs():
    r = subprocess.run([sys.executable, "-m", "stoker", "demo", "--samples", "1000",
                        "--epochs", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "epoch 0: 1000 samples" in r.stdout


def test_example_images_need_nothing_beyond_the_wheel(tmp_path):
    """`stoker example-data images` and the quickstart's `photos` write JPEGs with the
    encoder of the bundled libjpeg-turbo, Pillow unimportable; Pillow decodes them."""
    script = ("import sys; sys.modules['PIL'] = None; from stoker.cli import main; "
              "sys.exit(main(['example-data', 'images', 'i', 'photos', 'p']))")
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(stoker.Dataset(tmp_path / "i")) == 48
    files = sorted((tmp_path / "p").glob("*/*/*.jpg"))
    assert len(files) == 60
    red = np.asarray(PIL.Image.open(tmp_path / "p" / "train" / "red" / "000.jpg"))
    assert red[..., 0].mean() > red[..., 1].mean() + 100  # the class's dominant colour
