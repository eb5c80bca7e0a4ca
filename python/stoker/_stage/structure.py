"""The structure of a sample, as ``torch.utils.data.default_collate`` sees it: mappings,
namedtuples and sequences it recurses into, and the leaves it batches (NOTE [ Batching
Python outputs ] in collate.py). A structure is fixed from the first sample: it flattens
every sample to its leaves (checking the sample has that structure) and builds a batch
from the batched leaves."""

from __future__ import annotations

from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

__all__ = ["Structure", "key_name", "path_str", "where_text"]


def where_text(where: Any) -> str:
    """Errors name the sample; the name is made only for an error (a callable)."""
    return where() if callable(where) else where


def key_name(key: Hashable) -> str:
    return repr(key) if not isinstance(key, str) else f"'{key}'"


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def path_str(path: Tuple[Hashable, ...]) -> str:
    """A leaf's place in a sample, for errors: ['boxes'], [1], ['meta'][0]."""
    return "".join(f"[{p!r}]" for p in path) or "the sample"


class _Node:
    """The structure of a sample (default_collate's view of it): a leaf, or a container
    (``dict`` for mappings, ``seq`` for lists and tuples, ``named`` for namedtuples) of
    nodes. Leaves are numbered in order; ``leaf`` is the leaf's number."""

    __slots__ = ("kind", "type", "keys", "children", "leaf")

    def __init__(self, kind: str, type_: Any = None, keys: Tuple[Hashable, ...] = (),
                 children: Tuple["_Node", ...] = (), leaf: int = -1):
        self.kind = kind
        self.type = type_
        self.keys = keys
        self.children = children
        self.leaf = leaf


def _container(value: Any, declared: bool) -> Optional[str]:
    """The container kind of a value default_collate recurses into, else None (a leaf).
    A value declared in map_fields is a leaf whatever it is."""
    if declared:
        return None
    if isinstance(value, Mapping):
        return "dict"
    if _is_namedtuple(value):
        return "named"
    if isinstance(value, (list, tuple)):
        return "seq"
    return None


class Structure:
    """A sample's structure, fixed from the first sample: flattens every sample to its
    leaves (checking it has that structure) and builds a batch from batched leaves."""

    def __init__(self, sample: Any, top_declared: Mapping[Hashable, Any],
                 origin: str = "the first sample"):
        # the sample the structure comes from, named in errors: with several threads, the
        # first sample checked need not be the first of the epoch
        self.origin = origin
        self.paths: List[Tuple[Hashable, ...]] = []
        # leaves inside a sequence: default_collate gives their lists as tuples (zip's)
        self.in_sequence: List[bool] = []
        self.root = self._node(sample, (), top_declared)
        # one leaf at the top of a plain dict of leaves: flatten by its keys (fast path)
        r = self.root
        self.flat_dict: Optional[Tuple[Hashable, ...]] = \
            r.keys if r.kind == "dict" and all(c.kind == "leaf" for c in r.children) else None

    def _node(self, value: Any, path: Tuple[Hashable, ...],
              top_declared: Mapping[Hashable, Any], in_sequence: bool = False) -> _Node:
        declared = len(path) == 1 and path[0] in top_declared
        kind = _container(value, declared)
        if kind is None:
            self.paths.append(path)
            self.in_sequence.append(in_sequence)
            return _Node("leaf", leaf=len(self.paths) - 1)
        if kind == "dict":
            keys = tuple(value.keys())
            children = tuple(self._node(value[k], path + (k,), top_declared) for k in keys)
            return _Node("dict", type(value), keys, children)
        children = tuple(self._node(v, path + (i,), top_declared, True)
                         for i, v in enumerate(value))
        return _Node(kind, type(value), tuple(range(len(value))), children)

    def flatten(self, sample: Any, where: Any, what: str) -> List[Any]:
        keys = self.flat_dict
        if keys is not None and type(sample) is dict and len(sample) == len(keys):
            try:
                return [sample[k] for k in keys]
            except KeyError:
                pass  # the slow path says which
        out: List[Any] = []
        self._flatten(self.root, sample, (), out, where, what)
        return out

    def _flatten(self, node: _Node, value: Any, path: Tuple[Hashable, ...], out: List[Any],
                 where: Any, what: str) -> None:
        if node.kind == "leaf":
            out.append(value)
            return
        if node.kind == "dict":
            if not isinstance(value, Mapping):
                raise TypeError(f"{where_text(where)}: {path_str(path)} of the {what} is a "
                                f"{type(value).__name__}, where {self.origin} has a dict")
            if len(value) != len(node.keys) or any(k not in value for k in node.keys):
                extra = [k for k in value if k not in node.keys]
                missing = [k for k in node.keys if k not in value]
                parts = []
                if extra:
                    parts.append(f"has key(s) {', '.join(map(key_name, extra))} that "
                                 f"{self.origin} does not")
                if missing:
                    parts.append(f"lacks key(s) {', '.join(map(key_name, missing))}")
                at = "" if not path else f" at {path_str(path)}"
                raise ValueError(f"{where_text(where)}: the {what}{at} {' and '.join(parts)} "
                                 f"(keys of {self.origin}: "
                                 f"{', '.join(map(key_name, node.keys))}); every sample must "
                                 "have the same keys")
            for k, child in zip(node.keys, node.children):
                self._flatten(child, value[k], path + (k,), out, where, what)
            return
        if not isinstance(value, (list, tuple)) or (node.kind == "named") != \
                _is_namedtuple(value):
            raise TypeError(f"{where_text(where)}: {path_str(path)} of the {what} is a "
                            f"{type(value).__name__}, where {self.origin} has a "
                            f"{node.type.__name__}")
        if len(value) != len(node.children):
            raise ValueError(f"{where_text(where)}: {path_str(path)} of the {what} has "
                             f"{len(value)} elements where {self.origin} has "
                             f"{len(node.children)}: "
                             "each element in a batch should be of equal size (as "
                             "default_collate requires)")
        for i, (v, child) in enumerate(zip(value, node.children)):
            self._flatten(child, v, path + (i,), out, where, what)

    def build(self, leaves: Sequence[Any], lengths: Mapping[int, Any]) -> Any:
        """The batch: `leaves[i]` the batched leaf i; `lengths[i]` the lengths of a padded
        leaf (a value of the top dict: "<key>_lengths" goes beside it)."""
        return self._build(self.root, leaves, lengths, top=True)

    def _build(self, node: _Node, leaves: Sequence[Any], lengths: Mapping[int, Any],
               top: bool = False) -> Any:
        if node.kind == "leaf":
            return leaves[node.leaf]
        if node.kind == "dict":
            d: Dict[Hashable, Any] = {}
            for k, child in zip(node.keys, node.children):
                d[k] = self._build(child, leaves, lengths)
                if top and child.kind == "leaf" and child.leaf in lengths:
                    d[f"{k}_lengths"] = lengths[child.leaf]
            if node.type is dict:
                return d
            try:  # default_collate keeps the mapping's type where it can
                return node.type(d)
            except Exception:
                return d
        values = [self._build(child, leaves, lengths) for child in node.children]
        if node.kind == "named":
            return node.type(*values)
        return values  # a list, for a tuple too (default_collate's rule)
