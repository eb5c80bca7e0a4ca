"""A stoker.Dataset's record options, planned and built: each image field's decoded layout,
the transform groups, the fetch plan of samples read one by one, and the
``_core.RecordOptions`` a producer or a sample reader takes. The records source
(records.py) and a mixture's (mixture.py) plan with them, and ``Dataset.sample`` reads
through them (:func:`sample`), so that it gives what a loader's ``map=`` receives. Kept
apart from the sources' wiring (stoker/_build.py) so that stoker/dataset.py can use it
without an import circle."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, Mapping, Optional, Tuple

from .. import _core
from .._media_args import split_media
from .._plan_parts import GroupPlan, RecordPlan, Sampling
from .._transform_args import check_transforms, group_targets
from ..fields import Image
from ..ops import op_specs

__all__ = ["image_layouts", "transform_groups", "fetch_plan", "record_options",
           "sampler_options", "sample"]


def record_options(r: RecordPlan, sampling: Sampling, threads_hint: int = 0,
                   listed: Any = None, cache: Any = None) -> Any:
    """A RecordPlan as the ``_core.RecordOptions`` its producer takes (`cache`: the
    ``_core.DecodedCache`` build() opened for ``r.cache``)."""
    return _core.RecordOptions(
        sampler=sampler_options(sampling, listed),
        skip_errors=r.skip_errors,
        images={name: _core.ImageFieldSpec(layout, pixels) for name, layout, pixels in r.images},
        transforms=[_core.TransformSpec(list(g.fields), op_specs(list(g.ops)),
                                        [_core.TargetSpec(*t) for t in g.targets])
                    for g in r.groups],
        threads_hint=threads_hint, handoff=r.handoff, pad_values=dict(r.pad_values),
        mix=None if r.batch_mix is None else r.batch_mix.options(), verify=r.verify,
        cache=cache, **r.media.options())


def sampler_options(s: Sampling, listed: Any = None) -> Any:
    """The ``_core.SamplerOptions`` of `s` (`listed`: a user sampler's ListedOrders)."""
    return _core.SamplerOptions(batch_size=s.batch_size or 1, shuffle=s.shuffle,
                                seed=s.seed64, drop_last=s.drop_last,
                                even_batches=s.even_batches, shard_window=s.shard_window or 0,
                                listed=listed)


def fetch_plan(images: Any, checked: Mapping[Any, Any], groups: Tuple[GroupPlan, ...],
               verify: str = "first", cache: Any = None, media: Any = None) -> RecordPlan:
    """The RecordPlan of samples fetched one by one (map= receives them; ``ds.sample``):
    each field's own ops, and the transform groups of several fields."""
    kw = {} if media is None else {"media": media}
    return RecordPlan(images, tuple(GroupPlan((k,), tuple(ops)) for k, ops in checked.items()
                                    if ops and not isinstance(k, tuple)) +
                      tuple(g for g in groups if len(g.fields) > 1),
                      verify=verify, cache=cache, **kw)


def image_layouts(fields: Mapping[str, Any], image_layout: Optional[str],
            max_pixels: int) -> Tuple[Tuple[Tuple[str, str, int], ...], Tuple[str, ...]]:
    """Each image field's decoded layout: the one asked for, else the field's own; by
    default delivered as NCHW in shape, an HWC decode viewed with channels_last strides
    (no copy; NOTE in _iterator.LoaderIter.__next__)."""
    images, nchw = [], []
    for name, f in fields.items():
        if isinstance(f, Image):
            layout = image_layout or f.layout
            if image_layout is None and layout == "HWC":
                nchw.append(name)
            images.append((name, layout, max_pixels))
    return tuple(images), tuple(nchw)


def transform_groups(fields: Mapping[str, Any],
                     transforms: Mapping[Any, list]) -> Tuple[GroupPlan, ...]:
    """Transform groups, checked (the C++ op list too). A one-channel image
    (``stoker.image(mode="L")``) is a mask wherever it is: one channel, nearest-neighbour,
    no colour ops; alone, a group of one."""
    out = []
    for key, ops in transforms.items():
        names = key if isinstance(key, tuple) else (key,)
        is_mask = any(getattr(fields[n], "mode", "") == "L" for n in names)
        if not ops and not is_mask:
            continue
        op_specs(ops)  # the C++ op list's own checks (Normalize last, ...)
        out.append(GroupPlan(names, tuple(ops), tuple(group_targets(fields, names))))
    grouped = {n for k in transforms for n in (k if isinstance(k, tuple) else (k,))}
    out += [GroupPlan((n,), (), (("mask",),)) for n, f in fields.items()
            if isinstance(f, Image) and f.mode == "L" and n not in grouped]
    return tuple(out)


# Dataset.sample's readers: one per (transforms, layout, limit) while the dataset lives
_readers: "weakref.WeakKeyDictionary[Any, Dict[Any, Any]]" = weakref.WeakKeyDictionary()
_readers_lock = threading.Lock()
# one sample at a time, in no order: the sampling of a reader's options
_ONE = Sampling(1, False, 0, False, True, None, None, None)


def sample(dataset: Any, index: int, transforms: Optional[Mapping[Any, Any]], seed: int,
           image_layout: Optional[str], max_pixels: int, box_rows: Any = None,
           as_stored: Any = None) -> Dict[str, Any]:
    """``Dataset.sample``: sample `index` as a loader's ``map=`` receives it, planned and
    built as that loader's samples are (:func:`fetch_plan`, then its RecordOptions and a
    ``_stage.sources.DatasetSource``), the reader kept per (transforms, layout, limit)
    while the dataset lives; the draws are keyed by (seed, index) through its epoch."""
    from .._stage.sources import DatasetSource

    if image_layout not in (None, "HWC", "CHW"):
        raise ValueError(f"image_layout must be 'HWC', 'CHW' or None, got {image_layout!r}")
    max_pixels = int(max_pixels)
    media, transforms = split_media(dataset.fields, transforms, image_layout, max_pixels)
    checked = check_transforms(dataset.fields, transforms or {}, box_rows, as_stored)
    key = (repr(sorted(checked.items(), key=lambda kv: repr(kv[0]))), image_layout,
           max_pixels, repr(media))
    with _readers_lock:
        readers = _readers.setdefault(dataset, {})
        reader = readers.get(key)
    if reader is None:
        images, _ = image_layouts(dataset.fields, image_layout, max_pixels)
        plan = fetch_plan(images, checked, transform_groups(dataset.fields, checked), media=media)
        reader = DatasetSource(dataset, record_options(plan, _ONE, threads_hint=1))
        with _readers_lock:
            readers[key] = reader
    return reader.sample(index, int(seed) & 0xFFFFFFFFFFFFFFFF)
