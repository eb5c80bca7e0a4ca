"""The checks of a Loader's ``transforms=`` and ``batch_transforms=`` that the plan makes
(stoker/_plan.py, NOTE [ Loader plan ]): transform groups, whole (NOTE [ Whole groups ]),
what each field of a group is to the C++ targets, and MixUp and CutMix resolved as a
:class:`BatchMixPlan`. The checks of the other single arguments are in
stoker/_loader_args.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from . import _core
from .fields import Boxes, Field, Image, KeyPoints, NDArray
from .ops import BatchOp, Op

# -- transform groups ---------------------------------------------------------------------

def check_transforms(fields: Mapping[str, Field], transforms: Mapping[Any, Sequence[Op]],
                     box_rows: Any = None, as_stored: Any = None) -> Dict[Any, list]:
    """``{field: [op, ...]}`` over image fields, a single op taken as a list of one. A key
    may be a tuple of fields that move together (a transform group): images, masks, boxes,
    keypoints and per-box rows (:func:`group_targets`). The groups must be whole
    (:func:`complete_groups`): the keys come back with the per-box rows ``box_rows`` adds."""
    if not isinstance(transforms, Mapping):
        raise TypeError(f"transforms must be a dict {{field name: [ops]}}, got "
                        f"{type(transforms).__name__}")
    out: Dict[Any, list] = {}
    for key, ops in transforms.items():
        names = key if isinstance(key, tuple) else (key,)
        if not names:
            raise ValueError("transforms: an empty tuple of fields")
        for name in names:
            if not isinstance(name, str) or name not in fields:
                raise ValueError(f"transforms: no field {name!r} in the dataset "
                                 f"(fields: {', '.join(fields)})")
        if not isinstance(key, tuple) and not isinstance(fields[key], Image):
            raise ValueError(f"transforms: field {key!r} is not an image field; ops apply "
                             "to stoker.image() fields (put masks, boxes and keypoints in a "
                             "tuple key with their image)")
        if isinstance(key, tuple):
            group_targets(fields, key)  # a field that cannot follow the geometry: now
        if isinstance(ops, Op):
            ops = [ops]
        ops = list(ops)
        for op in ops:
            if not isinstance(op, Op):
                raise ValueError(f"transforms[{key!r}]: expected stoker.ops objects, got "
                                 f"{type(op).__name__}")
        out[key] = ops
    return complete_groups(fields, out, box_rows, as_stored)


_GEOMETRY = {"mask": "a mask", "boxes": "boxes", "keypoints": "keypoints"}


def _geometry_kind(f: Field) -> Optional[str]:
    """"mask", "boxes" or "keypoints" for a field whose values sit on an image's pixels."""
    if isinstance(f, Boxes):
        return "boxes"
    if isinstance(f, KeyPoints):
        return "keypoints"
    if isinstance(f, Image) and f.mode == "L":
        return "mask"
    return None


def _names(value: Any, what: str, fields: Mapping[str, Field]) -> Tuple[str, ...]:
    """A field name or a sequence of them, each a field of the dataset."""
    if value is None:
        return ()
    names = (value,) if isinstance(value, str) else tuple(value)
    for n in names:
        if not isinstance(n, str) or n not in fields:
            raise ValueError(f"{what}: no field {n!r} in the dataset (fields: "
                             f"{', '.join(fields)})")
    return names


def complete_groups(fields: Mapping[str, Field], transforms: Dict[Any, list],
                    box_rows: Any = None, as_stored: Any = None) -> Dict[Any, list]:
    """Transform groups that cannot be half-declared (NOTE [ Whole groups ]); the keys come
    back with the fields ``box_rows`` names added to the group with boxes.

    NOTE [ Whole groups ]
    A group keeps its targets on its image only for the fields it holds, so:

    * a group with boxes drops the boxes nothing is left of, and with them the rows of its
      other variable-length fields (class ids); a variable-length field of the dataset
      outside every group may be such rows, left whole while boxes go (class ids would
      move onto other boxes). Each must be in the group's key, or named in ``box_rows``
      (rows of the boxes: dropped with them, as in the key) or in ``as_stored`` (not per
      box: delivered as stored);
    * a mask, boxes or keypoints field must be in the group of the RGB image whose pixels
      move: outside every group it would stay where it was, in a group of its own it
      would move by draws of its own; or named in ``as_stored``, left as stored knowingly
      (a detection dataset read for classification). Only ops that move pixels
      (``Op.moves_pixels``) make this an error: colour ops leave targets where they are.
    """
    box_rows = _names(box_rows, "box_rows", fields)
    as_stored = _names(as_stored, "as_stored", fields)
    keys = {n: key for key in transforms for n in (key if isinstance(key, tuple) else (key,))}
    for name in box_rows:
        f = fields[name]
        if not isinstance(f, NDArray) or not f.variable or isinstance(f, (Boxes, KeyPoints)):
            raise ValueError(f"box_rows: {name!r} is not a variable-length ndarray field (boxes "
                             "and keypoints move with their group: put them in its key)")
    for what, names in (("box_rows", box_rows), ("as_stored", as_stored)):
        for name in names:
            if name in keys:
                raise ValueError(f"{what}: {name!r} is in the transforms key {keys[name]!r} "
                                 "already: a field of a group moves with it")
    for name in set(box_rows) & set(as_stored):
        raise ValueError(f"{name!r} is in box_rows and in as_stored: rows of the boxes, or "
                         "delivered as stored?")
    box_groups = [k for k in transforms if isinstance(k, tuple)
                  and any(isinstance(fields[n], Boxes) for n in k)]
    if box_rows and not box_groups:
        raise ValueError(f"box_rows: no transform group has boxes for {box_rows[0]!r} to be "
                         "rows of")
    if box_rows and len(box_groups) > 1:
        raise ValueError(f"box_rows: {box_rows[0]!r} could be rows of the boxes of "
                         f"{' or '.join(repr(g) for g in box_groups)}: put it in its group's "
                         "key")
    out = dict(transforms)
    for name, f in fields.items():
        if name in keys or name in as_stored or not isinstance(f, NDArray) or \
                not f.variable or isinstance(f, (Boxes, KeyPoints)) or not box_groups:
            continue
        group = box_groups[0]
        if name not in box_rows:
            raise ValueError(
                f"transforms: the group {group!r} drops the boxes nothing is left of, with the "
                f"rows of its per-box fields; {name!r} is a variable-length field outside it, "
                "which would keep every row (class ids would move onto other boxes). If it has "
                f"a row per box, add it to the group's key ({(*group, name)!r}) or name it in "
                f"box_rows=[{name!r}]; if not, in as_stored=[{name!r}]")
        out = {((*k, name) if k == group else k): v for k, v in out.items()}
    # targets outside the group of the image that moves
    rgb = [n for n, f in fields.items() if isinstance(f, Image) and f.mode != "L"]
    moving = {k for k, ops in transforms.items() if any(op.moves_pixels for op in ops)}
    image_moves = [k for k in moving
                   if any(n in rgb for n in (k if isinstance(k, tuple) else (k,)))]
    for name, f in fields.items():
        kind = _geometry_kind(f)
        key = keys.get(name)
        if kind is None or not rgb or name in as_stored:
            continue
        names = () if key is None else (key if isinstance(key, tuple) else (key,))
        if any(n in rgb for n in names):
            continue  # in the group of an image
        if key in moving or image_moves:
            image = next((n for k in image_moves
                          for n in (k if isinstance(k, tuple) else (k,)) if n in rgb), rgb[0])
            how = "stays where it was" if key is None else "moves by draws of its own"
            raise ValueError(
                f"transforms: {name!r} ({_GEOMETRY[kind]}) is not in the group of {image!r}, "
                f"whose ops move pixels: it {how} while the image moves. Put them in one "
                f"group: transforms={{({image!r}, {name!r}, ...): [...]}}, or, to have it as "
                f"stored knowingly, as_stored=[{name!r}]")
    return out


def group_targets(fields: Mapping[str, Field], names: Sequence[str]) -> list:
    """What each field of a transform group is, as the arguments of ``_core.TargetSpec``:
    an RGB image, a mask (``stoker.image(mode="L")`` or an integer ndarray of fixed shape
    (h, w) or (h, w, 1)), boxes, keypoints, or per-box rows (any other variable-length
    field)."""
    out: list = []
    for name in names:
        f = fields[name]
        if isinstance(f, Image):
            out.append(("mask" if f.mode == "L" else "image",))
        elif isinstance(f, Boxes):
            out.append(("boxes", f.format, f.normalized))
        elif isinstance(f, KeyPoints):
            out.append(("keypoints", "xyxy", f.normalized))
        elif isinstance(f, NDArray) and f.variable:
            out.append(("rows",))
        elif isinstance(f, NDArray) and f.dtype.kind in "iu" and (
                len(f.shape) == 2 or (len(f.shape) == 3 and f.shape[2] == 1)):
            out.append(("mask",))
        else:
            raise ValueError(f"transforms: field {name!r} ({f!r}) has no geometry to follow: "
                             "a group takes images, masks (stoker.image(mode='L') or an "
                             "integer ndarray (h, w)), stoker.boxes(), stoker.keypoints() and "
                             "variable-length per-box rows such as class ids")
    return out


# -- batch transforms (MixUp, CutMix) -----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BatchMixPlan:
    """MixUp and CutMix of a loader, resolved: which image and labels, the classes."""

    image: str
    labels: str
    num_classes: Optional[int]
    mixup: Optional[BatchOp]
    cutmix: Optional[BatchOp]
    switch_prob: float

    def options(self) -> Any:
        return _core.BatchMixOptions(image=self.image, labels=self.labels,
                                     num_classes=self.num_classes,
                                     mixup=self.mixup.params() if self.mixup else None,
                                     cutmix=self.cutmix.params() if self.cutmix else None,
                                     switch_prob=self.switch_prob)


def check_batch_transforms(fields: Mapping[str, Field], batch_transforms: Any
                           ) -> Optional[BatchMixPlan]:
    """``[MixUp(...), CutMix(...)]`` (one of each at most) as a :class:`BatchMixPlan`,
    or None. The image is the one RGB image field unless an op names it; the labels,
    "label" or "labels" unless an op names them."""
    if not batch_transforms:
        return None
    if isinstance(batch_transforms, BatchOp):
        batch_transforms = [batch_transforms]
    ops = list(batch_transforms)
    by_kind: Dict[str, BatchOp] = {}
    for op in ops:
        if not isinstance(op, BatchOp):
            raise ValueError(f"batch_transforms: expected stoker.ops.MixUp or CutMix, got "
                             f"{type(op).__name__}")
        if op._name in by_kind:
            raise ValueError(f"batch_transforms: two {type(op).__name__} ops")
        by_kind[op._name] = op

    def agreed(what: str, default: Any) -> Any:
        given = {getattr(op, what) for op in ops if getattr(op, what) is not None}
        if len(given) > 1:
            raise ValueError(f"batch_transforms: MixUp and CutMix disagree on {what} "
                             f"({sorted(map(repr, given))})")
        return given.pop() if given else default

    num_classes = agreed("num_classes", None)
    switch_prob = agreed("switch_prob", 0.5)
    image = agreed("image", None)
    if image is None:
        rgb = [n for n, f in fields.items() if isinstance(f, Image) and f.mode == "RGB"]
        if len(rgb) != 1:
            raise ValueError(f"batch_transforms: say which image to mix (image=...): the "
                             f"dataset has {len(rgb)} RGB image fields")
        image = rgb[0]
    labels = agreed("labels", None)
    if labels is None:
        found = [n for n in ("label", "labels") if n in fields]
        if not found:
            raise ValueError("batch_transforms: say which field holds the class ids "
                             "(labels=...): the dataset has no 'label' or 'labels' field")
        labels = found[0]
    for what, name in (("image", image), ("labels", labels)):
        if name not in fields:
            raise ValueError(f"batch_transforms: {what}={name!r} is no field of the dataset "
                             f"(fields: {', '.join(fields)})")
    return BatchMixPlan(image, labels, num_classes, by_kind.get("mixup"),
                        by_kind.get("cutmix"), float(switch_prob))

