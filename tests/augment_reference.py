"""Reference implementations, in NumPy, of the augmentation definitions stoker follows:
torchvision.transforms.v2's kernels on uint8 tensors (functional/_color.py, _geometry.py,
_misc.py) and its transforms' parameter rules. Written from the definitions for the tests;
not shipped, and not fast.

Conventions as torchvision's: float32 arithmetic, `.to(uint8)` truncates, `round_` is half to
even, grid_sample with align_corners=False and zero padding.
"""

import math

import numpy as np

F32 = np.float32


def _u8(x):
    return np.clip(x, 0, 255).astype(np.uint8)


def _gray_f(img):
    r, g, b = (img[..., c].astype(F32) for c in range(3))
    return r * F32(0.2989) + g * F32(0.587) + b * F32(0.114)


# --- colour -------------------------------------------------------------------------------

def brightness(img, f):
    return _u8(img.astype(F32) * F32(f))


def _blend(img, other, ratio):
    return _u8(img.astype(F32) * F32(ratio) + F32(1.0 - ratio) * other)


def contrast(img, f):
    if img.ndim == 2:
        mean = F32(img.astype(np.float64).mean())
    else:
        mean = F32(np.floor(_gray_f(img)).astype(np.float64).mean())
    return _blend(img, mean, f)


def saturation(img, f):
    if img.ndim == 2:
        return img.copy()
    gray = np.floor(_gray_f(img))[..., None]
    return _blend(img, gray, f)


def grayscale(img):
    g = _gray_f(img).astype(np.uint8)
    return np.repeat(g[..., None], 3, axis=-1)


def hue(img, shift):
    if img.ndim == 2:
        return img.copy()
    x = img.astype(F32) * F32(1.0 / 255)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    maxc = np.maximum(np.maximum(r, g), b)
    minc = np.minimum(np.minimum(r, g), b)
    eqc = maxc == minc
    cr = maxc - minc
    s = cr / np.where(eqc, F32(1), maxc)
    div = np.where(eqc, F32(1), cr)
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    hr = np.where(maxc == r, bc - gc, F32(0))
    hg = np.where((maxc == g) & (maxc != r), (rc + F32(2)) - bc, F32(0))
    hb = np.where((maxc != g) & (maxc != r), (gc + F32(4)) - rc, F32(0))
    h = np.fmod((hr + hg + hb) * F32(1.0 / 6.0) + F32(1), F32(1))
    h = np.mod(h + F32(shift), F32(1))
    h6 = h * F32(6)
    i = np.floor(h6)
    f = h6 - i
    i = i.astype(np.int32) % 6
    v = maxc
    sxf = s * f
    one_minus_s = F32(1) - s
    q = np.clip((F32(1) - sxf) * v, 0, 1)
    t = np.clip((sxf + one_minus_s) * v, 0, 1)
    p = np.clip(one_minus_s * v, 0, 1)
    vpqt = np.stack([v, p, q, t])
    select = np.array([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]])
    out = np.stack([np.take_along_axis(vpqt, select[c][i][None], 0)[0] for c in range(3)], -1)
    return (out * F32(255 + 1 - 1e-3)).astype(np.uint8)


def posterize(img, bits):
    if bits >= 8:
        return img.copy()
    return img & np.uint8(((1 << bits) - 1) << (8 - bits))


def solarize(img, threshold):
    return np.where(img.astype(F32) >= F32(threshold), 255 - img, img).astype(np.uint8)


def invert(img):
    return 255 - img


def _per_channel(img, fn):
    if img.ndim == 2:
        return fn(img)
    return np.stack([fn(img[..., c]) for c in range(img.shape[-1])], -1)


def equalize(img):
    def one(ch):
        hist = np.bincount(ch.ravel(), minlength=256)
        last = np.nonzero(hist)[0][-1]
        step = (ch.size - hist[last]) // 255
        if step == 0:
            return ch.copy()
        cum = np.cumsum(hist)
        lut = np.concatenate([[0], np.clip((cum[:-1] + step // 2) // step, 0, 255)])
        return lut.astype(np.uint8)[ch]
    return _per_channel(img, one)


def autocontrast(img):
    def one(ch):
        lo, hi = F32(ch.min()), F32(ch.max())
        if lo == hi:
            return ch.copy()
        inv = (hi - lo) * F32(1.0 / 255)
        return _u8((ch.astype(F32) - lo) / inv)
    return _per_channel(img, one)


def sharpness(img, f):
    h, w = img.shape[:2]
    if h <= 2 or w <= 2:
        return img.copy()
    x = img.astype(F32)
    if x.ndim == 2:
        x = x[..., None]
    a, b = F32(1 / 13), F32(5 / 13)
    blur = np.zeros_like(x[1:-1, 1:-1])
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            wgt = b if dy == dx == 0 else a
            blur = blur + wgt * x[1 + dy:h - 1 + dy, 1 + dx:w - 1 + dx]
    blur = np.round(blur)
    out = x.copy()
    mid = out[1:-1, 1:-1]
    out[1:-1, 1:-1] = mid + F32(1.0 - f) * (blur - mid)
    out = _u8(out)
    return out[..., 0] if img.ndim == 2 else out


COLOR = {"brightness": brightness, "contrast": contrast, "saturation": saturation, "hue": hue,
         "posterize": lambda im, v: posterize(im, int(v)), "solarize": solarize,
         "invert": lambda im, v: invert(im), "equalize": lambda im, v: equalize(im),
         "autocontrast": lambda im, v: autocontrast(im), "sharpness": sharpness,
         "grayscale": lambda im, v: grayscale(im) if im.ndim == 3 else im.copy()}


# --- blur ---------------------------------------------------------------------------------

def gaussian_kernel(size, sigma):
    lim = (size - 1) / (2.0 * math.sqrt(2.0))
    x = np.linspace(-lim, lim, size, dtype=F32)
    e = -((x / F32(sigma)) ** 2)
    k = np.exp(e - e.max())
    return (k / k.sum()).astype(F32)


def gaussian_blur(img, kx, ky, sx, sy):
    k2 = gaussian_kernel(ky, sy)[:, None] * gaussian_kernel(kx, sx)[None, :]
    x = img.astype(F32)
    if x.ndim == 2:
        x = x[..., None]
    p = np.pad(x, ((ky // 2, ky // 2), (kx // 2, kx // 2), (0, 0)), mode="reflect")
    h, w = img.shape[:2]
    out = np.zeros_like(x)
    for i in range(ky):
        for j in range(kx):
            out += k2[i, j] * p[i:i + h, j:j + w]
    out = np.round(out).astype(np.uint8)
    return out[..., 0] if img.ndim == 2 else out


# --- geometry -----------------------------------------------------------------------------

def _rss(angle, shear):
    """torchvision's rotate-scale-shear terms (a, b, c, d) of _get_inverse_affine_matrix."""
    rot = math.radians(angle)
    sx, sy = math.radians(shear[0]), math.radians(shear[1])
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    return a, b, c, d


def inverse_affine_matrix(center, angle, translate, scale, shear):
    """torchvision's _get_inverse_affine_matrix (inverted=True): 6 numbers."""
    a, b, c, d = _rss(angle, shear)
    (cx, cy), (tx, ty) = center, translate
    m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty)
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty)
    return m


def forward_affine_matrix(center, angle, translate, scale, shear):
    """The same with inverted=False: the map boxes go through (3x3)."""
    a, b, c, d = _rss(angle, shear)
    (cx, cy), (tx, ty) = center, translate
    m = [a * scale, b * scale, 0.0, c * scale, d * scale, 0.0]
    m[2] += cx + tx - m[0] * cx - m[1] * cy
    m[5] += cy + ty - m[3] * cx - m[4] * cy
    return np.array([m[:3], m[3:], [0, 0, 1]], dtype=np.float64)


def _grid_sample(img, gx, gy, mode, fill):
    """grid_sample(align_corners=False, padding zeros) + torchvision's fill blend."""
    h, w = img.shape[:2]
    x = img.astype(F32)
    if x.ndim == 2:
        x = x[..., None]
    ix = ((gx + F32(1)) * F32(w) - F32(1)) / F32(2)
    iy = ((gy + F32(1)) * F32(h) - F32(1)) / F32(2)

    def tap(xi, yi):
        inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
        xc, yc = np.clip(xi, 0, w - 1).astype(int), np.clip(yi, 0, h - 1).astype(int)
        return x[yc, xc] * inside[..., None], inside.astype(F32)

    if mode == "nearest":
        v, m = tap(np.rint(ix), np.rint(iy))
    else:
        x0, y0 = np.floor(ix), np.floor(iy)
        ax, ay = ix - x0, iy - y0
        v = np.zeros(ix.shape + (x.shape[2],), F32)
        m = np.zeros(ix.shape, F32)
        for dx, dy, wt in ((0, 0, (1 - ax) * (1 - ay)), (1, 0, ax * (1 - ay)),
                           (0, 1, (1 - ax) * ay), (1, 1, ax * ay)):
            tv, tm = tap(x0 + dx, y0 + dy)
            v += tv * wt[..., None]
            m += tm * wt
    if fill is not None:
        f = np.array(fill, F32).reshape(1, 1, -1)
        mm = m[..., None]
        if mode == "nearest":
            v = np.where(mm < 0.5, f, v)
        else:
            v = (v - f) * mm + f
    out = np.round(v).astype(np.uint8)
    return out[..., 0] if img.ndim == 2 else out


def affine_image(img, angle, translate, scale, shear, mode="nearest", fill=None, center=None):
    """torchvision's affine_image on a tensor (HWC here)."""
    h, w = img.shape[:2]
    center_f = [0.0, 0.0] if center is None else [center[0] - w * 0.5, center[1] - h * 0.5]
    m = inverse_affine_matrix(center_f, angle, [float(t) for t in translate], scale, shear)
    theta = np.array(m, F32).reshape(2, 3)
    xs = np.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, w, dtype=F32)
    ys = np.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, h, dtype=F32)
    bx, by = np.meshgrid(xs, ys)
    t = theta / np.array([[0.5 * w], [0.5 * h]], F32)
    gx = bx * t[0, 0] + by * t[0, 1] + t[0, 2]
    gy = bx * t[1, 0] + by * t[1, 1] + t[1, 2]
    return _grid_sample(img, gx.astype(F32), gy.astype(F32), mode, fill)


def rotate_image(img, angle, mode="nearest", fill=None):
    return affine_image(img, -angle, [0, 0], 1.0, [0.0, 0.0], mode, fill)


def perspective_coeffs(startpoints, endpoints):
    a = np.zeros((8, 8))
    for i, (p1, p2) in enumerate(zip(endpoints, startpoints, strict=True)):
        a[2 * i] = [p1[0], p1[1], 1, 0, 0, 0, -p2[0] * p1[0], -p2[0] * p1[1]]
        a[2 * i + 1] = [0, 0, 0, p1[0], p1[1], 1, -p2[1] * p1[0], -p2[1] * p1[1]]
    b = np.array(startpoints, np.float64).reshape(8)
    return np.linalg.lstsq(a, b, rcond=None)[0].astype(F32).astype(np.float64)


def perspective_image(img, coeffs, mode="bilinear", fill=None):
    h, w = img.shape[:2]
    xs = np.linspace(0.5, w - 0.5, w, dtype=F32)
    ys = np.linspace(0.5, h - 0.5, h, dtype=F32)
    bx, by = np.meshgrid(xs, ys)
    c = [F32(v) for v in coeffs]
    den = c[6] * bx + c[7] * by + F32(1)
    gx = (c[0] * bx + c[1] * by + c[2]) / F32(0.5 * w) / den - F32(1)
    gy = (c[3] * bx + c[4] * by + c[5]) / F32(0.5 * h) / den - F32(1)
    return _grid_sample(img, gx.astype(F32), gy.astype(F32), mode, fill)


def pad_window(img, x0, y0, out_w, out_h, mode, fill=0):
    """F.pad + crop: the window at (x0, y0) of the padded image."""
    h, w = img.shape[:2]
    left, top = max(0, -x0), max(0, -y0)
    right, bottom = max(0, x0 + out_w - w), max(0, y0 + out_h - h)
    pads = ((top, bottom), (left, right)) + (((0, 0),) if img.ndim == 3 else ())
    np_mode = {"constant": "constant", "edge": "edge", "reflect": "reflect",
               "symmetric": "symmetric"}[mode]
    kw = {"constant_values": fill} if mode == "constant" else {}
    p = np.pad(img, pads, mode=np_mode, **kw)
    return p[y0 + top:y0 + top + out_h, x0 + left:x0 + left + out_w]


# --- targets ------------------------------------------------------------------------------

def to_xyxy(b, fmt):
    b = b.astype(np.float64)
    if fmt == "xywh":
        return np.stack([b[:, 0], b[:, 1], b[:, 0] + b[:, 2], b[:, 1] + b[:, 3]], 1)
    if fmt == "cxcywh":
        return np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2,
                         b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2], 1)
    return b


def from_xyxy(b, fmt):
    if fmt == "xywh":
        return np.stack([b[:, 0], b[:, 1], b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]], 1)
    if fmt == "cxcywh":
        return np.stack([(b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2,
                         b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]], 1)
    return b


def boxes_through(boxes, w, h, ops):
    """torchvision's box kernels op by op (crop, resize, horizontal/vertical flip, pad,
    affine with its forward matrix: corners' enclosing box), clamped at the end.
    Returns xyxy boxes, the unclamped ones, and the canvas (w, h)."""
    b = boxes.astype(np.float64).copy()
    for op in ops:
        kind = op[0]
        if kind == "crop":
            x, y, cw, ch = op[1:]
            b -= [x, y, x, y]
            w, h = cw, ch
        elif kind == "resize":
            nw, nh = op[1:]
            b *= [nw / w, nh / h, nw / w, nh / h]
            w, h = nw, nh
        elif kind == "hflip":
            b[:, [0, 2]] = w - b[:, [2, 0]]
        elif kind == "vflip":
            b[:, [1, 3]] = h - b[:, [3, 1]]
        elif kind == "pad":
            left, top, right, bottom = op[1:]
            b += [left, top, left, top]
            w, h = w + left + right, h + top + bottom
        elif kind == "warp":
            m = np.array(op[1:10], np.float64).reshape(3, 3)
            pts = b[:, [[0, 1], [2, 1], [2, 3], [0, 3]]].reshape(-1, 2)
            ph = np.concatenate([pts, np.ones((len(pts), 1))], 1) @ m.T
            pts = (ph[:, :2] / ph[:, 2:]).reshape(-1, 4, 2)
            b = np.concatenate([pts.min(1), pts.max(1)], 1)
            w, h = op[10], op[11]
    moved = b.copy()
    b[:, [0, 2]] = b[:, [0, 2]].clip(0, w)
    b[:, [1, 3]] = b[:, [1, 3]].clip(0, h)
    return b, moved, w, h


def _clip_polygon(pts, w, h):
    """Sutherland-Hodgman: the part of the convex polygon `pts` ((n, 2)) in [0, w] x [0, h]."""
    for axis, at, above in ((0, 0.0, True), (0, w, False), (1, 0.0, True), (1, h, False)):
        out = []
        for i in range(len(pts)):
            a, b = pts[i], pts[(i + 1) % len(pts)]
            ia = a[axis] >= at if above else a[axis] <= at
            ib = b[axis] >= at if above else b[axis] <= at
            if ia:
                out.append(a)
            if ia != ib:
                t = (at - a[axis]) / (b[axis] - a[axis])
                out.append(a + t * (b - a))
        pts = np.array(out).reshape(-1, 2)
        if not len(pts):
            break
    return pts


def boxes_left(boxes, w, h, ops):
    """What is left of each box: the box clipped to the image, then moved op by op (as
    boxes_through) and clipped to each op's canvas, as a polygon; its enclosing box. Returns
    xyxy boxes (zeros where nothing is left), the unclamped moved boxes (boxes_through's),
    and the canvas (w, h)."""
    _, moved, ow, oh = boxes_through(boxes, w, h, ops)
    out = np.zeros((len(boxes), 4))
    for i, (x1, y1, x2, y2) in enumerate(np.asarray(boxes, np.float64)):
        pts = _clip_polygon(np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]]), w, h)
        cw, ch = w, h
        for op in ops:
            if not len(pts):
                break
            kind = op[0]
            if kind == "crop":
                x, y, cw, ch = op[1:]
                pts = pts - [x, y]
            elif kind == "resize":
                nw, nh = op[1:]
                pts = pts * [nw / cw, nh / ch]
                cw, ch = nw, nh
            elif kind == "hflip":
                pts = pts * [-1, 1] + [cw, 0]
            elif kind == "vflip":
                pts = pts * [1, -1] + [0, ch]
            elif kind == "pad":
                left, top, right, bottom = op[1:]
                pts = pts + [left, top]
                cw, ch = cw + left + right, ch + top + bottom
            elif kind == "warp":
                m = np.array(op[1:10], np.float64).reshape(3, 3)
                ph = np.concatenate([pts, np.ones((len(pts), 1))], 1) @ m.T
                pts = ph[:, :2] / ph[:, 2:]
                cw, ch = op[10], op[11]
            pts = _clip_polygon(pts, cw, ch)
        if len(pts):
            out[i] = [*pts.min(0), *pts.max(0)]
    return out, moved, ow, oh


def keep_boxes(clipped, moved, min_area=1.0, min_visibility=0.0, min_size=1.0):
    """SanitizeBoundingBoxes' sizes plus albumentations' visibility."""
    bw, bh = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
    area = bw * bh
    moved_area = (moved[:, 2] - moved[:, 0]).clip(0) * (moved[:, 3] - moved[:, 1]).clip(0)
    ok = (bw > 0) & (bh > 0) & (bw >= min_size) & (bh >= min_size) & (area >= min_area)
    if min_visibility > 0:
        ok &= area >= min_visibility * moved_area
    return ok


# --- batch mixes --------------------------------------------------------------------------

def mix_labels(labels, num_classes, lam, smoothing=0.0):
    off = smoothing / num_classes
    on = 1.0 - smoothing + off
    y = np.full((len(labels), num_classes), off)
    y[np.arange(len(labels)), labels] = on
    return lam * y + (1 - lam) * np.roll(y, 1, axis=0)
