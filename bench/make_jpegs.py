"""Synthetic photo-like JPEGs for the image benchmarks (not committed).

    python bench/make_jpegs.py OUT_DIR [--n 2000] [--quality 90] [--seed 0]

Each image: smooth colour gradients and low-frequency waves, a few filled shapes with
soft edges, and sensor-like noise, so that it compresses like a photo (a few bits per
pixel at quality 90, 4:2:0). Short side 300-500 pixels, aspect 3:4 to 16:9 either way:
the ImageNet-like range.
"""

import argparse
import os
import sys

import numpy as np


def make_image(rng: np.random.Generator) -> np.ndarray:
    short = int(rng.integers(300, 501))
    aspect = float(rng.uniform(4 / 3, 16 / 9))
    long_ = int(short * aspect)
    h, w = (short, long_) if rng.random() < 0.7 else (long_, short)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    base = rng.uniform(40, 200, 3)
    gx, gy = rng.uniform(-0.25, 0.25, (2, 3))
    for c in range(3):
        fx, fy, ph = rng.uniform(0.005, 0.03), rng.uniform(0.005, 0.03), rng.uniform(0, 6.3)
        img[..., c] = (base[c] + gx[c] * x + gy[c] * y
                       + 30 * np.sin(fx * x + ph) * np.cos(fy * y - ph))
    for _ in range(int(rng.integers(3, 9))):  # shapes: ellipses and rectangles, soft edges
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(15, w / 3), rng.uniform(15, h / 3)
        colour = rng.uniform(0, 255, 3)
        if rng.random() < 0.5:
            d = ((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2
        else:
            d = np.maximum(np.abs(x - cx) / rx, np.abs(y - cy) / ry)
        alpha = np.clip((1.0 - d) * 8, 0, 1)[..., None] * rng.uniform(0.5, 0.9)
        img = img * (1 - alpha) + colour * alpha
    img += rng.normal(0, 4, img.shape).astype(np.float32)  # sensor noise / texture
    return np.clip(img, 0, 255).astype(np.uint8)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from PIL import Image

    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    total = 0
    for i in range(args.n):
        path = os.path.join(args.out, f"{i:06d}.jpg")
        Image.fromarray(make_image(rng)).save(path, format="JPEG", quality=args.quality)
        total += os.path.getsize(path)
        if i % 100 == 0 or i == args.n - 1:
            print(f"\r{i + 1}/{args.n} images, {total / 1e6:.1f} MB", end="", file=sys.stderr)
    print(f"\nwrote {args.n} JPEGs ({total / args.n / 1e3:.0f} kB each) to {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
