"""Augmentation benchmark: stoker's native ops against Pillow (torchvision's PIL kernels)
and albumentations (OpenCV), on the same images and cores, in one run, printing ratios.

    python bench/make_jpegs.py /tmp/jpegs --n 1000
    python bench/bench_augment.py /tmp/jpegs [--ops] [--recipes] [--batch-size 128]

The ops part calls the kernels one at a time through stoker._testing, which a development
install builds (pip install --no-build-isolation .) and the wheel leaves out.

Two parts (both by default):

  ops       each op alone on 224x224 RGB crops of the JPEGs, one thread, microseconds per
            image: stoker's kernel (the one the loader's workers run), Pillow as
            torchvision.transforms.v2 runs it on PIL images, albumentations 2 on OpenCV.
            Medians of 5 interleaved rounds. Then MixUp and CutMix on a 64x3x224x224 float32
            batch: stoker's kernel against timm's torch code.
  recipes   whole pipelines from JPEG bytes to a batch, images/s:
              timm-style: RandomResizedCrop(224) + flip + RandAugment(2, 9) + Normalize +
                          RandomErasing(p=0.25, per-pixel noise)
              YOLO-style: Letterbox(640) + HSV jitter + flip, with boxes and their classes
              YOLO-mosaic: Mosaic(640) + RandomAffine(translate 0.1, scale 0.5-1.5, bilinear)
                          + the 640 centre + HSV jitter + flip + Letterbox(640), with boxes
                          and classes; the peer is albumentations' Mosaic (its dataset reads
                          and decodes the three other JPEGs) + Affine + HSV + flip
            stoker's Loader against torch.utils.data.DataLoader over the same JPEG files
            running Pillow or albumentations, each at its best num_workers (0, 1, 2), and
            stoker's own RandomResizedCrop(224) + flip as the reference for the timm-style
            cost. Targets (2 cores): timm-style >= 2x the best peer and within 25% of
            stoker's RRC + flip; YOLO-style and YOLO-mosaic >= 2x the best peer.
            Steady state, as a training run sees it: each loader is made once a round,
            runs one untimed epoch (start-up: DataLoader forks its workers, kept with
            persistent_workers=True; stoker touches its new batch buffers for the first
            time, 4x as many bytes with a float32 output), then --epochs timed epochs.

Files are read right before each timed run (an idle minute may evict the page cache).
"""

import argparse
import glob
import io
import math
import os
import random
import statistics
import sys
import tempfile
import time

import numpy as np

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def read_files(paths):
    """The files' bytes; reading them also warms the page cache (warm() again later)."""
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(f.read())
    return out


def warm(paths):
    read_files(paths)


# --- Pillow: torchvision's PIL kernels, written out (torchvision is not a dependency) -----

def pil_inverse_affine(center, angle, translate, scale, shear):
    """torchvision's _get_inverse_affine_matrix, as its PIL affine() passes to Image.transform."""
    rot = math.radians(angle)
    sx, sy = math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty)
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty)
    return m


def pil_affine(img, angle=0.0, translate=(0, 0), scale=1.0, shear=(0.0, 0.0), center=None,
               resample=0):
    from PIL import Image

    if center is None:
        center = (img.width * 0.5, img.height * 0.5)
    m = pil_inverse_affine(center, angle, translate, scale, shear)
    return img.transform(img.size, Image.AFFINE, m, resample)


_RA_OPS = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
           "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize"]


def pil_rand_augment(img, num_ops=2, magnitude=9, bins=31):
    """torchvision's RandAugment on a PIL image (nearest, no fill)."""
    from PIL import ImageEnhance, ImageOps

    w, h = img.size
    for _ in range(num_ops):
        op = random.choice(_RA_OPS)
        lin = lambda hi: hi * magnitude / (bins - 1)  # noqa: E731
        sign = -1 if random.random() <= 0.5 else 1
        if op == "ShearX":
            img = pil_affine(img, shear=(math.degrees(math.atan(sign * lin(0.3))), 0.0),
                             center=(0, 0))
        elif op == "ShearY":
            img = pil_affine(img, shear=(0.0, math.degrees(math.atan(sign * lin(0.3)))),
                             center=(0, 0))
        elif op == "TranslateX":
            img = pil_affine(img, translate=(int(sign * lin(150 / 331 * w)), 0))
        elif op == "TranslateY":
            img = pil_affine(img, translate=(0, int(sign * lin(150 / 331 * h))))
        elif op == "Rotate":
            img = img.rotate(sign * lin(30.0))
        elif op == "Brightness":
            img = ImageEnhance.Brightness(img).enhance(1 + sign * lin(0.9))
        elif op == "Color":
            img = ImageEnhance.Color(img).enhance(1 + sign * lin(0.9))
        elif op == "Contrast":
            img = ImageEnhance.Contrast(img).enhance(1 + sign * lin(0.9))
        elif op == "Sharpness":
            img = ImageEnhance.Sharpness(img).enhance(1 + sign * lin(0.9))
        elif op == "Posterize":
            img = ImageOps.posterize(img, int(round(8 - magnitude / ((bins - 1) / 4))))
        elif op == "Solarize":
            img = ImageOps.solarize(img, 255.0 * (1 - magnitude / (bins - 1)))
        elif op == "AutoContrast":
            img = ImageOps.autocontrast(img)
        elif op == "Equalize":
            img = ImageOps.equalize(img)
    return img


def np_normalize(arr):
    x = arr.astype(np.float32) * np.float32(1 / 255)
    return (x - np.array(MEAN, np.float32)) / np.array(STD, np.float32)


def np_random_erasing(x, p=0.25, scale=(0.02, 1 / 3), ratio=(0.3, 3.3)):
    """torchvision's RandomErasing rule with value='random' (timm's mode='pixel'), HWC."""
    if random.random() >= p:
        return x
    h, w = x.shape[:2]
    for _ in range(10):
        area = h * w * random.uniform(*scale)
        r = math.exp(random.uniform(math.log(ratio[0]), math.log(ratio[1])))
        eh, ew = int(round(math.sqrt(area * r))), int(round(math.sqrt(area / r)))
        if eh < h and ew < w:
            i, j = random.randint(0, h - eh), random.randint(0, w - ew)
            x[i:i + eh, j:j + ew] = np.random.standard_normal((eh, ew, x.shape[2]))
            return x
    return x


def letterbox_geometry(w, h, size=640):
    r = min(size / w, size / h)
    nw, nh = int(round(w * r)), int(round(h * r))
    left, top = (size - nw) // 2, (size - nh) // 2
    return r, nw, nh, left, top


def np_hsv_jitter(arr, hgain=0.015, sgain=0.7, vgain=0.4):
    """ultralytics' augment_hsv: random gains applied as tables in OpenCV's HSV space."""
    import cv2

    r = np.random.uniform(-1, 1, 3) * [hgain, sgain, vgain] + 1
    hue, sat, val = cv2.split(cv2.cvtColor(arr, cv2.COLOR_RGB2HSV))
    x = np.arange(0, 256, dtype=r.dtype)
    lut_hue = ((x * r[0]) % 180).astype(np.uint8)
    lut_sat = np.clip(x * r[1], 0, 255).astype(np.uint8)
    lut_val = np.clip(x * r[2], 0, 255).astype(np.uint8)
    hsv = cv2.merge((cv2.LUT(hue, lut_hue), cv2.LUT(sat, lut_sat), cv2.LUT(val, lut_val)))
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


# --- part 1: ops ------------------------------------------------------------------------------

def crops(files, n=64, size=224):
    from PIL import Image

    out = []
    for data in files[:n]:
        img = Image.open(io.BytesIO(data)).convert("RGB")
        s = min(img.size)
        out.append(np.asarray(img.crop((0, 0, s, s)).resize((size, size), Image.BILINEAR)))
    return out


def op_table():
    """(name, stoker fn, Pillow fn, albumentations fn) on one uint8 HWC array."""
    import albumentations as A
    import cv2
    from PIL import Image, ImageEnhance, ImageFilter, ImageOps
    from stoker import _testing

    def pil(fn):
        return lambda a: np.asarray(fn(Image.fromarray(a)))

    def alb(t):
        return lambda a: t(image=a)["image"]

    fwd = np.array(_testing.augment_affine(15.0, 10, -5, 1.1, 8.0, 0.0, 112, 112)).reshape(3, 3)
    inv = np.linalg.inv(fwd).ravel().tolist()
    rot = np.array(_testing.augment_affine(-15.0, 0, 0, 1, 0, 0, 112, 112)).reshape(3, 3)
    rot_inv = np.linalg.inv(rot).ravel().tolist()
    start = [(0, 0), (223, 0), (223, 223), (0, 223)]
    end = [(20, 10), (210, 5), (220, 215), (8, 200)]
    coeffs = _testing.augment_perspective_coeffs(start, end)
    jitter = [("brightness", 1.2), ("contrast", 0.8), ("saturation", 1.3), ("hue", 0.05)]

    def pil_jitter(img):
        img = ImageEnhance.Brightness(img).enhance(1.2)
        img = ImageEnhance.Contrast(img).enhance(0.8)
        img = ImageEnhance.Color(img).enhance(1.3)
        h, s, v = img.convert("HSV").split()
        h = h.point(lambda x: (x + int(0.05 * 255)) % 256)
        return Image.merge("HSV", (h, s, v)).convert("RGB")

    def stoker_erase(a):
        x = np.ones((3, 224, 224), np.float32)
        _testing.augment_erase(x, True, (30, 40, 100, 80), None, 1)
        return x

    def np_erase(a):
        x = np.ones((3, 224, 224), np.float32)
        x[:, 40:120, 30:130] = np.random.standard_normal((3, 80, 100))
        return x

    return [
        ("brightness", lambda a: _testing.augment_color(a, [("brightness", 1.3)]),
         pil(lambda i: ImageEnhance.Brightness(i).enhance(1.3)),
         alb(A.ColorJitter(brightness=(1.3, 1.3), contrast=0, saturation=0, hue=0, p=1))),
        ("contrast", lambda a: _testing.augment_color(a, [("contrast", 1.3)]),
         pil(lambda i: ImageEnhance.Contrast(i).enhance(1.3)),
         alb(A.ColorJitter(brightness=0, contrast=(1.3, 1.3), saturation=0, hue=0, p=1))),
        ("saturation", lambda a: _testing.augment_color(a, [("saturation", 1.3)]),
         pil(lambda i: ImageEnhance.Color(i).enhance(1.3)),
         alb(A.ColorJitter(brightness=0, contrast=0, saturation=(1.3, 1.3), hue=0, p=1))),
        ("hue", lambda a: _testing.augment_color(a, [("hue", 0.05)]),
         pil(lambda i: Image.merge("HSV", [i.convert("HSV").split()[0].point(
             lambda x: (x + 12) % 256)] + list(i.convert("HSV").split()[1:])).convert("RGB")),
         alb(A.ColorJitter(brightness=0, contrast=0, saturation=0, hue=(0.05, 0.05), p=1))),
        ("ColorJitter (4 factors)", lambda a: _testing.augment_color(a, jitter), pil(pil_jitter),
         alb(A.ColorJitter(brightness=0.2, contrast=0.2, saturation=0.3, hue=0.05, p=1))),
        ("grayscale", lambda a: _testing.augment_color(a, [("grayscale", 0)]),
         pil(lambda i: i.convert("L").convert("RGB")), alb(A.ToGray(num_output_channels=3, p=1))),
        ("posterize", lambda a: _testing.augment_color(a, [("posterize", 4)]),
         pil(lambda i: ImageOps.posterize(i, 4)), alb(A.Posterize(num_bits=4, p=1))),
        ("solarize", lambda a: _testing.augment_color(a, [("solarize", 128.0)]),
         pil(lambda i: ImageOps.solarize(i, 128)),
         alb(A.Solarize(threshold_range=(0.5, 0.5), p=1))),
        ("equalize", lambda a: _testing.augment_color(a, [("equalize", 0)]),
         pil(ImageOps.equalize), alb(A.Equalize(p=1))),
        ("autocontrast", lambda a: _testing.augment_color(a, [("autocontrast", 0)]),
         pil(ImageOps.autocontrast), alb(A.AutoContrast(p=1))),
        ("sharpness", lambda a: _testing.augment_color(a, [("sharpness", 1.8)]),
         pil(lambda i: ImageEnhance.Sharpness(i).enhance(1.8)),
         alb(A.Sharpen(alpha=(0.5, 0.5), lightness=(1.0, 1.0), p=1))),
        ("invert", lambda a: _testing.augment_color(a, [("invert", 0)]), pil(ImageOps.invert),
         alb(A.InvertImg(p=1))),
        ("GaussianBlur(23, sigma 2)", lambda a: _testing.augment_blur(a, 23, 23, 2.0, 2.0),
         pil(lambda i: i.filter(ImageFilter.GaussianBlur(2.0))),
         alb(A.GaussianBlur(blur_limit=(23, 23), sigma_limit=(2.0, 2.0), p=1))),
        ("rotate 15 (nearest)",
         lambda a: _testing.augment_warp(a, rot_inv, "nearest", None, 224, 224),
         pil(lambda i: i.rotate(15)),
         alb(A.Rotate(limit=(15, 15), interpolation=cv2.INTER_NEAREST, border_mode=0, p=1))),
        ("affine (bilinear)", lambda a: _testing.augment_warp(a, inv, "bilinear", [0], 224, 224),
         pil(lambda i: pil_affine(i, 15.0, (10, -5), 1.1, (8.0, 0.0), resample=2)),
         alb(A.Affine(rotate=(15, 15), scale=(1.1, 1.1), shear={"x": (8, 8), "y": (0, 0)},
                      translate_px={"x": (10, 10), "y": (-5, -5)}, p=1))),
        ("perspective (bilinear)",
         lambda a: _testing.augment_warp(a, list(coeffs) + [1.0], "bilinear", [0], 224, 224),
         pil(lambda i: i.transform(i.size, Image.PERSPECTIVE, coeffs, Image.BILINEAR)),
         alb(A.Perspective(scale=(0.05, 0.05), p=1))),
        ("pad 16 reflect", lambda a: _testing.augment_window(a, -16, -16, 256, 256, "reflect"),
         lambda a: np.pad(a, ((16, 16), (16, 16), (0, 0)), mode="reflect"),
         alb(A.PadIfNeeded(256, 256, border_mode=cv2.BORDER_REFLECT_101, p=1))),
        ("HSV jitter (YOLO's gains)", lambda a: _testing.augment_hsv(a, 1.01, 1.3, 0.8),
         lambda a: ultralytics_hsv(a, (1.01, 1.3, 0.8)),
         alb(A.HueSaturationValue(hue_shift_limit=(2, 2), sat_shift_limit=(50, 50),
                                  val_shift_limit=(-30, -30), p=1))),
        ("RandomErasing noise (float CHW)", stoker_erase, np_erase, np_erase),
        ("RandAugment(2, 9)",
         lambda a: _testing.augment_auto(a, "rand", 2, 9, 31, "nearest", None,
                                      random.getrandbits(32))[0],
         pil(pil_rand_augment), alb(albumentations_rand_augment())),
    ]


def ultralytics_hsv(arr, gains):
    """ultralytics' augment_hsv with fixed gains: OpenCV's 8-bit HSV and three tables."""
    import cv2

    hue, sat, val = cv2.split(cv2.cvtColor(arr, cv2.COLOR_RGB2HSV))
    x = np.arange(0, 256, dtype=np.float64)
    luts = [((x * gains[0]) % 180).astype(np.uint8),
            np.clip(x * gains[1], 0, 255).astype(np.uint8),
            np.clip(x * gains[2], 0, 255).astype(np.uint8)]
    hsv = cv2.merge([cv2.LUT(c, t) for c, t in zip((hue, sat, val), luts)])
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def run_batch_mixes(rounds, batch=64):
    """MixUp and CutMix on a float32 NCHW batch: stoker's kernel (what the workers run in
    BatchWork::finish) against timm's torch code on the same batch, one thread."""
    import torch
    from stoker import _testing

    torch.set_num_threads(1)
    x = torch.rand(batch, 3, 224, 224)
    labels = np.arange(batch) % 1000

    def timm_mixup():
        y = x.clone()
        lam = float(np.random.beta(0.8, 0.8))
        y.mul_(lam).add_(y.flip(0).mul_(1.0 - lam))
        return y

    def timm_cutmix():
        y = x.clone()
        y[:, :, 50:150, 60:180] = y.flip(0)[:, :, 50:150, 60:180]
        return y

    def stoker_mix(kind):
        params = (1.0, 1.0, 0.0)
        return lambda: _testing.augment_mix(x.numpy().copy(), labels, 1000,
                                         params if kind == "mixup" else None,
                                         params if kind == "cutmix" else None, 0.5, True,
                                         random.getrandbits(32))

    print(f"\nbatch mixes: microseconds per {batch}x3x224x224 float32 batch (incl. one copy), "
          f"one thread, median of {rounds} rounds")
    for name, mine, peer in (("MixUp", stoker_mix("mixup"), timm_mixup),
                             ("CutMix", stoker_mix("cutmix"), timm_cutmix)):
        t = {"stoker": [], "timm": []}
        for _ in range(rounds):
            for key, fn in (("stoker", mine), ("timm", peer)):
                t0 = time.perf_counter()
                fn()
                t[key].append((time.perf_counter() - t0) * 1e6)
        med = {k: statistics.median(v) for k, v in t.items()}
        print(f"  {name:<8}stoker {med['stoker']:9.0f}  timm (torch) {med['timm']:9.0f}  "
              f"{med['timm'] / med['stoker']:6.2f}x")


def albumentations_rand_augment():
    """RandAugment(2, 9) in albumentations' terms: two of the 14 ops, each at magnitude 9/30."""
    import albumentations as A

    m = 9 / 30
    shear = math.degrees(math.atan(0.3 * m))
    ops = [
        A.NoOp(),
        A.Affine(shear={"x": (-shear, shear), "y": (0, 0)}, p=1),
        A.Affine(shear={"x": (0, 0), "y": (-shear, shear)}, p=1),
        A.Affine(translate_percent={"x": (-150 / 331 * m, 150 / 331 * m), "y": (0, 0)}, p=1),
        A.Affine(translate_percent={"x": (0, 0), "y": (-150 / 331 * m, 150 / 331 * m)}, p=1),
        A.Rotate(limit=(30 * m, 30 * m), border_mode=0, p=1),
        A.RandomBrightnessContrast(brightness_limit=(0.9 * m, 0.9 * m), contrast_limit=0, p=1),
        A.ColorJitter(brightness=0, contrast=0, saturation=(1 + 0.9 * m,) * 2, hue=0, p=1),
        A.RandomBrightnessContrast(brightness_limit=0, contrast_limit=(0.9 * m, 0.9 * m), p=1),
        A.Sharpen(p=1),
        A.Posterize(num_bits=7, p=1),
        A.Solarize(threshold_range=(1 - m, 1 - m), p=1),
        A.AutoContrast(p=1),
        A.Equalize(p=1),
    ]
    return A.SomeOf(ops, n=2, p=1)


def time_op(fn, imgs, rounds):
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for a in imgs:
            fn(a)
        per.append((time.perf_counter() - t0) / len(imgs) * 1e6)
    return per


def run_ops(files, rounds):
    import cv2

    cv2.setNumThreads(1)
    imgs = crops(files)
    table = op_table()
    print(f"\nops: microseconds per 224x224 RGB image, one thread, median of {rounds} rounds "
          "(interleaved)")
    print(f"  {'op':<32}{'stoker':>9}{'Pillow':>9}{'albument.':>10}  stoker vs best peer")
    for name, s, p, a in table:
        times = {"stoker": [], "pil": [], "alb": []}
        for _ in range(rounds):  # interleaved: noise hits all three alike
            for key, fn in (("stoker", s), ("pil", p), ("alb", a)):
                times[key] += time_op(fn, imgs, 1)
        med = {k: statistics.median(v) for k, v in times.items()}
        best_peer = min(med["pil"], med["alb"])
        print(f"  {name:<32}{med['stoker']:>9.0f}{med['pil']:>9.0f}{med['alb']:>10.0f}  "
              f"{best_peer / med['stoker']:6.2f}x")


# --- part 2: recipes ----------------------------------------------------------------------------

class TimmPeer:
    """JPEG file -> tensor as the timm-style recipe, with Pillow or albumentations."""

    def __init__(self, paths, backend):
        self.paths, self.backend = paths, backend
        self.alb = None

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import torch

        with open(self.paths[i], "rb") as f:
            data = f.read()
        if self.backend == "pil":
            from PIL import Image
            from stoker.bench import rrc_params

            img = Image.open(io.BytesIO(data)).convert("RGB")
            top, left, h, w = rrc_params(*img.size)
            img = img.crop((left, top, left + w, top + h)).resize((224, 224), Image.BILINEAR)
            if random.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            x = np_normalize(np.asarray(pil_rand_augment(img)))
        else:
            import albumentations as A
            import cv2

            if self.alb is None:
                self.alb = A.Compose([A.RandomResizedCrop(size=(224, 224)), A.HorizontalFlip(),
                                      albumentations_rand_augment(),
                                      A.Normalize(mean=MEAN, std=STD)])
            arr = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR),
                               cv2.COLOR_BGR2RGB)
            x = self.alb(image=arr)["image"]
        x = np_random_erasing(np.ascontiguousarray(x))
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


class YoloPeer:
    """JPEG file + boxes -> letterboxed 640 image, HSV jitter, flip; boxes follow."""

    def __init__(self, paths, labels, backend):
        self.paths, self.labels, self.backend = paths, labels, backend
        self.alb = None

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import torch

        with open(self.paths[i], "rb") as f:
            data = f.read()
        boxes, classes = self.labels[i]
        if self.backend == "pil":
            from PIL import Image

            img = Image.open(io.BytesIO(data)).convert("RGB")
            r, nw, nh, left, top = letterbox_geometry(*img.size)
            canvas = Image.new("RGB", (640, 640), (114, 114, 114))
            canvas.paste(img.resize((nw, nh), Image.BILINEAR), (left, top))
            arr = np_hsv_jitter(np.asarray(canvas))
            b = boxes * np.float32([nw, nh, nw, nh])  # cxcywh, pixels of the resized image
            b[:, 0] += left
            b[:, 1] += top
            if random.random() < 0.5:
                arr = arr[:, ::-1]
                b[:, 0] = 640 - b[:, 0]
            out_boxes, out_classes = b / 640, classes
        else:
            import albumentations as A
            import cv2

            if self.alb is None:
                self.alb = A.Compose(
                    [A.LongestMaxSize(640), A.PadIfNeeded(640, 640, border_mode=cv2.BORDER_CONSTANT,
                                                          fill=(114, 114, 114)),
                     A.HueSaturationValue(hue_shift_limit=3, sat_shift_limit=70,
                                          val_shift_limit=40, p=1),
                     A.HorizontalFlip()],
                    bbox_params=A.BboxParams(format="yolo", label_fields=["classes"]))
            arr = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR),
                               cv2.COLOR_BGR2RGB)
            out = self.alb(image=arr, bboxes=boxes, classes=classes)
            arr, out_boxes, out_classes = out["image"], out["bboxes"], out["classes"]
        return (torch.from_numpy(np.ascontiguousarray(arr)),
                torch.as_tensor(np.asarray(out_boxes, np.float32).reshape(-1, 4)),
                torch.as_tensor(np.asarray(out_classes, np.int64)))


class MosaicPeer:
    """JPEG file + boxes, and three more drawn at random -> albumentations' Mosaic (640),
    Affine, HSV, flip, letterboxed 640 (a no-op on 640x640); boxes follow."""

    def __init__(self, paths, labels):
        self.paths, self.labels = paths, labels
        self.alb = None

    def __len__(self):
        return len(self.paths)

    def _load(self, i):
        import cv2

        with open(self.paths[i], "rb") as f:
            data = f.read()
        img = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR),
                           cv2.COLOR_BGR2RGB)
        return img, self.labels[i][0], self.labels[i][1]

    def __getitem__(self, i):
        import albumentations as A
        import cv2
        import torch

        if self.alb is None:
            self.alb = A.Compose(
                [A.Mosaic(grid_yx=(2, 2), target_size=(640, 640), cell_shape=(640, 640),
                          center_range=(0.25, 0.75), fit_mode="contain", fill=114, p=1.0),
                 A.Affine(scale=(0.5, 1.5), translate_percent=(-0.1, 0.1),
                          border_mode=cv2.BORDER_CONSTANT, fill=114, p=1.0),
                 A.HueSaturationValue(hue_shift_limit=3, sat_shift_limit=70, val_shift_limit=40,
                                      p=1),
                 A.HorizontalFlip(), A.LongestMaxSize(640),
                 A.PadIfNeeded(640, 640, border_mode=cv2.BORDER_CONSTANT, fill=(114, 114, 114))],
                bbox_params=A.BboxParams(format="yolo", label_fields=["classes"]))
        img, boxes, classes = self._load(i)
        meta = []
        for j in np.random.randint(0, len(self.paths), 3):
            im, b, c = self._load(int(j))
            meta.append({"image": im, "bboxes": b, "classes": c})
        out = self.alb(image=img, bboxes=boxes, classes=classes, mosaic_metadata=meta)
        return (torch.from_numpy(np.ascontiguousarray(out["image"])),
                torch.as_tensor(np.asarray(out["bboxes"], np.float32).reshape(-1, 4)),
                torch.as_tensor(np.asarray(out["classes"], np.int64)))


def yolo_collate(samples):
    """Images stacked; boxes and classes padded to the longest, with lengths (as stoker)."""
    import torch

    imgs = torch.stack([s[0] for s in samples])
    n = max(len(s[1]) for s in samples)
    boxes = torch.zeros(len(samples), n, 4)
    classes = torch.full((len(samples), n), -1, dtype=torch.int64)
    for i, (_, b, c) in enumerate(samples):
        boxes[i, :len(b)] = b
        classes[i, :len(c)] = c
    return imgs, boxes, classes, torch.tensor([len(s[1]) for s in samples])


def synthetic_labels(n, seed=0):
    """1-8 YOLO boxes (normalised cxcywh) and classes per image."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 9))
        wh = rng.uniform(0.05, 0.5, (k, 2))
        c = rng.uniform(wh / 2, 1 - wh / 2)
        out.append((np.concatenate([c, wh], 1).astype(np.float32),
                    rng.integers(0, 80, k).astype(np.int64)))
    return out


def _timed_epochs(loader, epochs, paths, count, set_epoch=None):
    """Images/s over `epochs` epochs of `loader` after one untimed epoch: the steady
    state a training run sees (start-up, such as forking workers or the first touch of
    new batch buffers, is in the first epoch, not here)."""
    for e in range(epochs + 1):
        if set_epoch is not None:
            set_epoch(e)
        if e == 1:
            warm(paths)  # the files are in the page cache for the timed epochs
            t0 = time.perf_counter()
            n = 0
        for batch in loader:
            if e:
                n += count(batch)
    return n / (time.perf_counter() - t0)


def time_dataloader(dataset, batch_size, workers, paths, epochs, collate=None):
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                         num_workers=workers, collate_fn=collate,
                                         persistent_workers=workers > 0)
    warm(paths)
    return _timed_epochs(loader, epochs, paths, lambda batch: len(
        batch[0]) if isinstance(batch, (tuple, list)) else len(batch))


def time_stoker(path, shards, batch_size, transforms, epoch, epochs, **kw):
    import stoker

    loader = stoker.Loader(stoker.Dataset(path), batch_size=batch_size, shuffle=True, seed=0,
                           transforms=transforms, stall_warning=None, **kw)
    warm(shards)
    try:
        return _timed_epochs(loader, epochs, shards, lambda batch: len(batch["image"]),
                             lambda e: loader.set_epoch(epoch * 100 + e))
    finally:
        loader.close()


RECIPES = ("rrc", "timm", "yolo", "mosaic")


def run_recipes(paths, files, batch_size, repeats, workers, epochs, only=RECIPES):
    import stoker

    ops = stoker.ops
    labels = synthetic_labels(len(files))
    timm = [ops.RandomResizedCrop(224), ops.RandomHorizontalFlip(), ops.RandAugment(2, 9),
            ops.Normalize(MEAN, STD), ops.RandomErasing(p=0.25, value="random")]
    rrc = [ops.RandomResizedCrop(224), ops.RandomHorizontalFlip()]
    # boxes and their classes follow the image (a transform group)
    yolo = {("image", "boxes", "classes"): [
        ops.Letterbox(640), ops.HSVJitter(0.015, 0.7, 0.4), ops.RandomHorizontalFlip()]}
    # ultralytics' train transforms: the mosaic's 1280 canvas, its affine warp written only
    # where the 640 centre crop keeps it (NOTE [ Lazy warps ]), HSV, flip, letterbox
    mosaic = {("image", "boxes", "classes"): [
        ops.Mosaic(640), ops.RandomAffine(0, translate=(0.1, 0.1), scale=(0.5, 1.5),
                                          interpolation="bilinear", fill=114),
        ops.CenterCrop(640), ops.HSVJitter(0.015, 0.7, 0.4), ops.RandomHorizontalFlip(),
        ops.Letterbox(640)]}
    results = {}
    rounds = iter(range(10_000))
    with tempfile.TemporaryDirectory(prefix="stoker-bench-") as tmp:
        path = os.path.join(tmp, "ds")
        fields = {"image": stoker.image(), "label": stoker.scalar("int64"),
                  "boxes": stoker.boxes("cxcywh", normalized=True),
                  "classes": stoker.ndarray("int64", (None,))}
        with stoker.ShardWriter(path, fields) as w:
            for i, data in enumerate(files):
                w.write({"image": data, "label": i % 1000, "boxes": labels[i][0],
                         "classes": labels[i][1]})
        ds = stoker.Dataset(path)
        shards = [os.path.join(ds.path, s["path"]) for s in ds.shards]
        contenders = [("rrc", "stoker RRC+flip", {"image": rrc}),
                      ("timm", "stoker timm-style", {"image": timm}),
                      ("yolo", "stoker YOLO-style", yolo), ("mosaic", "stoker YOLO-mosaic", mosaic)]
        for _ in range(repeats):  # interleaved rounds; medians below
            for recipe, name, tf in contenders:
                if recipe not in only:
                    continue
                # the dataset has boxes: the image-only recipes leave them as stored
                kw = {"pad_values": {"classes": -1}} if "YOLO" in name else \
                    {"as_stored": ["boxes", "classes"]}
                results.setdefault(name, []).append(
                    time_stoker(path, shards, batch_size, tf, next(rounds), epochs, **kw))
            for backend, label in (("pil", "Pillow"), ("alb", "albumentations")):
                for wk in workers:
                    if "timm" in only:
                        results.setdefault(f"DataLoader+{label} timm-style workers={wk}",
                                           []).append(
                            time_dataloader(TimmPeer(paths, backend), batch_size, wk, paths,
                                            epochs))
                    if "yolo" in only:
                        results.setdefault(f"DataLoader+{label} YOLO-style workers={wk}",
                                           []).append(
                            time_dataloader(YoloPeer(paths, labels, backend), batch_size, wk,
                                            paths, epochs, yolo_collate))
            for wk in workers if "mosaic" in only else ():
                results.setdefault(f"DataLoader+albumentations YOLO-mosaic workers={wk}",
                                   []).append(
                    time_dataloader(MosaicPeer(paths, labels), batch_size, wk, paths, epochs,
                                    yolo_collate))
    med = {k: statistics.median(v) for k, v in results.items()}
    width = max(map(len, med))
    print(f"\nrecipes: images/s over {epochs} epochs after an untimed one, median of {repeats} "
          f"interleaved rounds, batch {batch_size}")
    for k, v in med.items():
        print(f"  {k:<{width}}  {v:8.0f}")
    if "timm" in only:
        best_timm = max(v for k, v in med.items() if "timm" in k and k.startswith("DataLoader"))
        print(f"timm-style: stoker / best DataLoader peer = "
              f"{med['stoker timm-style'] / best_timm:.2f}x (target >= 2)")
    if "timm" in only and "rrc" in only:
        print(f"timm-style: stoker / stoker RRC+flip = "
              f"{med['stoker timm-style'] / med['stoker RRC+flip']:.2f} (target >= 0.75)")
    if "yolo" in only:
        best_yolo = max(v for k, v in med.items() if "YOLO-style" in k and k.startswith("Data"))
        print(f"YOLO-style: stoker / best DataLoader peer = "
              f"{med['stoker YOLO-style'] / best_yolo:.2f}x (target >= 2)")
    if "mosaic" in only:
        best_mosaic = max(v for k, v in med.items() if "mosaic" in k and k.startswith("Data"))
        print(f"YOLO-mosaic: stoker / best DataLoader peer = "
              f"{med['stoker YOLO-mosaic'] / best_mosaic:.2f}x (target >= 2)")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("images", help="folder of JPEGs (bench/make_jpegs.py)")
    p.add_argument("--ops", action="store_true", help="only the per-op part")
    p.add_argument("--recipes", action="store_true", help="only the recipes")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians)")
    p.add_argument("--rounds", type=int, default=5, help="ops: rounds per op")
    p.add_argument("--limit", type=int, default=None, help="use the first N images")
    p.add_argument("--workers", default="0,1,2", help="DataLoader num_workers to try")
    p.add_argument("--only", default=",".join(RECIPES),
                   help=f"recipes: which to run, of {','.join(RECIPES)}")
    p.add_argument("--epochs", type=int, default=2,
                   help="recipes: timed epochs per loader, after an untimed one")
    args = p.parse_args()
    if args.epochs < 1:
        p.error("--epochs must be at least 1")
    paths = sorted(glob.glob(os.path.join(args.images, "*.jp*g")))[: args.limit]
    if not paths:
        sys.exit(f"no JPEGs in {args.images}: run bench/make_jpegs.py first")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    files = read_files(paths)
    print(f"{len(files)} JPEGs, {sum(map(len, files)) / len(files) / 1e3:.0f} kB each, "
          f"{cores} cores")
    both = not args.ops and not args.recipes
    if args.ops or both:
        run_ops(files, args.rounds)
        run_batch_mixes(args.rounds)
    if args.recipes or both:
        run_recipes(paths, files, args.batch_size, args.repeats,
                    [int(w) for w in args.workers.split(",")], args.epochs,
                    tuple(args.only.split(",")))


if __name__ == "__main__":
    main()
