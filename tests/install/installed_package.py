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
# the libraries the wheel carries (scripts/build-wheel.sh): FFmpeg itself is linked in
BUNDLED = ["libdav1d", "libjpeg", "libpng16", "libz"]
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
    assert [stem(n).split("-")[0] for n in bundled] == BUNDLED, bundled
    for binary in [CORE, *(LIBS / n for n in bundled)]:
        for name, where in ldd(binary).items():
            assert where is not None, f"{binary.name} needs {name}, which is not found"
            if stem(name).split("-")[0] in BUNDLED:
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
    crop = _core.decode_image(images[1], stoker.ops.op_specs([stoker.ops.CenterCrop(16)]))
    assert np.array_equal(crop, photo[16:32, 24:40])


def test_codecs_in_use_are_the_bundled_ones():
    assert _core.image_size(encoded("PNG", np.zeros((4, 6, 3), np.uint8))) == (4, 6)
    maps = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
            if line.count(" ") >= 5 and "/" in line}
    ours = {Path(p).name for p in maps if Path(p).parent == LIBS}
    assert {stem(n).split("-")[0] for n in ours} == set(BUNDLED), ours
    system_codecs = [p for p in maps if re.search(r"/lib(jpeg|png|av|sw|dav1d)[^/]*$", p)
                     and p.startswith(("/usr/", "/lib"))]
    assert system_codecs == [], system_codecs


# Two 12-frame 32x32 videos (H.264 in mp4, AV1 in Matroska, a key frame every 6 frames, made
# with PyAV as tests/media_reference.py makes them), and the SHA-256 of the RGB frames PyAV's
# full decode gives (its bundled FFmpeg, a different build from the wheel's): the wheel's
# decoders-only FFmpeg (scripts/build-ffmpeg.sh) must give the same bytes, here where no
# decoder of the system is in reach.
_H264 = (
    "AAAAIGZ0eXBpc29tAAACAGlzb21pc28yYXZjMW1wNDEAAAAIZnJlZQAABhRtZGF0AAACmwYF//+X3EXpvebZSLeW"
    "LNgg2SPu73gyNjQgLSBjb3JlIDE2NSAtIEguMjY0L01QRUctNCBBVkMgY29kZWMgLSBDb3B5bGVmdCAyMDAzLTIw"
    "MjUgLSBodHRwOi8vd3d3LnZpZGVvbGFuLm9yZy94MjY0Lmh0bWwgLSBvcHRpb25zOiBjYWJhYz0xIHJlZj0zIGRl"
    "YmxvY2s9MTowOjAgYW5hbHlzZT0weDM6MHgxMTMgbWU9aGV4IHN1Ym1lPTcgcHN5PTEgcHN5X3JkPTEuMDA6MC4w"
    "MCBtaXhlZF9yZWY9MSBtZV9yYW5nZT0xNiBjaHJvbWFfbWU9MSB0cmVsbGlzPTEgOHg4ZGN0PTEgY3FtPTAgZGVh"
    "ZHpvbmU9MjEsMTEgZmFzdF9wc2tpcD0xIGNocm9tYV9xcF9vZmZzZXQ9LTIgdGhyZWFkcz0xIGxvb2thaGVhZF90"
    "aHJlYWRzPTEgc2xpY2VkX3RocmVhZHM9MCBucj0wIGRlY2ltYXRlPTEgaW50ZXJsYWNlZD0wIGJsdXJheV9jb21w"
    "YXQ9MCBjb25zdHJhaW5lZF9pbnRyYT0wIGJmcmFtZXM9MyBiX3B5cmFtaWQ9MiBiX2FkYXB0PTEgYl9iaWFzPTAg"
    "ZGlyZWN0PTEgd2VpZ2h0Yj0xIG9wZW5fZ29wPTAgd2VpZ2h0cD0yIGtleWludD02IGtleWludF9taW49NCBzY2Vu"
    "ZWN1dD0wIGludHJhX3JlZnJlc2g9MCByY19sb29rYWhlYWQ9NiByYz1jcmYgbWJ0cmVlPTEgY3JmPTIzLjAgcWNv"
    "bXA9MC42MCBxcG1pbj0wIHFwbWF4PTY5IHFwc3RlcD00IGlwX3JhdGlvPTEuNDAgYXE9MToxLjAwAIAAAABDZYiE"
    "ACn/V5g98OZwj8NUhqTKfLEo2ZV/Uw1P26Dbtt3DkScvLc3f3PKFfUevkvEDG/eZQ2yA8UA3BBa+DdkCTJp7wQAA"
    "AD1BmiFsQp/cS+70Mq3XL/+F/lg9we4UboVdq+9EczZFv2jczjFdboGFT78ERagxsZzsfszkoNcHCJhnuoQgAAAA"
    "P0GaQ0nhCEMgg8B/BKAhEAgsB/BACFP//SJu/A0i0n2WQirB9ksTdEHTVA9juocIa/7Ae8SXspzb2mGR8/8zwQAA"
    "ADYBnmJqQp/9dgPD5Tv4GFcv/OPwZ8fNXHmhV2reqGWtK2Ife4UMQagadBoznVHTTegb2GPTwLAAAAA/QZpkSeEP"
    "JlMCK//C1Kce63x77bHrx/hQPUVwOdHybC2erMa+VfhwaQUOOIEnsllPRgAJvYZbsewlcVMCilXBAAAANEGahUvh"
    "CEPIfA/CkD8IAI7/xlcftaLZcUuIzL8gW4v/t6RLs5HOLseWNcx1f+UitdSuEu8AAABQZYiCABH/amH/6yijTBKm"
    "sPOYcufiSjR0HG6Azzy2tYqKSMnDisYZq+q1+Yn5PA6hGl/ZaoHkiitx35KQ2bArnaxev1pHzDBMZ+0UVZScwB8A"
    "AABGQZohbEKf+c7y5yLByv/9GXcx3Hx7E18bJLelscNXZL2AnBVQYaRpehXgxhqdtuO9VeSf/lz/g4RrXamkxslv"
    "/6qksgWH4wAAAGRBmkM8IZMphCn/6FiDNFFpPv7PUfhTWTTFcnZpkzdbl6XIgSckRlnZTn3fBqpWH/cw54xf+EhQ"
    "ekuvwiq26ONk9qTcDTUkV7tJkqbL9Y5VIzB+36hf/poizel7aL3Fv0iGHpLAAAAANQGeYmpCn/txJhv4GFb+Yzrm"
    "oNzqbrjDJ+6xkj3aSb4FNB6Cd1j23w0HpV9C7PMio+H8CY6cAAAATUGaZEnhDyZTAjP/3SYFdX7/EVjL6e5U2jad"
    "/HnJFiU/N1t8bv35jMsoZMz5efFuubvEaWKTzEuqZzSvOa39SF2cECD9xSNonHj8x2YxAAAAWUGahUvhCEPIINAe"
    "w6BOAlgQMB7DACO/3eXN92SRbJol72nfdSj8/Hxu1rTtU7L9jAGRXAELOARQAocaj58/N/dTXRWvyNZNSPUYp3Df"
    "qLDFbArwC7pbIBDoAAADlG1vb3YAAABsbXZoZAAAAAAAAAAAAAAAAAAAA+gAAAHgAAEAAAEAAAAAAAAAAAAAAAAB"
    "AAAAAAAAAAAAAAAAAAAAAQAAAAAAAAAAAAAAAAAAQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAIAAAK+"
    "dHJhawAAAFx0a2hkAAAAAwAAAAAAAAAAAAAAAQAAAAAAAAHgAAAAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAAAAAAA"
    "AAAAAQAAAAAAAAAAAAAAAAAAQAAAAAAgAAAAIAAAAAAAJGVkdHMAAAAcZWxzdAAAAAAAAAABAAAB4AAABAAAAQAA"
    "AAACNm1kaWEAAAAgbWRoZAAAAAAAAAAAAAAAAAAAMgAAABgAVcQAAAAAAC1oZGxyAAAAAAAAAAB2aWRlAAAAAAAA"
    "AAAAAAAAVmlkZW9IYW5kbGVyAAAAAeFtaW5mAAAAFHZtaGQAAAABAAAAAAAAAAAAAAAkZGluZgAAABxkcmVmAAAA"
    "AAAAAAEAAAAMdXJsIAAAAAEAAAGhc3RibAAAAK1zdHNkAAAAAAAAAAEAAACdYXZjMQAAAAAAAAABAAAAAAAAAAAA"
    "AAAAAAAAAAAgACAASAAAAEgAAAAAAAAAAQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABj//wAAADNh"
    "dmNDAWQACv/hABZnZAAKrNlJaEAAAAMAQAAADIPEiWWAAQAGaOvjyyLA/fj4AAAAABRidHJ0AAAAAAAAZMgAAAAA"
    "AAAAGHN0dHMAAAAAAAAAAQAAAAwAAAIAAAAAGHN0c3MAAAAAAAAAAgAAAAEAAAAHAAAASGN0dHMAAAAAAAAABwAA"
    "AAIAAAQAAAAAAQAABgAAAAABAAACAAAAAAQAAAQAAAAAAQAABgAAAAABAAACAAAAAAIAAAQAAAAAHHN0c2MAAAAA"
    "AAAAAQAAAAEAAAAMAAAAAQAAAERzdHN6AAAAAAAAAAAAAAAMAAAC5gAAAEEAAABDAAAAOgAAAEMAAAA4AAAAVAAA"
    "AEoAAABoAAAAOQAAAFEAAABdAAAAFHN0Y28AAAAAAAAAAQAAADAAAABidWR0YQAAAFptZXRhAAAAAAAAACFoZGxy"
    "AAAAAAAAAABtZGlyYXBwbAAAAAAAAAAAAAAAAC1pbHN0AAAAJal0b28AAAAdZGF0YQAAAAEAAAAATGF2ZjYyLjEy"
    "LjEwMg=="
)
_AV1 = (
    "GkXfo6NChoEBQveBAULygQRC84EIQoKIbWF0cm9za2FCh4EEQoWBAhhTgGcBAAAAAAAGUhFNm3TAv4S64vecTbuL"
    "U6uEFUmpZlOsgaFNu4tTq4QWVK5rU6yB8U27jFOrhBJUw2dTrIIBYE27jFOrhBxTu2tTrIIGJOwBAAAAAAAAUwAA"
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAAAAAAAAFUmpZsu/hBGu/k4q17GDD0JATYCNTGF2ZjYyLjEyLjEwMldBjUxhdmY2Mi4xMi4xMDJz"
    "pJD/VAGHiyJpKuDCQVuskCWqRImIQH4AAAAAAAAWVK5r6r+ED7ouzq4BAAAAAAAAW9eBAXPFiKMRjVtmLSh+nIEA"
    "IrWcg3VuZIiBAIaFVl9BVjGDgQEj44OEAmJaAOCKsIEguoEgVLKBBFXugQDsAQAAAAAAAAIAAGOikIEADAAKCgAA"
    "AAIn/gF8ACASVMNn3r+EfTdMUnNzoGPAgGfImkWjh0VOQ09ERVJEh41MYXZmNjIuMTIuMTAyc3OyY8CLY8WIoxGN"
    "W2YtKH5nyKFFo4hEVVJBVElPTkSHkzAwOjAwOjAwLjQ4MDAwMDAwMAAfQ7Z1RFu/hM724GXngQCjQIKBAACACgoA"
    "AAACJ/4lfIAgMnAQAJaAEECCAeAAtX7kLAoBOh8wzoM4/A32UkZ3xcLy4B12ow0zMZHn5TE44Ny9cS3EM0DSgUH7"
    "MA5np9D4ASdctadle2FBPWGuKpt1XeH3vAFveFQFRYG6R8Ic9jP7smorfD4XLhyJ4o9xfsbHPwxwo0DCgQAoADJN"
    "KAQAJJJJMU8AQQIIE8AQABDwlCpVG32x/RiSXn48+FsxYCPFNECkiXRh8QNzMTiUrCiDnIfZxF0cEnHIktd5Jcoo"
    "b1y0ih67KqE/ZwQyPigCAQSSADF4AAABPAGAAAvLfSm4NqKll7XSdFT9EQ7LV0yYNo9UpPhk16yKiX+dNyWYwjxj"
    "sfRgft5ZP+xgMi0wAwAJJNsjGAAABHgDAAC0zfNDhsUIZPBv46vWZYVbV1w7Li1DAqitzCe+GCCjh4EAUAAaAbij"
    "vYEAeAAyNzAGAA22ACMYAAAEeAMAAHV3Z4teZAOdNMo1Wbp39uqc/vP5XPmTd7cQE1GFlHZ4cBnss013j4Cjh4EA"
    "oAAaAYijw4EAyAAyPTAKAgAAAGLwAAACeAAAHqc3an1Zl0eXHSAVaWkZA8DZz8iNXwdydgDTMUc/uX/D805YtgH7"
    "h1aACEpp1aajQIuBAPCACgoAAAACJ/4lfIAgMnkQGJaAEECCAeAAwvOCb9sZ/6TK0/tiRn53R4FWpJQ9BVSpfxgC"
    "2iYHp8MLuNW3F98si7f+KeVnAzx3z/auJ29nLO2PL3a0MP0XnwYAkb2G8QsO4yqxvLVAZU2vULylAnYsfMTyYtMa"
    "vlkTWklIKkB1AMp0WOvbWAmqo0EsgQEYADKVASgKACSSSTFPAEECCBPvEAAQg2zDINf/W31oAYINrlI4eNA+Lf5m"
    "pgfuZphmvyD4qBAjJZFrVMRErBbJnH+WT+NCaBI7F8MNis9esRwP6U3k1gRPJcVcyMbQ6OT0hBvvD2jSqk7CQKq+"
    "KjbqUNoYpY/jz0WrdrmmNhXP0Dmq/X3M90gPxqLHGBgGNnH9loWkpDBj2EDUMlEoCAEEkgAxeAAAAT7xgABw8x+h"
    "YeEb8PPN6vXz67DvwXamvk7iJDymYsETErawPbd30H1afWe45mKZdrdaVDh1VKpYrQ+lbikqnu4BvyGXOlwyOzAP"
    "AAkk2yMYAAAEegMAAA9qUzTs3dCMnXXiI0+swhsuEa/Hb7jWJmMXbDabpuwvH/InF5GJML1yojEgo4eBAUAAGgG4"
    "o7mBAWgAMjMwEgANtgAjGAAABHwDAADCU0NjxZ7MipxjYpMXsT9Zyx3hb5mtcl2kXM1SVYjTEbalUvCjh4EBkAAa"
    "AYij5oEBuAAyYDAWAgAAAGLwAAACfAAAtrQGydNxOnyZArvzSuR/+EdDBkY+47bK5lHh9xse9f9BCP/ImeQsv0gX"
    "F1bGEY1Ty3ymIXPHrYOtDaD22uorGm+yqMENCD0bYJ2WXHtjqWFwcBxTu2upv4SxqRfBu4+zgQC3iveBAfGCAcPw"
    "gQm7kLOB8LeL94EB8YIBw/CCAek="
)
TINY_VIDEOS = {
    "h264": (_H264,
             "a04191db996e1ec19d6e5eceadc88dfe03183165871e9068f28810142a5f57bd"),
    "av1": (_AV1,
            "2923f3af289e0b4aba001296fe372b4bf7172e99a9e42b5793579b9350e31b11"),
}


def test_video_clips_decode_with_the_bundled_ffmpeg(tmp_path):
    import base64
    import hashlib

    for codec, (b64, want) in TINY_VIDEOS.items():
        record = stoker.video().encode(base64.b64decode(b64))
        spec = stoker.ops.CenterClip(12).spec(layout="HWC")
        frames, pts = _core.decode_clip(record, spec)
        assert hashlib.sha256(frames.tobytes()).hexdigest() == want, codec
        assert np.allclose(pts, np.arange(12) * 0.04)
    fields = {"video": stoker.video()}
    with stoker.ShardWriter(tmp_path / "v", fields) as w:
        w.write({"video": base64.b64decode(TINY_VIDEOS["h264"][0])})
    loader = stoker.Loader(stoker.Dataset(tmp_path / "v"), batch_size=1,
                           transforms={"video": [stoker.ops.RandomClip(4, step=2)]})
    (batch,) = list(loader)
    assert tuple(batch["video"].shape) == (1, 4, 3, 32, 32)



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
