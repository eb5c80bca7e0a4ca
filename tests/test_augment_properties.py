"""Properties of transform groups: random compositions of every geometric op keep the
image, its mask, its boxes (with their class rows) and its keypoints on the same pixels.

Each example paints a scene whose targets are known exactly: a gray background (label 1)
and a few axis-aligned rectangles of saturated colours (labels 2, 3, ...), each with its box
(the rectangle itself), its class row (its label) and a keypoint at its centre. A random
composition of 2 to 5 geometric ops (every op that moves pixels, over its parameter
ranges) runs on it through one transform group, and the output is held to what the image
shows, pixel by pixel:

- the mask's label is the class of the image's colour wherever the colour is unambiguous
  (not a blend), away from the mask's label edges: fill where the image shows fill, an
  object's label where it shows the object;
- each kept box encloses the visible pixels of its object (its row's class) and is their
  bounding box, since an object fills its box: rectangles stay convex polygons under
  every op, so the box of what is left of one is the box of its visible pixels;
- an object with many visible pixels keeps its box; one with none has no box, or a sliver;
- a visible keypoint lies on its object.

"Edges" are a band around label edges and a tolerance on boxes of 2 pixels, plus the
largest magnification the ops can make (a nearest-neighbour warp rounds to the pixels of
its stage, which a later enlargement magnifies; bilinear and antialiased resamples blend
colours, which are left out as ambiguous).

The default run is a few hundred derandomised examples (seconds); STOKER_SOAK_FULL=1 runs
many more, with fresh randomness. A failure shrinks to the smallest composition
(hypothesis) and prints it.
"""

from __future__ import annotations

import itertools
import math
import os
import warnings

import cv2
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from conftest import native_testing, png  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from stoker import ops as T  # noqa: E402

_testing = native_testing()  # the test-only entry points (tests/ext/)

# hypothesis' pytest plugin imports its patch writer (libcst) to report a failure, and that
# import warns (warnings are errors here): import it now, quietly.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import hypothesis.extra._patching  # noqa: F401
    except ImportError:
        pass

FULL = os.environ.get("STOKER_SOAK_FULL") == "1"

BACKGROUND = (100, 100, 100)
FILL = (0, 0, 0)
# 6 object colours (the scene's 3 objects, and a mosaic's other samples' one each): two
# levels per channel, so that a blend of two colours is never near a third, and no gray,
# which a blend of the fill and the background would look like
COLOURS = [c for c in itertools.product((30, 230), repeat=3) if len(set(c)) > 1]
MASK_FILL = 255
# Colour classes: 0 fill, 1 background, 2.. objects; a pixel farther than this from every
# colour (largest channel difference) is a blend, left out. Fill is held closer: a pixel
# mostly fill at the edge of what is left of the image is a blend with fill, which takes
# the bilinear warps' taps from both sides of the edge.
PALETTE = np.array([FILL, BACKGROUND] + COLOURS, np.int16)
NEAR = np.array([12] + [40] * (len(PALETTE) - 1), np.int16)



# -- scenes ---------------------------------------------------------------------------------

@st.composite
def scenes(draw, first_label=2, most=3):
    """(image, mask, boxes xyxy, classes, keypoints): 1 to `most` rectangles on a grid of
    cells, so that they never overlap, labelled from `first_label` (a mosaic's other samples
    get labels of their own)."""
    h = draw(st.integers(40, 112))
    w = draw(st.integers(40, 112))
    img = np.empty((h, w, 3), np.uint8)
    img[:] = BACKGROUND
    mask = np.ones((h, w), np.uint8)
    n = draw(st.integers(1, most))
    cells = draw(st.permutations(range(4)))[:n]
    boxes, classes, kps = [], [], []
    for k, cell in enumerate(cells):
        cy, cx = divmod(cell, 2)
        y0, x0, ch, cw = cy * h // 2, cx * w // 2, h // 2, w // 2
        bh = draw(st.integers(6, ch - 2))
        bw = draw(st.integers(6, cw - 2))
        y1 = y0 + draw(st.integers(1, ch - bh - 1))
        x1 = x0 + draw(st.integers(1, cw - bw - 1))
        label = first_label + k
        img[y1:y1 + bh, x1:x1 + bw] = COLOURS[label - 2]
        mask[y1:y1 + bh, x1:x1 + bw] = label
        boxes.append([x1, y1, x1 + bw, y1 + bh])
        classes.append(label)
        # the centre, as a pixel index (x of a pixel's column)
        kps.append([[x1 + (bw - 1) / 2, y1 + (bh - 1) / 2, 2]])
    return (img, mask, np.array(boxes, np.float32), np.array(classes, np.int64),
            np.array(kps, np.float32))


# -- compositions ---------------------------------------------------------------------------

SIDE = st.integers(24, 96)
P = st.sampled_from([0.0, 0.5, 1.0])
INTERP = st.sampled_from(["nearest", "bilinear"])


def _size(draw):
    return draw(st.one_of(SIDE, st.tuples(SIDE, SIDE)))


def _hw(size):
    return (size, size) if isinstance(size, int) else size


@st.composite
def random_resized_crop(draw):
    size = _size(draw)
    lo = draw(st.floats(0.1, 1.0))
    hi = draw(st.floats(lo, 1.0))
    rlo = draw(st.floats(0.5, 1.0))
    rhi = draw(st.floats(1.0, 2.0))
    return T.RandomResizedCrop(size, scale=(lo, hi), ratio=(rlo, rhi))


@st.composite
def resize(draw):
    kind = draw(st.sampled_from(["hw", "shorter", "max"]))
    if kind == "hw":
        return T.Resize(draw(st.tuples(SIDE, SIDE)))
    s = draw(SIDE)
    if kind == "shorter":
        return T.Resize(s, max_size=draw(st.one_of(st.none(), st.integers(s + 1, 160))))
    return T.Resize(None, max_size=s)


@st.composite
def center_crop(draw):
    return T.CenterCrop(draw(st.one_of(st.integers(16, 128),
                                       st.tuples(st.integers(16, 128), st.integers(16, 128)))))


@st.composite
def random_crop(draw):
    pad = draw(st.one_of(st.integers(0, 16), st.tuples(st.integers(0, 16), st.integers(0, 16)),
                         st.tuples(*[st.integers(0, 16)] * 4)))
    if draw(st.booleans()):
        return T.RandomCrop(_size(draw), padding=pad, pad_if_needed=True, fill=FILL,
                            mask_fill=MASK_FILL)
    # too large for the image, it is refused (the example is then left out)
    return T.RandomCrop(draw(st.integers(8, 24)), padding=pad, fill=FILL, mask_fill=MASK_FILL)


@st.composite
def pad(draw):
    padding = draw(st.one_of(st.integers(0, 16), st.tuples(*[st.integers(0, 16)] * 4)))
    return T.Pad(padding, fill=FILL, mask_fill=MASK_FILL)


@st.composite
def flip(draw):
    op = draw(st.sampled_from([T.RandomHorizontalFlip, T.RandomVerticalFlip]))
    return op(draw(P))


@st.composite
def letterbox(draw):
    return T.Letterbox(_size(draw), fill=FILL, mask_fill=MASK_FILL, scaleup=draw(st.booleans()))


def _degrees(draw):
    return draw(st.one_of(st.floats(0, 180), st.tuples(st.floats(-180, 0), st.floats(0, 180))))


def _center(draw):
    return draw(st.one_of(st.none(), st.tuples(st.floats(-10, 100), st.floats(-10, 100))))


@st.composite
def rotation(draw):
    expand = draw(st.booleans())
    return T.RandomRotation(_degrees(draw), interpolation=draw(INTERP), expand=expand,
                            center=None if expand else _center(draw), fill=FILL,
                            mask_fill=MASK_FILL)


@st.composite
def affine(draw):
    translate = draw(st.one_of(st.none(), st.tuples(st.floats(0, 0.4), st.floats(0, 0.4))))
    lo = draw(st.floats(0.4, 1.6))
    scale = draw(st.one_of(st.none(), st.tuples(st.just(lo), st.floats(lo, 1.8))))
    shear = draw(st.one_of(st.none(), st.floats(0, 30),
                           st.tuples(st.floats(-30, 0), st.floats(0, 30)),
                           st.tuples(st.floats(-30, 0), st.floats(0, 30), st.floats(-30, 0),
                                     st.floats(0, 30))))
    return T.RandomAffine(_degrees(draw), translate=translate, scale=scale, shear=shear,
                          interpolation=draw(INTERP), fill=FILL, center=_center(draw),
                          mask_fill=MASK_FILL)


@st.composite
def perspective(draw):
    return T.RandomPerspective(draw(st.floats(0, 0.6)), p=draw(st.sampled_from([0.5, 1.0])),
                               interpolation=draw(INTERP), fill=FILL, mask_fill=MASK_FILL)


@st.composite
def mosaic(draw):
    lo = draw(st.floats(0.25, 1.0))
    return T.Mosaic(draw(st.one_of(st.integers(24, 64), st.tuples(st.integers(24, 64),
                                                                    st.integers(24, 64)))),
                    center=(lo, draw(st.floats(lo, 1.75))), fill=FILL, mask_fill=MASK_FILL)


GEOMETRIC = st.one_of(random_resized_crop(), resize(), center_crop(), random_crop(), pad(),
                      flip(), letterbox(), rotation(), affine(), perspective())
FIXES_SIZE = (T.RandomResizedCrop, T.CenterCrop, T.RandomCrop, T.Letterbox)


@st.composite
def compositions(draw, with_mosaic=True):
    """2 to 5 geometric ops (a rotation with expand=True followed by one that fixes the size,
    as batches need), a quarter of them after a Mosaic, sometimes SanitizeBoundingBoxes."""
    ops = draw(st.lists(GEOMETRIC, min_size=2, max_size=5))
    if with_mosaic and draw(st.integers(0, 3)) == 0:
        ops[0] = draw(mosaic())
    last_expand = max((i for i, op in enumerate(ops)
                       if isinstance(op, T.RandomRotation) and op.expand), default=-1)
    if last_expand >= 0 and not any(
            isinstance(op, FIXES_SIZE) or (isinstance(op, T.Resize) and isinstance(op.size, tuple))
            for op in ops[last_expand + 1:]):
        ops.append(draw(st.one_of(center_crop(), letterbox(), random_crop())))
    if draw(st.integers(0, 3)) == 0:
        first = 1 if isinstance(ops[0], T.Mosaic) else 0  # a Mosaic stays first
        ops.insert(draw(st.integers(first, len(ops))), T.SanitizeBoundingBoxes())
    return ops


def zoom_bound(ops, sizes) -> float:
    """How much the ops may enlarge a detail of the (h, w) images `sizes` (a mosaic's four,
    else one), at most: the product of each op's largest enlargement over the sizes its
    input may have (sizes tracked as ranges)."""
    hlo = hhi = sizes[0][0]
    wlo = whi = sizes[0][1]
    zoom = 1.0

    def resized(sh, sw, op):
        if isinstance(op.size, tuple):
            return op.size
        short, long_ = min(sh, sw), max(sh, sw)
        if op.size is None:
            ns, nl = op.max_size * short // long_, op.max_size
        else:
            ns, nl = op.size, op.size * long_ // short
            if op.max_size and nl > op.max_size:
                ns, nl = op.max_size * ns // nl, op.max_size
        ns = max(ns, 1)
        return (nl, ns) if sw <= sh else (ns, nl)

    for op in ops:
        z = 1.0
        corners = [(a, b) for a in {hlo, hhi} for b in {wlo, whi}]
        if isinstance(op, T.Mosaic):
            H, W = op.size
            z = max(min(H / h, W / w) for h, w in sizes)
            hlo = hhi = 2 * H
            wlo = whi = 2 * W
        elif isinstance(op, T.RandomResizedCrop):
            lo, _ = op.scale
            rlo, rhi = op.ratio
            area = hlo * wlo
            side = max(1, math.floor(min(math.sqrt(lo * area * rlo), math.sqrt(lo * area / rhi),
                                         hlo, wlo)))
            z = max(op.size) / side
            hlo = hhi = op.size[0]
            wlo = whi = op.size[1]
        elif isinstance(op, T.Resize):
            outs = [(resized(a, b, op), (a, b)) for a, b in corners]
            z = max(max(o[0] / i[0], o[1] / i[1]) for o, i in outs)
            hlo, hhi = min(o[0] for o, _ in outs), max(o[0] for o, _ in outs)
            wlo, whi = min(o[1] for o, _ in outs), max(o[1] for o, _ in outs)
        elif isinstance(op, (T.CenterCrop, T.RandomCrop)):
            hlo = hhi = op.size[0]
            wlo = whi = op.size[1]
        elif isinstance(op, T.Pad):
            left, top, right, bottom = op.padding
            hlo, hhi, wlo, whi = hlo + top + bottom, hhi + top + bottom, wlo + left + right, \
                whi + left + right
        elif isinstance(op, T.Letterbox):
            H, W = op.size
            z = max(min(H / a, W / b) for a, b in corners) if op.scaleup else 1.0
            hlo = hhi = H
            wlo = whi = W
        elif isinstance(op, T.RandomRotation) and op.expand:
            hhi = whi = math.ceil(1.5 * max(hhi, whi))
            hlo = wlo = min(hlo, wlo)
        elif isinstance(op, T.RandomAffine):
            # a shear stretches lengths by up to 1 / cos(shear) along each axis
            shear = max((abs(s) for s in op.shear), default=0) if op.shear else 0
            z = (op.scale[1] if op.scale else 1.0) / math.cos(math.radians(shear)) ** 2
        elif isinstance(op, T.RandomPerspective):
            z = 1.0 / (1.0 - op.distortion_scale) ** 2
        zoom *= max(1.0, z)
    return zoom


# -- the checks -------------------------------------------------------------------------------

def colour_classes(img: np.ndarray) -> np.ndarray:
    """Each pixel's colour class (0 fill, 1 background, 2.. objects), -1 for a blend."""
    d = np.abs(img[:, :, None, :].astype(np.int16) - PALETTE[None, None]).max(-1)
    cls = d.argmin(-1)
    return np.where(d.min(-1) <= NEAR[cls], cls, -1)


def uses(ops, others):
    """The samples the ops read besides the scene: a Mosaic's three."""
    return list(others) if ops and isinstance(ops[0], T.Mosaic) else []


def run(scene, ops, seed, others=()):
    """The group's output, or None where the ops refuse the sample (a RandomCrop larger than
    its image without pad_if_needed)."""
    img, mask, boxes, classes, kps = scene
    more = [dict(image=png(o[0]), mask=png(o[1]), boxes=o[2], classes=o[3], keypoints=o[4])
            for o in uses(ops, others)]
    try:
        return _testing.augment_group(png(img), png(mask), boxes, classes=classes,
                                      keypoints=kps, ops=T.op_specs(list(ops)), seed=seed,
                                      **({"others": more} if more else {}))
    except Exception as e:
        if "pad_if_needed" in str(e):
            return None
        raise


def problems(scene, ops, seed, out=None, others=()) -> list:
    """What is wrong with one composition's output, as messages (empty: all holds)."""
    read = [scene] + uses(ops, others)
    classes = np.concatenate([r[3] for r in read])
    if out is None:
        out = run(scene, ops, seed, others)
    zoom = zoom_bound(ops, [r[1].shape for r in read])
    image, omask = out["image"], out["mask"]
    H, W = omask.shape
    tol = 2 + math.ceil(min(zoom, 40))
    found = []

    # masks: the label of what the image shows, away from the mask's label edges
    cls = colour_classes(image)
    label = np.where((omask == 0) | (omask == MASK_FILL), 0, omask).astype(np.int16)
    k = np.ones((2 * tol + 1, 2 * tol + 1), np.uint8)
    interior = cv2.erode(label.astype(np.uint8), k, borderType=cv2.BORDER_REPLICATE) == \
        cv2.dilate(label.astype(np.uint8), k, borderType=cv2.BORDER_REPLICATE)
    wrong = interior & (cls >= 0) & (cls != label)
    if wrong.sum() > 2 + 0.002 * H * W:
        ys, xs = np.nonzero(wrong)
        found.append(f"mask: {int(wrong.sum())} of {H * W} pixels labelled otherwise than the "
                     f"image shows (e.g. at y={ys[0]}, x={xs[0]}: mask {int(omask[ys[0], xs[0]])}"
                     f", image class {int(cls[ys[0], xs[0]])})")

    # boxes with their class rows, and keypoints
    ob, oc, ok = out["boxes"], out["classes"], out["keypoints"]
    if not (len(ob) == len(oc) == len(ok)):
        found.append(f"rows: {len(ob)} boxes, {len(oc)} classes, {len(ok)} keypoints")
        return found
    for c in classes.tolist():
        n = int((cls == c).sum())  # pixels that show the object's colour
        # what shows the object: its colour, or its label in the mask (checked above against
        # the image; it keeps thin slivers that bilinear resampling blends away)
        ys, xs = np.nonzero((cls == c) | (omask == c))
        rows = np.nonzero(oc == c)[0]
        if len(rows) > 1:
            found.append(f"rows: class {c} in {len(rows)} rows")
            continue
        if not len(rows):
            if n > 4 * (tol + 1) ** 2:
                found.append(f"box dropped: class {c}, but {n} pixels of it are visible")
            continue
        box = np.round(ob[rows[0]], 1).tolist()
        x1, y1, x2, y2 = ob[rows[0]].tolist()
        if not (-1e-3 <= x1 <= x2 <= W + 1e-3 and -1e-3 <= y1 <= y2 <= H + 1e-3):
            found.append(f"box outside: class {c}: {box} outside the {W}x{H} output or reversed")
        if x2 - x1 <= 0 or y2 - y1 <= 0:
            found.append(f"box empty: class {c}: {box} with nothing left is kept")
        if not len(ys):
            if min(x2 - x1, y2 - y1) > tol:
                found.append(f"box phantom: class {c}: {box} kept, but nothing of the object "
                             "shows")
        else:
            # the box of what shows (pixel j covers [j, j + 1))
            vx1, vy1, vx2, vy2 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
            off = max(x1 - vx1, vx2 - x2, y1 - vy1, vy2 - y2)  # showing outside the box
            loose = max(vx1 - x1, x2 - vx2, vy1 - y1, y2 - vy2)  # box beyond what shows
            if off > tol or (len(ys) > (tol + 1) ** 2 and loose > 2 * tol + 2):
                found.append(f"box misplaced: class {c}: {box} but the object shows over "
                             f"[{vx1}, {vy1}, {vx2}, {vy2}]")
        px, py, v = ok[rows[0], 0].tolist()
        if v and min(x2 - x1, y2 - y1) >= 2:  # a smaller object blends into what is around it
            xi, yi = int(math.floor(px + 0.5)), int(math.floor(py + 0.5))
            near = cls[max(0, yi - tol):yi + tol + 1, max(0, xi - tol):xi + tol + 1]
            # an object shrunk to a few pixels may show only blends of its colour
            on = (near == c).any() or (n < (tol + 1) ** 2 and (near == -1).any())
            if not (0 <= px < W and 0 <= py < H) or not on:
                found.append(f"keypoint: class {c} at ({px:.1f}, {py:.1f}) is visible but not on "
                             "its object")
    return found


def describe(ops, seed):
    return f"seed={seed} ops=[{', '.join(repr(o) for o in ops)}]"


@settings(max_examples=3000 if FULL else 400, derandomize=not FULL, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
          print_blob=True)
@given(scene=scenes(), ops=compositions(), seed=st.integers(0, 2**63 - 1),
       others=st.tuples(scenes(5, 1), scenes(6, 1), scenes(7, 1)))
def test_random_compositions_keep_every_target_on_its_pixels(scene, ops, seed, others):
    out = run(scene, ops, seed, others)
    hypothesis.assume(out is not None)
    found = problems(scene, ops, seed, out, others)
    assert not found, describe(ops, seed) + "\n" + "\n".join(found)


def failure_rate(n: int, with_mosaic: bool = True) -> None:
    """Prints the share of n random compositions that break a property, and the kinds of
    problems: ``python tests/test_augment_properties.py N [--no-mosaic]`` (without Mosaic:
    the compositions a build before Mosaic can run)."""
    counts = {"examples": 0, "failed": 0}
    kinds: dict = {}

    @settings(max_examples=n, deadline=None, database=None,
              phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(scene=scenes(), ops=compositions(with_mosaic), seed=st.integers(0, 2**63 - 1),
           others=st.tuples(scenes(5, 1), scenes(6, 1), scenes(7, 1)))
    def one(scene, ops, seed, others):
        out = run(scene, ops, seed, others)
        if out is None:
            return
        counts["examples"] += 1
        found = problems(scene, ops, seed, out, others)
        if found:
            counts["failed"] += 1
            for f in {f.split(":")[0] for f in found}:
                kinds[f] = kinds.get(f, 0) + 1

    one()
    e, f = counts["examples"], counts["failed"]
    print(f"{f} of {e} compositions break a property ({100 * f / max(e, 1):.1f}%); "
          f"by target: {kinds}")


if __name__ == "__main__":
    import sys

    failure_rate(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, "--no-mosaic" not in sys.argv)
